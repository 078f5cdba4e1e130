"""The manual purge behind the idle gate, on the one serialized worker (MAINT-MAN-1,
MAINT-IDLE-1), with real Host and maintenance servers on each backend."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentactivity.maintenance.v1 import maintenance_pb2
from tests.integration.maintenance.stack import Stack, fake_clock
from tests.support.fake_clock import FakeClock
from tests.support.polling import eventually
from tests.support.rpc_errors import error_details
from tests.support.session_trees import add_tree, sessions

RUN = maintenance_pb2


class Recorder:
    """Wraps maintenance's Host port: logs each call and runs a hook after purge batches."""

    def __init__(self, host: Any, after_batch: Any = None, hold_automatic: Any = None) -> None:
        self._host = host
        self.calls: list[str] = []
        self._after_batch = after_batch
        self._hold = hold_automatic

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)

    async def purge_workspace(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append("workspace-dry-run" if kwargs.get("dry_run") else "workspace")
        result = await self._host.purge_workspace(*args, **kwargs)
        if not kwargs.get("dry_run") and self._after_batch is not None:
            self._after_batch(self.calls.count("workspace"))
        return result

    async def purge_expired(self, *args: Any) -> Any:
        self.calls.append("automatic")
        if self._hold is not None:
            await asyncio.to_thread(self._hold.wait, 30)
        return await self._host.purge_expired(*args)


def tombstones(stack: Stack) -> set[str]:
    return {sid for sid, row in sessions(stack.engine).items() if row.deleted_at_unix_ms}


@pytest.mark.spec("MAINT-MAN-1", "MAINT-IDLE-1")
def test_refused_with_agent_active_and_retry_info_while_a_turn_is_active(stack: Stack) -> None:
    stack.tombstone({"gone": None})
    add_tree(stack.engine, {"busy": None}, workspace_id="ws-2")
    stack.start_turn("busy", "t-1", workspace_id="ws-2")
    m = stack.maintenance(fake_clock())
    with pytest.raises(grpc.RpcError) as refused:
        m.purge("ws-1")
    code, reason, _ = error_details(refused.value)
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "AGENT_ACTIVE")
    status = rpc_status.from_call(refused.value)  # type: ignore[arg-type]
    assert status is not None
    retry = error_details_pb2.RetryInfo()
    info = error_details_pb2.ErrorInfo()
    for detail in status.details:
        if detail.Is(retry.DESCRIPTOR):
            detail.Unpack(retry)
        if detail.Is(info.DESCRIPTOR):
            detail.Unpack(info)
    assert retry.retry_delay.seconds == 30
    assert info.metadata["active_workspace_count"] == "1"
    assert tombstones(stack) == {"gone"}, "nothing changed"
    assert m.status().idle_gate.state == RUN.IDLE_GATE_STATE_AGENT_ACTIVE

    stack.settle_turns()
    assert m.purge("ws-1").run.state == RUN.MAINTENANCE_RUN_STATE_COMPLETED
    assert tombstones(stack) == set()


@pytest.mark.spec("MAINT-MAN-1", "MAINT-IDLE-1")
def test_work_beginning_mid_run_stops_between_batches_and_reports_progress(
    stack: Stack,
) -> None:
    stack.tombstone({f"t{i}": None for i in range(5)})
    add_tree(stack.engine, {"live": None})

    def after_batch(count: int) -> None:
        if count == 2:
            stack.start_turn("live", "t-1")

    m = stack.maintenance(
        fake_clock(),
        wrap=lambda host: Recorder(host, after_batch=after_batch),
        maintenance_manual_batch_components=1,
    )
    response = m.purge("ws-1")
    run = response.run
    assert run.state == RUN.MAINTENANCE_RUN_STATE_STOPPED_AGENT_ACTIVE
    assert run.progress.batches_completed == 2
    assert run.progress.components_purged == 2
    assert run.progress.more_remaining
    assert run.detail == "a Turn became active in 1 workspace(s)"
    assert len(response.purged_session_ids) == 2
    assert len(tombstones(stack)) == 3, "the committed batches stand, the rest waits"
    assert run.cleanup.completed == 2

    stack.settle_turns()
    again = m.purge("ws-1").run
    assert again.state == RUN.MAINTENANCE_RUN_STATE_COMPLETED
    assert again.progress.components_purged == 3
    assert tombstones(stack) == set()


@pytest.mark.spec("MAINT-MAN-1")
def test_manual_purge_ignores_retention_and_targets_one_component(stack: Stack) -> None:
    # The clock is real time: these tombstones are minutes old, far inside retention.
    now_clock = FakeClock(time.time_ns() // 1_000_000)
    stack.tombstone({"a": None, "a1": "a", "a2": "a1", "b": None})
    m = stack.maintenance(now_clock)
    response = m.purge("ws-1", "a")
    assert sorted(response.purged_session_ids) == ["a", "a1", "a2"]
    assert not response.run.HasField("purge_cutoff_unix_ms")
    assert tombstones(stack) == {"b"}
    # An automatic run now would keep "b": it is inside retention.
    assert m.parts.scheduler.schedule.due(None, now_clock.now_ms())
    now_clock.advance(600)
    now_clock.wait_for_sleeper(now_clock.now_ms() + 1)
    assert m.status().last_run.trigger == RUN.RUN_TRIGGER_AUTOMATIC
    assert tombstones(stack) == {"b"}


@pytest.mark.spec("MAINT-MAN-1", "MAINT-IDLE-1")
def test_manual_and_automatic_runs_never_overlap(stack: Stack) -> None:
    stack.tombstone({"auto": None})
    clock = fake_clock()
    hold = threading.Event()
    recorders: list[Recorder] = []

    def wrap(host: Any) -> Any:
        recorders.append(Recorder(host, hold_automatic=hold))
        return recorders[0]

    m = stack.maintenance(clock, wrap=wrap)
    clock.advance(600)  # the automatic run starts and is held inside its first batch
    assert eventually(lambda: recorders[0].calls == ["automatic"])
    manual = m.stub.RunManualPurge.future(
        RUN.RunManualPurgeRequest(workspace_id="ws-1", scope=RUN.PURGE_SCOPE_WORKSPACE),
        metadata=(("authorization", "Bearer token-admin"),),
        timeout=60,
    )
    time.sleep(0.5)
    assert recorders[0].calls == ["automatic"], "the manual request waits for the worker"
    current = m.status().current_run
    assert current.trigger == RUN.RUN_TRIGGER_AUTOMATIC
    hold.set()
    response = manual.result()
    assert response.run.state == RUN.MAINTENANCE_RUN_STATE_COMPLETED
    calls = recorders[0].calls
    assert calls[0] == "automatic"
    assert calls.index("workspace-dry-run") > max(
        i for i, c in enumerate(calls) if c == "automatic"
    )


@pytest.mark.spec("MAINT-MAN-1")
def test_a_refused_target_changes_nothing(stack: Stack) -> None:
    stack.tombstone({"kept": None})
    m = stack.maintenance(fake_clock())
    with pytest.raises(grpc.RpcError) as missing:
        m.purge("ws-1", "no-such-session")
    assert error_details(missing.value)[:2] == (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")
    assert tombstones(stack) == {"kept"}
    assert not m.status().HasField("last_run")


@pytest.mark.spec("MAINT-IDLE-1", "ARCH-4")
def test_a_stop_lets_the_run_in_flight_end_after_its_batch(stack: Stack) -> None:
    stack.tombstone({f"t{i}": None for i in range(4)})
    clock = fake_clock()
    hold = threading.Event()
    recorders: list[Recorder] = []

    def wrap(host: Any) -> Any:
        recorders.append(Recorder(host, hold_automatic=hold))
        return recorders[0]

    m = stack.maintenance(clock, wrap=wrap, maintenance_batch_max_trees=1)
    clock.advance(600)  # the automatic run starts and is held inside its first batch
    assert eventually(lambda: recorders[0].calls == ["automatic"])
    stopping = threading.Thread(target=m.server.stop, args=(5.0,))
    stopping.start()
    time.sleep(0.3)
    hold.set()
    stopping.join(timeout=30)
    last = m.parts.worker.last
    assert last is not None
    assert last.state.value == "STOPPED_DRAINING"
    assert last.batches_completed == 1
    assert len(tombstones(stack)) == 3, "the held batch committed; no batch started after it"
