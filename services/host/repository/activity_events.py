"""``activity_events`` rows: append in per-workspace order, read, prune (HOST-OBS-1/2, SCALE-1).

Every event carries its workspace's gap-free sequence ``workspace_seq``. An append first bumps
its workspace's ``workspace_event_heads`` row (``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``)
and only then inserts the events: the bump takes the row's lock, held until the appending
transaction ends, so a later append of the same workspace can neither draw a sequence number
nor an id before the earlier one committed or rolled back. Within a workspace, ``id`` and
``workspace_seq`` therefore both increase in commit order, and a reader of ``id > cursor`` (or
``workspace_seq > cursor``) never skips a row that commits late. Appends of different
workspaces take different rows and no longer wait for each other (they used to share one
``pg_advisory_xact_lock``; ADR 0037). A transaction that appends for several workspaces bumps
their heads in workspace order, so two such transactions cannot deadlock. SQLite serializes
writers anyway; the same statements run there.

The append is :func:`append_events`, a synchronous function of a write transaction
(``store.direct_writes``): a direct write calls it on its own connection, and
:meth:`EventLogRepository.append` runs it on the ORM transaction's connection, so there is one
implementation of the append. Readers use :class:`EventLogRepository` on the transaction's
``AsyncSession``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from sqlalchemy import (
    BigInteger,
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
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from store.direct_writes import TransactionWriteConnection, WriteConnection, WriteStatement
from store.models import ActivityEvent, ActivityEventRetention, WorkspaceEventHead

__all__ = [
    "EVENT_PRUNE_LOCK",
    "AppendedRun",
    "EventLogRepository",
    "LogBounds",
    "NewEventRow",
    "StoredEvent",
    "append_events",
]

EVENT_PRUNE_LOCK = 0x7475_7474_6965_7632
"""``pg_advisory_xact_lock`` key that serializes pruners (several Host replicas may run one)."""

_WORKSPACE_BATCH = 5_000
"""Workspaces per bookkeeping and delete statement (the bounds travel as one parameter)."""

_Retention = ActivityEventRetention
# Core tables: statements on them are not ORM-enabled (no session synchronization).
_EVENTS_TABLE: Final = cast(Table, ActivityEvent.__table__)
_RETENTION_TABLE: Final = cast(Table, ActivityEventRetention.__table__)
_HEADS_TABLE: Final = cast(Table, WorkspaceEventHead.__table__)


def _bump_head(dialect_insert: Any) -> WriteStatement:
    """``last_seq += :count`` for one workspace (created at ``:count``); returns the new value."""
    statement = dialect_insert(_HEADS_TABLE).values(
        workspace_id=bindparam("workspace_id"), last_seq=bindparam("count")
    )
    bump = statement.on_conflict_do_update(
        index_elements=[_HEADS_TABLE.c.workspace_id],
        set_={"last_seq": _HEADS_TABLE.c.last_seq + statement.excluded.last_seq},
    ).returning(_HEADS_TABLE.c.last_seq)
    return WriteStatement(bump)


# Built once and compiled once per backend: the append runs in every writing transaction, on
# the ORM path (through ``EventLogRepository.append``) and in direct writes alike.
_BUMP_HEAD: Final = {
    "postgresql": _bump_head(postgresql.insert),
    "sqlite": _bump_head(sqlite.insert),
}
_EVENT_COLUMNS: Final = (
    "workspace_id",
    "workspace_seq",
    "session_id",
    "event_type",
    "payload",
    "created_at_unix_ms",
)
# Postgres: the bump and the inserts as one statement (one round trip per workspace), which
# also carries the transaction's deferred writes (``WriteConnection.defer``). The bump is a
# data-modifying CTE: it runs once and takes the head row's lock before any row is inserted.
# Rows are inserted in their order (``ORDER BY`` ordinality: ids are drawn in that order) and
# come back as (workspace_seq, id); ``workspace_seq`` says which row is which.
_APPEND_PG: Final = WriteStatement(
    text(
        "WITH head AS ("
        " INSERT INTO workspace_event_heads (workspace_id, last_seq)"
        " VALUES (:workspace_id, :count)"
        " ON CONFLICT (workspace_id) DO UPDATE"
        " SET last_seq = workspace_event_heads.last_seq + excluded.last_seq"
        " RETURNING last_seq)"
        " INSERT INTO activity_events"
        " (workspace_id, workspace_seq, session_id, event_type, payload, created_at_unix_ms)"
        " SELECT CAST(:workspace_id AS VARCHAR), head.last_seq - :count + appended.ordinal,"
        " appended.session_id, appended.event_type, appended.payload,"
        " appended.created_at_unix_ms"
        " FROM head, unnest(CAST(:session_ids AS VARCHAR[]), CAST(:event_types AS VARCHAR[]),"
        " CAST(:payloads AS BYTEA[]), CAST(:created AS BIGINT[]))"
        " WITH ORDINALITY AS appended"
        " (session_id, event_type, payload, created_at_unix_ms, ordinal)"
        " ORDER BY appended.ordinal"
        " RETURNING workspace_seq, id"
    )
)
_INSERT_EVENT: Final = WriteStatement(
    insert(_EVENTS_TABLE)
    .values({name: bindparam(name) for name in _EVENT_COLUMNS})
    .returning(_EVENTS_TABLE.c.id, sort_by_parameter_order=True)
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
    """A committed row: ``event_id`` is the cursor; ``payload`` the serialized event.

    ``workspace_seq`` is the workspace's gap-free sequence number of the event (SCALE-1).
    """

    event_id: int
    workspace_id: str
    session_id: str | None
    event_type: str
    payload: bytes
    created_at_unix_ms: int
    workspace_seq: int = 0


@dataclass(frozen=True)
class AppendedRun:
    """What one append wrote for one workspace.

    Attributes:
        previous_seq: The workspace's last sequence number before this append (0: none). It
            is exact (the head row's lock serializes the workspace's appends), so a live
            subscriber that already emitted it can emit the new events without a read.
        ids: The new rows' ids, in row order; the i-th has sequence ``previous_seq + 1 + i``.
    """

    previous_seq: int
    ids: list[int]


def _stored(row: ActivityEvent) -> StoredEvent:
    return StoredEvent(
        event_id=row.id,
        workspace_seq=row.workspace_seq,
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
        workspace_head_seq: That event's ``workspace_seq`` (0 when it has none).
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
    workspace_head_seq: int = 0


def append_events(conn: WriteConnection, rows: Sequence[NewEventRow]) -> dict[str, AppendedRun]:
    """Append rows in order, numbered per workspace, in the open write transaction.

    Per workspace (in workspace order, so two multi-workspace appends cannot deadlock) one
    statement bumps the head row by the number of its rows; its lock orders this append after
    every earlier one of the workspace and before every later one, until the transaction ends.
    Then the rows are inserted with their ``workspace_seq``, their ids returned in row order.

    Args:
        conn: the transaction: a direct write's, or an ORM transaction's connection
            (``EventLogRepository.append``).
        rows: the rows, in the order their ids are to increase.

    Returns:
        Per workspace, its previous sequence number and the new ids in row order.
    """
    if not rows:
        return {}
    first_workspace = rows[0].workspace_id
    if conn.backend == "postgresql" and all(row.workspace_id == first_workspace for row in rows):
        return _append_in_one_statement(conn, rows)
    per_workspace: dict[str, int] = {}
    for row in rows:
        per_workspace[row.workspace_id] = per_workspace.get(row.workspace_id, 0) + 1
    bump = _BUMP_HEAD[conn.backend]
    next_seq: dict[str, int] = {}
    result: dict[str, AppendedRun] = {}
    for workspace_id in sorted(per_workspace):
        count = per_workspace[workspace_id]
        last = int(conn.returned(bump, {"workspace_id": workspace_id, "count": count})[0][0])
        result[workspace_id] = AppendedRun(previous_seq=last - count, ids=[])
        next_seq[workspace_id] = last - count + 1
    parameters = []
    for row in rows:
        seq = next_seq[row.workspace_id]
        next_seq[row.workspace_id] = seq + 1
        parameters.append(
            {
                "workspace_id": row.workspace_id,
                "workspace_seq": seq,
                "session_id": row.session_id,
                "event_type": row.event_type,
                "payload": row.payload,
                "created_at_unix_ms": row.created_at_unix_ms,
            }
        )
    for row, (new_id,) in zip(rows, conn.returned_each(_INSERT_EVENT, parameters), strict=True):
        result[row.workspace_id].ids.append(int(new_id))
    return result


def _append_in_one_statement(
    conn: WriteConnection, rows: Sequence[NewEventRow]
) -> dict[str, AppendedRun]:
    """:func:`append_events` on Postgres for rows of one workspace: one statement.

    The statement carries the transaction's deferred writes (it touches no row they touch).
    An append across workspaces keeps one statement per row, so ids follow the row order
    across workspaces too.
    """
    workspace_id = rows[0].workspace_id
    returned = conn.returned(
        _APPEND_PG,
        {
            "workspace_id": workspace_id,
            "count": len(rows),
            "session_ids": [row.session_id for row in rows],
            "event_types": [row.event_type for row in rows],
            "payloads": [row.payload for row in rows],
            "created": [row.created_at_unix_ms for row in rows],
        },
        carries_deferred=True,
    )
    if len(returned) != len(rows):
        raise RuntimeError(f"appended {len(returned)} of {len(rows)} events")
    ordered = sorted(returned)
    return {
        workspace_id: AppendedRun(
            previous_seq=int(ordered[0][0]) - 1, ids=[int(new_id) for _, new_id in ordered]
        )
    }


class EventLogRepository:
    """Appends, reads and prunes the log inside one ``AsyncSession`` transaction."""

    def __init__(self, session: AsyncSession) -> None:
        self._db = session

    async def append(self, rows: Sequence[NewEventRow]) -> dict[str, AppendedRun]:
        """Append rows in order, numbered per workspace; per workspace what was written.

        :func:`append_events` on this transaction's connection (one implementation for the
        ORM path and direct writes).
        """
        if not rows:
            return {}
        connection = await self._db.connection()
        return await connection.run_sync(
            lambda sync: append_events(TransactionWriteConnection(sync), rows)
        )

    async def bounds(self, workspace_id: str) -> LogBounds:
        """The workspace head (0 when empty), the log head and the workspace's retention bound."""
        head = (
            await self._db.execute(
                select(ActivityEvent.id, ActivityEvent.workspace_seq)
                .where(ActivityEvent.workspace_id == workspace_id)
                .order_by(ActivityEvent.id.desc())
                .limit(1)
            )
        ).first()
        global_head = (await self._db.execute(select(func.max(ActivityEvent.id)))).scalar_one()
        return LogBounds(
            workspace_head=0 if head is None else int(head[0]),
            workspace_head_seq=0 if head is None else int(head[1]),
            global_head=int(global_head or 0),
            oldest_retained=await self.pruned_through(workspace_id) + 1,
        )

    async def heads(self, workspace_ids: Sequence[str]) -> dict[str, int]:
        """The last committed ``workspace_seq`` of each of ``workspace_ids`` that has events.

        One primary-key lookup per workspace in one statement: how a replica learns, cheaply,
        that another process committed events (``services.host.activity.log_follower``).
        """
        if not workspace_ids:
            return {}
        rows = await self._db.execute(
            select(_HEADS_TABLE.c.workspace_id, _HEADS_TABLE.c.last_seq).where(
                _HEADS_TABLE.c.workspace_id.in_(list(workspace_ids))
            )
        )
        return {str(workspace_id): int(last) for workspace_id, last in rows}

    async def after_seq(
        self, workspace_id: str, after_seq: int, *, up_to: int | None, limit: int
    ) -> list[StoredEvent]:
        """Up to ``limit`` events with ``after_seq < workspace_seq <= up_to``, in order."""
        query = select(ActivityEvent).where(
            ActivityEvent.workspace_id == workspace_id, ActivityEvent.workspace_seq > after_seq
        )
        if up_to is not None:
            query = query.where(ActivityEvent.workspace_seq <= up_to)
        query = query.order_by(ActivityEvent.workspace_seq).limit(limit)
        return [_stored(row) for row in (await self._db.execute(query)).scalars()]

    async def pruned_through_seq(self, workspace_id: str) -> int:
        """The highest ``workspace_seq`` the pruner deleted from the workspace (0 when none)."""
        pruned = (
            await self._db.execute(
                select(_Retention.pruned_through_seq).where(_Retention.workspace_id == workspace_id)
            )
        ).scalar_one_or_none()
        return int(pruned or 0)

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

        Set-based: the age bounds, the count bounds (``last_seq - pruned_through_seq`` is the
        number a workspace retains; the last event it loses is one index probe), the
        bookkeeping and the delete are one statement each (per 5,000 workspaces), whatever the
        number of workspaces. Pruners are serialized (an advisory lock on Postgres, the write
        lock on SQLite), so two never record bounds over each other.

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
        through = await self._age_bounds(older_than_unix_ms, int(head))
        keep = max(1, keep_newest)
        # A workspace retains exactly its events above ``pruned_through_seq`` (the sequence is
        # gap-free), so the ones over the count bound are found by one index probe each: the
        # event numbered ``last_seq - keep`` is the last it loses. Appends that commit while
        # this runs only make the bound conservative.
        pruned_seq = func.coalesce(_RETENTION_TABLE.c.pruned_through_seq, 0)
        over = await db.execute(
            select(ActivityEvent.workspace_id, ActivityEvent.id, ActivityEvent.workspace_seq)
            .select_from(_HEADS_TABLE)
            .outerjoin(
                _RETENTION_TABLE,
                _RETENTION_TABLE.c.workspace_id == _HEADS_TABLE.c.workspace_id,
            )
            .join(
                ActivityEvent,
                and_(
                    ActivityEvent.workspace_id == _HEADS_TABLE.c.workspace_id,
                    ActivityEvent.workspace_seq == _HEADS_TABLE.c.last_seq - keep,
                ),
            )
            .where(_HEADS_TABLE.c.last_seq - pruned_seq > keep)
        )
        for workspace_id, last_id, last_seq in over:
            known = through.get(str(workspace_id))
            if known is None or known[0] < int(last_id):
                through[str(workspace_id)] = (int(last_id), int(last_seq))
        deleted = 0
        ordered = [(ws, bound[0], bound[1]) for ws, bound in sorted(through.items())]
        for start in range(0, len(ordered), _WORKSPACE_BATCH):
            deleted += await self._delete_through(
                postgres, ordered[start : start + _WORKSPACE_BATCH]
            )
        return deleted

    async def _age_bounds(self, older_than_unix_ms: int, head: int) -> dict[str, tuple[int, int]]:
        """Per workspace, its newest event created before the cutoff that is not its newest.

        Reads the events older than the cutoff through ``ix_activity_events_created_at_unix_ms``
        and probes ``(workspace_id, id)`` for a newer event of the same workspace. Returns
        ``(id, workspace_seq)`` of that event (both grow together within a workspace).
        """
        # Materialized, so SQLite reads the old events through the created_at index instead of
        # walking (workspace_id, id) for the GROUP BY order.
        old = (
            select(ActivityEvent.workspace_id, ActivityEvent.id, ActivityEvent.workspace_seq)
            .where(ActivityEvent.created_at_unix_ms < older_than_unix_ms, ActivityEvent.id <= head)
            .cte("old_events")
            .prefix_with("MATERIALIZED")
        )
        newer = aliased(ActivityEvent)
        rows = await self._db.execute(
            select(old.c.workspace_id, func.max(old.c.id), func.max(old.c.workspace_seq))
            .where(exists().where(newer.workspace_id == old.c.workspace_id, newer.id > old.c.id))
            .group_by(old.c.workspace_id)
        )
        return {str(workspace_id): (int(last), int(seq)) for workspace_id, last, seq in rows}

    async def _delete_through(self, postgres: bool, bounds: Sequence[tuple[str, int, int]]) -> int:
        """Delete each workspace's events up to its bound and record the bound.

        Two statements whatever the number of workspaces: the bookkeeping upsert
        (``pruned_through_event_id`` and ``pruned_through_seq``), then the ``DELETE``. The
        bounds travel as one parameter, so the statements are compiled once.
        """
        limits = _limits(postgres, bounds)
        insert_into = postgresql.insert if postgres else sqlite.insert
        record = insert_into(_RETENTION_TABLE).from_select(
            ["workspace_id", "pruned_through_event_id", "pruned_through_seq"],
            # ``WHERE true``: SQLite needs it to parse ``INSERT ... SELECT ... ON CONFLICT``.
            select(limits.c.workspace_id, limits.c.through_id, limits.c.through_seq).where(
                literal(True)
            ),
        )
        await self._db.execute(
            record.on_conflict_do_update(
                index_elements=[_RETENTION_TABLE.c.workspace_id],
                set_={
                    "pruned_through_event_id": record.excluded.pruned_through_event_id,
                    "pruned_through_seq": record.excluded.pruned_through_seq,
                },
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


def _limits(postgres: bool, bounds: Sequence[tuple[str, int, int]]) -> Any:
    """``(workspace_id, through_id, through_seq)`` rows from one parameter (compiled once).

    Postgres: ``unnest`` of a ``text[]`` and two ``bigint[]``; SQLite: ``json_each`` of a JSON
    array of triples.
    """
    if postgres:
        return (
            func.unnest(
                literal([ws for ws, _, _ in bounds], postgresql.ARRAY(Text())),
                literal([through for _, through, _ in bounds], postgresql.ARRAY(BigInteger())),
                literal([seq for _, _, seq in bounds], postgresql.ARRAY(BigInteger())),
            )
            .table_valued(
                column("workspace_id", Text()),
                column("through_id", BigInteger()),
                column("through_seq", BigInteger()),
            )
            .render_derived(name="limits")
        )
    triples = func.json_each(
        literal(json.dumps([list(triple) for triple in bounds]), Text())
    ).table_valued("value")
    return (
        select(
            func.json_extract(triples.c.value, "$[0]").label("workspace_id"),
            func.json_extract(triples.c.value, "$[1]").label("through_id"),
            func.json_extract(triples.c.value, "$[2]").label("through_seq"),
        )
        .select_from(triples)
        .subquery("limits")  # not a CTE: sqlite3 reports no rowcount for a statement with WITH
    )
