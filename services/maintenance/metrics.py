"""Counters of maintenance work, exported as OpenTelemetry metrics (MAINT-STAT-1).

The worker and the cleaner bump plain counters; :meth:`MaintenanceMetrics.register` exposes
them as observable counters on the service's meter, so they reach Prometheus with the RPC
metrics (``TUTTI_METRICS_PORT``) without the domain code touching OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opentelemetry.metrics import CallbackOptions, Meter, Observation

__all__ = ["MaintenanceMetrics"]


@dataclass
class MaintenanceMetrics:
    """Monotonic counts since the process started."""

    runs_automatic: int = 0
    runs_manual: int = 0
    runs_completed: int = 0
    runs_stopped: int = 0
    batches: int = 0
    sessions_purged: int = 0
    rows_purged: int = 0
    cleanups_completed: int = 0
    cleanup_failures: int = 0
    cleanup_retries: int = 0
    idle_gate_paused_ms: int = 0
    lease_acquired: int = 0
    lease_lost: int = 0
    lease_released: int = 0
    lease_held: Callable[[], bool] = lambda: True
    """Whether this replica is the worker now (SCALE-5); wired to the lease by the app."""

    def register(self, meter: Meter) -> None:
        """Register one observable counter per count on ``meter``."""

        def observe(
            read: Callable[[], int], **attributes: str
        ) -> Callable[..., Iterable[Observation]]:
            def callback(_options: CallbackOptions) -> Iterable[Observation]:
                return [Observation(read(), attributes)]

            return callback

        meter.create_observable_counter(
            "maintenance.runs",
            callbacks=[
                observe(lambda: self.runs_automatic, trigger="automatic"),
                observe(lambda: self.runs_manual, trigger="manual"),
            ],
            description="Maintenance runs started, by trigger",
        )
        meter.create_observable_counter(
            "maintenance.runs.finished",
            callbacks=[
                observe(lambda: self.runs_completed, outcome="completed"),
                observe(lambda: self.runs_stopped, outcome="stopped"),
            ],
            description="Maintenance runs finished, completed or stopped early",
        )
        for name, read, description in (
            ("maintenance.batches", lambda: self.batches, "Purge batches committed"),
            ("maintenance.sessions.purged", lambda: self.sessions_purged, "Sessions purged"),
            ("maintenance.rows.purged", lambda: self.rows_purged, "Canonical rows purged"),
            (
                "maintenance.cleanup.completed",
                lambda: self.cleanups_completed,
                "Cleanup rows released and completed",
            ),
            (
                "maintenance.cleanup.failures",
                lambda: self.cleanup_failures,
                "Failed cleanup attempts (retried with backoff)",
            ),
            (
                "maintenance.cleanup.retries",
                lambda: self.cleanup_retries,
                "Cleanup attempts of rows that had failed before",
            ),
        ):
            meter.create_observable_counter(
                name, callbacks=[observe(read)], description=description
            )
        meter.create_observable_counter(
            "maintenance.worker_lease.transitions",
            callbacks=[
                observe(lambda: self.lease_acquired, event="acquired"),
                observe(lambda: self.lease_lost, event="lost"),
                observe(lambda: self.lease_released, event="released"),
            ],
            description="Worker lease acquired, lost (connection failed) or released (drain)",
        )
        meter.create_observable_gauge(
            "maintenance.worker_lease.held",
            callbacks=[observe(lambda: int(self.lease_held()))],
            description="1 on the replica that is the maintenance worker, 0 on a standby",
        )
        meter.create_observable_counter(
            "maintenance.idle_gate.paused",
            callbacks=[observe(lambda: self.idle_gate_paused_ms)],
            unit="ms",
            description="Time a due run waited, or a run stopped early, because a Turn was active",
        )
