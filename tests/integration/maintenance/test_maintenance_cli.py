"""``tutti maintenance retention | purge | status`` as subprocesses against live servers.

A real Host and a real maintenance server (:mod:`tests.integration.maintenance.stack`) on
SQLite and Postgres; the CLI runs as ``python -m tutti`` with a bearer token and
``TUTTI_MAINTENANCE_ADDRESS``, a private ``HOME`` (so no running suite's record is found)
and no other ``TUTTI_*`` variables. (MAINT-PREF-1, MAINT-MAN-1, MAINT-STAT-1, OPS-2)
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from agentactivity.host.v1 import host_pb2
from agentactivity.maintenance.v1 import maintenance_pb2
from services.maintenance.host_port import (
    ActivityState,
    DeletedPage,
    HostPort,
    PendingPage,
    RetentionPurge,
    WorkspacePurge,
)
from tests.integration.maintenance.stack import MaintenanceUnderTest, Stack, fake_clock
from tests.support.servers import auth_metadata, token_for
from tests.support.session_trees import add_active_turn, add_tree, sessions
from tutti.maintenance_commands import EXIT_AGENT_ACTIVE, EXIT_STOPPED

ROOT = Path(__file__).resolve().parents[3]
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def _tutti(
    m: MaintenanceUnderTest, tmp_path: Path, *args: str, principal: str = "admin"
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUTTI_")}
    env.update(
        HOME=str(tmp_path / "home"),
        TUTTI_DATA_DIR=str(tmp_path / "cli"),
        TUTTI_CLI_TOKEN=token_for(principal),
        TUTTI_MAINTENANCE_ADDRESS=m.server.address,
    )
    return subprocess.run(
        [sys.executable, "-m", "tutti", "maintenance", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
        cwd=ROOT,
    )


class _SlowBatches:
    """Host as maintenance sees it, with a pause after each real manual purge batch (so the
    CLI's twice-a-second status polls see the run's progress) and a hook per batch."""

    def __init__(
        self, inner: HostPort, delay_s: float, after_batch: Callable[[int], None] | None = None
    ) -> None:
        self._inner = inner
        self._delay_s = delay_s
        self._after_batch = after_batch
        self.batches = 0

    async def activity_state(self) -> ActivityState:
        return await self._inner.activity_state()

    async def purge_expired(
        self, cutoff_unix_ms: int, max_trees: int, max_rows: int, max_bytes: int
    ) -> RetentionPurge:
        return await self._inner.purge_expired(cutoff_unix_ms, max_trees, max_rows, max_bytes)

    async def purge_workspace(
        self, workspace_id: str, session_id: str | None, max_components: int, dry_run: bool = False
    ) -> WorkspacePurge:
        result = await self._inner.purge_workspace(
            workspace_id, session_id, max_components, dry_run=dry_run
        )
        if not dry_run:
            self.batches += 1
            if self._after_batch is not None:
                await asyncio.to_thread(self._after_batch, self.batches)
            await asyncio.sleep(self._delay_s)
        return result

    async def pending_cleanups(self, cursor: str, limit: int) -> PendingPage:
        return await self._inner.pending_cleanups(cursor, limit)

    async def complete_cleanups(self, rows: Sequence[tuple[str, str]]) -> None:
        await self._inner.complete_cleanups(rows)

    async def deleted_sessions(self, workspace_id: str, cursor: str, limit: int) -> DeletedPage:
        return await self._inner.deleted_sessions(workspace_id, cursor, limit)


def _deleted_roots(stack: Stack, workspace_id: str = "ws-1") -> set[str]:
    """The workspace's topmost tombstones as Host lists them."""
    response = stack.host_stub.ListDeletedSessions(
        host_pb2.ListDeletedSessionsRequest(workspace_id=workspace_id),
        metadata=auth_metadata("admin"),
    )
    return {item.session.session_id for item in response.items}


@pytest.mark.spec("MAINT-PREF-1")
def test_retention_is_read_set_and_refused_for_a_device(stack: Stack, tmp_path: Path) -> None:
    m = stack.maintenance(fake_clock())

    shown = _tutti(m, tmp_path, "retention")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == "retention: 30 days (default; never set)\n"

    changed = _tutti(m, tmp_path, "retention", "--set", "15")
    assert changed.returncode == 0, changed.stderr
    assert re.fullmatch(rf"retention: 15 days \(set {ISO} \([^)]+\)\)\n", changed.stdout)

    as_json = _tutti(m, tmp_path, "retention", "--json")
    assert as_json.returncode == 0, as_json.stderr
    preference = json.loads(as_json.stdout)["preference"]
    assert preference["retention"] == "RETENTION_PERIOD_15_DAYS"
    assert preference["retentionDays"] == 15
    assert preference["isDefault"] is False
    assert int(preference["updatedAtUnixMs"]) > 0

    refused = _tutti(m, tmp_path, "retention", "--set", "30", principal="ws1-device")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: PERMISSION_DENIED"), refused.stderr
    assert "Traceback" not in refused.stderr
    stored = m.call("GetRetentionPreference", maintenance_pb2.GetRetentionPreferenceRequest())
    assert stored.preference.retention_days == 15, "the refusal changed nothing"

    assert _tutti(m, tmp_path, "retention", "--set", "7").returncode == 2  # 15 or 30 only


@pytest.mark.spec("MAINT-MAN-1")
def test_a_workspace_purge_reports_progress_then_a_summary(stack: Stack, tmp_path: Path) -> None:
    stack.tombstone({"a": None, "a1": "a", "b": None, "c": None})
    stack.tombstone({"other": None}, workspace_id="ws-2")
    add_tree(stack.engine, {"live": None})
    m = stack.maintenance(
        fake_clock(),
        wrap=lambda host: _SlowBatches(host, 1.0),
        maintenance_manual_batch_components=1,
    )

    purged = _tutti(m, tmp_path, "purge", "--workspace", "ws-1")
    assert purged.returncode == 0, purged.stderr
    progress = [line for line in purged.stderr.splitlines() if line.startswith("progress: ")]
    assert len(progress) >= 2, purged.stderr
    assert len(set(progress)) == len(progress), "a line only when the progress changes"
    assert any(line.startswith("progress: 1 batch(es), 1 component(s)") for line in progress)
    assert all("; cleanup " in line and " failed" in line for line in progress)
    lines = purged.stdout.splitlines()
    assert re.fullmatch(r"run \w+: COMPLETED \(all targeted work drained\)", lines[0])
    assert "  purged: 3 component(s), 4 Session(s) in 3 batch(es)" in lines
    assert "  cleanup: 4 attempted, 4 completed, 0 failed" in lines
    assert "  compaction: not requested" in lines

    assert _deleted_roots(stack) == set()
    assert set(sessions(stack.engine)) == {"live"}, "live Sessions stay"
    assert _deleted_roots(stack, "ws-2") == {"other"}, "another workspace is untouched"


@pytest.mark.spec("MAINT-MAN-1")
def test_one_component_is_purged_and_its_json_parses(stack: Stack, tmp_path: Path) -> None:
    stack.tombstone({"a": None, "a1": "a", "b": None})
    add_tree(stack.engine, {"live": None})
    m = stack.maintenance(fake_clock())

    purged = _tutti(m, tmp_path, "purge", "--workspace", "ws-1", "--session", "a", "--json")
    assert purged.returncode == 0, purged.stderr
    document = json.loads(purged.stdout)
    assert sorted(document["purgedSessionIds"]) == ["a", "a1"]
    run = document["run"]
    assert run["state"] == "MAINTENANCE_RUN_STATE_COMPLETED"
    assert run["trigger"] == "RUN_TRIGGER_MANUAL"
    assert run["workspaceId"] == "ws-1"
    assert run["progress"]["componentsPurged"] == 1
    assert run["compaction"]["outcome"] == "COMPACTION_OUTCOME_NOT_REQUESTED"
    assert _deleted_roots(stack) == {"b"}

    # Not a topmost tombstone: Host's typed refusal passes through, nothing changes.
    missing = _tutti(m, tmp_path, "purge", "--workspace", "ws-1", "--session", "gone")
    assert missing.returncode == 1, missing.stdout
    assert "\nerror: NOT_FOUND (SESSION_NOT_FOUND): " in missing.stderr, missing.stderr
    live = _tutti(m, tmp_path, "purge", "--workspace", "ws-1", "--session", "live")
    assert live.returncode == 1, live.stdout
    assert "\nerror: FAILED_PRECONDITION (SESSION_NOT_DELETED): " in live.stderr, live.stderr
    assert "Traceback" not in missing.stderr + live.stderr
    assert _deleted_roots(stack) == {"b"}
    assert set(sessions(stack.engine)) == {"b", "live"}


@pytest.mark.spec("MAINT-MAN-1")
def test_an_active_turn_refuses_the_purge_with_its_retry_delay(
    stack: Stack, tmp_path: Path
) -> None:
    stack.tombstone({"a": None})
    add_tree(stack.engine, {"live": None})
    add_active_turn(stack.engine, "live", "t-1")
    m = stack.maintenance(fake_clock(), maintenance_agent_active_retry_seconds=30)

    refused = _tutti(m, tmp_path, "purge", "--workspace", "ws-1")
    assert refused.returncode == EXIT_AGENT_ACTIVE, refused.stderr
    assert refused.stderr.splitlines()[-2].startswith(
        "error: FAILED_PRECONDITION (AGENT_ACTIVE): "
    ), refused.stderr
    assert refused.stderr.splitlines()[-1].strip() == (
        "a Turn is active in 1 workspace(s); retry in 30 s"
    )
    assert refused.stdout == ""
    assert _deleted_roots(stack) == {"a"}, "nothing changed"

    shown = _tutti(m, tmp_path, "status")
    assert shown.returncode == 0, shown.stderr
    assert "idle gate:           closed: a Turn is active in 1 workspace(s): ws-1\n" in shown.stdout
    assert "paused by idle gate: yes, a due run waits; the gate is closed: " in shown.stdout


@pytest.mark.spec("MAINT-MAN-1")
def test_agent_work_beginning_mid_run_stops_it_with_its_own_exit_code(
    stack: Stack, tmp_path: Path
) -> None:
    stack.tombstone({"a": None, "b": None, "c": None})
    add_tree(stack.engine, {"live": None})

    def after_batch(batch: int) -> None:
        if batch == 1:
            add_active_turn(stack.engine, "live", "t-1")

    m = stack.maintenance(
        fake_clock(),
        wrap=lambda host: _SlowBatches(host, 0.0, after_batch),
        maintenance_manual_batch_components=1,
    )

    stopped = _tutti(m, tmp_path, "purge", "--workspace", "ws-1", "--compact")
    assert stopped.returncode == EXIT_STOPPED, stopped.stderr
    lines = stopped.stdout.splitlines()
    assert lines[0].endswith(
        ": STOPPED_AGENT_ACTIVE (agent work began; committed batches stand; run again later)"
    ), stopped.stdout
    assert "  purged: 1 component(s), 1 Session(s) in 1 batch(es)" in lines
    assert "  more remaining: yes" in lines
    assert "  compaction: skipped: the run stopped before its final batch" in lines
    assert len(_deleted_roots(stack)) == 2, "the committed batch stands, the rest waits"


@pytest.mark.spec("MAINT-STAT-1")
def test_status_shows_schedule_database_cleanup_and_a_preview(
    stack: Stack, tmp_path: Path, backend: str
) -> None:
    stack.tombstone({"a": None, "a1": "a", "b": None, "stuck": None})
    # A symlinked Session directory is never followed, so its cleanup fails and is retried.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (stack.resources / "sessions").mkdir(parents=True)
    (stack.resources / "sessions" / "stuck").symlink_to(elsewhere)
    clock = fake_clock()
    m = stack.maintenance(clock)

    before = _tutti(m, tmp_path, "status", "--preview-workspace", "ws-1")
    assert before.returncode == 0, before.stderr
    text = before.stdout
    assert "retention:           30 days (default; never set)\n" in text
    assert re.search(
        rf"^purge cutoff:        {ISO} \(30 d ago\); automatic runs", text, re.MULTILINE
    ), text
    assert "last completed run:  never\n" in text
    assert re.search(rf"^next check:          {ISO} \(in 10 min\)$", text, re.MULTILINE), text
    assert "next run eligible:   now (no completion marker)\n" in text
    assert "idle gate:           open (no Turn is active)\n" in text
    assert "paused by idle gate: no\n" in text
    assert "current run:         none\n" in text
    assert "last run:            none\n" in text
    assert "cleanup:             0 pending, 0 failing\n" in text
    assert re.search(rf"^database:            {backend}, \d", text, re.MULTILINE), text
    assert "preview ws-1:  3 topmost component(s), 4 Session(s); 3 restorable, " in text
    assert "0 not restorable, 3 past the cutoff" in text

    assert m.purge("ws-1").run.state == maintenance_pb2.MAINTENANCE_RUN_STATE_COMPLETED
    after = _tutti(m, tmp_path, "status", "--json")
    assert after.returncode == 0, after.stderr
    document = json.loads(after.stdout)
    assert document["lastRun"]["state"] == "MAINTENANCE_RUN_STATE_COMPLETED"
    assert document["cleanup"]["failingRows"] == 1
    assert "manualPurgePreview" not in document
    assert document["database"]["backend"] == f"STORE_BACKEND_{backend.upper()}"

    shown = _tutti(m, tmp_path, "status", "--preview-workspace", "ws-1")
    assert shown.returncode == 0, shown.stderr
    assert re.search(
        rf"^last run:            manual of ws-1, COMPLETED, finished {ISO} \(now\); 1 batch\(es\), "
        r"3 component\(s\) and 4 Session\(s\) purged",
        shown.stdout,
        re.MULTILINE,
    ), shown.stdout
    assert "cleanup:             1 pending, 1 failing\n" in shown.stdout
    assert re.search(
        rf"^  ws-1/stuck: 1 attempt\(s\), last {ISO} \(now\), next {ISO} \(in 1 min\): .*stuck",
        shown.stdout,
        re.MULTILINE,
    ), shown.stdout
    assert "preview ws-1:  0 topmost component(s), 0 Session(s)" in shown.stdout
