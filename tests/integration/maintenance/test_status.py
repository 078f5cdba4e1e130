"""The status read (MAINT-STAT-1) and maintenance's metrics: what is reported, to whom, and
that reading it changes nothing."""

from __future__ import annotations

import grpc
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from agentactivity.maintenance.v1 import maintenance_pb2
from tests.integration.maintenance.stack import Stack, fake_clock
from tests.support.rpc_errors import error_details
from tests.support.session_trees import add_tree, sessions
from tests.support.store_snapshot import snapshot

RUN = maintenance_pb2


@pytest.mark.spec("MAINT-STAT-1", "MAINT-PREF-1")
def test_status_reports_schedule_gate_database_and_a_preview_that_changes_nothing(
    stack: Stack, backend: str
) -> None:
    stack.tombstone({"r1": None, "r1c": "r1", "r2": None})
    clock = fake_clock()
    m = stack.maintenance(clock)
    ids = ["r1", "r1c", "r2"]
    before = snapshot(stack.engine, "ws-1", ids)
    status = m.status(preview_workspace_id="ws-1")
    assert snapshot(stack.engine, "ws-1", ids) == before, "a status read changes nothing"

    assert status.retention.retention_days == 30
    assert status.purge_cutoff_unix_ms == clock.now_ms() - 30 * 24 * 3600 * 1000
    assert not status.HasField("last_completed_run_unix_ms")
    assert not status.HasField("next_run_eligible_at_unix_ms")
    assert status.next_check_unix_ms == clock.now_ms() + 600_000
    assert not status.paused_by_idle_gate
    assert status.idle_gate.state == RUN.IDLE_GATE_STATE_OPEN
    assert not status.HasField("current_run")
    assert not status.HasField("last_run")
    assert status.database.backend == (
        RUN.STORE_BACKEND_SQLITE if backend == "sqlite" else RUN.STORE_BACKEND_POSTGRES
    )
    assert status.database.size_bytes > 0
    assert status.database.compaction_min_reclaimable_fraction == 0.25
    assert status.database.HasField("reclaimable_fraction") == (backend == "sqlite")
    preview = status.manual_purge_preview
    assert (preview.workspace_id, preview.topmost_components, preview.sessions) == ("ws-1", 2, 3)
    assert (preview.restorable_components, preview.non_restorable_components) == (2, 0)
    assert preview.past_cutoff_components == 2
    assert set(sessions(stack.engine)) == set(ids)
    assert stack.pending_cleanups() == set()


@pytest.mark.spec("MAINT-STAT-1", "SEC-1")
def test_workspace_detail_is_limited_to_the_callers_workspaces(stack: Stack) -> None:
    add_tree(stack.engine, {"busy1": None}, workspace_id="ws-1")
    add_tree(stack.engine, {"busy2": None}, workspace_id="ws-2")
    stack.start_turn("busy1", "t1", workspace_id="ws-1")
    stack.start_turn("busy2", "t2", workspace_id="ws-2")
    m = stack.maintenance(fake_clock())
    admin = m.status("admin").idle_gate
    device = m.status("ws1-device").idle_gate
    assert admin.state == device.state == RUN.IDLE_GATE_STATE_AGENT_ACTIVE
    assert admin.active_workspace_count == device.active_workspace_count == 2
    assert list(admin.active_workspace_ids) == ["ws-1", "ws-2"]
    assert list(device.active_workspace_ids) == ["ws-1"]
    # A due run held back by the gate shows as paused.
    assert m.status().paused_by_idle_gate


@pytest.mark.spec("MAINT-STAT-1", "MAINT-OUT-1")
def test_runs_batches_rows_cleanup_and_pauses_are_metrics(stack: Stack) -> None:
    stack.tombstone({f"s{i}": None for i in range(3)})
    for i in range(3):
        stack.create_resources("ws-1", f"s{i}")
    clock = fake_clock()
    m = stack.maintenance(clock, maintenance_batch_max_trees=1)
    clock.advance(600)
    clock.wait_for_sleeper(clock.now_ms() + 1)
    reader = InMemoryMetricReader()
    m.parts.metrics.register(MeterProvider(metric_readers=[reader]).get_meter("test"))
    data = reader.get_metrics_data()
    assert data is not None
    values: dict[tuple[str, tuple[tuple[str, object], ...]], int] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    key = (metric.name, tuple(sorted((point.attributes or {}).items())))
                    values[key] = int(point.value)  # type: ignore[union-attr]
    assert values[("maintenance.runs", (("trigger", "automatic"),))] == 1
    assert values[("maintenance.runs.finished", (("outcome", "completed"),))] == 1
    assert values[("maintenance.batches", ())] == 3
    assert values[("maintenance.sessions.purged", ())] == 3
    assert values[("maintenance.rows.purged", ())] >= 3
    assert values[("maintenance.cleanup.completed", ())] == 3
    assert values[("maintenance.cleanup.failures", ())] == 0
    assert values[("maintenance.idle_gate.paused", ())] == 0


@pytest.mark.spec("MAINT-STAT-1", "MAINT-IDLE-1")
def test_without_host_the_status_still_answers_and_the_gate_is_closed(stack: Stack) -> None:
    clock = fake_clock()
    m = stack.maintenance(clock)
    stack.host.stop()
    status = m.status()
    assert status.idle_gate.state == RUN.IDLE_GATE_STATE_ACTIVITY_STATE_UNAVAILABLE
    assert status.cleanup.pending_rows_capped, "the pending count is only a lower bound"
    assert status.paused_by_idle_gate
    with pytest.raises(grpc.RpcError) as refused:
        m.status(preview_workspace_id="ws-1")
    assert error_details(refused.value)[:2] == (grpc.StatusCode.UNAVAILABLE, "HOST_UNAVAILABLE")
    with pytest.raises(grpc.RpcError) as purge:
        m.purge("ws-1")
    assert error_details(purge.value)[:2] == (grpc.StatusCode.UNAVAILABLE, "HOST_UNAVAILABLE")
    clock.advance(600)
    clock.wait_for_sleeper(clock.now_ms() + 1)
    assert not m.status().HasField("last_run"), "no run starts behind a closed gate"
