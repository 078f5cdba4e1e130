"""The maintenance worker lease (SCALE-5, ADR 0035).

On Postgres one replica at a time is the worker: a session-level advisory lock on a dedicated
connection, observed here through ``pg_locks``. A standby takes over within the poll bound
when the holder's connection dies or the holder drains; a holder that loses its lease mid-run
stops before its next batch, and a manual purge on a standby is refused ``WORKER_STANDBY``
with ``RetryInfo``. On SQLite the single-node lease keeps today's behaviour.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import grpc
import pytest
from sqlalchemy import Engine, text

from agentactivity.maintenance.v1 import maintenance_pb2
from grpcserver.call_errors import call_error
from services.maintenance.lease import (
    WORKER_LEASE_CLASSID,
    WORKER_LEASE_KEY,
    WORKER_LEASE_OBJID,
    PostgresLease,
    SingleNodeLease,
    WorkerLease,
)
from services.maintenance.metrics import MaintenanceMetrics
from services.maintenance.worker import LEASE_LOST
from tests.integration.maintenance.stack import Stack, fake_clock
from tests.support.polling import eventually
from tests.support.rpc_errors import error_details
from tests.support.session_trees import sessions

RUN = maintenance_pb2
POLL_S = 0.3
# The handover bound: one poll interval, plus the time a loaded 2-core machine may take to
# schedule the standby's attempt and answer the probe (seconds, with a full suite
# running beside it). Still far below anything that would hide a missing handover: a lock left
# behind by a dead session would hold until TCP keepalive, minutes.
HANDOVER_SLACK_S = 10.0

_HOLDERS = text(
    """
    SELECT l.pid, a.application_name FROM pg_locks l
    JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.classid = :classid
      AND l.objid = :objid AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    """
)


def lease_holders(engine: Engine) -> list[tuple[int, str]]:
    """(backend pid, application name) of every session holding the worker lease."""
    with engine.connect() as connection:
        rows = connection.execute(
            _HOLDERS, {"classid": WORKER_LEASE_CLASSID, "objid": WORKER_LEASE_OBJID}
        ).all()
    return [(int(pid), str(name)) for pid, name in rows]


def is_worker(lease: WorkerLease) -> bool:
    """Whether ``lease`` is held now (a call, so a type checker does not pin the value)."""
    return lease.held


def lock_waiters(engine: Engine) -> int:
    """Sessions waiting for the worker lease (not granted)."""
    with engine.connect() as connection:
        return int(
            connection.execute(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    " AND classid = :classid AND objid = :objid"
                ),
                {"classid": WORKER_LEASE_CLASSID, "objid": WORKER_LEASE_OBJID},
            ).scalar_one()
        )


def terminate(engine: Engine, pid: int) -> None:
    """End a server session, as a network cut or a dead client would."""
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})


@pytest.mark.spec("SCALE-5")
@pytest.mark.parametrize("backend", ["sqlite"])
def test_sqlite_keeps_the_single_node_worker(stack: Stack) -> None:
    stack.tombstone({"gone": None})
    m = stack.maintenance(fake_clock())
    assert isinstance(m.parts.lease, SingleNodeLease)
    assert m.purge("ws-1").run.state == RUN.MAINTENANCE_RUN_STATE_COMPLETED


@pytest.mark.spec("SCALE-5")
@pytest.mark.parametrize("backend", ["postgres"])
@pytest.mark.postgres
def test_one_holder_takes_over_within_the_poll_bound(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    asyncio.run(_takeover(migrated_db_url, sync_engine))


async def _takeover(url: str, engine: Engine) -> None:
    metrics = [MaintenanceMetrics(), MaintenanceMetrics()]
    leases = [
        PostgresLease(url, poll_seconds=POLL_S, probe_timeout_seconds=2.0, metrics=m)
        for m in metrics
    ]
    try:
        for lease in leases:
            await lease.start()
        assert [lease.held for lease in leases] == [True, False]
        assert len(lease_holders(engine)) == 1
        # Standbys keep polling and never take a held lease.
        await asyncio.sleep(POLL_S * 3)
        assert [lease.held for lease in leases] == [True, False]
        assert len(lease_holders(engine)) == 1

        # The holder's session dies (the lock dies with it): the holder notices at its next
        # probe, and within the poll bound exactly one replica holds the lease again.
        ((pid, _),) = lease_holders(engine)
        terminate(engine, pid)
        started = time.monotonic()
        assert not await leases[0].confirm()
        assert metrics[0].lease_lost == 1
        while not any(lease.held for lease in leases):
            assert time.monotonic() - started < POLL_S + HANDOVER_SLACK_S, "no takeover"
            await asyncio.sleep(0.02)
        assert sum(lease.held for lease in leases) == 1
        assert len(lease_holders(engine)) == 1

        # A drained holder releases at once; the other takes over within the poll bound.
        holder = next(lease for lease in leases if lease.held)
        other = next(lease for lease in leases if lease is not holder)
        await holder.release()
        started = time.monotonic()
        while not other.held:
            assert time.monotonic() - started < POLL_S + HANDOVER_SLACK_S, "no takeover"
            await asyncio.sleep(0.02)
        assert len(lease_holders(engine)) == 1
        assert sum(m.lease_released for m in metrics) == 1
    finally:
        for lease in leases:
            await lease.release()
    assert lease_holders(engine) == []


class GatedHost:
    """Maintenance's Host port whose workspace batches wait for the test after the second."""

    def __init__(self, host: Any) -> None:
        self._host = host
        self.batches = 0
        self.reached = threading.Event()
        self.go_on = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)

    async def purge_workspace(self, *args: Any, **kwargs: Any) -> Any:
        result = await self._host.purge_workspace(*args, **kwargs)
        if not kwargs.get("dry_run"):
            self.batches += 1
            if self.batches == 2:
                self.reached.set()
                await asyncio.to_thread(self.go_on.wait, 30)
        return result


@pytest.mark.spec("SCALE-5", "MAINT-MAN-1")
@pytest.mark.parametrize("backend", ["postgres"])
@pytest.mark.postgres
def test_a_lost_lease_stops_the_run_and_a_standby_refuses_typed(
    stack: Stack, migrated_db_url: str
) -> None:
    roots = stack.tombstone({f"t{i}": None for i in range(6)})
    gated: list[GatedHost] = []

    def wrap(host: Any) -> Any:
        gated.append(GatedHost(host))
        return gated[0]

    m = stack.maintenance(
        fake_clock(),
        wrap=wrap,
        maintenance_manual_batch_components=1,
        maintenance_lease_poll_seconds=POLL_S,
    )
    assert isinstance(m.parts.lease, PostgresLease)
    assert m.parts.lease.held
    call = m.stub.RunManualPurge.future(
        RUN.RunManualPurgeRequest(workspace_id="ws-1", scope=RUN.PURGE_SCOPE_WORKSPACE),
        metadata=(("authorization", "Bearer token-admin"),),
        timeout=60,
    )
    assert gated[0].reached.wait(30)
    # While the second batch is in flight, the lease connection dies and another holder
    # (here: the test, queued on the lock first) gets the lock before maintenance retries.
    ((pid, _),) = lease_holders(stack.engine)
    with stack.engine.connect() as other:
        waiting = threading.Thread(
            target=other.execute,
            args=(text("SELECT pg_advisory_lock(:key)"), {"key": WORKER_LEASE_KEY}),
        )
        waiting.start()
        assert eventually(lambda: lock_waiters(stack.engine) == 1)
        terminate(stack.engine, pid)
        waiting.join(timeout=10)
        assert not waiting.is_alive()
        other.commit()
        gated[0].go_on.set()
        run = call.result().run
        assert run.state == RUN.MAINTENANCE_RUN_STATE_STOPPED_DRAINING
        assert run.detail == LEASE_LOST
        assert run.progress.batches_completed == 2
        assert run.progress.components_purged == 2
        left = {sid for sid, row in sessions(stack.engine).items() if row.deleted_at_unix_ms}
        assert len(left) == len(roots) - 2, "whole batches only; nothing after the loss"
        assert m.parts.metrics.lease_lost == 1

        # A standby refuses a manual purge, typed and with a retry hint; nothing changes.
        time.sleep(POLL_S * 2)
        assert not is_worker(m.parts.lease)
        with pytest.raises(grpc.RpcError) as refused:
            m.purge("ws-1")
        code, reason, _ = error_details(refused.value)
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "WORKER_STANDBY")
        assert call_error(refused.value).retry_after_seconds == pytest.approx(POLL_S)
        assert {sid for sid, row in sessions(stack.engine).items() if row.deleted_at_unix_ms} == (
            left
        )
        other.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": WORKER_LEASE_KEY})
        other.commit()

    # The other holder went away: maintenance takes the lease back and finishes the work.
    assert eventually(lambda: is_worker(m.parts.lease), timeout=POLL_S + HANDOVER_SLACK_S)
    assert m.parts.metrics.lease_acquired == 2
    assert m.purge("ws-1").run.state == RUN.MAINTENANCE_RUN_STATE_COMPLETED
    assert not any(row.deleted_at_unix_ms for row in sessions(stack.engine).values())
