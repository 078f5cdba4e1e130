"""``tutti maintenance retention | purge | status`` (MAINT-PREF-1, MAINT-MAN-1, MAINT-STAT-1).

The operator's view of the maintenance service::

    tutti maintenance retention                  # the effective retention preference
    tutti maintenance retention --set 15         # change it (a deployment-wide admin token)
    tutti maintenance purge --workspace ws-1     # purge every topmost tombstone of ws-1 now
    tutti maintenance purge --workspace ws-1 --session s-1 --compact
    tutti maintenance status --preview-workspace ws-1

Token discovery is that of ``tutti reference`` (``--token`` / ``TUTTI_CLI_TOKEN`` /
``<data dir>/auth/cli-token``, the local admin token of ``tutti up``). The address is
``--address``, else ``TUTTI_MAINTENANCE_ADDRESS``, else the running ``tutti up``'s
maintenance server (when it is the suite of this data directory), else ``127.0.0.1:50054``.

``purge`` calls ``RunManualPurge`` (which blocks until the run ends) and meanwhile polls
``GetMaintenanceStatus`` about twice a second, printing a progress line to stderr whenever
the run's counts change; the summary goes to stdout. Times in ``status`` are ISO-8601 UTC
with a relative form measured from the server's clock (``generated_at``).
"""

from __future__ import annotations

import datetime
import enum
import time
from typing import Annotated, NoReturn

import grpc
import typer
from google.protobuf import json_format
from google.protobuf.message import Message
from pydantic_settings import BaseSettings, SettingsConfigDict

from agentactivity.maintenance.v1 import maintenance_pb2, maintenance_pb2_grpc
from grpcserver.call_errors import call_error
from grpcserver.channels import sync_channel
from grpcserver.settings import DEFAULT_PORTS
from tutti.reference_commands import CliSettings, TokenOption, _fail, _token, cli_settings
from tutti.suite_record import find_running_suite

__all__ = [
    "EXIT_AGENT_ACTIVE",
    "EXIT_ERROR",
    "EXIT_STOPPED",
    "EXIT_USAGE",
    "format_size",
    "format_time",
    "maintenance_address",
    "maintenance_app",
]

EXIT_ERROR = 1
"""A refused or failed call, or a run that ended FAILED."""
EXIT_USAGE = 2
"""Bad usage (no token, a wrong option value)."""
EXIT_STOPPED = 3
"""The run stopped early (agent work began, Host unreachable, service draining): the
batches it committed stand; run the purge again later."""
EXIT_AGENT_ACTIVE = 4
"""Refused before anything changed because the idle gate is closed (``AGENT_ACTIVE`` or
``ACTIVITY_STATE_UNAVAILABLE``); retry after the printed delay."""

POLL_SECONDS = 0.5
"""How often ``purge`` reads the status while the run goes on."""

maintenance_app = typer.Typer(
    no_args_is_help=True,
    help="Tombstone retention, manual purge and maintenance status.",
)

_M = maintenance_pb2


class _AddressSettings(BaseSettings):
    """The one setting of the maintenance commands beyond :class:`CliSettings`."""

    model_config = SettingsConfigDict(env_prefix="TUTTI_", extra="ignore", frozen=True)

    maintenance_address: str | None = None
    """Where the maintenance service listens (``TUTTI_MAINTENANCE_ADDRESS``)."""


def maintenance_address(settings: CliSettings, option: str | None) -> str:
    """Where maintenance listens.

    ``--address``, ``TUTTI_MAINTENANCE_ADDRESS``, the running suite's record (when it is the
    suite of this data directory), or the default port.
    """
    if option:
        return option
    explicit = _AddressSettings().maintenance_address
    if explicit:
        return explicit
    record = find_running_suite()
    if (
        record is not None
        and "maintenance" in record.addresses
        and record.data_dir.resolve() == settings.data_dir.resolve()
    ):
        return record.addresses["maintenance"]
    return f"127.0.0.1:{DEFAULT_PORTS['maintenance']}"


AddressOption = Annotated[
    str | None, typer.Option(help="maintenance address; default TUTTI_MAINTENANCE_ADDRESS.")
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print the response as proto3 JSON instead.")
]


# --- presentation ------------------------------------------------------------------------


def _enum(enum_type: object, value: int, prefix: str) -> str:
    try:
        return str(enum_type.Name(value)).removeprefix(prefix)  # type: ignore[attr-defined]
    except ValueError:
        return str(value)


def _relative(delta_ms: int) -> str:
    seconds = abs(delta_ms) / 1000
    if seconds < 1:
        return "now"
    if seconds < 60:
        amount = f"{seconds:.0f} s"
    elif seconds < 3600:
        amount = f"{seconds / 60:.0f} min"
    elif seconds < 48 * 3600:
        amount = f"{seconds / 3600:.0f} h"
    else:
        amount = f"{seconds / 86400:.0f} d"
    return f"in {amount}" if delta_ms > 0 else f"{amount} ago"


def format_time(unix_ms: int, now_ms: int) -> str:
    """``2025-06-01T12:00:00Z (in 12 min)``: ISO-8601 UTC and the distance from ``now_ms``."""
    moment = datetime.datetime.fromtimestamp(unix_ms / 1000, tz=datetime.UTC)
    iso = moment.isoformat(timespec="seconds").replace("+00:00", "Z")
    return f"{iso} ({_relative(unix_ms - now_ms)})"


def format_size(size: int) -> str:
    """A byte count for people: ``512 B``, ``12.3 MiB``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover - the loop always returns


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.0f} %"


def _print_json(message: Message) -> None:
    typer.echo(
        json_format.MessageToJson(message, indent=2, always_print_fields_with_no_presence=True)
    )


def _progress(run: maintenance_pb2.MaintenanceRun) -> str:
    p, c = run.progress, run.cleanup
    blocked = f", {p.components_blocked} blocked" if p.components_blocked else ""
    return (
        f"{p.batches_completed} batch(es), {p.components_purged} component(s) and "
        f"{p.sessions_purged} Session(s) purged{blocked}; cleanup {c.attempted} attempted, "
        f"{c.completed} completed, {c.failed} failed"
    )


_STATE_NOTES = {
    _M.MAINTENANCE_RUN_STATE_COMPLETED: "all targeted work drained",
    _M.MAINTENANCE_RUN_STATE_STOPPED_AGENT_ACTIVE: (
        "agent work began; committed batches stand; run again later"
    ),
    _M.MAINTENANCE_RUN_STATE_STOPPED_HOST_UNAVAILABLE: (
        "Host could not be reached; committed batches stand; run again later"
    ),
    _M.MAINTENANCE_RUN_STATE_STOPPED_DRAINING: (
        "the maintenance service is shutting down (or stopped being the worker); committed "
        "batches stand; run again later"
    ),
    _M.MAINTENANCE_RUN_STATE_FAILED: (
        "the run ended on an unexpected error; committed batches stand"
    ),
}

_COMPACTION_NOTES = {
    _M.COMPACTION_OUTCOME_NOT_REQUESTED: "not requested",
    _M.COMPACTION_OUTCOME_COMPLETED: "completed",
    _M.COMPACTION_OUTCOME_SKIPPED_RUN_INCOMPLETE: "skipped: the run stopped before its final batch",
    _M.COMPACTION_OUTCOME_SKIPPED_AGENT_ACTIVE: "skipped: agent work began before compaction",
    _M.COMPACTION_OUTCOME_SKIPPED_DATABASE_TOO_LARGE: (
        "skipped: the database is larger than the threshold"
    ),
    _M.COMPACTION_OUTCOME_SKIPPED_TOO_LITTLE_RECLAIMABLE: (
        "skipped: too few pages are reclaimable"
    ),
    _M.COMPACTION_OUTCOME_SKIPPED_UNSUPPORTED_BACKEND: (
        "skipped: this store backend does not compact"
    ),
    _M.COMPACTION_OUTCOME_FAILED: "failed (the purge result stands)",
}


def _compaction(report: maintenance_pb2.CompactionReport) -> str:
    text = _COMPACTION_NOTES.get(report.outcome, _enum(_M.CompactionOutcome, report.outcome, ""))
    sizes = []
    if report.HasField("size_before_bytes"):
        before = format_size(report.size_before_bytes)
        if report.HasField("size_after_bytes"):
            sizes.append(f"{before} -> {format_size(report.size_after_bytes)}")
        else:
            sizes.append(before)
    if report.HasField("reclaimable_fraction_before"):
        sizes.append(f"{_percent(report.reclaimable_fraction_before)} reclaimable before")
    return f"{text} ({', '.join(sizes)})" if sizes else text


def _run_line(run: maintenance_pb2.MaintenanceRun, now_ms: int) -> str:
    trigger = _enum(_M.RunTrigger, run.trigger, "RUN_TRIGGER_")
    state = _enum(_M.MaintenanceRunState, run.state, "MAINTENANCE_RUN_STATE_")
    where = f" of {run.workspace_id}" if run.HasField("workspace_id") else ""
    when = (
        f"finished {format_time(run.finished_at_unix_ms, now_ms)}"
        if run.HasField("finished_at_unix_ms")
        else f"started {format_time(run.started_at_unix_ms, now_ms)}"
    )
    return f"{trigger.lower()}{where}, {state}, {when}; {_progress(run)}"


# --- errors --------------------------------------------------------------------------------


def _refusal(error: grpc.RpcError) -> tuple[str, int]:
    """The lines describing a refused call, and the exit code it means."""
    said = call_error(error)
    code, reason, metadata, retry = said.code, said.reason, said.metadata, said.retry_after_seconds
    fields = [f"{v.field}: {v.description}" for v in said.field_violations]
    message = " ".join(str(error.details()).split())
    head = f"{code.name}{f' ({reason})' if reason else ''}: {message}"
    lines = [head, *(f"  {field}" for field in fields)]
    retry_text = f"retry in {retry:g} s" if retry is not None else "retry later"
    exit_code = EXIT_ERROR
    if reason == "AGENT_ACTIVE":
        count = metadata.get("active_workspace_count", "?")
        lines.append(f"a Turn is active in {count} workspace(s); {retry_text}")
        exit_code = EXIT_AGENT_ACTIVE
    elif reason == "ACTIVITY_STATE_UNAVAILABLE":
        lines.append(f"Host's activity state cannot be read, so nothing ran; {retry_text}")
        exit_code = EXIT_AGENT_ACTIVE
    elif retry is not None:
        lines.append(retry_text)
    return "\n       ".join(lines), exit_code


def _rpc_fail(error: grpc.RpcError) -> NoReturn:
    text, code = _refusal(error)
    typer.echo(f"error: {text}", err=True)
    raise typer.Exit(code)


class _Client:
    def __init__(self, token: str | None, address: str | None) -> None:
        settings = cli_settings()
        self.metadata = (("authorization", f"Bearer {_token(settings, token)}"),)
        self.address = maintenance_address(settings, address)
        self.channel = sync_channel(self.address, settings)
        self.stub = maintenance_pb2_grpc.MaintenanceServiceStub(self.channel)

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.channel.close()


# --- retention -----------------------------------------------------------------------------


class RetentionDays(enum.StrEnum):
    """The retention choices of ``--set``."""

    FIFTEEN = "15"
    THIRTY = "30"


_PERIODS = {
    RetentionDays.FIFTEEN: _M.RETENTION_PERIOD_15_DAYS,
    RetentionDays.THIRTY: _M.RETENTION_PERIOD_30_DAYS,
}


def _preference_line(preference: maintenance_pb2.RetentionPreference, now_ms: int) -> str:
    if preference.is_default:
        return f"{preference.retention_days} days (default; never set)"
    if preference.HasField("updated_at_unix_ms"):
        changed = format_time(preference.updated_at_unix_ms, now_ms)
        return f"{preference.retention_days} days (set {changed})"
    return f"{preference.retention_days} days"


@maintenance_app.command("retention")
def retention(
    set_days: Annotated[
        RetentionDays | None,
        typer.Option("--set", help="Keep tombstones 15 or 30 days (needs a deployment admin)."),
    ] = None,
    json_output: JsonOption = False,
    token: TokenOption = None,
    address: AddressOption = None,
    timeout: Annotated[float, typer.Option(help="Deadline of the call, in seconds.")] = 30.0,
) -> None:
    """Print the deployment-wide tombstone retention, or change it with --set (MAINT-PREF-1).

    The automatic purge cutoff is now minus the retention, compared with each tombstone's
    deletion time; a change applies from the next run. Exit codes: 0 done, 1 refused.
    """
    response: maintenance_pb2.GetRetentionPreferenceResponse | (
        maintenance_pb2.SetRetentionPreferenceResponse
    )
    with _Client(token, address) as client:
        try:
            if set_days is None:
                response = client.stub.GetRetentionPreference(
                    _M.GetRetentionPreferenceRequest(), metadata=client.metadata, timeout=timeout
                )
            else:
                response = client.stub.SetRetentionPreference(
                    _M.SetRetentionPreferenceRequest(retention=_PERIODS[set_days]),
                    metadata=client.metadata,
                    timeout=timeout,
                )
        except grpc.RpcError as error:
            _rpc_fail(error)
    if json_output:
        _print_json(response)
        return
    now_ms = time.time_ns() // 1_000_000
    typer.echo(f"retention: {_preference_line(response.preference, now_ms)}")


# --- purge ---------------------------------------------------------------------------------


def _watch(
    client: _Client,
    future: grpc.Future[maintenance_pb2.RunManualPurgeResponse],
    workspace: str,
    poll_timeout: float,
) -> maintenance_pb2.RunManualPurgeResponse:
    """Wait for the purge, printing a line to stderr whenever its progress changes."""
    shown: str | None = None
    waiting_shown = False
    poll_failed = False
    while True:
        try:
            return future.result(timeout=POLL_SECONDS)
        except grpc.FutureTimeoutError:
            pass
        except grpc.RpcError as error:
            _rpc_fail(error)
        try:
            status = client.stub.GetMaintenanceStatus(
                _M.GetMaintenanceStatusRequest(), metadata=client.metadata, timeout=poll_timeout
            )
        except grpc.RpcError as error:
            if not poll_failed:  # progress is a courtesy: the purge itself goes on
                typer.echo(f"(progress unavailable: {error.code().name})", err=True)
                poll_failed = True
            continue
        if not status.HasField("current_run"):
            continue
        run = status.current_run
        if run.trigger != _M.RUN_TRIGGER_MANUAL or run.workspace_id != workspace:
            if not waiting_shown:
                typer.echo("waiting: another maintenance run holds the worker", err=True)
                waiting_shown = True
            continue
        line = _progress(run)
        if line != shown:
            typer.echo(f"progress: {line}", err=True)
            shown = line


_EXIT_BY_STATE = {
    _M.MAINTENANCE_RUN_STATE_COMPLETED: 0,
    _M.MAINTENANCE_RUN_STATE_STOPPED_AGENT_ACTIVE: EXIT_STOPPED,
    _M.MAINTENANCE_RUN_STATE_STOPPED_HOST_UNAVAILABLE: EXIT_STOPPED,
    _M.MAINTENANCE_RUN_STATE_STOPPED_DRAINING: EXIT_STOPPED,
    _M.MAINTENANCE_RUN_STATE_FAILED: EXIT_ERROR,
}


@maintenance_app.command("purge")
def purge(
    workspace: Annotated[str, typer.Option(help="Workspace whose tombstones to purge.")],
    session: Annotated[
        str | None,
        typer.Option(help="Purge only this topmost tombstone (and its tree); default: all."),
    ] = None,
    compact: Annotated[
        bool,
        typer.Option(
            "--compact", help="Compact the database afterwards if it is eligible (SQLite)."
        ),
    ] = False,
    json_output: JsonOption = False,
    token: TokenOption = None,
    address: AddressOption = None,
    timeout: Annotated[
        float,
        typer.Option(help="Deadline of the purge, in seconds (it waits for a run in progress)."),
    ] = 3600.0,
) -> None:
    """Permanently delete tombstoned Sessions now, regardless of retention (MAINT-MAN-1).

    Without --session: every topmost tombstone of the workspace; with it: that one
    complete component. The purge waits for an idle system (no active Turn) and
    stops between batches when agent work begins. Progress lines go to stderr,
    the summary to stdout (--json: the RunManualPurgeResponse as proto3 JSON).

    Exit codes:

    0 completed (a tree kept whole is reported as blocked).
    1 refused or failed (e.g. NOT_FOUND: not a topmost tombstone there).
    2 bad usage (no token, a wrong option).
    3 stopped early (agent work began, Host unreachable, service draining):
      committed batches stand; run the purge again later.
    4 refused, nothing changed: a Turn is active (AGENT_ACTIVE) or the activity
      state cannot be read; retry after the printed delay.
    """
    request = _M.RunManualPurgeRequest(
        workspace_id=workspace,
        scope=_M.PURGE_SCOPE_WORKSPACE if session is None else _M.PURGE_SCOPE_COMPONENT,
        compact=compact,
    )
    if session is not None:
        request.session_id = session
    target = f"{session} in {workspace}" if session else f"every tombstone of {workspace}"
    with _Client(token, address) as client:
        typer.echo(f"purging {target} ...", err=True)
        future = client.stub.RunManualPurge.future(
            request, metadata=client.metadata, timeout=timeout
        )
        try:
            response = _watch(client, future, workspace, min(10.0, timeout))
        except KeyboardInterrupt:
            future.cancel()
            _fail("interrupted: a run that already started finishes on the server", 130)
    run = response.run
    if json_output:
        _print_json(response)
    else:
        state = _enum(_M.MaintenanceRunState, run.state, "MAINTENANCE_RUN_STATE_")
        note = _STATE_NOTES.get(run.state, "")
        typer.echo(f"run {run.run_id}: {state}{f' ({note})' if note else ''}")
        if run.detail:
            typer.echo(f"  why: {run.detail}")
        p = run.progress
        typer.echo(
            f"  purged: {p.components_purged} component(s), {p.sessions_purged} Session(s) "
            f"in {p.batches_completed} batch(es)"
        )
        if p.components_blocked:
            typer.echo(f"  blocked: {p.components_blocked} component(s) kept whole")
        if p.more_remaining:
            typer.echo("  more remaining: yes")
        c = run.cleanup
        typer.echo(
            f"  cleanup: {c.attempted} attempted, {c.completed} completed, {c.failed} failed"
        )
        typer.echo(f"  compaction: {_compaction(run.compaction)}")
    raise typer.Exit(_EXIT_BY_STATE.get(run.state, EXIT_ERROR))


# --- status --------------------------------------------------------------------------------


def _gate_text(gate: maintenance_pb2.IdleGate) -> str:
    if gate.state == _M.IDLE_GATE_STATE_OPEN:
        return "open (no Turn is active)"
    if gate.state == _M.IDLE_GATE_STATE_AGENT_ACTIVE:
        yours = f": {', '.join(gate.active_workspace_ids)}" if gate.active_workspace_ids else ""
        return f"closed: a Turn is active in {gate.active_workspace_count} workspace(s){yours}"
    if gate.state == _M.IDLE_GATE_STATE_ACTIVITY_STATE_UNAVAILABLE:
        return "closed: Host's activity state cannot be read (the gate fails closed)"
    return _enum(_M.IdleGateState, gate.state, "IDLE_GATE_STATE_")


def _status_lines(status: maintenance_pb2.GetMaintenanceStatusResponse) -> list[str]:
    now = status.generated_at_unix_ms
    lines = [
        f"retention:           {_preference_line(status.retention, now)}",
        f"purge cutoff:        {format_time(status.purge_cutoff_unix_ms, now)};"
        " automatic runs purge tombstones deleted before it",
        "last completed run:  "
        + (
            format_time(status.last_completed_run_unix_ms, now)
            if status.HasField("last_completed_run_unix_ms")
            else "never"
        ),
        f"next check:          {format_time(status.next_check_unix_ms, now)}",
        "next run eligible:   "
        + (
            format_time(status.next_run_eligible_at_unix_ms, now)
            if status.HasField("next_run_eligible_at_unix_ms")
            else "now (no completion marker)"
        ),
        f"idle gate:           {_gate_text(status.idle_gate)}",
        "paused by idle gate: "
        + (
            f"yes, a due run waits; the gate is {_gate_text(status.idle_gate)}"
            if status.paused_by_idle_gate
            else "no"
        ),
        "current run:         "
        + (_run_line(status.current_run, now) if status.HasField("current_run") else "none"),
        "last run:            "
        + (_run_line(status.last_run, now) if status.HasField("last_run") else "none"),
    ]
    if status.HasField("last_run") and status.last_run.compaction.outcome not in (
        _M.COMPACTION_OUTCOME_UNSPECIFIED,
        _M.COMPACTION_OUTCOME_NOT_REQUESTED,
    ):
        lines.append(f"  compaction: {_compaction(status.last_run.compaction)}")
    cleanup = status.cleanup
    at_least = "at least " if cleanup.pending_rows_capped else ""
    lines.append(
        f"cleanup:             {at_least}{cleanup.pending_rows} pending, "
        f"{cleanup.failing_rows} failing"
    )
    for row in cleanup.failing:
        lines.append(
            f"  {row.workspace_id}/{row.session_id}: {row.attempts} attempt(s), last "
            f"{format_time(row.last_attempt_at_unix_ms, now)}, next "
            f"{format_time(row.next_attempt_at_unix_ms, now)}: {row.last_error}"
        )
    db = status.database
    backend = _enum(_M.StoreBackend, db.backend, "STORE_BACKEND_").lower()
    reclaimable = (
        f"{_percent(db.reclaimable_fraction)} reclaimable"
        if db.HasField("reclaimable_fraction")
        else "reclaimable space unknown"
    )
    eligible = "eligible" if db.compaction_eligible else "not eligible"
    lines.append(
        f"database:            {backend}, {format_size(db.size_bytes)}, {reclaimable}; "
        f"compaction {eligible} (needs <= {format_size(db.compaction_max_size_bytes)} and "
        f">= {_percent(db.compaction_min_reclaimable_fraction)} reclaimable)"
    )
    if status.HasField("manual_purge_preview"):
        p = status.manual_purge_preview
        lines.append(
            f"preview {p.workspace_id}:  {p.topmost_components} topmost component(s), "
            f"{p.sessions} Session(s); {p.restorable_components} restorable, "
            f"{p.non_restorable_components} not restorable, {p.past_cutoff_components} past "
            "the cutoff (an upper bound: the boundary check runs at purge time)"
        )
    return lines


@maintenance_app.command("status")
def status(
    preview_workspace: Annotated[
        str | None,
        typer.Option(help="Also count what `purge --workspace` would remove there (dry run)."),
    ] = None,
    json_output: JsonOption = False,
    token: TokenOption = None,
    address: AddressOption = None,
    timeout: Annotated[float, typer.Option(help="Deadline of the call, in seconds.")] = 30.0,
) -> None:
    """Show retention, schedule, idle gate, runs, cleanup and database size (MAINT-STAT-1).

    Changes nothing. Times are ISO-8601 UTC, relative to the server's clock. Exit codes:
    0 shown, 1 refused.
    """
    request = _M.GetMaintenanceStatusRequest()
    if preview_workspace is not None:
        request.preview_workspace_id = preview_workspace
    with _Client(token, address) as client:
        try:
            response = client.stub.GetMaintenanceStatus(
                request, metadata=client.metadata, timeout=timeout
            )
        except grpc.RpcError as error:
            _rpc_fail(error)
    if json_output:
        _print_json(response)
        return
    for line in _status_lines(response):
        typer.echo(line)
