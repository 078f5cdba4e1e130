"""Resource cleanup from Host's outbox (HOST-CLEAN-1, MAINT-OUT-1).

One pass lists every pending outbox row with its ownership facts, releases each Session's
resources (:func:`session_resources.release.release_resources` decides the three classes from
those facts) and completes the released rows on Host in one ``CompleteResourceCleanups`` call.
A row whose release fails stays pending on Host and gets an attempt record here with
exponential backoff; later passes skip it until its retry is due. A failure therefore never
changes the purge that wrote the row, and nothing here writes a Host row except through that
completion, so no row is resurrected.

Rows without an attempt record are attempted at once: that is both the immediate attempt right
after a purge batch and the recovery of rows a crashed process left behind.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from services.maintenance.clock import Clock
from services.maintenance.host_port import MAX_COMPLETIONS, HostPort, PendingCleanup
from services.maintenance.metrics import MaintenanceMetrics
from services.maintenance.records import BackoffPolicy, CleanupAttempts
from session_resources.layout import ResourceLayout
from session_resources.release import CleanupFacts, ResourceReleaseError, release_resources

__all__ = ["CleanupPass", "ResourceCleaner"]

_log = logging.getLogger(__name__)

PAGE_LIMIT = 1000
MAX_ROWS_PER_PASS = 20_000
"""Bound of one pass; the rest waits for the next pass (rows are ordered oldest first)."""


@dataclass(frozen=True)
class CleanupPass:
    """What one pass did (the ``CleanupSummary`` of a run)."""

    attempted: int = 0
    completed: int = 0
    failed: int = 0

    def __add__(self, other: CleanupPass) -> CleanupPass:
        return CleanupPass(
            self.attempted + other.attempted,
            self.completed + other.completed,
            self.failed + other.failed,
        )


class ResourceCleaner:
    """Releases resources of purged Sessions and completes their outbox rows."""

    def __init__(
        self,
        host: HostPort,
        attempts: CleanupAttempts,
        layout: ResourceLayout,
        clock: Clock,
        backoff: BackoffPolicy,
        metrics: MaintenanceMetrics,
    ) -> None:
        self._host = host
        self._attempts = attempts
        self._layout = layout
        self._clock = clock
        self._backoff = backoff
        self._metrics = metrics

    async def pending(self) -> list[PendingCleanup]:
        """Every pending row on Host, oldest first, bounded by :data:`MAX_ROWS_PER_PASS`."""
        rows: list[PendingCleanup] = []
        cursor = ""
        while len(rows) < MAX_ROWS_PER_PASS:
            page = await self._host.pending_cleanups(cursor, PAGE_LIMIT)
            rows.extend(page.rows)
            cursor = page.next_cursor
            if not cursor:
                break
        return rows

    async def run_pass(self) -> CleanupPass:
        """Attempt every pending row that has no failure record or whose retry is due.

        Raises:
            HostUnavailable: Host could not be asked; rows stay pending for the next pass.
        """
        rows = await self.pending()
        known = {(a.workspace_id, a.session_id): a for a in await self._attempts.all()}
        stale = set(known) - {(r.workspace_id, r.session_id) for r in rows}
        if stale and len(rows) < MAX_ROWS_PER_PASS:
            # Completed elsewhere (another pass, an operator): the backoff record is moot.
            await self._attempts.forget(stale)
        now = self._clock.now_ms()
        summary = CleanupPass()
        due = [
            (row, known.get((row.workspace_id, row.session_id)))
            for row in rows
            if (attempt := known.get((row.workspace_id, row.session_id))) is None
            or attempt.next_attempt_at_unix_ms <= now
        ]
        self._metrics.cleanup_retries += sum(1 for _, previous in due if previous is not None)
        # The filesystem work of the whole pass in one worker thread (not one hop per row).
        errors = await asyncio.to_thread(self._release_all, [row for row, _ in due])
        released: list[tuple[str, str]] = []
        for (row, _), error in zip(due, errors, strict=True):
            if error is None:
                released.append((row.workspace_id, row.session_id))
            else:
                await self._record_failure(row, error)
                summary += CleanupPass(attempted=1, failed=1)
        # One Host commit per chunk instead of one per row; if Host fails here the rows stay
        # pending and the next pass releases them again (idempotent) before completing.
        for start in range(0, len(released), MAX_COMPLETIONS):
            chunk = released[start : start + MAX_COMPLETIONS]
            await self._host.complete_cleanups(chunk)
            self._metrics.cleanups_completed += len(chunk)
            summary += CleanupPass(attempted=len(chunk), completed=len(chunk))
        await self._attempts.forget(k for k in released if k in known)
        return summary

    def _release_all(self, rows: list[PendingCleanup]) -> list[str | None]:
        """Release each row's resources (in a worker thread); per row ``None`` or the error."""
        errors: list[str | None] = []
        for row in rows:
            facts = CleanupFacts(
                workspace_id=row.workspace_id,
                session_id=row.session_id,
                id_owned_anywhere=row.id_owned_anywhere,
                live_owner_in_other_workspace=row.live_owner_in_other_workspace,
            )
            try:
                release_resources(self._layout, facts)
            except (ResourceReleaseError, ValueError) as error:
                errors.append(str(error))
            else:
                errors.append(None)
        return errors

    async def _record_failure(self, row: PendingCleanup, error: str) -> None:
        failure = await self._attempts.record_failure(
            row.workspace_id, row.session_id, error, self._clock.now_ms(), self._backoff
        )
        self._metrics.cleanup_failures += 1
        _log.warning(
            "resource cleanup failed; retried after backoff",
            extra={
                "workspace_id": row.workspace_id,
                "session_id": row.session_id,
                "attempts": failure.attempts,
                "next_attempt_at_unix_ms": failure.next_attempt_at_unix_ms,
                "error": error,
            },
        )
