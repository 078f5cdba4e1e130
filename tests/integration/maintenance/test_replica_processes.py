"""Two and three real ``tutti serve maintenance`` processes on one Postgres (SCALE-5).

The lease holder is observed in ``pg_locks`` (joined with ``pg_stat_activity``, whose
``application_name`` names the holder's process id): exactly one process holds it at every
sample, the standby refuses manual purges while the holder runs one, ``kill -9`` of the holder
mid-run hands the lease to the standby within the poll bound, and a drained (SIGTERM) holder
hands it over the same way. The run the killed holder left is finished by the new one with
whole trees only.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc
import pytest

from agentactivity.maintenance.v1 import maintenance_pb2, maintenance_pb2_grpc
from tests.integration.maintenance.stack import Stack
from tests.integration.maintenance.test_worker_lease import HANDOVER_SLACK_S, lease_holders
from tests.support.polling import eventually
from tests.support.rpc_errors import error_details
from tests.support.servers import auth_metadata, token_for
from tests.support.service_process import ServiceProcess, service_process
from tests.support.session_trees import add_messages, sessions

RUN = maintenance_pb2
POLL_S = 0.5
DRAIN_DELAY_S = 0.5
TREES = 16
PURGE_ALL = RUN.RunManualPurgeRequest(workspace_id="ws-1", scope=RUN.PURGE_SCOPE_WORKSPACE)
PURGE_OTHER = RUN.RunManualPurgeRequest(workspace_id="ws-2", scope=RUN.PURGE_SCOPE_WORKSPACE)


def holder_pids(stack: Stack) -> list[int]:
    """OS process ids of the lease holders, from their connections' application name."""
    return [int(name.rsplit("-", 1)[1]) for _, name in lease_holders(stack.engine)]


def stub(
    process: ServiceProcess,
) -> tuple[grpc.Channel, maintenance_pb2_grpc.MaintenanceServiceStub]:
    channel = grpc.insecure_channel(process.address)
    return channel, maintenance_pb2_grpc.MaintenanceServiceStub(channel)


def refused_as_standby(client: maintenance_pb2_grpc.MaintenanceServiceStub) -> bool:
    """A manual purge on ``client`` is refused ``UNAVAILABLE`` ``WORKER_STANDBY``."""
    try:
        client.RunManualPurge(PURGE_OTHER, metadata=auth_metadata("admin"), timeout=30)
    except grpc.RpcError as error:
        code, reason, _ = error_details(error)
        return (code, reason) == (grpc.StatusCode.UNAVAILABLE, "WORKER_STANDBY")
    return False


def handover(stack: Stack, to: ServiceProcess, started: float, after: float = 0.0) -> float:
    """Seconds from ``started`` (monotonic) until ``to`` is the only holder; fails past
    ``after`` plus the poll bound plus slack."""
    while holder_pids(stack) != [to.process.pid]:
        assert len(holder_pids(stack)) <= 1
        elapsed = time.monotonic() - started
        assert elapsed < after + POLL_S + HANDOVER_SLACK_S, f"no handover in {elapsed:.2f} s"
        time.sleep(0.01)
    return time.monotonic() - started


@pytest.mark.spec("SCALE-5", "MAINT-MAN-1")
@pytest.mark.parametrize("backend", ["postgres"])
@pytest.mark.postgres
def test_one_worker_among_processes_and_kill_9_hands_over(
    stack: Stack, migrated_db_url: str, tmp_path: Path
) -> None:
    parents: dict[str, str | None] = {}
    for i in range(TREES):
        parents |= {f"r{i}": None, f"r{i}a": f"r{i}"}
    stack.tombstone(parents)
    add_messages(stack.engine, list(parents), 60)
    settings = {
        "host_address": stack.host.address,
        "service_token": token_for("service"),
        "resources_dir": str(stack.resources),
        "maintenance_scheduler_enabled": "false",
        "maintenance_manual_batch_components": "1",
        "maintenance_lease_poll_seconds": str(POLL_S),
        "drain_delay_seconds": str(DRAIN_DELAY_S),
    }
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()

    with (
        service_process(
            "maintenance", tmp_path / "a", database_url=migrated_db_url, **settings
        ) as a,
        service_process(
            "maintenance", tmp_path / "b", database_url=migrated_db_url, **settings
        ) as b,
    ):
        # The first replica took the lease before it turned ready; the second is a standby.
        assert holder_pids(stack) == [a.process.pid]
        a_channel, a_stub = stub(a)
        b_channel, b_stub = stub(b)
        assert refused_as_standby(b_stub)

        call = a_stub.RunManualPurge.future(PURGE_ALL, metadata=auth_metadata("admin"), timeout=120)

        def progressed() -> bool:
            # Sampled all along the run: one holder, and the standby never purges.
            assert holder_pids(stack) == [a.process.pid]
            status = a_stub.GetMaintenanceStatus(
                RUN.GetMaintenanceStatusRequest(), metadata=auth_metadata("admin")
            )
            return status.current_run.progress.batches_completed >= 3

        assert eventually(progressed, timeout=60)
        assert refused_as_standby(b_stub)
        assert holder_pids(stack) == [a.process.pid]

        killed = time.monotonic()
        a.process.send_signal(signal.SIGKILL)
        a.process.wait(timeout=10)
        with pytest.raises(grpc.RpcError):
            call.result()
        a_channel.close()
        took = handover(stack, b, killed)
        print(f"kill -9 handover: {took:.3f} s (poll bound {POLL_S} s)")

        # Whole trees only; the new worker finishes what the killed one left.
        stored = set(sessions(stack.engine))
        for i in range(TREES):
            assert ({f"r{i}", f"r{i}a"} & stored) in (set(), {f"r{i}", f"r{i}a"})
        assert len(stored) < len(parents), "killed mid-run"
        response = b_stub.RunManualPurge(PURGE_ALL, metadata=auth_metadata("admin"), timeout=120)
        assert response.run.state == RUN.MAINTENANCE_RUN_STATE_COMPLETED
        assert not set(sessions(stack.engine)) & set(parents)

        # A third replica is a standby until the holder drains (SIGTERM) and releases.
        with service_process(
            "maintenance", tmp_path / "c", database_url=migrated_db_url, **settings
        ) as c:
            c_channel, c_stub = stub(c)
            assert holder_pids(stack) == [b.process.pid]
            assert refused_as_standby(c_stub)
            b_channel.close()
            stopping = time.monotonic()
            b.process.send_signal(signal.SIGTERM)
            # The holder keeps serving through the drain delay, then releases on drain.
            took = handover(stack, c, stopping, after=DRAIN_DELAY_S)
            assert b.process.wait(timeout=30) == 0
            print(f"drain handover: {took:.3f} s (drain delay {DRAIN_DELAY_S} s, poll {POLL_S} s)")
            response = c_stub.RunManualPurge(
                PURGE_OTHER, metadata=auth_metadata("admin"), timeout=30
            )
            assert response.run.state == RUN.MAINTENANCE_RUN_STATE_COMPLETED
            c_channel.close()
