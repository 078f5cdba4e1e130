"""The maintenance status read (MAINT-STAT-1): a snapshot composed from every part.

Nothing here changes anything: the idle gate is observed (a Host read), the cleanup outbox is
listed, the database is measured and the optional preview lists a workspace's topmost
tombstones. Workspace-specific detail (active workspace ids, failing cleanup rows) is limited
to the caller's workspaces; counts are deployment-wide.
"""

from __future__ import annotations

from dataclasses import dataclass

from domainerrors import Unavailable
from services.maintenance.clock import Clock
from services.maintenance.compaction import Compactor, DatabaseMeasurement
from services.maintenance.host_port import HostPort, HostUnavailable, PendingPage
from services.maintenance.idle_gate import GateObservation
from services.maintenance.records import CleanupAttempt, CleanupAttempts, CompletionMarkers
from services.maintenance.retention import RetentionPreference, RetentionPreferences
from services.maintenance.scheduler import Scheduler
from services.maintenance.worker import MaintenanceWorker, RunRecord

__all__ = ["CleanupStatus", "MaintenanceStatus", "PurgePreview", "StatusReader"]

PENDING_COUNT_CAP = 1000
"""Pending cleanup rows counted by a status read; beyond it the count is a lower bound."""
FAILING_LISTED = 50
PREVIEW_PAGE = 200
PREVIEW_MAX_PAGES = 50


@dataclass(frozen=True)
class CleanupStatus:
    """Pending and failing cleanup rows."""

    pending_rows: int
    pending_rows_capped: bool
    failing_rows: int
    failing: tuple[CleanupAttempt, ...]


@dataclass(frozen=True)
class PurgePreview:
    """What a workspace-wide manual purge would remove (counts only)."""

    workspace_id: str
    topmost_components: int
    sessions: int
    restorable_components: int
    non_restorable_components: int
    past_cutoff_components: int


@dataclass(frozen=True)
class MaintenanceStatus:
    """Everything ``GetMaintenanceStatus`` reports."""

    retention: RetentionPreference
    purge_cutoff_unix_ms: int
    last_completed_run_unix_ms: int | None
    next_check_unix_ms: int
    next_run_eligible_at_unix_ms: int | None
    paused_by_idle_gate: bool
    idle_gate: GateObservation
    current_run: RunRecord | None
    last_run: RunRecord | None
    cleanup: CleanupStatus
    database: DatabaseMeasurement
    compaction_max_size_bytes: int
    compaction_min_reclaimable_fraction: float
    compaction_eligible: bool
    preview: PurgePreview | None
    generated_at_unix_ms: int


class StatusReader:
    """Composes :class:`MaintenanceStatus`."""

    def __init__(
        self,
        *,
        host: HostPort,
        retention: RetentionPreferences,
        markers: CompletionMarkers,
        attempts: CleanupAttempts,
        compactor: Compactor,
        worker: MaintenanceWorker,
        scheduler: Scheduler,
        clock: Clock,
    ) -> None:
        self._host = host
        self._retention = retention
        self._markers = markers
        self._attempts = attempts
        self._compactor = compactor
        self._worker = worker
        self._scheduler = scheduler
        self._clock = clock

    async def read(
        self, scope: frozenset[str] | None, preview_workspace_id: str | None
    ) -> MaintenanceStatus:
        """The status as seen by a principal whose workspaces are ``scope`` (``None``: all).

        Raises:
            DomainError: Host refused the preview's workspace (passed through).
        """
        now = self._clock.now_ms()
        retention = await self._retention.get()
        cutoff = retention.cutoff_unix_ms(now)
        marker = await self._markers.get()
        gate = await self._worker.gate.observe()
        measurement = await self._compactor.measure()
        schedule = self._scheduler.schedule
        preview = (
            await self._preview(preview_workspace_id, cutoff)
            if preview_workspace_id is not None
            else None
        )
        return MaintenanceStatus(
            retention=retention,
            purge_cutoff_unix_ms=cutoff,
            last_completed_run_unix_ms=marker,
            next_check_unix_ms=self._scheduler.next_check_unix_ms or now,
            next_run_eligible_at_unix_ms=(
                None if marker is None else marker + schedule.completion_spacing_ms
            ),
            paused_by_idle_gate=self._scheduler.paused_since_unix_ms is not None
            or (schedule.due(marker, now) and not gate.open),
            idle_gate=gate,
            current_run=self._worker.current,
            last_run=self._worker.last,
            cleanup=await self._cleanup(scope),
            database=measurement,
            compaction_max_size_bytes=self._compactor.max_size_bytes,
            compaction_min_reclaimable_fraction=self._compactor.min_reclaimable_fraction,
            compaction_eligible=self._compactor.eligible(measurement) is None,
            preview=preview,
            generated_at_unix_ms=self._clock.now_ms(),
        )

    async def _cleanup(self, scope: frozenset[str] | None) -> CleanupStatus:
        try:
            page = await self._host.pending_cleanups("", PENDING_COUNT_CAP)
        except HostUnavailable:
            # Without Host the pending count is unknown: report what maintenance knows (its
            # failure records) and mark the count as a lower bound.
            page = PendingPage(rows=(), next_cursor="unknown")
        pending = {(row.workspace_id, row.session_id) for row in page.rows}
        capped = bool(page.next_cursor)
        attempts = await self._attempts.all()
        failing = [a for a in attempts if capped or (a.workspace_id, a.session_id) in pending]
        visible = [a for a in failing if scope is None or a.workspace_id in scope]
        return CleanupStatus(
            pending_rows=len(page.rows),
            pending_rows_capped=capped,
            failing_rows=len(failing),
            failing=tuple(visible[:FAILING_LISTED]),
        )

    async def _preview(self, workspace_id: str, cutoff: int) -> PurgePreview:
        components = sessions = restorable = past_cutoff = 0
        cursor = ""
        for _ in range(PREVIEW_MAX_PAGES):
            try:
                page = await self._host.deleted_sessions(workspace_id, cursor, PREVIEW_PAGE)
            except HostUnavailable as error:
                raise Unavailable(
                    "Host is unavailable, so the preview cannot be computed; try again",
                    reason="HOST_UNAVAILABLE",
                    metadata={"code": error.code},
                    retry_after_seconds=5.0,
                ) from None
            for tree in page.trees:
                components += 1
                sessions += tree.tree_size
                restorable += tree.restorable
                past_cutoff += tree.deleted_at_unix_ms <= cutoff
            cursor = page.next_cursor
            if not cursor:
                break
        return PurgePreview(
            workspace_id=workspace_id,
            topmost_components=components,
            sessions=sessions,
            restorable_components=restorable,
            non_restorable_components=components - restorable,
            past_cutoff_components=past_cutoff,
        )
