"""Maintenance's own durable rows: the daily completion marker and cleanup attempts.

These are the only tables maintenance writes (ARCH-2): ``maintenance_markers`` holds the
completion marker of automatic runs (MAINT-SCHED-1), written only after a run drained all
eligible work; ``maintenance_cleanup_attempts`` holds attempts and backoff of resource-cleanup
rows whose release failed (MAINT-OUT-1). The cleanup rows themselves are Host's, read only
through Host RPCs, so nothing here can resurrect or change one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import delete, insert, select, tuple_, update

from store.database import Database
from store.models import MaintenanceCleanupAttempt, MaintenanceMarker
from store.transactions import write_connection

__all__ = ["AUTOMATIC_RUN_MARKER", "CleanupAttempt", "CleanupAttempts", "CompletionMarkers"]

AUTOMATIC_RUN_MARKER = "automatic_run_completed"
"""Name of the marker row of the daily automatic run."""


class CompletionMarkers:
    """Reads and writes named completion markers."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def get(self, name: str = AUTOMATIC_RUN_MARKER) -> int | None:
        """When the marker was last written (Unix ms), or ``None`` if never."""
        async with self._database.engine.connect() as connection:
            value = (
                await connection.execute(
                    select(MaintenanceMarker.completed_at_unix_ms).where(
                        MaintenanceMarker.name == name
                    )
                )
            ).scalar_one_or_none()
        return None if value is None else int(value)

    async def record(self, completed_at_unix_ms: int, name: str = AUTOMATIC_RUN_MARKER) -> None:
        """Write the marker (insert or move it forward; never backwards)."""
        async with write_connection(self._database.engine) as connection:
            stored = (
                await connection.execute(
                    select(MaintenanceMarker.completed_at_unix_ms).where(
                        MaintenanceMarker.name == name
                    )
                )
            ).scalar_one_or_none()
            if stored is None:
                await connection.execute(
                    insert(MaintenanceMarker).values(
                        name=name, completed_at_unix_ms=completed_at_unix_ms
                    )
                )
            elif stored < completed_at_unix_ms:
                await connection.execute(
                    update(MaintenanceMarker)
                    .where(MaintenanceMarker.name == name)
                    .values(completed_at_unix_ms=completed_at_unix_ms)
                )


@dataclass(frozen=True)
class CleanupAttempt:
    """Failed attempts of one cleanup row and when it may be retried."""

    workspace_id: str
    session_id: str
    attempts: int
    next_attempt_at_unix_ms: int
    last_error: str
    updated_at_unix_ms: int


def _attempt(row: object) -> CleanupAttempt:
    return CleanupAttempt(
        workspace_id=row.workspace_id,  # type: ignore[attr-defined]
        session_id=row.session_id,  # type: ignore[attr-defined]
        attempts=row.attempts,  # type: ignore[attr-defined]
        next_attempt_at_unix_ms=row.next_attempt_at_unix_ms,  # type: ignore[attr-defined]
        last_error=row.last_error or "",  # type: ignore[attr-defined]
        updated_at_unix_ms=row.updated_at_unix_ms,  # type: ignore[attr-defined]
    )


_COLUMNS = (
    MaintenanceCleanupAttempt.workspace_id,
    MaintenanceCleanupAttempt.session_id,
    MaintenanceCleanupAttempt.attempts,
    MaintenanceCleanupAttempt.next_attempt_at_unix_ms,
    MaintenanceCleanupAttempt.last_error,
    MaintenanceCleanupAttempt.updated_at_unix_ms,
)


class CleanupAttempts:
    """Attempts and backoff per (workspace, Session) cleanup row."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def all(self) -> list[CleanupAttempt]:
        """Every recorded failing row, soonest retry first."""
        async with self._database.engine.connect() as connection:
            rows = (
                await connection.execute(
                    select(*_COLUMNS).order_by(
                        MaintenanceCleanupAttempt.next_attempt_at_unix_ms,
                        MaintenanceCleanupAttempt.workspace_id,
                        MaintenanceCleanupAttempt.session_id,
                    )
                )
            ).all()
        return [_attempt(row) for row in rows]

    async def record_failure(
        self, workspace_id: str, session_id: str, error: str, now_ms: int, backoff: BackoffPolicy
    ) -> CleanupAttempt:
        """Count one more failed attempt and schedule the next after backoff."""
        key = (
            MaintenanceCleanupAttempt.workspace_id == workspace_id,
            MaintenanceCleanupAttempt.session_id == session_id,
        )
        async with write_connection(self._database.engine) as connection:
            previous = (
                await connection.execute(select(MaintenanceCleanupAttempt.attempts).where(*key))
            ).scalar_one_or_none()
            attempts = (previous or 0) + 1
            values = {
                "attempts": attempts,
                "next_attempt_at_unix_ms": now_ms + backoff.delay_ms(attempts),
                "last_error": error[:500],
                "updated_at_unix_ms": now_ms,
            }
            if previous is None:
                await connection.execute(
                    insert(MaintenanceCleanupAttempt).values(
                        workspace_id=workspace_id, session_id=session_id, **values
                    )
                )
            else:
                await connection.execute(
                    update(MaintenanceCleanupAttempt).where(*key).values(**values)
                )
            row = (await connection.execute(select(*_COLUMNS).where(*key))).one()
        return _attempt(row)

    async def forget(self, keys: Iterable[tuple[str, str]]) -> None:
        """Drop the attempts of rows that were completed (or no longer exist on Host)."""
        pending = list(keys)
        if not pending:
            return
        async with write_connection(self._database.engine) as connection:
            for start in range(0, len(pending), 500):
                await connection.execute(
                    delete(MaintenanceCleanupAttempt).where(
                        tuple_(
                            MaintenanceCleanupAttempt.workspace_id,
                            MaintenanceCleanupAttempt.session_id,
                        ).in_(pending[start : start + 500])
                    )
                )


@dataclass(frozen=True)
class BackoffPolicy:
    """Exponential backoff of cleanup retries: ``base * 2**(attempts-1)``, capped."""

    base_seconds: float
    max_seconds: float

    def delay_ms(self, attempts: int) -> int:
        """Delay after the ``attempts``-th failure."""
        exponent = min(max(attempts - 1, 0), 30)
        return int(min(self.base_seconds * (2**exponent), self.max_seconds) * 1000)
