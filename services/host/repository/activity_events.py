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

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from sqlalchemy import (
    BigInteger,
    Executable,
    Table,
    Text,
    and_,
    bindparam,
    column,
    delete,
    exists,
    func,
    insert,
    literal,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from store.models import ActivityEvent, ActivityEventRetention

__all__ = [
    "EVENT_APPEND_LOCK",
    "EVENT_PRUNE_LOCK",
    "EventLogRepository",
    "LogBounds",
    "NewEventRow",
    "StoredEvent",
]

EVENT_APPEND_LOCK = 0x7475_7474_6965_7631
"""``pg_advisory_xact_lock`` key that serializes activity-event appends on Postgres (one key
for every writer of the log, deletion included, so ids commit in id order)."""

EVENT_PRUNE_LOCK = 0x7475_7474_6965_7632
"""``pg_advisory_xact_lock`` key that serializes pruners (several Host replicas may run one)."""

_WORKSPACE_BATCH = 5_000
"""Workspaces per delete statement (two parameters each, under SQLite's 32,766)."""

_Retention = ActivityEventRetention
# Core tables: statements on them are not ORM-enabled (no session synchronization).
_EVENTS_TABLE: Final = cast(Table, ActivityEvent.__table__)
_RETENTION_TABLE: Final = cast(Table, ActivityEventRetention.__table__)


# Built once (compiled-statement cache): the append runs in every writing transaction.
_LOCK_APPENDS: Final = text("SELECT pg_advisory_xact_lock(:key)")
_WORKSPACE_HEAD: Final = select(func.max(_EVENTS_TABLE.c.id)).where(
    _EVENTS_TABLE.c.workspace_id == bindparam("workspace_id")
)
_INSERT_EVENTS: Final = insert(_EVENTS_TABLE).returning(
    _EVENTS_TABLE.c.id, sort_by_parameter_order=True
)


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
    """Where a workspace's feed stands.

    Attributes:
        workspace_head: The workspace's newest event id (0 when it has none).
        global_head: The log's newest event id; a cursor above it is from the future.
        oldest_retained: The lowest id from which the workspace's feed is complete: one more
            than the highest event id the pruner deleted from this workspace (1 when it
            deleted none). Every event of the workspace with this id or higher is retained,
            so a cursor below ``oldest_retained - 1`` has expired and any other has not.
            Other workspaces' pruning never moves it.
    """

    workspace_head: int
    global_head: int
    oldest_retained: int | None


class EventLogRepository:
    """Appends, reads and prunes the log inside one ``AsyncSession`` transaction."""

    def __init__(self, session: AsyncSession) -> None:
        self._db = session

    async def append(self, rows: Sequence[NewEventRow]) -> dict[str, tuple[int, list[int]]]:
        """Append rows in order under the append lock; per workspace: previous id and new ids.

        The previous id (the workspace's highest committed event id before this append, 0
        when none) is exact because appends are serialized: a live subscriber that already
        emitted it can emit the new rows directly, without a read
        (``services.host.activity.feed``). The rows go in as one ``INSERT`` with ids in row
        order (one statement on Postgres; SQLite's ``RETURNING`` order is unspecified, so
        SQLAlchemy sends that ordered insert one row at a time there).
        """
        if not rows:
            return {}
        if self._db.get_bind().dialect.name == "postgresql":
            await self._db.execute(_LOCK_APPENDS, {"key": EVENT_APPEND_LOCK})
        result: dict[str, tuple[int, list[int]]] = {}
        for row in rows:
            if row.workspace_id not in result:
                previous = (
                    await self._db.execute(_WORKSPACE_HEAD, {"workspace_id": row.workspace_id})
                ).scalar_one_or_none()
                result[row.workspace_id] = (int(previous or 0), [])
        # One multi-row INSERT for the whole set; SQLAlchemy returns the ids in the order of
        # the parameter rows (``sort_by_parameter_order``), so row i gets the i-th id.
        new_ids = (
            await self._db.execute(
                _INSERT_EVENTS,
                [
                    {
                        "workspace_id": row.workspace_id,
                        "session_id": row.session_id,
                        "event_type": row.event_type,
                        "payload": row.payload,
                        "created_at_unix_ms": row.created_at_unix_ms,
                    }
                    for row in rows
                ],
            )
        ).scalars()
        for row, new_id in zip(rows, new_ids, strict=True):
            result[row.workspace_id][1].append(int(new_id))
        return result

    async def bounds(self, workspace_id: str) -> LogBounds:
        """The workspace head (0 when empty), the log head and the workspace's retention bound."""
        workspace_head = (
            await self._db.execute(
                select(func.max(ActivityEvent.id)).where(ActivityEvent.workspace_id == workspace_id)
            )
        ).scalar_one_or_none()
        global_head = (await self._db.execute(select(func.max(ActivityEvent.id)))).scalar_one()
        return LogBounds(
            workspace_head=int(workspace_head or 0),
            global_head=int(global_head or 0),
            oldest_retained=await self.pruned_through(workspace_id) + 1,
        )

    async def pruned_through(self, workspace_id: str) -> int:
        """The highest event id the pruner deleted from the workspace (0 when none)."""
        pruned = (
            await self._db.execute(
                select(_Retention.pruned_through_event_id).where(
                    _Retention.workspace_id == workspace_id
                )
            )
        ).scalar_one_or_none()
        return int(pruned or 0)

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
        """Apply the retention bounds to every workspace, each on its own (ADR 0015 §10).

        A workspace keeps its newest ``keep_newest`` events (at least one) that are not older
        than the cutoff, and always its newest event, so its head and its retention bound stay
        defined and an expired cursor can be told from an empty feed. Each workspace loses a
        prefix of its events (by id): by age, everything up to its newest event created before
        the cutoff that is not its newest event; by count, everything below its newest
        ``keep_newest``. One workspace's traffic never shortens another's feed.

        Set-based: counting the events appended since the last prune, finding the age bound
        and deleting are one statement each (per 5,000 workspaces), whatever the number of
        workspaces; only a workspace over the count bound costs one more statement, an index
        walk over exactly the events it loses. Pruners are serialized (an advisory lock on
        Postgres, the write lock on SQLite), since the counts are incremental.

        Returns:
            How many rows were deleted.
        """
        db = self._db
        postgres = (await db.connection()).dialect.name == "postgresql"
        if postgres:
            await db.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": EVENT_PRUNE_LOCK})
        head = (await db.execute(select(func.max(ActivityEvent.id)))).scalar_one_or_none()
        if head is None:
            return 0
        counted = (
            await db.execute(select(func.max(_Retention.counted_through_event_id)))
        ).scalar_one_or_none()
        if int(head) > int(counted or 0):
            await db.execute(_count_appended(postgres, int(counted or 0), int(head)))
        through = await self._age_bounds(older_than_unix_ms, int(head))
        keep = max(1, keep_newest)
        over = (
            await db.execute(
                select(_Retention.workspace_id, _Retention.retained_count).where(
                    _Retention.retained_count > keep
                )
            )
        ).all()
        for workspace_id, retained in over:
            # The last event this workspace loses: a walk over exactly the events to delete.
            last = (
                await db.execute(
                    select(ActivityEvent.id)
                    .where(ActivityEvent.workspace_id == workspace_id)
                    .order_by(ActivityEvent.id)
                    .offset(int(retained) - keep - 1)
                    .limit(1)
                )
            ).scalar_one_or_none()
            if last is not None:
                through[str(workspace_id)] = max(through.get(str(workspace_id), 0), int(last))
        deleted = 0
        ordered = sorted(through.items())
        for start in range(0, len(ordered), _WORKSPACE_BATCH):
            deleted += await self._delete_through(
                postgres, ordered[start : start + _WORKSPACE_BATCH]
            )
        return deleted

    async def _age_bounds(self, older_than_unix_ms: int, head: int) -> dict[str, int]:
        """Per workspace, its newest event created before the cutoff that is not its newest.

        Reads the events older than the cutoff through ``ix_activity_events_created_at_unix_ms``
        and probes ``(workspace_id, id)`` for a newer event of the same workspace.
        """
        # Materialized, so SQLite reads the old events through the created_at index instead of
        # walking (workspace_id, id) for the GROUP BY order.
        old = (
            select(ActivityEvent.workspace_id, ActivityEvent.id)
            .where(ActivityEvent.created_at_unix_ms < older_than_unix_ms, ActivityEvent.id <= head)
            .cte("old_events")
            .prefix_with("MATERIALIZED")
        )
        newer = aliased(ActivityEvent)
        rows = await self._db.execute(
            select(old.c.workspace_id, func.max(old.c.id))
            .where(exists().where(newer.workspace_id == old.c.workspace_id, newer.id > old.c.id))
            .group_by(old.c.workspace_id)
        )
        return {str(workspace_id): int(last) for workspace_id, last in rows}

    async def _delete_through(self, postgres: bool, bounds: Sequence[tuple[str, int]]) -> int:
        """Delete each workspace's events up to its bound; record the bound and the new count.

        Two statements whatever the number of workspaces: the bookkeeping ``UPDATE ... FROM``
        (each workspace's lost events counted through ``(workspace_id, id)``), then the
        ``DELETE``. The bounds travel as one parameter, so the statements are compiled once.
        """
        limits = _limits(postgres, bounds)
        lost = (
            select(func.count())
            .select_from(ActivityEvent)
            .where(
                ActivityEvent.workspace_id == _RETENTION_TABLE.c.workspace_id,
                ActivityEvent.id <= limits.c.through_id,
            )
            .scalar_subquery()
        )
        await self._db.execute(
            update(_RETENTION_TABLE)
            .where(_RETENTION_TABLE.c.workspace_id == limits.c.workspace_id)
            .values(
                retained_count=_RETENTION_TABLE.c.retained_count - lost,
                pruned_through_event_id=limits.c.through_id,
            )
        )
        if postgres:
            # DELETE ... USING: one index range per workspace.
            statement = delete(_EVENTS_TABLE).where(
                _EVENTS_TABLE.c.workspace_id == limits.c.workspace_id,
                _EVENTS_TABLE.c.id <= limits.c.through_id,
            )
        else:
            doomed = _EVENTS_TABLE.alias("doomed")
            statement = delete(_EVENTS_TABLE).where(
                _EVENTS_TABLE.c.id.in_(
                    select(doomed.c.id).join(
                        limits,
                        and_(
                            doomed.c.workspace_id == limits.c.workspace_id,
                            doomed.c.id <= limits.c.through_id,
                        ),
                    )
                )
            )
        result = await self._db.execute(statement)
        return int(getattr(result, "rowcount", 0) or 0)


def _limits(postgres: bool, bounds: Sequence[tuple[str, int]]) -> Any:
    """``(workspace_id, through_id)`` rows from one parameter (a statement compiled once).

    Postgres: ``unnest`` of a ``text[]`` and a ``bigint[]``; SQLite: ``json_each`` of a JSON
    array of pairs.
    """
    if postgres:
        return (
            func.unnest(
                literal([ws for ws, _ in bounds], postgresql.ARRAY(Text())),
                literal([through for _, through in bounds], postgresql.ARRAY(BigInteger())),
            )
            .table_valued(column("workspace_id", Text()), column("through_id", BigInteger()))
            .render_derived(name="limits")
        )
    pairs = func.json_each(
        literal(json.dumps([list(pair) for pair in bounds]), Text())
    ).table_valued("value")
    return (
        select(
            func.json_extract(pairs.c.value, "$[0]").label("workspace_id"),
            func.json_extract(pairs.c.value, "$[1]").label("through_id"),
        )
        .select_from(pairs)
        .subquery("limits")  # not a CTE: sqlite3 reports no rowcount for a statement with WITH
    )


def _count_appended(postgres: bool, after_id: int, through_id: int) -> Executable:
    """Add the events with ``after_id < id <= through_id`` to their workspaces' counts.

    One ``INSERT ... SELECT ... GROUP BY ... ON CONFLICT DO UPDATE`` over the id range (the
    primary key). Appends commit in id order (:data:`EVENT_APPEND_LOCK`), so no event with an
    id up to ``through_id`` can commit after this statement saw ``through_id``.
    """
    insert_into = postgresql.insert if postgres else sqlite.insert
    statement = insert_into(_Retention).from_select(
        ["workspace_id", "pruned_through_event_id", "counted_through_event_id", "retained_count"],
        select(
            ActivityEvent.workspace_id,
            literal(0, BigInteger()),
            literal(through_id, BigInteger()),
            func.count(),
        )
        .where(ActivityEvent.id > after_id, ActivityEvent.id <= through_id)
        .group_by(ActivityEvent.workspace_id),
    )
    return statement.on_conflict_do_update(
        index_elements=[_Retention.workspace_id],
        set_={
            "retained_count": _Retention.retained_count + statement.excluded.retained_count,
            "counted_through_event_id": statement.excluded.counted_through_event_id,
        },
    )
