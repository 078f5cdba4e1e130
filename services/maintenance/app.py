"""Process wiring of the maintenance service: ``tutti serve maintenance``.

One worker, one scheduler and one status reader per process, all on one clock. Maintenance
reaches Host only through :class:`~services.maintenance.host_port.GrpcHost` and uses the
store for its own tables and for database-level size and compaction. On Postgres the worker
runs under a lease (:mod:`services.maintenance.lease`), so several replicas may run
(SCALE-5); the lease is taken before readiness and given up on drain.
"""

from __future__ import annotations

from agentactivity.maintenance.v1 import maintenance_pb2, maintenance_pb2_grpc
from grpcserver.app import ServiceDefinition, definition_for
from services.maintenance.authorization import AUTHORIZATION
from services.maintenance.cleanup import ResourceCleaner
from services.maintenance.clock import Clock, SystemClock
from services.maintenance.compaction import Compactor
from services.maintenance.host_port import GrpcHost, HostPort
from services.maintenance.idle_gate import IdleGate
from services.maintenance.lease import PostgresLease, SingleNodeLease, WorkerLease
from services.maintenance.metrics import MaintenanceMetrics
from services.maintenance.records import BackoffPolicy, CleanupAttempts, CompletionMarkers
from services.maintenance.retention import RetentionPreferences
from services.maintenance.scheduler import Schedule, Scheduler
from services.maintenance.servicer import MaintenanceServicer
from services.maintenance.settings import Settings
from services.maintenance.status import StatusReader
from services.maintenance.worker import MaintenanceWorker
from session_resources.layout import ResourceLayout
from store.database import Database
from store.engine import backend_name

__all__ = ["Maintenance", "Settings", "build"]

STOP_WAIT_SECONDS = 10.0
"""How long stop waits for a run to end between batches before cancelling it."""


class Maintenance:
    """The parts of one maintenance process (tests reach them through ``build``)."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None = None,
        host: HostPort | None = None,
        lease: WorkerLease | None = None,
    ) -> None:
        self.clock = clock or SystemClock()
        self.database = Database(
            settings.resolved_database_url(),
            sqlite_write_queue_seconds=settings.sqlite_write_queue_seconds,
            sqlite_group_commit=settings.sqlite_group_commit,
            sqlite_synchronous=settings.sqlite_synchronous,
        )
        self._grpc_host = (
            GrpcHost(settings, settings.maintenance_host_timeout_seconds) if host is None else None
        )
        self.host: HostPort = host or self._grpc_host  # type: ignore[assignment]
        self.metrics = MaintenanceMetrics()
        self.lease: WorkerLease = lease or _lease_for(settings, self.database.url, self.metrics)
        self.metrics.lease_held = lambda: self.lease.held
        self.retention = RetentionPreferences(self.database, clock=self.clock.now_ms)
        self.markers = CompletionMarkers(self.database)
        attempts = CleanupAttempts(self.database)
        self.cleaner = ResourceCleaner(
            self.host,
            attempts,
            ResourceLayout(settings.resolved_resources_dir()),
            self.clock,
            BackoffPolicy(
                settings.maintenance_cleanup_backoff_seconds,
                settings.maintenance_cleanup_backoff_max_seconds,
            ),
            self.metrics,
        )
        self.compactor = Compactor(
            self.database,
            max_size_bytes=settings.compaction_max_size_bytes,
            min_reclaimable_fraction=settings.compaction_min_reclaimable_fraction,
        )
        self.worker = MaintenanceWorker(
            settings=settings,
            host=self.host,
            gate=IdleGate(self.host, self.clock),
            retention=self.retention,
            markers=self.markers,
            cleaner=self.cleaner,
            compactor=self.compactor,
            clock=self.clock,
            metrics=self.metrics,
            lease=self.lease,
        )
        self.scheduler = Scheduler(
            Schedule.from_settings(settings),
            self.worker,
            self.markers,
            self.clock,
            self.metrics,
            enabled=settings.maintenance_scheduler_enabled,
        )
        self.status = StatusReader(
            host=self.host,
            retention=self.retention,
            markers=self.markers,
            attempts=attempts,
            compactor=self.compactor,
            worker=self.worker,
            scheduler=self.scheduler,
            clock=self.clock,
        )

    async def drain(self) -> None:
        """Let the run in progress stop after its in-flight batch, then give up the lease.

        ARCH-4; a standby takes the lease at its next attempt.
        """
        self.worker.drain()
        await self.worker.wait_idle(STOP_WAIT_SECONDS)
        await self.lease.release()

    async def stop(self) -> None:
        """Let a run end after its batch, then stop the schedule and close Host and the store."""
        self.worker.drain()
        await self.worker.wait_idle(STOP_WAIT_SECONDS)
        await self.scheduler.stop()
        await self.lease.release()
        if self._grpc_host is not None:
            await self._grpc_host.close()
        await self.database.stop()


def _lease_for(settings: Settings, database_url: str, metrics: MaintenanceMetrics) -> WorkerLease:
    """A Postgres lease for a shared store; a single-node one for SQLite (one process)."""
    if backend_name(database_url) != "postgresql":
        return SingleNodeLease()
    return PostgresLease(
        database_url,
        poll_seconds=settings.maintenance_lease_poll_seconds,
        probe_timeout_seconds=settings.maintenance_lease_probe_timeout_seconds,
        metrics=metrics,
    )


def build(
    settings: Settings, *, clock: Clock | None = None, host: HostPort | None = None
) -> ServiceDefinition:
    """Assemble the maintenance service for :func:`grpcserver.app.serve`.

    ``clock`` and ``host`` replace the wall clock and Host's gRPC API (tests).
    """
    return definition_for_parts(Maintenance(settings, clock=clock, host=host))


def definition_for_parts(parts: Maintenance) -> ServiceDefinition:
    """The service definition of already built parts (tests keep a handle on them)."""
    servicer = MaintenanceServicer(parts.retention, parts.worker, parts.status)
    return definition_for(
        "maintenance",
        [
            (
                maintenance_pb2.DESCRIPTOR.services_by_name["MaintenanceService"],
                maintenance_pb2_grpc.add_MaintenanceServiceServicer_to_server,
                servicer,
            )
        ],
        authorization=AUTHORIZATION,
        # The lease is tried before readiness, so a lone replica serves as the worker at once;
        # the scheduler starts last: its first check counts from readiness (MAINT-SCHED-1).
        on_start=[parts.database.start, parts.lease.start, parts.scheduler.start],
        on_drain=[parts.drain],
        on_stop=[parts.stop],
        instruments=[parts.metrics.register],
    )
