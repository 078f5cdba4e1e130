"""When automatic maintenance runs (MAINT-SCHED-1).

The first check is ``TUTTI_MAINTENANCE_FIRST_CHECK_DELAY_SECONDS`` (10 minutes) after the
service became ready, then one every ``TUTTI_MAINTENANCE_CHECK_INTERVAL_SECONDS`` (30
minutes). A check:

* runs an automatic purge when one is **due** — no durable completion marker yet, or the
  marker is at least ``TUTTI_MAINTENANCE_COMPLETION_SPACING_SECONDS`` (24 hours) old. The
  worker writes the marker only when a run drained all eligible work, so a run stopped by
  agent activity is tried again at the next check, and a restart inside the 24 hours reads the
  marker and does not run again;
* otherwise, retries due resource cleanups in this idle window (MAINT-OUT-1).

Both go through the serialized worker, which observes the idle gate itself and does
nothing on a standby replica (SCALE-5): every replica keeps this schedule, and whichever holds
the worker lease at a check acts on it. Time spent due
but waiting on a closed gate is counted in the ``maintenance.idle_gate.paused`` metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from services.maintenance.clock import Clock
from services.maintenance.idle_gate import GateObservation
from services.maintenance.metrics import MaintenanceMetrics
from services.maintenance.records import CompletionMarkers
from services.maintenance.settings import Settings
from services.maintenance.worker import MaintenanceWorker, RunRecord, RunState

__all__ = ["Schedule", "Scheduler"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Schedule:
    """The three timings of MAINT-SCHED-1, in milliseconds."""

    first_check_delay_ms: int
    check_interval_ms: int
    completion_spacing_ms: int

    @classmethod
    def from_settings(cls, settings: Settings) -> Schedule:
        """The schedule configured by ``TUTTI_MAINTENANCE_*``."""
        return cls(
            first_check_delay_ms=int(settings.maintenance_first_check_delay_seconds * 1000),
            check_interval_ms=int(settings.maintenance_check_interval_seconds * 1000),
            completion_spacing_ms=int(settings.maintenance_completion_spacing_seconds * 1000),
        )

    def due(self, marker_unix_ms: int | None, now_ms: int) -> bool:
        """Whether an automatic run is due given the completion marker."""
        return marker_unix_ms is None or now_ms >= marker_unix_ms + self.completion_spacing_ms


class Scheduler:
    """Drives the worker from the clock; started when the service is ready."""

    def __init__(
        self,
        schedule: Schedule,
        worker: MaintenanceWorker,
        markers: CompletionMarkers,
        clock: Clock,
        metrics: MaintenanceMetrics,
        *,
        enabled: bool = True,
    ) -> None:
        self.schedule = schedule
        self._worker = worker
        self._markers = markers
        self._clock = clock
        self._metrics = metrics
        self._enabled = enabled
        self._task: asyncio.Task[None] | None = None
        self.next_check_unix_ms: int | None = None
        self.checks = 0
        self.paused_since_unix_ms: int | None = None
        """Set while a run is due but the idle gate keeps it (or kept the last one) from
        finishing; cleared when a run completes."""
        self.paused_by: GateObservation | None = None

    async def start(self) -> None:
        """Plan the first check from now (readiness) and start the loop."""
        self.next_check_unix_ms = self._clock.now_ms() + self.schedule.first_check_delay_ms
        if self._enabled:
            self._task = asyncio.create_task(self._loop(), name="maintenance-scheduler")

    async def stop(self) -> None:
        """Stop the loop (the worker was drained first, so a run ends between batches)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            assert self.next_check_unix_ms is not None
            await self._clock.sleep_until(self.next_check_unix_ms)
            try:
                await self.check()
            except Exception:  # noqa: BLE001 - one failed check must not end the schedule
                _log.exception("maintenance check failed")
            self.next_check_unix_ms = max(
                self.next_check_unix_ms + self.schedule.check_interval_ms,
                self._clock.now_ms() + 1,
            )

    async def check(self) -> RunRecord | GateObservation | None:
        """One scheduled check: the automatic run when due, else a cleanup retry pass.

        Returns the run, the closed gate that held a due run back, or ``None`` when no run
        was due, this replica is a standby, or another worker claimed the run.
        """
        self.checks += 1
        now = self._clock.now_ms()
        if not self.schedule.due(await self._markers.get(), now):
            await self._worker.retry_cleanups()
            return None
        outcome = await self._worker.run_automatic(self.schedule.completion_spacing_ms)
        if outcome is None:
            return None
        finished = self._clock.now_ms()
        if isinstance(outcome, RunRecord) and outcome.state is RunState.COMPLETED:
            self._resume(finished)
        elif isinstance(outcome, RunRecord) and outcome.state is RunState.STOPPED_AGENT_ACTIVE:
            self._pause(finished, self._worker.gate.last)
        elif isinstance(outcome, GateObservation):
            self._pause(now, outcome)
        return outcome

    def _pause(self, now: int, gate: GateObservation | None) -> None:
        if self.paused_since_unix_ms is not None:
            self._metrics.idle_gate_paused_ms += now - self.paused_since_unix_ms
        self.paused_since_unix_ms = now
        self.paused_by = gate

    def _resume(self, now: int) -> None:
        if self.paused_since_unix_ms is not None:
            self._metrics.idle_gate_paused_ms += now - self.paused_since_unix_ms
        self.paused_since_unix_ms = None
        self.paused_by = None
