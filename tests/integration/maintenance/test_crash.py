"""A maintenance process killed mid-run (SIGKILL) leaves no partial tree, and the next run
finishes the work: every purged Session's cleanup completes, untouched ones keep their
resources (MAINT-MAN-1, MAINT-OUT-1, HOST-DEL-10)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc
import pytest

from agentactivity.maintenance.v1 import maintenance_pb2, maintenance_pb2_grpc
from tests.integration.maintenance.stack import Stack
from tests.support.polling import eventually
from tests.support.servers import auth_metadata, token_for
from tests.support.service_process import service_process
from tests.support.session_trees import add_messages, sessions

RUN = maintenance_pb2
TREES = 24


def tree_states(stack: Stack) -> dict[str, str]:
    """Each tree: ``whole`` (all three members stored), ``gone`` or ``partial``."""
    stored = set(sessions(stack.engine))
    states = {}
    for i in range(TREES):
        members = {f"r{i}", f"r{i}a", f"r{i}b"}
        present = members & stored
        states[f"r{i}"] = "whole" if present == members else "gone" if not present else "partial"
    return states


@pytest.mark.spec("MAINT-MAN-1", "MAINT-OUT-1")
def test_a_killed_run_leaves_whole_trees_and_the_next_run_finishes(
    stack: Stack, migrated_db_url: str, tmp_path: Path
) -> None:
    parents: dict[str, str | None] = {}
    for i in range(TREES):
        parents |= {f"r{i}": None, f"r{i}a": f"r{i}", f"r{i}b": f"r{i}a"}
    stack.tombstone(parents)
    add_messages(stack.engine, list(parents), 60)
    for session_id in parents:
        stack.create_resources("ws-1", session_id)
    settings = {
        "host_address": stack.host.address,
        "service_token": token_for("service"),
        "resources_dir": str(stack.resources),
        "maintenance_scheduler_enabled": "false",
        "maintenance_manual_batch_components": "1",
    }
    for run_dir in ("first", "second"):
        (tmp_path / run_dir).mkdir()
    request = RUN.RunManualPurgeRequest(workspace_id="ws-1", scope=RUN.PURGE_SCOPE_WORKSPACE)

    with service_process(
        "maintenance", tmp_path / "first", database_url=migrated_db_url, **settings
    ) as first:
        channel = grpc.insecure_channel(first.address)
        stub = maintenance_pb2_grpc.MaintenanceServiceStub(channel)
        call = stub.RunManualPurge.future(request, metadata=auth_metadata("admin"), timeout=120)

        def progressed() -> bool:
            status = stub.GetMaintenanceStatus(
                RUN.GetMaintenanceStatusRequest(), metadata=auth_metadata("admin")
            )
            return status.current_run.progress.batches_completed >= 3

        assert eventually(progressed, timeout=60)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
        with pytest.raises(grpc.RpcError):
            call.result()
        channel.close()

    # The batch Host was purging when maintenance died may still commit after the kill (the
    # call's cancellation races its transaction): read the trees once Host has gone quiet.
    def quiet() -> bool:
        before = tree_states(stack)
        time.sleep(1.0)
        return tree_states(stack) == before

    assert eventually(quiet, timeout=30)
    states = tree_states(stack)
    assert "partial" not in states.values(), states
    gone = [root for root, state in states.items() if state == "gone"]
    assert 3 <= len(gone) < TREES, "killed mid-run"
    # Purged Sessions' cleanup rows are completed or still pending, never lost.
    stored = set(sessions(stack.engine))
    pending = {sid for _, sid in stack.pending_cleanups()}
    for session_id in parents:
        if session_id in stored:
            assert stack.resource_classes("ws-1", session_id) == {
                "session",
                "workspace",
                "agent_lease",
            }
        elif session_id not in pending:
            assert stack.resource_classes("ws-1", session_id) == set()

    with service_process(
        "maintenance", tmp_path / "second", database_url=migrated_db_url, **settings
    ) as second:
        channel = grpc.insecure_channel(second.address)
        stub = maintenance_pb2_grpc.MaintenanceServiceStub(channel)
        response = stub.RunManualPurge(request, metadata=auth_metadata("admin"), timeout=120)
        channel.close()
    assert response.run.state == RUN.MAINTENANCE_RUN_STATE_COMPLETED
    assert response.run.progress.components_purged == TREES - len(gone)
    assert set(tree_states(stack).values()) == {"gone"}
    assert stack.pending_cleanups() == set()
    for session_id in parents:
        assert stack.resource_classes("ws-1", session_id) == set()
