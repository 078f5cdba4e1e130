"""``tutti live watch``: a small device on the live stream, printing what it receives.

Built on the device-side :class:`~services.livestream.subscriber.Subscriber`
(LIVE-SUB-1), so it shows exactly what a phone would see::

    tutti live watch --attach s-1                         # fresh epoch, baseline of s-1
    tutti live watch --state dev.json --attach s-1        # remember cursor + projection
    tutti live watch --state dev.json --resume            # resume from the saved cursor

One line per delivery as it arrives (``sequence kind`` and its ids; deltas with a
clipped text) and a line starting with ``!!`` for everything a device must notice: every
reconcile (its reason and keys), every resume rejection, every reconnect. ``==`` lines
are transport state (``stream_ready``: resumed or fresh epoch) and attachment barriers.

Address: ``--address``, else ``TUTTI_LIVESTREAM_ADDRESS``, else the running ``tutti up``'s
livestream, else ``127.0.0.1:50053``. Token and workspace are found as for ``tutti
session`` (``--token`` / ``TUTTI_CLI_TOKEN`` / ``<data dir>/auth/cli-token``;
``--workspace`` / ``TUTTI_WORKSPACE`` / ``<data dir>/auth/workspace``). ``--state FILE``
keeps the device id, the resume cursor, the attachment projection and the revisions in
FILE; without ``--resume`` the first call starts without cursor (a fresh epoch).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from pathlib import Path
from typing import Annotated

import grpc
import typer

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.livestream.v1 import livestream_pb2
from grpcserver.channels import channel_credentials
from grpcserver.settings import DEFAULT_PORTS
from services.livestream.subscriber import (
    AttachmentCaughtUp,
    AttachmentDetached,
    AttachmentRejected,
    AttachmentStarted,
    Connecting,
    Delivered,
    FileStateStore,
    MemoryStateStore,
    Ready,
    Reconcile,
    ReconcileKey,
    Reconnecting,
    ResumeRejected,
    StateCorruptError,
    StateStore,
    Subscriber,
    SubscriberEvent,
    Terminated,
)
from tutti.reference_commands import (
    CliSettings,
    TokenOption,
    _fail,
    _token,
    _workspace,
    cli_settings,
)
from tutti.session_commands import clip
from tutti.suite_record import find_running_suite

__all__ = ["binding_for", "describe", "live_address", "live_app"]

live_app = typer.Typer(no_args_is_help=True, help="Watch the live device stream (DeviceLink).")

TEXT_PREVIEW_CHARS = 60
"""How many characters of a delta's text a line shows."""


def binding_for(session_id: str) -> str:
    """The binding id ``tutti live watch --attach`` uses for a Session."""
    return f"cli-{session_id}"


def live_address(settings: CliSettings, option: str | None) -> str:
    """Where livestream listens.

    ``--address``, ``TUTTI_LIVESTREAM_ADDRESS``, the running suite's record (when it is the
    suite of this data directory), or the default port.
    """
    if option:
        return option
    explicit = os.environ.get("TUTTI_LIVESTREAM_ADDRESS")
    if explicit:
        return explicit
    record = find_running_suite()
    if (
        record is not None
        and "livestream" in record.addresses
        and record.data_dir.resolve() == settings.data_dir.resolve()
    ):
        return record.addresses["livestream"]
    return f"127.0.0.1:{DEFAULT_PORTS['livestream']}"


def _keys(keys: tuple[ReconcileKey, ...]) -> str:
    return " ".join(
        "/".join(part for part in (k.workspace_id, k.session_id, k.turn_id, k.message_id) if part)
        + f"({k.scope})"
        for k in keys
    )


def _enum(enum: object, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix)  # type: ignore[attr-defined]
    except ValueError:
        return str(value)


def _delivery(event: Delivered) -> str:
    delivery = event.delivery
    head = f"{event.sequence:>7} {event.kind:<20}"
    if event.kind == "message_delta":
        d = delivery.message_delta
        target = _enum(canonical_pb2.DeltaTarget, d.target, "DELTA_TARGET_")
        operation = _enum(canonical_pb2.DeltaOperation, d.operation, "DELTA_OPERATION_")
        text = clip(d.text, TEXT_PREVIEW_CHARS).replace("\n", "\\n")
        return (
            f"{head} session={d.session_id} turn={d.turn_id} message={d.message_id} "
            f"{target}/{operation} {text!r}"
        )
    if event.kind == "turn_update":
        u = delivery.turn_update
        phase = _enum(canonical_pb2.TurnPhase, u.turn.phase, "TURN_PHASE_")
        active = u.active_turn_id if u.HasField("active_turn_id") else "-"
        return (
            f"{head} session={u.turn.session_id} turn={u.turn.turn_id} phase={phase} "
            f"version={u.turn.version} active={active}"
        )
    if event.kind == "interaction_update":
        i = delivery.interaction_update
        status = _enum(canonical_pb2.InteractionStatus, i.status, "INTERACTION_STATUS_")
        return (
            f"{head} session={i.session_id} turn={i.turn_id} request={i.request_id} status={status}"
        )
    if event.kind == "interaction_snapshot":
        s = delivery.interaction_snapshot
        root = s.root_turn_id if s.HasField("root_turn_id") else "-"
        return (
            f"{head} binding={s.binding_id} revision={s.revision} session={s.session_id} "
            f"root={root} interactions={len(s.interactions)}"
        )
    gap = delivery.discontinuity
    reason = _enum(livestream_pb2.DiscontinuityReason, gap.reason, "DISCONTINUITY_REASON_")
    keys = gap.keys
    ids = " ".join(
        f"{name}={getattr(keys, name)}"
        for name in ("session_id", "turn_id", "message_id")
        if keys.HasField(name)
    )
    return f"{head} reason={reason} workspace={keys.workspace_id} {ids}".rstrip()


def describe(event: SubscriberEvent, address: str) -> str:
    """The line ``tutti live watch`` prints for ``event``."""
    if isinstance(event, Delivered):
        return _delivery(event)
    if isinstance(event, Reconcile):
        dropped = " [cursor dropped: next connect starts a fresh epoch]"
        detail = f" ({event.detail})" if event.detail else ""
        return (
            f"!! RECONCILE reason={event.reason} keys={_keys(event.keys)}"
            f"{dropped if event.cursor_dropped else ''}{detail}"
        )
    if isinstance(event, ResumeRejected):
        rejected = (
            f"{event.rejected_cursor.epoch}@{event.rejected_cursor.last_sequence}"
            if event.rejected_cursor is not None
            else "-"
        )
        return (
            f"!! RESUME REJECTED reason={event.reason} cursor={rejected} fresh epoch={event.epoch}"
        )
    if isinstance(event, Ready):
        how = "resumed" if event.resumed else "FRESH EPOCH"
        return (
            f"== stream_ready {how} epoch={event.epoch} latest_sequence={event.latest_sequence} "
            f"heartbeat={event.limits.heartbeat_interval_ms}ms"
        )
    if isinstance(event, Connecting):
        cursor = (
            f"resuming {event.cursor.epoch}@{event.cursor.last_sequence}"
            if event.cursor is not None
            else "no cursor (fresh epoch)"
        )
        return f"-- connecting to {address}, {cursor}"
    if isinstance(event, Reconnecting):
        code = event.code.name if event.code is not None else "LOCAL"
        reason = f" ({event.reason})" if event.reason else ""
        return (
            f"!! RECONNECT in {event.delay_s:.2f}s (attempt {event.attempt}) after "
            f"{code}{reason}: {' '.join(event.message.split())}"
        )
    if isinstance(event, AttachmentStarted):
        caller = f" caller={event.caller_turn_id}" if event.caller_turn_id else ""
        return (
            f"{event.sequence:>7} {'attachment_changed':<20} binding={event.binding_id} "
            f"revision={event.revision} session={event.session_id}{caller} (baseline follows)"
        )
    if isinstance(event, AttachmentDetached):
        return (
            f"{event.sequence:>7} {'attachment_changed':<20} binding={event.binding_id} "
            f"revision={event.revision} detached"
        )
    if isinstance(event, AttachmentCaughtUp):
        root = event.current_root_turn_id or "-"
        return (
            f"== {event.sequence} caught up: binding={event.binding_id} "
            f"revision={event.revision} session={event.session_id} "
            f"turns={len(event.canonical_turn_ids)} root={root}"
        )
    if isinstance(event, AttachmentRejected):
        return (
            f"!! ATTACHMENT REJECTED {event.sequence}: binding={event.binding_id} "
            f"revision={event.revision} session={event.session_id} reason={event.reason}"
        )
    return (
        f"!! TERMINATED {event.code.name}"
        f"{f' ({event.reason})' if event.reason else ''}: {event.message}"
    )


async def _watch(
    subscriber: Subscriber, sessions: list[tuple[str, str]], address: str
) -> Terminated | None:
    async with subscriber:
        state = subscriber.state
        for workspace_id, session_id in sessions:
            binding = binding_for(session_id)
            want = state.desired.get(binding)
            # Already desired (a --state file): the Subscriber re-sends it if the server
            # does not hold it, so a resume does not rerun a baseline that completed.
            if want is None or (want.workspace_id, want.session_id) != (workspace_id, session_id):
                await subscriber.attach(binding, workspace_id, session_id)
        async for event in subscriber.events():
            typer.echo(describe(event, address))
            if isinstance(event, Terminated):
                return event
    return None


@live_app.command("watch")
def live_watch(
    workspace: Annotated[
        list[str] | None,
        typer.Option(
            help="Workspace of the link's scope (repeatable); default TUTTI_WORKSPACE or "
            "<data dir>/auth/workspace."
        ),
    ] = None,
    device_id: Annotated[
        str | None,
        typer.Option(help="Device identity; default: the one in --state, else a new one."),
    ] = None,
    state: Annotated[
        Path | None,
        typer.Option(help="Keep the cursor, attachment projection and revisions in this file."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Resume from the cursor saved in --state.")
    ] = False,
    attach: Annotated[
        list[str] | None,
        typer.Option(help="Session id to attach to, in the first workspace (repeatable)."),
    ] = None,
    address: Annotated[
        str | None, typer.Option(help="livestream address; default TUTTI_LIVESTREAM_ADDRESS.")
    ] = None,
    token: TokenOption = None,
    duration: Annotated[
        float | None, typer.Option(help="Stop after this many seconds (default: Ctrl-C).")
    ] = None,
) -> None:
    """Connect as a device and print every delivery, reconcile and reconnect."""
    if resume and state is None:
        _fail("--resume needs --state FILE (the saved cursor)", 2)
    settings = cli_settings()
    workspaces = list(dict.fromkeys(workspace or [_workspace(settings, None)]))
    bearer = _token(settings, token)
    target = live_address(settings, address)
    store: StateStore = FileStateStore(state) if state is not None else MemoryStateStore()
    try:
        saved = store.load()
    except StateCorruptError as error:
        _fail(f"{state}: {error}", 2)
    if saved is not None and saved.cursor is None and resume:
        typer.echo(f"-- {state} holds no cursor: starting a fresh epoch")
    if device_id is None:
        device_id = (saved.device_id if saved is not None else "") or (
            f"cli-{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        )
    typer.echo(f"-- device {device_id}, workspaces {','.join(workspaces)}")
    subscriber = Subscriber(
        target=target,
        credentials=channel_credentials(settings),
        token=bearer,
        device_id=device_id,
        workspace_ids=workspaces,
        store=store,
        resume=resume,
        client_build="tutti-live-watch",
    )
    sessions = [(workspaces[0], session_id) for session_id in attach or []]

    async def run() -> Terminated | None:
        if duration is None:
            return await _watch(subscriber, sessions, target)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(duration):
                return await _watch(subscriber, sessions, target)
        return None

    try:
        terminated = asyncio.run(run())
    except KeyboardInterrupt:
        typer.echo("-- stopped")
        return
    if terminated is not None:
        reason = f" ({terminated.reason})" if terminated.reason else ""
        code = terminated.code.name if isinstance(terminated.code, grpc.StatusCode) else "?"
        _fail(f"{code}{reason}: {terminated.message}")
