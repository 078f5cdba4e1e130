"""Maintenance's own durable rows: the daily completion marker and cleanup attempts.

These are the only tables maintenance writes (ARCH-2): ``maintenance_markers`` holds the
completion marker of automatic runs (MAINT-SCHED-1), written only after a run drained all
eligible work, and the claim of the automatic run in progress (SCALE-5, ADR 0035);
``maintenance_cleanup_attempts`` holds attempts and backoff of resource-cleanup
rows whose release failed (MAINT-OUT-1). The cleanup rows themselves are Host's, read only
through Host RPCs, so nothing here can resurrect or change one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import delete, insert, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import Executable

from store.database import Database
from store.models import MaintenanceCleanupAttempt, MaintenanceMarker
from store.transactions import write_connection

__all__ = [
    "AUTOMATIC_RUN_CLAIM",
    "AUTOMATIC_RUN_MARKER",
    "CleanupAttempt",
    "CleanupAttempts",
    "CompletionMarkers",
]

AUTOMATIC_RUN_MARKER = "automatic_run_completed"
"""Name of the marker row of the daily automatic run."""

AUTOMATIC_RUN_CLAIM = "automatic_run_claim"
"""Name of the row that claims the automatic run in progress. Its instant is when the claim
expires: in the past (or 0) means free. The instant a claimer wrote is also its token: every
claim writes a later instant than the one it replaced, so a token names one claim."""


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

    async def claim_automatic(self, now_ms: int, spacing_ms: int, claim_ms: int) -> int | None:
        """Decide and claim the automatic run in one transaction (SCALE-5).

        The claim row is locked first (``FOR UPDATE`` on Postgres, ``BEGIN IMMEDIATE`` on
        SQLite), so deciders queue on it; the completion marker is read after that lock, so
        a decider that waited sees the run that finished meanwhile. Claimed only when no
        automatic run completed within ``spacing_ms`` and no other claim is live.

        Returns:
            The claim's token (its expiry), to renew and finish the claim; ``None`` when the
            run is not due or another worker's claim is live.
        """
        async with write_connection(self._database.engine) as connection:
            await connection.execute(_insert_ignoring_conflict(connection, AUTOMATIC_RUN_CLAIM))
            held_until = (
                await connection.execute(
                    select(MaintenanceMarker.completed_at_unix_ms)
                    .where(MaintenanceMarker.name == AUTOMATIC_RUN_CLAIM)
                    .with_for_update()
                )
            ).scalar_one()
            completed = (
                await connection.execute(
                    select(MaintenanceMarker.completed_at_unix_ms).where(
                        MaintenanceMarker.name == AUTOMATIC_RUN_MARKER
                    )
                )
            ).scalar_one_or_none()
            if held_until > now_ms:
                return None
            if completed is not None and now_ms < completed + spacing_ms:
                return None
            token = max(now_ms + claim_ms, held_until + 1)
            await connection.execute(
                update(MaintenanceMarker)
                .where(MaintenanceMarker.name == AUTOMATIC_RUN_CLAIM)
                .values(completed_at_unix_ms=token)
            )
        return token

    async def renew_claim(self, token: int, now_ms: int, claim_ms: int) -> int | None:
        """Extend a live claim (between batches); ``None`` when it is no longer this one."""
        renewed = max(now_ms + claim_ms, token + 1)
        async with write_connection(self._database.engine) as connection:
            result = await connection.execute(
                update(MaintenanceMarker)
                .where(
                    MaintenanceMarker.name == AUTOMATIC_RUN_CLAIM,
                    MaintenanceMarker.completed_at_unix_ms == token,
                )
                .values(completed_at_unix_ms=renewed)
            )
        return renewed if result.rowcount == 1 else None

    async def finish_claim(self, token: int, now_ms: int, *, completed: bool) -> None:
        """End a claim; a completed run also moves the daily marker, in the same transaction.

        A claim that is no longer this one (it expired and another worker took it) is left
        alone and the marker is not moved: that worker's run decides the day.
        """
        async with write_connection(self._database.engine) as connection:
            released = await connection.execute(
                update(MaintenanceMarker)
                .where(
                    MaintenanceMarker.name == AUTOMATIC_RUN_CLAIM,
                    MaintenanceMarker.completed_at_unix_ms == token,
                )
                .values(completed_at_unix_ms=0)
            )
            if completed and released.rowcount == 1:
                await _move_marker(connection, AUTOMATIC_RUN_MARKER, now_ms)


def _insert_ignoring_conflict(connection: AsyncConnection, name: str) -> Executable:
    """``INSERT .. ON CONFLICT DO NOTHING`` of a marker row at 0 (free), per dialect."""
    if connection.dialect.name == "postgresql":
        return (
            postgresql.insert(MaintenanceMarker)
            .values(name=name, completed_at_unix_ms=0)
            .on_conflict_do_nothing()
        )
    return (
        sqlite.insert(MaintenanceMarker)
        .values(name=name, completed_at_unix_ms=0)
        .on_conflict_do_nothing()
    )


async def _move_marker(connection: AsyncConnection, name: str, instant_ms: int) -> None:
    """Insert the marker or move it forward (never backwards)."""
    await connection.execute(_insert_ignoring_conflict(connection, name))
    await connection.execute(
        update(MaintenanceMarker)
        .where(
            MaintenanceMarker.name == name,
            MaintenanceMarker.completed_at_unix_ms < instant_ms,
        )
        .values(completed_at_unix_ms=instant_ms)
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
