"""``activity_events`` rows: append under the ordering lock, read, prune (HOST-OBS-1/2).

Ids are the feed cursor. SQLite serializes writers, so ids commit in id order there. Postgres
assigns identity values at insert, not at commit, so two transactions could commit ids out of
order and a reader of ``id > cursor`` could skip the slower one's rows (ADR 0011, "Open").
Every append therefore takes :data:`EVENT_APPEND_LOCK` with ``pg_advisory_xact_lock`` first:
the lock is held until the appending transaction ends, so a later append cannot even insert
(and get a higher id) before the earlier one committed or rolled back.

These functions take a *synchronous* :class:`~sqlalchemy.orm.Session`: the appender runs in the
ORM ``before_commit`` hook of the transaction it belongs to (inside the asyncio greenlet, as
SQLAlchemy documents for event handlers), while readers use :class:`EventReader` on an
``AsyncSession``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session as OrmSession

from store.models import ActivityEvent

__all__ = [
    "EVENT_APPEND_LOCK",
    "EventReader",
    "NewEventRow",
    "StoredEvent",
    "append_rows",
    "is_postgres",
]

EVENT_APPEND_LOCK = 0x7475_7474_6965_7631
"""``pg_advisory_xact_lock`` key that serializes activity-event appends on Postgres (one key
for every writer of the log, deletion included, so ids commit in id order)."""

_PRUNE_CHUNK = 10_000


@dataclass(frozen=True)
class NewEventRow:
    """A row to append: the serialized ``ActivityEvent`` and its routing columns."""

    workspace_id: str
    session_id: str | None
    event_type: str
    payload: bytes
    created_at_unix_ms: int


@dataclass(frozen=True)
class StoredEvent:
    """A committed row: ``event_id`` is the cursor; ``payload`` the serialized event."""

    event_id: int
    workspace_id: str
    session_id: str | None
    event_type: str
    payload: bytes
    created_at_unix_ms: int


def is_postgres(db: OrmSession) -> bool:
    """Whether the transaction runs on Postgres."""
    return db.connection().dialect.name == "postgresql"


def append_rows(db: OrmSession, rows: Sequence[NewEventRow]) -> dict[str, tuple[int, list[int]]]:
    """Append rows in order under the append lock; per workspace: previous id and new ids.

    The previous id (the workspace's highest committed event id before this append, 0 when
    none) is exact because appends are serialized: a live subscriber that already emitted it
    can emit the new rows directly, without a read (see ``services.host.activity_watch``).
    """
    if not rows:
        return {}
    if is_postgres(db):
        db.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": EVENT_APPEND_LOCK})
    result: dict[str, tuple[int, list[int]]] = {}
    for row in rows:
        if row.workspace_id not in result:
            previous = db.execute(
                select(func.max(ActivityEvent.id)).where(
                    ActivityEvent.workspace_id == row.workspace_id
                )
            ).scalar_one_or_none()
            result[row.workspace_id] = (int(previous or 0), [])
        new_id = db.execute(
            insert(ActivityEvent)
            .values(
                workspace_id=row.workspace_id,
                session_id=row.session_id,
                event_type=row.event_type,
                payload=row.payload,
                created_at_unix_ms=row.created_at_unix_ms,
            )
            .returning(ActivityEvent.id)
        ).scalar_one()
        result[row.workspace_id][1].append(int(new_id))
    return result


def _stored(row: ActivityEvent) -> StoredEvent:
    return StoredEvent(
        event_id=row.id,
        workspace_id=row.workspace_id,
        session_id=row.session_id,
        event_type=row.event_type,
        payload=row.payload,
        created_at_unix_ms=row.created_at_unix_ms,
    )


@dataclass(frozen=True)
class LogBounds:
    """Where a workspace's feed stands: its head, the log's head and oldest retained id."""

    workspace_head: int
    global_head: int
    oldest_retained: int | None


class EventReader:
    """Reads and prunes the log inside one ``AsyncSession`` transaction."""

    def __init__(self, session: AsyncSession) -> None:
        self._db = session

    async def bounds(self, workspace_id: str) -> LogBounds:
        """The workspace head (0 when empty), the log head and the oldest retained id."""
        workspace_head = (
            await self._db.execute(
                select(func.max(ActivityEvent.id)).where(ActivityEvent.workspace_id == workspace_id)
            )
        ).scalar_one_or_none()
        global_head, oldest = (
            await self._db.execute(select(func.max(ActivityEvent.id), func.min(ActivityEvent.id)))
        ).one()
        return LogBounds(
            workspace_head=int(workspace_head or 0),
            global_head=int(global_head or 0),
            oldest_retained=None if oldest is None else int(oldest),
        )

    async def after(
        self, workspace_id: str, after_id: int, *, up_to: int | None, limit: int
    ) -> list[StoredEvent]:
        """Up to ``limit`` events of the workspace with ``after_id < id <= up_to``, in id order."""
        query = select(ActivityEvent).where(
            ActivityEvent.workspace_id == workspace_id, ActivityEvent.id > after_id
        )
        if up_to is not None:
            query = query.where(ActivityEvent.id <= up_to)
        query = query.order_by(ActivityEvent.id).limit(limit)
        return [_stored(row) for row in (await self._db.execute(query)).scalars()]

    async def prune(self, *, older_than_unix_ms: int, keep_newest: int) -> int:
        """Delete rows older than the cutoff or beyond the newest ``keep_newest``.

        The newest row always stays, so the oldest retained id stays defined and an
        expired cursor can be told from an empty log. Deletes in id chunks.

        Returns:
            How many rows were deleted.
        """
        newest = (await self._db.execute(select(func.max(ActivityEvent.id)))).scalar_one_or_none()
        if newest is None:
            return 0
        by_age = (
            await self._db.execute(
                select(func.max(ActivityEvent.id)).where(
                    ActivityEvent.created_at_unix_ms < older_than_unix_ms
                )
            )
        ).scalar_one_or_none()
        by_size = (
            await self._db.execute(
                select(ActivityEvent.id)
                .order_by(ActivityEvent.id.desc())
                .offset(max(1, keep_newest))
                .limit(1)
            )
        ).scalar_one_or_none()
        through = min(max(int(by_age or 0), int(by_size or 0)), int(newest) - 1)
        if through <= 0:
            return 0
        deleted = 0
        oldest = (await self._db.execute(select(func.min(ActivityEvent.id)))).scalar_one()
        start = int(oldest)
        while start <= through:
            stop = min(through, start + _PRUNE_CHUNK - 1)
            result = await self._db.execute(
                delete(ActivityEvent).where(ActivityEvent.id >= start, ActivityEvent.id <= stop)
            )
            deleted += int(getattr(result, "rowcount", 0) or 0)
            start = stop + 1
        return deleted
