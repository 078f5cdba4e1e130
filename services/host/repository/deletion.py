"""SQL of delete, restore, purge and the resource-cleanup outbox (HOST-DEL-*, HOST-CLEAN-1).

Every statement that names a set of Sessions is chunked, so a 5,000-Session tree never builds one
enormous statement: on SQLite ``_CHUNK`` ids per ``IN`` list; on Postgres the ids travel as one
``text[]`` parameter (``= ANY(:ids)``, ``_ARRAY_CHUNK`` per statement; why:
``repository.id_sets``). The retention purge's component statements are in ``repository.purge``.
Tree shape is read as :class:`TreeRow` values — the columns the deletion rules need and nothing
else — and the rules themselves live in ``services.host.deletion.delete``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Table,
    Text,
    and_,
    delete,
    exists,
    func,
    literal,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute, aliased

from services.host.model.records import SessionRecord
from services.host.repository.changes import ActivityChanges
from services.host.repository.command_rows import SessionRoute
from services.host.repository.id_sets import IdSetStatements
from services.host.repository.sessions import session_record
from store.models import (
    HostOperation,
    Interaction,
    ResourceCleanupOutbox,
    RuntimeCommandOutbox,
    Session,
    Turn,
)

__all__ = [
    "CleanupRow",
    "DeletedListingQuery",
    "DeletionRepository",
    "PurgeCandidate",
    "TreeRow",
    "WorkspaceFilter",
    "session_records",
]

_CHUNK = 500
_ARRAY_CHUNK = 5_000
_session_table: Table = Session.__table__  # type: ignore[assignment]
_parent_table = _session_table.alias("parent")  # built once: an alias copies every column


WorkspaceFilter = str | frozenset[str] | None
"""Which workspaces a cross-workspace read or purge covers: one workspace, a set (a scoped
caller's own workspaces, SEC-1), or ``None`` for every workspace (a deployment-wide caller)."""


def workspace_clause(
    column: InstrumentedAttribute[str] | ColumnElement[str], workspaces: WorkspaceFilter
) -> ColumnElement[bool] | None:
    """The ``WHERE`` term restricting ``column`` to ``workspaces`` (``None``: no restriction)."""
    if workspaces is None:
        return None
    if isinstance(workspaces, str):
        return column == workspaces
    return column.in_(sorted(workspaces))


def _chunks(values: Sequence[str]) -> Iterator[list[str]]:
    for start in range(0, len(values), _CHUNK):
        yield list(values[start : start + _CHUNK])


@dataclass(frozen=True)
class TreeRow:
    """One Session as the deletion rules see it."""

    session_id: str
    parent_session_id: str | None
    root_session_id: str
    deleted_at_unix_ms: int | None
    deletion_generation: str | None
    component_size: int | None
    tombstone_legacy: bool
    active_turn_id: str | None = None
    updated_at_unix_ms: int = 0

    @property
    def is_live(self) -> bool:
        """Whether the Session is not tombstoned."""
        return self.deleted_at_unix_ms is None


_TREE_COLUMNS = (
    Session.session_id,
    Session.parent_session_id,
    Session.root_session_id,
    Session.deleted_at_unix_ms,
    Session.deletion_generation,
    Session.component_size,
    Session.tombstone_legacy,
    Session.active_turn_id,
    Session.updated_at_unix_ms,
)


def _tree_row(row: Sequence[object]) -> TreeRow:
    return TreeRow(
        session_id=str(row[0]),
        parent_session_id=None if row[1] is None else str(row[1]),
        root_session_id=str(row[2]),
        deleted_at_unix_ms=None if row[3] is None else int(str(row[3])),
        deletion_generation=None if row[4] is None else str(row[4]),
        component_size=None if row[5] is None else int(str(row[5])),
        tombstone_legacy=bool(row[6]),
        active_turn_id=None if row[7] is None else str(row[7]),
        updated_at_unix_ms=int(str(row[8])),
    )


@dataclass(frozen=True)
class PurgeCandidate:
    """A topmost tombstone a purge considers, in scan order."""

    workspace_id: str
    session_id: str
    root_session_id: str
    deleted_at_unix_ms: int
    deletion_generation: str | None = None
    component_size: int | None = None
    tombstone_legacy: bool = False


@dataclass(frozen=True)
class DeletedListingQuery:
    """Which topmost tombstones ``ListDeletedSessions`` covers (HOST-DEL-7)."""

    workspace_id: str
    title_contains: str | None = None
    section_key: str | None = None


@dataclass(frozen=True)
class CleanupRow:
    """A pending resource-cleanup outbox row with its ownership facts (HOST-CLEAN-1)."""

    workspace_id: str
    session_id: str
    purged_at_unix_ms: int
    id_owned_anywhere: bool
    live_owner_in_other_workspace: bool


class DeletionRepository(IdSetStatements):
    """Reads and writes what delete, restore, purge and the cleanup outbox touch."""

    def __init__(self, session: AsyncSession, changes: ActivityChanges) -> None:
        super().__init__(session)
        self._changes = changes

    def _batches(self, values: Sequence[str]) -> Iterator[list[str]]:
        """``values`` in statement-sized id lists."""
        for batch in self._batched(values, sqlite_size=_CHUNK, postgres_size=_ARRAY_CHUNK):
            yield list(batch)

    # ------------------------------------------------------------------------ tree reads

    async def roots_of(self, workspace_id: str, session_ids: Sequence[str]) -> dict[str, str]:
        """``session_id -> root_session_id`` of the ids that exist in the workspace."""
        found: dict[str, str] = {}
        for chunk in self._batches(sorted(set(session_ids))):
            rows = await self._db.execute(
                select(Session.session_id, Session.root_session_id).where(
                    Session.workspace_id == workspace_id, self._among(Session.session_id, chunk)
                )
            )
            found.update({str(row[0]): str(row[1]) for row in rows})
        return found

    async def tree_rows(
        self, workspace_id: str, root_ids: Iterable[str], *, lock: bool = False
    ) -> list[TreeRow]:
        """Every Session of the trees rooted at ``root_ids``.

        ``lock`` takes ``FOR UPDATE`` row locks on Postgres, in ``session_id`` order, so a
        concurrent child insert (whose foreign-key check needs a key-share lock on the
        parent) waits for this transaction; SQLite's ``BEGIN IMMEDIATE`` already excludes
        every other writer.
        """
        found: list[TreeRow] = []
        if lock and self._postgres:
            # Root rows first: every writer that settles Turns locks a tree root first
            # (``SessionRowRepository.lock_with_root``), so the two never deadlock.
            for chunk in self._batches(sorted(set(root_ids))):
                await self._db.execute(
                    select(Session.session_id)
                    .where(
                        Session.workspace_id == workspace_id, self._among(Session.session_id, chunk)
                    )
                    .order_by(Session.session_id)
                    .with_for_update()
                )
        for chunk in self._batches(sorted(set(root_ids))):
            query = select(*_TREE_COLUMNS).where(
                Session.workspace_id == workspace_id,
                self._among(Session.root_session_id, chunk),
            )
            if lock and self._postgres:
                # Row locks are taken in ORDER BY order: the same order in every transaction.
                query = query.order_by(Session.session_id).with_for_update()
                found.extend(_tree_row(row) for row in await self._db.execute(query))
                continue
            # Sorted here, not in SQL: for ``ORDER BY session_id`` SQLite walks the primary key
            # of the whole workspace instead of ``ix_sessions_root`` (42 ms at 100,000
            # Sessions for one listing page's trees, ADR 0024).
            rows = [_tree_row(row) for row in await self._db.execute(query)]
            found.extend(sorted(rows, key=lambda row: row.session_id))
        return found

    # ---------------------------------------------------------------------- delete writes

    async def tombstone(
        self,
        workspace_id: str,
        session_ids: Sequence[str],
        *,
        deleted_at_unix_ms: int,
        generation: str,
        component_size: int,
    ) -> None:
        """Mark one component; ``updated_at`` and placement are deliberately untouched."""
        for chunk in self._batches(session_ids):
            await self._db.execute(
                update(Session)
                .where(Session.workspace_id == workspace_id, self._among(Session.session_id, chunk))
                .values(
                    deleted_at_unix_ms=deleted_at_unix_ms,
                    deletion_generation=generation,
                    component_size=component_size,
                    tombstone_legacy=False,
                    active_turn_id=None,
                )
            )

    async def keep_updated_at(self, workspace_id: str, original: dict[str, int]) -> None:
        """Put back ``updated_at`` where quiescing moved it: delete never rewrites it."""
        ids = sorted(original)
        for chunk in self._batches(ids):
            rows = await self._db.execute(
                select(Session.session_id, Session.updated_at_unix_ms).where(
                    Session.workspace_id == workspace_id, self._among(Session.session_id, chunk)
                )
            )
            for session_id, updated in [(str(r[0]), int(r[1])) for r in rows]:
                if updated != original[session_id]:
                    await self._db.execute(
                        update(Session)
                        .where(
                            Session.workspace_id == workspace_id,
                            Session.session_id == session_id,
                        )
                        .values(updated_at_unix_ms=original[session_id])
                    )

    async def clear_tombstones(self, workspace_id: str, session_ids: Sequence[str]) -> None:
        """Restore: clear every tombstone column of these Sessions."""
        for chunk in self._batches(session_ids):
            await self._db.execute(
                update(Session)
                .where(Session.workspace_id == workspace_id, self._among(Session.session_id, chunk))
                .values(
                    deleted_at_unix_ms=None,
                    deletion_generation=None,
                    component_size=None,
                    tombstone_legacy=False,
                )
            )

    async def active_turn_keys(
        self, workspace_id: str, session_ids: Sequence[str]
    ) -> list[tuple[str, str]]:
        """``(session_id, turn_id)`` of every Turn before ``settled`` in these Sessions."""
        keys: list[tuple[str, str]] = []
        for chunk in self._batches(session_ids):
            rows = await self._db.execute(
                select(Turn.session_id, Turn.turn_id)
                .where(
                    Turn.workspace_id == workspace_id,
                    self._among(Turn.session_id, chunk),
                    Turn.phase != "settled",
                )
                .order_by(Turn.session_id, Turn.created_at_unix_ms, Turn.turn_id)
            )
            keys.extend((str(row[0]), str(row[1])) for row in rows)
        return keys

    async def open_interaction_turns(
        self, workspace_id: str, session_ids: Sequence[str]
    ) -> tuple[list[tuple[str, str]], int]:
        """Turns with pending/resolving Interactions in these Sessions, and how many."""
        keys: set[tuple[str, str]] = set()
        count = 0
        for chunk in self._batches(session_ids):
            rows = await self._db.execute(
                select(Interaction.session_id, Interaction.turn_id, func.count())
                .where(
                    Interaction.workspace_id == workspace_id,
                    self._among(Interaction.session_id, chunk),
                    Interaction.status.in_(("pending", "resolving")),
                )
                .group_by(Interaction.session_id, Interaction.turn_id)
            )
            for row in rows:
                keys.add((str(row[0]), str(row[1])))
                count += int(row[2])
        return sorted(keys), count

    async def settle_runtime_commands(
        self, workspace_id: str, session_ids: Sequence[str], now: int
    ) -> None:
        """Unacknowledged runtime commands of deleted Sessions never run: fail them."""
        for chunk in self._batches(session_ids):
            await self._db.execute(
                update(RuntimeCommandOutbox)
                .where(
                    RuntimeCommandOutbox.workspace_id == workspace_id,
                    self._among(RuntimeCommandOutbox.session_id, chunk),
                    RuntimeCommandOutbox.state.in_(("pending", "dispatched")),
                )
                .values(state="failed", last_error="session_deleted", updated_at_unix_ms=now)
            )

    async def runtime_sessions(
        self, workspace_id: str, session_ids: Sequence[str]
    ) -> list[SessionRoute]:
        """The Sessions a runtime may hold a provider session for, in ``session_ids`` order.

        A Session has one once it ran: it has a Turn (Host sent ``start_turn``, or the runtime
        reported one), a stored provider resume identity, or a parent (child Sessions are
        created by a runtime's report). A root Session that never ran was never started on a
        runtime, so there is nothing to release.
        """
        has_turn = (
            exists()
            .where(Turn.workspace_id == Session.workspace_id, Turn.session_id == Session.session_id)
            .correlate(Session)
        )
        found: dict[str, SessionRoute] = {}
        for chunk in self._batches(session_ids):
            rows = await self._db.execute(
                select(Session.session_id, Session.agent_target_id, Session.provider).where(
                    Session.workspace_id == workspace_id,
                    self._among(Session.session_id, chunk),
                    or_(
                        Session.provider_resume_json.is_not(None),
                        Session.parent_session_id.is_not(None),
                        has_turn,
                    ),
                )
            )
            for session_id, agent_target_id, provider in rows:
                found[str(session_id)] = SessionRoute(
                    workspace_id,
                    str(session_id),
                    None if agent_target_id is None else str(agent_target_id),
                    str(provider),
                )
        return [found[session_id] for session_id in session_ids if session_id in found]

    async def withdraw_releases(self, workspace_id: str, session_ids: Sequence[str]) -> int:
        """Delete the unacknowledged ``release_session`` commands of restored Sessions.

        Returns:
            How many commands were withdrawn.
        """
        withdrawn = 0
        for chunk in self._batches(session_ids):
            result = await self._db.execute(
                delete(RuntimeCommandOutbox).where(
                    RuntimeCommandOutbox.workspace_id == workspace_id,
                    self._among(RuntimeCommandOutbox.session_id, chunk),
                    RuntimeCommandOutbox.command_kind == "release_session",
                    RuntimeCommandOutbox.state.in_(("pending", "dispatched")),
                )
            )
            withdrawn += int(getattr(result, "rowcount", 0) or 0)
        return withdrawn

    async def settle_host_operations(
        self, workspace_id: str, session_ids: Sequence[str], now: int
    ) -> None:
        """Pending Host operations (fork, Goal, plan) of deleted Sessions fail for good."""
        for chunk in self._batches(session_ids):
            await self._db.execute(
                update(HostOperation)
                .where(
                    HostOperation.workspace_id == workspace_id,
                    self._among(HostOperation.session_id, chunk),
                    HostOperation.state == "pending",
                )
                .values(
                    state="failed",
                    error_json='{"reason":"SESSION_DELETED"}',
                    lease_owner=None,
                    lease_expires_at_unix_ms=None,
                    version=HostOperation.version + 1,
                    updated_at_unix_ms=now,
                )
            )

    def note_deleted(
        self, workspace_id: str, session_id: str, generation: str, deleted_at_unix_ms: int
    ) -> None:
        """Record ``session_deleted`` for the activity outbox (HOST-DEL-6)."""
        self._changes.session_deleted(
            workspace_id, session_id, generation=generation, deleted_at_unix_ms=deleted_at_unix_ms
        )

    def note_restored(self, workspace_id: str, session_id: str, generation: str) -> None:
        """Record ``session_restored`` for the activity outbox (HOST-DEL-8)."""
        self._changes.session_restored(workspace_id, session_id, generation=generation)

    # ------------------------------------------------------------------------- listing

    def _topmost_clauses(self, query: DeletedListingQuery) -> list[object]:
        parent = aliased(Session)
        # A scalar subquery, not EXISTS: Postgres turned ``OR EXISTS (...)`` into a hashed
        # subplan that read every live Session of the workspace before the first row (106 ms
        # at 100,000 Sessions, ADR 0024); a scalar subquery runs per candidate row, one
        # primary-key lookup each, so a page costs a page's worth of lookups on both backends.
        parent_live = (
            select(parent.deleted_at_unix_ms.is_(None))
            .where(
                parent.workspace_id == Session.workspace_id,
                parent.session_id == Session.parent_session_id,
            )
            .scalar_subquery()
        )
        clauses: list[object] = [
            Session.workspace_id == query.workspace_id,
            Session.deleted_at_unix_ms.is_not(None),
            or_(Session.parent_session_id.is_(None), parent_live),
        ]
        if query.section_key is not None:
            clauses.append(Session.rail_section_key == query.section_key)
        if query.title_contains:
            clauses.append(
                func.lower(Session.title).contains(query.title_contains.lower(), autoescape=True)
            )
        return clauses

    def deleted_page_query(
        self, query: DeletedListingQuery, *, after: tuple[int, str] | None, limit: int
    ) -> object:
        """The page statement (exposed so the benchmark can show its query plan)."""
        statement = select(Session).where(*self._topmost_clauses(query))  # type: ignore[arg-type]
        if after is not None:
            updated, session_id = after
            statement = statement.where(
                or_(
                    Session.updated_at_unix_ms < updated,
                    and_(Session.updated_at_unix_ms == updated, Session.session_id > session_id),
                )
            )
        return (
            statement.order_by(Session.updated_at_unix_ms.desc(), Session.session_id.asc())
            .limit(limit)
            .execution_options(populate_existing=True)
        )

    async def deleted_page(
        self,
        query: DeletedListingQuery,
        *,
        after: tuple[int, str] | None,
        limit: int,
        count: bool = False,
    ) -> tuple[list[Session], int | None]:
        """Topmost tombstones after ``after`` (``limit`` rows), and the filtered total if asked.

        The page reads ``limit`` entries of ``ix_sessions_tombstone_listing``; the total reads
        every matching tombstone, so it is computed only when ``count`` is set (ADR 0024).
        """
        total: int | None = None
        if count:
            total = int(
                (
                    await self._db.execute(
                        select(func.count())
                        .select_from(Session)
                        .where(*self._topmost_clauses(query))  # type: ignore[arg-type]
                    )
                ).scalar_one()
            )
        statement = self.deleted_page_query(query, after=after, limit=limit)
        rows = (await self._db.execute(statement)).scalars().all()  # type: ignore[call-overload]
        return list(rows), total

    # --------------------------------------------------------------------------- purge

    async def purge_candidates(
        self,
        workspaces: WorkspaceFilter,
        cutoff_unix_ms: int | None,
        *,
        after: tuple[int, str, str] | None,
        limit: int,
    ) -> list[PurgeCandidate]:
        """Topmost tombstones deleted at or before ``cutoff`` (``None``: any), oldest first.

        Scan order is ``(deleted_at, workspace_id, session_id)``; ``after`` continues it.
        """
        # Table columns, not ORM attributes: a Core statement skips the ORM compile state
        # each execution builds (a read-only scan of plain tuples needs none; ~15 % of the
        # host's CPU in a retention purge, bench/README.md "Purge round 6").
        sessions, parent = _session_table, _parent_table
        live_parent = exists().where(
            parent.c.workspace_id == sessions.c.workspace_id,
            parent.c.session_id == sessions.c.parent_session_id,
            parent.c.deleted_at_unix_ms.is_(None),
        )
        statement = select(
            sessions.c.workspace_id,
            sessions.c.session_id,
            sessions.c.root_session_id,
            sessions.c.deleted_at_unix_ms,
            sessions.c.deletion_generation,
            sessions.c.component_size,
            sessions.c.tombstone_legacy,
        ).where(
            sessions.c.deleted_at_unix_ms.is_not(None),
            or_(sessions.c.parent_session_id.is_(None), live_parent),
        )
        restrict = workspace_clause(sessions.c.workspace_id, workspaces)
        if restrict is not None:
            statement = statement.where(restrict)
        if cutoff_unix_ms is not None:
            statement = statement.where(sessions.c.deleted_at_unix_ms <= cutoff_unix_ms)
        if after is not None:
            deleted_at, ws, sid = after
            deleted = sessions.c.deleted_at_unix_ms
            statement = statement.where(
                or_(
                    deleted > deleted_at,
                    and_(deleted == deleted_at, sessions.c.workspace_id > ws),
                    and_(
                        deleted == deleted_at,
                        sessions.c.workspace_id == ws,
                        sessions.c.session_id > sid,
                    ),
                )
            )
        statement = statement.order_by(
            sessions.c.deleted_at_unix_ms, sessions.c.workspace_id, sessions.c.session_id
        ).limit(limit)
        return [
            PurgeCandidate(
                workspace_id=str(row[0]),
                session_id=str(row[1]),
                root_session_id=str(row[2]),
                deleted_at_unix_ms=int(row[3] or 0),
                deletion_generation=None if row[4] is None else str(row[4]),
                component_size=None if row[5] is None else int(row[5]),
                tombstone_legacy=bool(row[6]),
            )
            for row in await self._db.execute(statement)
        ]

    async def delete_sessions(self, workspace_id: str, levels: Sequence[Sequence[str]]) -> int:
        """Delete Sessions level by level, deepest level first (leaf-first, HOST-DEL-10).

        On Postgres a set that fits one array parameter goes in one statement (see below).

        Everything a Session owns goes with it (``ON DELETE CASCADE``); the parent edge is
        ``NO ACTION``, so a child left behind would make the statement fail.

        Returns:
            How many ``sessions`` rows were deleted.
        """
        deleted = 0
        everything = [member for level in reversed(levels) for member in level]
        if self._postgres and len(everything) <= _ARRAY_CHUNK:
            # Postgres checks a NO ACTION reference at the end of the statement, so one
            # statement may remove parents together with their children: one round trip
            # instead of one per level.
            result = await self._db.execute(
                delete(Session).where(
                    Session.workspace_id == workspace_id,
                    self._among(Session.session_id, everything),
                )
            )
            return int(result.rowcount)  # type: ignore[attr-defined]
        for level in reversed(levels):
            for chunk in self._batches(level):
                result = await self._db.execute(
                    delete(Session).where(
                        Session.workspace_id == workspace_id, self._among(Session.session_id, chunk)
                    )
                )
                deleted += int(result.rowcount)  # type: ignore[attr-defined]
        return deleted

    async def insert_cleanup_rows(
        self, workspace_id: str, session_ids: Sequence[str], now: int, reason: str
    ) -> None:
        """One resource-cleanup outbox row per purged (workspace, Session) (HOST-DEL-9).

        A row already pending for the same key (an earlier purge of a reused id) is kept:
        ``ON CONFLICT DO NOTHING`` on the primary key, so no read precedes the insert.
        """
        if self._postgres:
            for chunk in self._batches(session_ids):
                rows = select(
                    literal(workspace_id, Text),
                    func.unnest(literal(chunk, postgresql.ARRAY(Text))),
                    literal(now, BigInteger),
                    literal(reason, Text),
                )
                await self._db.execute(
                    postgresql.insert(ResourceCleanupOutbox)
                    .from_select(
                        ["workspace_id", "session_id", "purged_at_unix_ms", "reason"], rows
                    )
                    .on_conflict_do_nothing()
                )
            return
        for chunk in self._batches(session_ids):
            await self._db.execute(
                sqlite.insert(ResourceCleanupOutbox).on_conflict_do_nothing(),
                [
                    {
                        "workspace_id": workspace_id,
                        "session_id": sid,
                        "purged_at_unix_ms": now,
                        "reason": reason,
                    }
                    for sid in chunk
                ],
            )

    # ----------------------------------------------------------------- cleanup outbox

    async def pending_cleanups(
        self, workspaces: WorkspaceFilter, *, after: tuple[int, str, str] | None, limit: int
    ) -> list[CleanupRow]:
        """Pending outbox rows with ownership facts, ``(purged_at, workspace, session)`` order."""
        owner = aliased(Session)
        live_other = aliased(Session)
        owned = (
            exists()
            .where(owner.session_id == ResourceCleanupOutbox.session_id)
            .correlate(ResourceCleanupOutbox)
        )
        other = (
            exists()
            .where(
                live_other.session_id == ResourceCleanupOutbox.session_id,
                live_other.workspace_id != ResourceCleanupOutbox.workspace_id,
                live_other.deleted_at_unix_ms.is_(None),
            )
            .correlate(ResourceCleanupOutbox)
        )
        statement = select(
            ResourceCleanupOutbox.workspace_id,
            ResourceCleanupOutbox.session_id,
            ResourceCleanupOutbox.purged_at_unix_ms,
            owned.label("owned"),
            other.label("other"),
        )
        restrict = workspace_clause(ResourceCleanupOutbox.workspace_id, workspaces)
        if restrict is not None:
            statement = statement.where(restrict)
        if after is not None:
            purged_at, ws, sid = after
            statement = statement.where(
                or_(
                    ResourceCleanupOutbox.purged_at_unix_ms > purged_at,
                    and_(
                        ResourceCleanupOutbox.purged_at_unix_ms == purged_at,
                        ResourceCleanupOutbox.workspace_id > ws,
                    ),
                    and_(
                        ResourceCleanupOutbox.purged_at_unix_ms == purged_at,
                        ResourceCleanupOutbox.workspace_id == ws,
                        ResourceCleanupOutbox.session_id > sid,
                    ),
                )
            )
        statement = statement.order_by(
            ResourceCleanupOutbox.purged_at_unix_ms,
            ResourceCleanupOutbox.workspace_id,
            ResourceCleanupOutbox.session_id,
        ).limit(limit)
        return [
            CleanupRow(str(row[0]), str(row[1]), int(row[2]), bool(row[3]), bool(row[4]))
            for row in await self._db.execute(statement)
        ]

    async def records(self, workspace_id: str, session_ids: Sequence[str]) -> list[SessionRecord]:
        """Full Session records of ``session_ids``, in that order (missing ids skipped)."""
        found = await session_records(self._db, workspace_id, session_ids)
        return [found[sid] for sid in session_ids if sid in found]

    async def complete_cleanup(self, workspace_id: str, session_id: str) -> tuple[bool, bool]:
        """Delete one outbox row; returns (a row was deleted, no row for the id remains)."""
        result = await self._db.execute(
            delete(ResourceCleanupOutbox).where(
                ResourceCleanupOutbox.workspace_id == workspace_id,
                ResourceCleanupOutbox.session_id == session_id,
            )
        )
        remaining = (
            await self._db.execute(
                select(literal(True)).where(ResourceCleanupOutbox.session_id == session_id).limit(1)
            )
        ).first()
        return int(result.rowcount) > 0, remaining is None  # type: ignore[attr-defined]

    async def complete_cleanups(self, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Delete these (workspace, Session) outbox rows; returns the keys that existed."""
        existed: set[tuple[str, str]] = set()
        key = tuple_(ResourceCleanupOutbox.workspace_id, ResourceCleanupOutbox.session_id)
        for start in range(0, len(keys), _CHUNK):
            chunk = list(keys[start : start + _CHUNK])
            rows = await self._db.execute(
                select(ResourceCleanupOutbox.workspace_id, ResourceCleanupOutbox.session_id).where(
                    key.in_(chunk)
                )
            )
            found = {(str(ws), str(sid)) for ws, sid in rows}
            if found:
                await self._db.execute(delete(ResourceCleanupOutbox).where(key.in_(sorted(found))))
            existed |= found
        return existed

    async def ids_with_pending_cleanup(self, session_ids: set[str]) -> set[str]:
        """Which of these Session ids still have an outbox row in any workspace."""
        found: set[str] = set()
        for chunk in _chunks(sorted(session_ids)):
            rows = await self._db.execute(
                select(ResourceCleanupOutbox.session_id)
                .where(ResourceCleanupOutbox.session_id.in_(chunk))
                .distinct()
            )
            found.update(str(row[0]) for row in rows)
        return found


async def session_records(
    db: AsyncSession, workspace_id: str, session_ids: Sequence[str]
) -> dict[str, SessionRecord]:
    """Full Session records of these ids (one query per chunk), keyed by id."""
    found: dict[str, SessionRecord] = {}
    for chunk in _chunks(session_ids):
        rows = (
            await db.execute(
                select(Session)
                .where(Session.workspace_id == workspace_id, Session.session_id.in_(chunk))
                .execution_options(populate_existing=True)
            )
        ).scalars()
        found.update({row.session_id: session_record(row) for row in rows})
    return found
