"""The one serialized maintenance worker: automatic and manual runs (MAINT-IDLE-1, MAINT-MAN-1).

Every run holds the worker's lock from its first gate check to its last cleanup, so an
automatic run and a manual request never overlap (a manual request waits for its turn,
bounded by its caller's deadline). A run is a loop of short bounded Host purge batches:

1. observe the idle gate; closed means stop (automatic and mid-run) or refuse (a manual
   request before its first batch, ``AGENT_ACTIVE`` with ``RetryInfo``);
2. one purge batch on Host (each tree commits atomically there, with its cleanup rows);
3. an immediate resource-cleanup pass (MAINT-OUT-1), which also retries due failures.

An automatic run purges restorable trees deleted before ``now - retention`` across every
workspace and, only when it drained all eligible work, writes the durable completion marker
(MAINT-SCHED-1). A manual run targets one workspace (one component or every topmost
tombstone) regardless of retention and may end with compaction (MAINT-VAC-1). A run stopped
early keeps its committed batches: Host never leaves a partial tree, so the next run simply
continues.

With several replicas (SCALE-5, ADR 0035) only the holder of the worker lease runs anything:
a standby's scheduler does nothing and its manual purge is refused ``UNAVAILABLE``
``WORKER_STANDBY`` with ``RetryInfo``. The holder re-confirms the lease before every batch and
stops (``STOPPED_DRAINING``) when it is gone, so a replica that lost its lease finishes at most
its in-flight batch, which Host commits (or not) as a whole. An automatic run also claims the
day in the store (:meth:`CompletionMarkers.claim_automatic`) and renews the claim between
batches, so two workers deciding the same day never both run it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from domainerrors import DomainError, FailedPrecondition, Unavailable
from services.maintenance.cleanup import CleanupPass, ResourceCleaner
from services.maintenance.clock import Clock
from services.maintenance.compaction import CompactionResult, Compactor
from services.maintenance.host_port import HostPort, HostUnavailable
from services.maintenance.idle_gate import GateObservation, GateState, IdleGate
from services.maintenance.lease import WorkerLease
from services.maintenance.metrics import MaintenanceMetrics
from services.maintenance.records import CompletionMarkers
from services.maintenance.retention import RetentionPreferences
from services.maintenance.settings import Settings

__all__ = ["MaintenanceWorker", "RunRecord", "RunState", "Trigger"]

_log = logging.getLogger(__name__)


class Trigger(enum.Enum):
    """What started a run."""

    AUTOMATIC = "AUTOMATIC"
    MANUAL = "MANUAL"


class RunState(enum.Enum):
    """State of a run (the proto ``MaintenanceRunState`` without its prefix)."""

    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    STOPPED_AGENT_ACTIVE = "STOPPED_AGENT_ACTIVE"
    STOPPED_HOST_UNAVAILABLE = "STOPPED_HOST_UNAVAILABLE"
    STOPPED_DRAINING = "STOPPED_DRAINING"
    FAILED = "FAILED"


@dataclass
class RunRecord:
    """One run, updated in place while it runs (status reads show its progress).

    ``compaction`` names the proto ``CompactionOutcome`` without its prefix.
    """

    run_id: str
    trigger: Trigger
    started_at_unix_ms: int
    workspace_id: str | None = None
    purge_cutoff_unix_ms: int | None = None
    state: RunState = RunState.RUNNING
    finished_at_unix_ms: int | None = None
    batches_completed: int = 0
    components_purged: int = 0
    sessions_purged: int = 0
    components_blocked: int = 0
    more_remaining: bool = False
    cleanup: CleanupPass = field(default_factory=CleanupPass)
    compaction: str = "NOT_REQUESTED"
    compaction_result: CompactionResult | None = None
    purged_session_ids: list[str] = field(default_factory=list)
    detail: str = ""


Batch = Callable[[], Awaitable[tuple[int, int, int, bool, list[str]]]]
"""One purge batch: (components purged, sessions purged, components blocked, more remaining,
purged Session ids)."""

Keep = Callable[[], Awaitable[str | None]]
"""Checked before every batch: ``None`` to go on, else why this replica must stop."""

LEASE_LOST = "this replica is no longer the maintenance worker (worker lease lost)"
CLAIM_LOST = "the automatic run's claim expired and was taken by another worker"


class MaintenanceWorker:
    """Runs maintenance, one run at a time."""

    def __init__(
        self,
        *,
        settings: Settings,
        host: HostPort,
        gate: IdleGate,
        retention: RetentionPreferences,
        markers: CompletionMarkers,
        cleaner: ResourceCleaner,
        compactor: Compactor,
        clock: Clock,
        metrics: MaintenanceMetrics,
        lease: WorkerLease,
    ) -> None:
        self._settings = settings
        self._lease = lease
        self._host = host
        self._gate = gate
        self._retention = retention
        self._markers = markers
        self._cleaner = cleaner
        self._compactor = compactor
        self._clock = clock
        self._metrics = metrics
        self._lock = asyncio.Lock()
        self._draining = False
        self._tasks: set[asyncio.Task[RunRecord]] = set()
        self.current: RunRecord | None = None
        self.last: RunRecord | None = None

    def drain(self) -> None:
        """Stop the run in progress after its in-flight batch (ARCH-4); no new runs start."""
        self._draining = True

    @property
    def gate(self) -> IdleGate:
        """The idle gate the worker observes."""
        return self._gate

    @property
    def lease(self) -> WorkerLease:
        """The worker lease this replica runs under."""
        return self._lease

    @property
    def busy(self) -> bool:
        """Whether a run holds the worker."""
        return self._lock.locked()

    async def run_automatic(self, completion_spacing_ms: int) -> RunRecord | GateObservation | None:
        """One automatic run, the closed gate that kept it from starting, or ``None``.

        ``None``: this replica is a standby, or the day's run is done or claimed by another
        worker (checked atomically with the claim). The cutoff is fixed when the run
        starts; a retention change applies to the next run.
        """
        async with self._lock:
            if self._draining or not await self._lease.confirm():
                return None
            gate = await self._gate.observe()
            if not gate.open:
                return gate
            now = self._clock.now_ms()
            claim_ms = int(self._settings.maintenance_run_claim_seconds * 1000)
            token = await self._markers.claim_automatic(now, completion_spacing_ms, claim_ms)
            if token is None:
                _log.info("automatic maintenance run not claimed: done or claimed elsewhere")
                return None
            claim = [token]

            async def keep() -> str | None:
                if not await self._lease.confirm():
                    return LEASE_LOST
                renewed = await self._markers.renew_claim(claim[0], self._clock.now_ms(), claim_ms)
                if renewed is None:
                    return CLAIM_LOST
                claim[0] = renewed
                return None

            cutoff = (await self._retention.get()).cutoff_unix_ms(now)
            run = self._begin(Trigger.AUTOMATIC, purge_cutoff_unix_ms=cutoff)
            self._metrics.runs_automatic += 1
            settings = self._settings

            async def batch() -> tuple[int, int, int, bool, list[str]]:
                result = await self._host.purge_expired(
                    cutoff,
                    settings.maintenance_batch_max_trees,
                    settings.maintenance_batch_max_rows,
                    settings.maintenance_batch_max_bytes,
                )
                self._metrics.rows_purged += result.rows
                return (
                    result.trees,
                    len(result.purged),
                    result.blocked,
                    result.more_remaining,
                    [session for _, session in result.purged],
                )

            try:
                await self._drive(run, batch, keep)
            finally:
                # Only a run that drained all eligible work counts for the day (MAINT-SCHED-1);
                # any other end frees the claim for the next check. A crash leaves the claim
                # to expire (TUTTI_MAINTENANCE_RUN_CLAIM_SECONDS), and so does a finish the
                # store refuses: the run is then retried after the expiry, never twice at once.
                try:
                    await self._markers.finish_claim(
                        claim[0], self._clock.now_ms(), completed=run.state is RunState.COMPLETED
                    )
                except Exception:  # noqa: BLE001 - the run's outcome stands; the claim expires
                    _log.exception("automatic run claim not finished", extra={"run_id": run.run_id})
            return self._finish(run)

    async def retry_cleanups(self) -> CleanupPass | None:
        """A cleanup pass in an idle window between runs; ``None`` when the gate is closed."""
        async with self._lock:
            if self._draining or not await self._lease.confirm():
                return None
            if not (await self._gate.observe()).open:
                return None
            try:
                return await self._cleaner.run_pass()
            except HostUnavailable as error:
                _log.warning("cleanup pass stopped: Host unavailable", extra={"error": str(error)})
                return None

    async def run_manual(
        self, workspace_id: str, session_id: str | None, compact: bool
    ) -> RunRecord:
        """One manual purge of a workspace (or one component), behind the idle gate.

        Waiting for the worker is bounded by the caller (its deadline cancels the wait);
        once the run has started it finishes even if the caller goes away, and its result
        is the status's ``last_run``.

        Raises:
            FailedPrecondition: ``AGENT_ACTIVE`` with ``RetryInfo`` — a Turn is active when
                the worker reaches the request; nothing changed.
            Unavailable: ``ACTIVITY_STATE_UNAVAILABLE`` (the gate fails closed),
                ``HOST_UNAVAILABLE``, ``DRAINING`` or ``WORKER_STANDBY`` (another replica is
                the worker, SCALE-5), with ``RetryInfo``; nothing changed.
            DomainError: Host's refusal of the target (``SESSION_NOT_FOUND``...), unchanged.
        """
        await self._lock.acquire()
        task = asyncio.create_task(self._manual(workspace_id, session_id, compact))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def _manual(self, workspace_id: str, session_id: str | None, compact: bool) -> RunRecord:
        try:
            if self._draining:
                raise Unavailable(
                    "maintenance is shutting down", reason="DRAINING", retry_after_seconds=1.0
                )
            # The target is checked by Host's own rules before anything else, so a bad
            # request is refused the same way whether or not agents are busy.
            await self._workspace_batch(workspace_id, session_id, dry_run=True)
            if not await self._lease.confirm():
                # Only the lease holder purges, so a manual run never overlaps the holder's.
                raise Unavailable(
                    "this maintenance replica is a standby; another replica is the worker",
                    reason="WORKER_STANDBY",
                    retry_after_seconds=self._lease.retry_after_seconds,
                )
            self._refuse_closed(await self._gate.observe())
            run = self._begin(Trigger.MANUAL, workspace_id=workspace_id)
            self._metrics.runs_manual += 1

            async def batch() -> tuple[int, int, int, bool, list[str]]:
                return await self._workspace_batch(workspace_id, session_id)

            async def keep() -> str | None:
                return None if await self._lease.confirm() else LEASE_LOST

            await self._drive(run, batch, keep)
            if compact:
                await self._compact(run)
            return self._finish(run)
        finally:
            self._lock.release()

    async def wait_idle(self, timeout_seconds: float) -> None:
        """Wait (bounded) until no run holds the worker (service stop, after :meth:`drain`).

        A drained run ends after its in-flight batch, so the stop does not cancel it in the
        middle of a Host call.
        """

        async def idle() -> None:
            if self._tasks:
                await asyncio.wait(set(self._tasks))
            async with self._lock:
                pass

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(idle(), timeout_seconds)

    async def _workspace_batch(
        self, workspace_id: str, session_id: str | None, *, dry_run: bool = False
    ) -> tuple[int, int, int, bool, list[str]]:
        try:
            result = await self._host.purge_workspace(
                workspace_id,
                session_id,
                1 if dry_run else self._settings.maintenance_manual_batch_components,
                dry_run=dry_run,
            )
        except HostUnavailable as error:
            if not dry_run:
                raise
            raise Unavailable(
                "Host is unavailable; try again",
                reason="HOST_UNAVAILABLE",
                metadata={"code": error.code},
                retry_after_seconds=5.0,
            ) from None
        ids = list(result.purged_session_ids)
        return result.components, len(ids), result.blocked, result.more_remaining, ids

    def _refuse_closed(self, gate: GateObservation) -> None:
        if gate.state is GateState.AGENT_ACTIVE:
            raise FailedPrecondition(
                "an agent Turn is active; maintenance waits for an idle system",
                reason="AGENT_ACTIVE",
                metadata={"active_workspace_count": str(len(gate.active_workspaces))},
                retry_after_seconds=self._settings.maintenance_agent_active_retry_seconds,
            )
        if gate.state is GateState.ACTIVITY_STATE_UNAVAILABLE:
            raise Unavailable(
                "Host's activity state cannot be read, so the idle gate stays closed",
                reason="ACTIVITY_STATE_UNAVAILABLE",
                retry_after_seconds=5.0,
            )

    def _begin(self, trigger: Trigger, **fields: object) -> RunRecord:
        run = RunRecord(
            run_id=uuid.uuid4().hex,
            trigger=trigger,
            started_at_unix_ms=self._clock.now_ms(),
            **fields,  # type: ignore[arg-type]
        )
        self.current = run
        _log.info(
            "maintenance run started",
            extra={
                "run_id": run.run_id,
                "trigger": trigger.value,
                "workspace_id": run.workspace_id,
            },
        )
        return run

    async def _drive(self, run: RunRecord, batch: Batch, keep: Keep) -> None:
        """Batches until the work is drained, the gate closes, Host fails or a drain begins.

        ``keep`` is checked before every batch: a replica that stopped being the worker
        stops there.
        """
        try:
            run.cleanup += await self._cleaner.run_pass()
            while True:
                lost = await keep()
                if lost is not None:
                    run.state = RunState.STOPPED_DRAINING
                    run.detail = lost
                    return
                components, sessions, blocked, more, ids = await batch()
                run.batches_completed += 1
                run.components_purged += components
                run.sessions_purged += sessions
                # Every batch rescans and meets the same blocked trees: keep the largest count.
                run.components_blocked = max(run.components_blocked, blocked)
                run.more_remaining = more
                run.purged_session_ids.extend(ids)
                self._metrics.batches += 1
                self._metrics.sessions_purged += sessions
                if components or ids:
                    run.cleanup += await self._cleaner.run_pass()
                if not more:
                    run.state = RunState.COMPLETED
                    return
                if components == 0:
                    # Host reports more but removed nothing: do not spin on it.
                    run.state = RunState.FAILED
                    run.detail = "Host reported remaining work but purged nothing"
                    return
                if self._draining:
                    run.state = RunState.STOPPED_DRAINING
                    return
                gate = await self._gate.observe()
                if not gate.open:
                    run.state = (
                        RunState.STOPPED_AGENT_ACTIVE
                        if gate.state is GateState.AGENT_ACTIVE
                        else RunState.STOPPED_HOST_UNAVAILABLE
                    )
                    run.detail = gate.detail or (
                        f"a Turn became active in {len(gate.active_workspaces)} workspace(s)"
                    )
                    return
        except HostUnavailable as error:
            run.state = RunState.STOPPED_HOST_UNAVAILABLE
            run.detail = str(error)
        except DomainError as error:
            # Host refused a later batch of a manual purge; what committed stands.
            run.state = RunState.FAILED
            run.detail = f"{error.reason}: {error.message}"
        except Exception as error:  # noqa: BLE001 - the run ends FAILED, the worker lives on
            _log.exception("maintenance run failed", extra={"run_id": run.run_id})
            run.state = RunState.FAILED
            run.detail = type(error).__name__

    async def _compact(self, run: RunRecord) -> None:
        """Compaction after the final batch, only on a drained, still idle system."""
        if run.state is not RunState.COMPLETED:
            run.compaction = "SKIPPED_RUN_INCOMPLETE"
            return
        if not (await self._gate.observe()).open:
            run.compaction = "SKIPPED_AGENT_ACTIVE"
            return
        result = await self._compactor.compact()
        run.compaction = result.outcome.name
        run.compaction_result = result

    def _finish(self, run: RunRecord) -> RunRecord:
        run.finished_at_unix_ms = self._clock.now_ms()
        if run.state is RunState.COMPLETED:
            self._metrics.runs_completed += 1
        else:
            self._metrics.runs_stopped += 1
        self.current = None
        self.last = run
        _log.info(
            "maintenance run finished",
            extra={
                "run_id": run.run_id,
                "trigger": run.trigger.value,
                "state": run.state.value,
                "batches": run.batches_completed,
                "sessions_purged": run.sessions_purged,
                "detail": run.detail,
            },
        )
        return run
