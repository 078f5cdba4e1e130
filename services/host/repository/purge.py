"""Set-based SQL of the retention purge (HOST-DEL-9).

A restorable tombstone tree is exactly one component: every member carries the component's
generation (a fresh id per delete) and ``deleted_at``, and the component's size. So the purge
reads and removes components **by generation** rather than Session by Session:

* :meth:`PurgeRepository.component_shapes` aggregates each candidate component in one statement
  (members, the range of ``deleted_at`` and ``component_size``, legacy members, children outside
  the component, members whose parent is outside it), which is enough to decide that the tree
  of a topmost tombstone is that component and nothing else, and in the same statement the
  canonical rows and payload bytes a purge of it would remove (its volume: one pass over the
  members instead of a second statement over the same rows);
* :meth:`PurgeRepository.component_volumes` counts the volume alone, for the rare tree the scan
  classified from its rows;
* :meth:`PurgeRepository.purge_components` removes components with the fence in the ``DELETE``
  itself — workspace, root, generation **and** exact ``deleted_at`` — and writes their
  resource-cleanup outbox rows in the same transaction (on Postgres in the same statement). It
  returns what it removed, so the caller can compare with what the scan selected and roll back
  when a component changed in between.

Id sets travel as one array parameter on Postgres (see ``repository.deletion``) and as ``IN``
lists of at most ``_CHUNK`` trees on SQLite; a tree never spans two statements, because all its
members share the root the statements are chunked by.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    LargeBinary,
    Table,
    Text,
    and_,
    case,
    cast,
    delete,
    exists,
    func,
    literal,
    or_,
    select,
    tuple_,
    union_all,
)
from sqlalchemy.dialects import postgresql, sqlite

from services.host.repository.id_sets import IdSetStatements
from store.models import Interaction, Message, ResourceCleanupOutbox, Session, Turn

__all__ = ["ComponentFence", "ComponentShape", "PurgeRepository"]

_CHUNK = 400
"""Trees per SQLite statement (two parameters each stay far below SQLite's limit)."""
_ARRAY_CHUNK = 5_000
"""Trees per Postgres statement (array parameters)."""

_sessions: Table = Session.__table__  # type: ignore[assignment]
_outbox: Table = ResourceCleanupOutbox.__table__  # type: ignore[assignment]
# Aliases are built once: SQLAlchemy copies every column of a table for each new alias.
_member = _sessions.alias("member")
_child = _sessions.alias("child")
_parent = _sessions.alias("parent")


@dataclass(frozen=True)
class ComponentFence:
    """What identifies one selected component: the purge removes exactly these rows."""

    root_session_id: str
    generation: str
    deleted_at_unix_ms: int


@dataclass(frozen=True)
class ComponentShape:
    """Aggregates over the rows of one generation inside the candidate roots."""

    members: int
    deleted_at_range: tuple[int, int]
    component_size_range: tuple[int, int]
    legacy_members: int
    foreign_children: int
    """Children of a member that are not in the component (live, legacy, another generation)."""
    heads: int
    """Members whose parent is not in the component (exactly the topmost in a sound tree)."""
    owned_rows: int = 0
    """Turns, Messages and Interactions of the members (the Sessions not included)."""
    payload_bytes: int = 0
    """Stored bytes of the members' message payloads."""


class PurgeRepository(IdSetStatements):
    """Reads and removes whole tombstone components by generation."""

    def _chunks(self, fences: Sequence[ComponentFence]) -> Iterator[Sequence[ComponentFence]]:
        """Trees per statement; a tree never spans two (its members share its root)."""
        return self._batched(fences, sqlite_size=_CHUNK, postgres_size=_ARRAY_CHUNK)

    def _in_components(self, table: Any, fences: Sequence[ComponentFence]) -> ColumnElement[bool]:
        """Rows of ``sessions`` (or an alias) that belong to one of these components."""
        roots = sorted({fence.root_session_id for fence in fences})
        generations = [fence.generation for fence in fences]
        return and_(
            self._among(table.c.root_session_id, roots),
            self._among(table.c.deletion_generation, generations),
        )

    def _fenced(self, fences: Sequence[ComponentFence]) -> ColumnElement[bool]:
        """The exact fence: root, generation and ``deleted_at`` of each selected component."""
        pair = tuple_(_sessions.c.deletion_generation, _sessions.c.deleted_at_unix_ms)
        if self._postgres:
            pairs = (
                func.unnest(
                    literal([f.generation for f in fences], postgresql.ARRAY(Text)),
                    literal([f.deleted_at_unix_ms for f in fences], postgresql.ARRAY(BigInteger)),
                )
                .table_valued("generation", "deleted_at")
                .render_derived()
            )
            matches = pair.in_(select(pairs.c.generation, pairs.c.deleted_at))
        else:
            matches = pair.in_([(f.generation, f.deleted_at_unix_ms) for f in fences])
        return and_(self._in_components(_sessions, fences), matches)

    # ---------------------------------------------------------------------------- scan

    async def component_shapes(
        self, workspace_id: str, fences: Sequence[ComponentFence]
    ) -> dict[str, ComponentShape]:
        """Per generation: the aggregates that decide whether it is one whole, clean tree."""
        member, child, parent = _member, _child, _parent
        foreign_child = exists().where(
            child.c.workspace_id == member.c.workspace_id,
            child.c.parent_session_id == member.c.session_id,
            or_(
                child.c.deletion_generation.is_(None),
                child.c.deletion_generation != member.c.deletion_generation,
            ),
        )
        parent_inside = exists().where(
            parent.c.workspace_id == member.c.workspace_id,
            parent.c.session_id == member.c.parent_session_id,
            parent.c.deletion_generation == member.c.deletion_generation,
        )
        owned_rows, payload_bytes, source = self._member_volume()
        shapes: dict[str, ComponentShape] = {}
        for chunk in self._chunks(fences):
            statement = (
                select(
                    member.c.deletion_generation,
                    func.count(),
                    func.min(member.c.deleted_at_unix_ms),
                    func.max(member.c.deleted_at_unix_ms),
                    func.min(member.c.component_size),
                    func.max(member.c.component_size),
                    func.sum(case((member.c.tombstone_legacy, 1), else_=0)),
                    func.sum(case((foreign_child, 1), else_=0)),
                    func.sum(case((parent_inside, 0), else_=1)),
                    func.sum(owned_rows),
                    func.sum(payload_bytes),
                )
                .select_from(source)
                .where(member.c.workspace_id == workspace_id, self._in_components(member, chunk))
                .group_by(member.c.deletion_generation)
            )
            for row in await self._db.execute(statement):
                shapes[str(row[0])] = ComponentShape(
                    members=int(row[1]),
                    deleted_at_range=(int(row[2]), int(row[3])),
                    component_size_range=(int(row[4] or 0), int(row[5] or 0)),
                    legacy_members=int(row[6]),
                    foreign_children=int(row[7]),
                    heads=int(row[8]),
                    owned_rows=int(row[9] or 0),
                    payload_bytes=int(row[10] or 0),
                )
        return shapes

    def _member_volume(self) -> tuple[ColumnElement[int], ColumnElement[int], Any]:
        """Per member of ``_member``: owned rows, payload bytes, and the FROM they need.

        Correlated per member, so each member's index range is probed once; on Postgres the
        member's messages are read once for both their count and their bytes (``LATERAL``),
        SQLite has no ``LATERAL`` and probes the range twice (count, then bytes).
        """

        def count(model: Any) -> ColumnElement[int]:
            return (
                select(func.count())
                .where(
                    model.workspace_id == _member.c.workspace_id,
                    model.session_id == _member.c.session_id,
                )
                .scalar_subquery()
            )

        others = count(Turn) + count(Interaction)
        if self._postgres:
            messages = (
                select(
                    func.count().label("rows"),
                    func.coalesce(func.sum(self._payload_bytes()), 0).label("bytes"),
                )
                .where(
                    Message.workspace_id == _member.c.workspace_id,
                    Message.session_id == _member.c.session_id,
                )
                .lateral("owned_messages")
            )
            return (
                messages.c.rows + others,
                messages.c.bytes,
                _member.join(messages, literal(True)),
            )
        size = (
            select(func.coalesce(func.sum(self._payload_bytes()), 0))
            .where(
                Message.workspace_id == _member.c.workspace_id,
                Message.session_id == _member.c.session_id,
            )
            .scalar_subquery()
        )
        return count(Message) + others, size, _member

    def _payload_bytes(self) -> ColumnElement[int]:
        """Stored UTF-8 bytes of a message payload, the same on both backends.

        Postgres ``octet_length`` reads the size from the TOAST header without de-toasting the
        value; SQLite counts the bytes of the text cast to a blob.
        """
        if self._postgres:
            return func.octet_length(Message.payload_json)
        return func.length(cast(Message.payload_json, LargeBinary))

    def _owned_rows(
        self,
        workspace_id: str,
        fences: Sequence[ComponentFence],
        model: Any,
        size: ColumnElement[int],
    ) -> Any:
        """``(generation, rows, size)`` of one owned table, grouped by component (Postgres)."""
        member = _member
        return (
            select(member.c.deletion_generation, func.count(), func.coalesce(size, 0))
            .select_from(member)
            .join(
                model,
                and_(
                    model.workspace_id == member.c.workspace_id,
                    model.session_id == member.c.session_id,
                ),
            )
            .where(member.c.workspace_id == workspace_id, self._in_components(member, fences))
            .group_by(member.c.deletion_generation)
        )

    def _owned_per_member(self, workspace_id: str, fences: Sequence[ComponentFence]) -> Any:
        """The SQLite form of the volume: correlated per-member counts.

        Joined, SQLite's planner drives the join from the owned table's workspace prefix and
        reads every message of the workspace; correlated, it probes each member's index range.
        """

        def owned(model: Any, aggregate: ColumnElement[Any]) -> Any:
            return (
                select(aggregate)
                .where(
                    model.workspace_id == _member.c.workspace_id,
                    model.session_id == _member.c.session_id,
                )
                .scalar_subquery()
            )

        rows = (
            func.sum(owned(Message, func.count()))
            + func.sum(owned(Turn, func.count()))
            + func.sum(owned(Interaction, func.count()))
        )
        size = func.sum(owned(Message, func.coalesce(func.sum(self._payload_bytes()), 0)))
        return (
            select(_member.c.deletion_generation, rows, size)
            .where(_member.c.workspace_id == workspace_id, self._in_components(_member, fences))
            .group_by(_member.c.deletion_generation)
        )

    async def component_volumes(
        self, workspace_id: str, fences: Sequence[ComponentFence]
    ) -> dict[str, tuple[int, int]]:
        """Per generation: owned canonical rows and stored message payload bytes.

        The owned rows are Turns, Messages and Interactions (the Sessions themselves not
        included). One statement per chunk.
        """
        volumes: dict[str, list[int]] = {}
        for chunk in self._chunks(fences):
            if self._postgres:
                counted: Any = union_all(
                    self._owned_rows(workspace_id, chunk, Message, func.sum(self._payload_bytes())),
                    self._owned_rows(workspace_id, chunk, Turn, literal(0, Integer)),
                    self._owned_rows(workspace_id, chunk, Interaction, literal(0, Integer)),
                )
            else:
                counted = self._owned_per_member(workspace_id, chunk)
            for generation, rows, size in await self._db.execute(counted):
                entry = volumes.setdefault(str(generation), [0, 0])
                entry[0] += int(rows or 0)
                entry[1] += int(size or 0)
        return {generation: (rows, size) for generation, (rows, size) in volumes.items()}

    async def component_members(
        self, workspace_id: str, fences: Sequence[ComponentFence]
    ) -> dict[str, list[str]]:
        """Per generation: its Session ids (what a dry run reports)."""
        members: dict[str, list[str]] = {}
        for chunk in self._chunks(fences):
            rows = await self._db.execute(
                select(_sessions.c.deletion_generation, _sessions.c.session_id)
                .where(_sessions.c.workspace_id == workspace_id, self._fenced(chunk))
                .order_by(_sessions.c.session_id)
            )
            for generation, session_id in rows:
                members.setdefault(str(generation), []).append(str(session_id))
        return members

    # --------------------------------------------------------------------------- write

    async def lock_roots(self, workspace_id: str, root_ids: Sequence[str]) -> None:
        """Postgres: ``FOR UPDATE`` on the tree roots, in id order.

        That is the order every Turn-settling writer and delete uses, so a purge never
        deadlocks with them. SQLite's ``BEGIN IMMEDIATE`` already excludes every other writer.
        """
        if not self._postgres:
            return
        roots = sorted(set(root_ids))
        for start in range(0, len(roots), _ARRAY_CHUNK):
            await self._db.execute(
                select(_sessions.c.session_id)
                .where(
                    _sessions.c.workspace_id == workspace_id,
                    self._among(_sessions.c.session_id, roots[start : start + _ARRAY_CHUNK]),
                )
                .order_by(_sessions.c.session_id)
                .with_for_update()
            )

    async def under_tombstoned_parent(
        self, workspace_id: str, session_ids: Sequence[str]
    ) -> set[str]:
        """Which of these Sessions have a tombstoned parent (are no longer topmost)."""
        if not session_ids:
            return set()
        rows = await self._db.execute(
            select(_member.c.session_id)
            .join(
                _parent,
                and_(
                    _parent.c.workspace_id == _member.c.workspace_id,
                    _parent.c.session_id == _member.c.parent_session_id,
                ),
            )
            .where(
                _member.c.workspace_id == workspace_id,
                self._among(_member.c.session_id, sorted(set(session_ids))),
                _parent.c.deleted_at_unix_ms.is_not(None),
            )
        )
        return {str(row[0]) for row in rows}

    async def purge_components(
        self,
        workspace_id: str,
        fences: Sequence[ComponentFence],
        now: int,
        reason: str,
    ) -> list[tuple[str, str]]:
        """Remove the fenced components and write one cleanup-outbox row per removed Session.

        Everything a Session owns goes with it (``ON DELETE CASCADE``). A child outside the
        removed rows makes the statement fail (the parent edge is ``NO ACTION``, checked at the
        end of the statement), so a removed tree is always complete. A pending outbox row for
        the same key (an earlier purge of a reused id) is kept (``ON CONFLICT DO NOTHING``).

        Returns:
            ``(session_id, generation)`` of every removed Session.

        Raises:
            sqlalchemy.exc.IntegrityError: a member gained a child outside its component; the
                caller rolls the transaction back.
        """
        removed: list[tuple[str, str]] = []
        for chunk in self._chunks(fences):
            where = and_(_sessions.c.workspace_id == workspace_id, self._fenced(chunk))
            outbox_columns = ["workspace_id", "session_id", "purged_at_unix_ms", "reason"]

            def outbox_rows(session_id: Any) -> Any:
                return select(
                    literal(workspace_id, Text),
                    session_id,
                    literal(now, BigInteger),
                    literal(reason, Text),
                )

            if self._postgres:
                # One statement: the DELETE's RETURNING feeds the outbox INSERT.
                doomed = (
                    delete(_sessions)
                    .where(where)
                    .returning(_sessions.c.session_id, _sessions.c.deletion_generation)
                    .cte("doomed")
                )
                written = (
                    postgresql.insert(_outbox)
                    .from_select(outbox_columns, outbox_rows(doomed.c.session_id))
                    .on_conflict_do_nothing()
                    .cte("written")
                )
                statement: Any = (
                    select(doomed.c.session_id, doomed.c.deletion_generation)
                    .add_cte(written)
                    .select_from(doomed)
                )
                rows = await self._db.execute(statement)
            else:
                # The SELECT has a WHERE clause, which SQLite needs to parse ON CONFLICT here.
                await self._db.execute(
                    sqlite.insert(_outbox)
                    .from_select(outbox_columns, outbox_rows(_sessions.c.session_id).where(where))
                    .on_conflict_do_nothing()
                )
                rows = await self._db.execute(
                    delete(_sessions)
                    .where(where)
                    .returning(_sessions.c.session_id, _sessions.c.deletion_generation)
                )
            removed.extend((str(row[0]), str(row[1])) for row in rows)
        return removed
