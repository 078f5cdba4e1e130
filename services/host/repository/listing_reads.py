"""The rail listings as direct reads: a page, its Turns, counts and totals in one statement.

``ListSessionSections``, ``ListSessionSectionPage`` (and the pinned and search pages, which
share it) and ``ListDeletedSessions`` run on every rail refresh. Through the ORM a page was
four statements (the page, a ``count`` or the maintained counts, the latest Turns by an ``IN``
list, the pending Interactions by another), each through the ``AsyncSession``, its identity
map and a loop hop; ``ListSessionSections`` does that for every section (ADR 0039).

Here a page is one :class:`~store.read_unions.ReadUnion` of fixed-arity Core statements,
compiled once per *shape* (which filters and whether a cursor are present) and run on a store
read thread (``store.direct_reads``, ADR 0023): the page rows, the pending Interaction counts
of the page rows' trees, the latest effective Turn of each page row
(joined to the page through a scalar subquery on ``ix_turns_session_created``), and
``total_count`` from ``session_listing_counts`` (ADR 0024). On Postgres that is one statement
and one round trip; on SQLite one statement per part in a deferred read transaction. The
page still reads a page's worth of ``ix_sessions_unpinned_roots`` / ``ix_sessions_pinned_roots``
(``INDEXED BY`` on SQLite, ``repository.listing_indexes``), so its cost does not depend on
how many Sessions exist.

A filter by an authorized Session-id set needs an ``IN`` list of up to 5,000 ids, which a
direct read refuses (fixed arity); such listings keep the ORM query of
:class:`~services.host.repository.sessions.SessionRepository` (:func:`supports`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Final, cast

from sqlalchemy import Integer, String, Table, and_, bindparam, func, literal_column, or_, select
from sqlalchemy.sql import ColumnElement

from services.host.model.records import SessionRecord, TurnRecord
from services.host.repository.deletion import DeletedListingQuery, TreeRow
from services.host.repository.hot_reads import SESSION_RECORD_KEYS
from services.host.repository.listing_indexes import PINNED_ROOTS_TABLE, UNPINNED_ROOTS_TABLE
from services.host.repository.projects import ProjectRecord
from services.host.repository.row_records import session_record, turn_record
from services.host.repository.sessions import RootSessionQuery
from store.direct_reads import ReadConnection, ReadQuery
from store.models import Interaction, Session, SessionListingCount, Turn, UserProject
from store.read_unions import ReadUnion, UnionPart

__all__ = [
    "DeletedRows",
    "ListingPage",
    "RailRows",
    "deleted_page",
    "explainable_deleted",
    "explainable_page",
    "like_contains",
    "listing_page",
    "rail",
    "supports",
]

_S = cast(Table, Session.__table__)
_T = cast(Table, Turn.__table__)
_I = cast(Table, Interaction.__table__)
_C = cast(Table, SessionListingCount.__table__)
_P = cast(Table, UserProject.__table__)

_LIKE_ESCAPE: Final = "/"


@dataclass(frozen=True)
class ListingPage:
    """One listing page's rows: at most ``limit`` Sessions and what their items carry."""

    sessions: list[SessionRecord]
    latest_turns: dict[str, TurnRecord]
    pending_counts: dict[str, int]
    total_count: int
    has_more: bool


@dataclass(frozen=True)
class RailRows:
    """``ListSessionSections``' rows: projects in rail order, their pages, then the rest."""

    projects: list[ProjectRecord]
    project_pages: list[ListingPage]
    conversations: ListingPage
    pinned: ListingPage


@dataclass(frozen=True)
class DeletedRows:
    """A page of topmost tombstones (up to the asked limit) and every member of their trees."""

    sessions: list[SessionRecord]
    trees: list[TreeRow]
    total_count: int | None


def supports(query: RootSessionQuery) -> bool:
    """Whether :func:`listing_page` can serve ``query`` (not an authorized id set)."""
    return query.session_ids is None


def like_contains(text: str) -> str:
    """A ``LIKE`` pattern (escape ``/``) matching values that contain ``text`` literally.

    The same escaping SQLAlchemy's ``contains(..., autoescape=True)`` applies, as a value, so
    the statement can bind it.
    """
    escaped = (
        text.replace(_LIKE_ESCAPE, _LIKE_ESCAPE * 2)
        .replace("%", _LIKE_ESCAPE + "%")
        .replace("_", _LIKE_ESCAPE + "_")
    )
    return f"%{escaped}%"


# --------------------------------------------------------------------------- section pages


@dataclass(frozen=True)
class _PageShape:
    """Which clauses a listing page's statement has (its values are parameters)."""

    section: bool
    pinned: bool | None
    agent: bool
    title: bool
    after: bool
    rows: int
    """How many rows the page reads (the page size + 1), written into the SQL."""


def _shape(query: RootSessionQuery, after: tuple[int, str] | None, limit: int) -> _PageShape:
    return _PageShape(
        section=query.section_key is not None,
        pinned=query.pinned,
        agent=query.agent_target_id is not None,
        title=bool(query.title_contains),
        after=after is not None,
        rows=limit + 1,
    )


def _fixed_limit(rows: int) -> Any:
    """``LIMIT <rows>`` as SQL text, not a parameter (see :data:`_SHAPES_KEPT`)."""
    return literal_column(str(int(rows)), Integer)


_SHAPES_KEPT: Final = 512
"""Compiled listing statements kept (shapes by page sizes; clients use a few page sizes).

The page size is part of the statement, not a parameter: psycopg prepares a statement after
its fifth use, and Postgres's *generic* plan for ``LIMIT $n`` assumes a large page, under
which it joined the page to every Turn with a hash join over a sequential scan (87 ms at
100,000 Sessions instead of 0.5 ms, ADR 0039). With the size in the SQL every plan knows the
page is ``rows`` rows.
"""


def _params(query: RootSessionQuery, after: tuple[int, str] | None, limit: int) -> dict[str, Any]:
    params: dict[str, Any] = {"ws": query.workspace_id}
    if query.section_key is not None:
        params["section"] = query.section_key
    if query.agent_target_id is not None:
        params["agent"] = query.agent_target_id
    if query.title_contains:
        params["title"] = like_contains(query.title_contains.lower())
    if after is not None:
        params["after_updated"], params["after_id"] = after
    return params


def _scope_clauses(shape: _PageShape, table: Any) -> list[ColumnElement[bool]]:
    """``live_roots_clauses`` of ``repository.sessions`` with every value a parameter."""
    clauses: list[ColumnElement[bool]] = [
        table.c.workspace_id == bindparam("ws"),
        table.c.deleted_at_unix_ms.is_(None),
        table.c.parent_session_id.is_(None),
    ]
    if shape.section:
        clauses.append(table.c.rail_section_key == bindparam("section"))
    if shape.pinned is True:
        clauses.append(table.c.pinned_at_unix_ms.is_not(None))
    elif shape.pinned is False:
        clauses.append(table.c.pinned_at_unix_ms.is_(None))
    if shape.agent:
        clauses.append(table.c.agent_target_id == bindparam("agent"))
    if shape.title:
        pattern = bindparam("title", type_=String)
        clauses.append(func.lower(table.c.title).like(pattern, escape=_LIKE_ESCAPE))
    return clauses


def _page_source(shape: _PageShape) -> Any:
    # ``page_source`` of ``repository.sessions``: the listing index that serves the order.
    if shape.pinned is True:
        return PINNED_ROOTS_TABLE
    if shape.pinned is False and shape.section:
        return UNPINNED_ROOTS_TABLE
    return _S


def _total_part(shape: _PageShape) -> UnionPart:
    """``total_count``: maintained counts where they answer it, else a count (ADR 0024)."""
    if shape.title:
        # A title filter is counted over its scope, as the ORM path does.
        counted = select(func.count().label("total")).select_from(_S)
        return UnionPart(counted.where(*_scope_clauses(shape, _S)))
    total = func.coalesce(func.sum(_C.c.live_roots), 0).label("total")
    counts = select(total).where(_C.c.workspace_id == bindparam("ws"))
    if shape.section:
        counts = counts.where(_C.c.rail_section_key == bindparam("section"))
    if shape.pinned is not None:
        counts = counts.where(_C.c.pinned.is_(shape.pinned))
    if shape.agent:
        counts = counts.where(_C.c.agent_target_id == bindparam("agent"))
    return UnionPart(counts)


@functools.lru_cache(maxsize=_SHAPES_KEPT)
def _page_read(shape: _PageShape) -> ReadUnion:
    """The page, its latest Turns and its total for one shape, built and compiled once."""
    source = _page_source(shape)
    clauses = _scope_clauses(shape, source)
    if shape.after:
        updated = bindparam("after_updated", type_=Integer)
        clauses.append(
            or_(
                source.c.updated_at_unix_ms < updated,
                and_(
                    source.c.updated_at_unix_ms == updated,
                    source.c.session_id > bindparam("after_id"),
                ),
            )
        )
    page = (
        select(*(source.c[key] for key in SESSION_RECORD_KEYS))
        .where(*clauses)
        .order_by(source.c.updated_at_unix_ms.desc(), source.c.session_id.asc())
        .limit(_fixed_limit(shape.rows))
        .subquery("page")
    )
    # Actionable pending Interactions of each page row's live tree: the ORM path's GROUP BY,
    # with its IN list of page ids replaced by the page itself.
    tree = _S.alias("tree")
    pending = UnionPart(
        select(tree.c.root_session_id.label("session_id"), func.count().label("pending"))
        .select_from(
            _I.join(
                tree,
                and_(
                    tree.c.workspace_id == _I.c.workspace_id,
                    tree.c.session_id == _I.c.session_id,
                ),
            )
        )
        .where(
            _I.c.workspace_id == bindparam("ws"),
            tree.c.root_session_id.in_(select(page.c.session_id).scalar_subquery()),
            tree.c.deleted_at_unix_ms.is_(None),
            _I.c.status == "pending",
            _I.c.actionable.is_(True),
        )
        .group_by(tree.c.root_session_id)
    )
    rows = UnionPart(
        select(*page.c), order_by=(page.c.updated_at_unix_ms.desc(), page.c.session_id.asc())
    )
    # The latest effective Turn of each page row: its id by an ORDER BY ... LIMIT 1 probe of
    # ix_turns_session_created per row, then the Turn by primary key.
    newest = _T.alias("newest")
    latest_id = (
        select(newest.c.turn_id)
        .where(
            newest.c.workspace_id == page.c.workspace_id,
            newest.c.session_id == page.c.session_id,
            newest.c.retracted_at_unix_ms.is_(None),
        )
        .order_by(newest.c.created_at_unix_ms.desc(), newest.c.turn_id.desc())
        .limit(1)
        .scalar_subquery()
    )
    latest_ids = select(page.c.session_id, latest_id.label("turn_id")).subquery("latest_ids")
    latest = UnionPart(
        select(_T).join(
            latest_ids,
            and_(
                _T.c.workspace_id == bindparam("ws"),
                _T.c.session_id == latest_ids.c.session_id,
                _T.c.turn_id == latest_ids.c.turn_id,
            ),
        )
    )
    return ReadUnion(rows=rows, latest=latest, pending=pending, total=_total_part(shape))


def listing_page(
    conn: ReadConnection,
    query: RootSessionQuery,
    *,
    after: tuple[int, str] | None,
    limit: int,
) -> ListingPage:
    """One page of ``query`` (HOST-SES-4), as ``SessionRepository.root_sessions`` pages it.

    Args:
        conn: the read's connection.
        query: scope and filters; not an authorized id set (:func:`supports`).
        after: ``(updated_at_unix_ms, session_id)`` of the previous page's last row.
        limit: page size.

    Raises:
        ValueError: ``query`` filters by an authorized id set.
    """
    if not supports(query):
        raise ValueError("an authorized id set is listed through the ORM query")
    parts = conn.union(_page_read(_shape(query, after, limit)), _params(query, after, limit))
    rows = parts["rows"]
    kept = rows[:limit]
    sessions = [session_record(row) for row in kept]
    on_page = {record.session_id for record in sessions}
    return ListingPage(
        sessions=sessions,
        latest_turns={
            row.session_id: turn_record(row) for row in parts["latest"] if row.session_id in on_page
        },
        pending_counts={
            row.session_id: int(row.pending)
            for row in parts["pending"]
            if row.session_id in on_page
        },
        total_count=int(parts["total"][0].total) if parts["total"] else 0,
        has_more=len(rows) > limit,
    )


def explainable_page(query: RootSessionQuery, *, limit: int) -> tuple[Any, dict[str, Any]]:
    """The first page's statement and its parts with their parameters bound (query plans)."""
    return _bound(_page_read(_shape(query, None, limit)), _params(query, None, limit))


def _bound(read: ReadUnion, params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    parts = {
        name: part.statement.params(params)
        for name, part in zip(read.names, read.part_queries, strict=True)
    }
    return read.statement.params(params), parts


_PROJECTS: Final = ReadQuery(
    select(_P.c.workspace_id, _P.c.project_key, _P.c.label, _P.c.path, _P.c.created_at_unix_ms)
    .where(_P.c.workspace_id == bindparam("ws"))
    .order_by(_P.c.label, _P.c.project_key)
)


def rail(
    conn: ReadConnection,
    scope: RootSessionQuery,
    *,
    conversations_key: str,
    limit: int,
) -> RailRows:
    """Every project section's first page, the conversations page and the pinned page.

    Runs in one read transaction (several statements), so every page describes one committed
    state.

    Args:
        conn: the read's connection.
        scope: the workspace and the filters (its section and pinned fields are ignored).
        conversations_key: the conversations section's key.
        limit: page size of every page.
    """
    projects = [
        ProjectRecord(
            workspace_id=row.workspace_id,
            section_key=row.project_key,
            label=row.label,
            path=row.path,
            created_at_unix_ms=row.created_at_unix_ms,
        )
        for row in conn.all(_PROJECTS, {"ws": scope.workspace_id})
    ]

    def section(key: str) -> ListingPage:
        query = dataclasses.replace(scope, section_key=key, pinned=False)
        return listing_page(conn, query, after=None, limit=limit)

    return RailRows(
        projects=projects,
        project_pages=[section(project.section_key) for project in projects],
        conversations=section(conversations_key),
        pinned=listing_page(
            conn, dataclasses.replace(scope, section_key=None, pinned=True), after=None, limit=limit
        ),
    )


# --------------------------------------------------------------------------- deleted listing


@dataclass(frozen=True)
class _DeletedShape:
    section: bool
    title: bool
    after: bool
    count: bool
    rows: int


def _topmost_clauses(shape: _DeletedShape) -> list[ColumnElement[bool]]:
    """``DeletionRepository._topmost_clauses`` with every value a parameter."""
    parent = _S.alias("parent")
    # A per-row scalar subquery (one primary-key probe), not EXISTS: see ADR 0024.
    parent_live = (
        select(parent.c.deleted_at_unix_ms.is_(None))
        .where(
            parent.c.workspace_id == _S.c.workspace_id,
            parent.c.session_id == _S.c.parent_session_id,
        )
        .scalar_subquery()
    )
    clauses: list[ColumnElement[bool]] = [
        _S.c.workspace_id == bindparam("ws"),
        _S.c.deleted_at_unix_ms.is_not(None),
        or_(_S.c.parent_session_id.is_(None), parent_live),
    ]
    if shape.section:
        clauses.append(_S.c.rail_section_key == bindparam("section"))
    if shape.title:
        pattern = bindparam("title", type_=String)
        clauses.append(func.lower(_S.c.title).like(pattern, escape=_LIKE_ESCAPE))
    return clauses


_TREE_KEYS: Final = tuple(field.name for field in dataclasses.fields(TreeRow))


@functools.lru_cache(maxsize=_SHAPES_KEPT)
def _deleted_read(shape: _DeletedShape) -> ReadUnion:
    clauses = _topmost_clauses(shape)
    if shape.after:
        updated = bindparam("after_updated", type_=Integer)
        clauses.append(
            or_(
                _S.c.updated_at_unix_ms < updated,
                and_(_S.c.updated_at_unix_ms == updated, _S.c.session_id > bindparam("after_id")),
            )
        )
    order = (_S.c.updated_at_unix_ms.desc(), _S.c.session_id.asc())
    limit = _fixed_limit(shape.rows)
    page = select(*(_S.c[key] for key in SESSION_RECORD_KEYS)).where(*clauses)
    roots = select(_S.c.root_session_id).where(*clauses).order_by(*order).limit(limit)
    member = _S.alias("member")
    trees = select(*(member.c[key] for key in _TREE_KEYS)).where(
        member.c.workspace_id == bindparam("ws"),
        member.c.root_session_id.in_(roots.scalar_subquery()),
    )
    parts = {
        "page": UnionPart(page, order_by=order, limit=limit),
        "trees": UnionPart(trees),
    }
    if shape.count:
        counted = select(func.count().label("total")).select_from(_S)
        parts["total"] = UnionPart(counted.where(*_topmost_clauses(shape)))
    return ReadUnion(**parts)


def explainable_deleted(query: DeletedListingQuery, *, limit: int) -> tuple[Any, dict[str, Any]]:
    """The first deleted page's statement and its parts, parameters bound (query plans)."""
    shape, params = _deleted_params(query, None, limit, count=False)
    return _bound(_deleted_read(shape), params)


def _deleted_params(
    query: DeletedListingQuery, after: tuple[int, str] | None, limit: int, *, count: bool
) -> tuple[_DeletedShape, dict[str, Any]]:
    shape = _DeletedShape(
        section=query.section_key is not None,
        title=bool(query.title_contains),
        after=after is not None,
        count=count,
        rows=limit,
    )
    params: dict[str, Any] = {"ws": query.workspace_id}
    if query.section_key is not None:
        params["section"] = query.section_key
    if query.title_contains:
        params["title"] = like_contains(query.title_contains.lower())
    if after is not None:
        params["after_updated"], params["after_id"] = after
    return shape, params


def deleted_page(
    conn: ReadConnection,
    query: DeletedListingQuery,
    *,
    after: tuple[int, str] | None,
    limit: int,
    count: bool,
) -> DeletedRows:
    """Topmost tombstones after ``after`` (``limit`` rows) with their trees (HOST-DEL-7).

    ``DeletionRepository.deleted_page`` and ``tree_rows`` in one statement: the trees are
    every Session whose root is the root of a page row. The total is counted only with
    ``count`` (it reads every matching tombstone, ADR 0024).
    """
    shape, params = _deleted_params(query, after, limit, count=count)
    parts = conn.union(_deleted_read(shape), params)
    trees = [TreeRow(**{key: getattr(row, key) for key in _TREE_KEYS}) for row in parts["trees"]]
    total = parts.get("total")
    return DeletedRows(
        sessions=[session_record(row) for row in parts["page"]],
        trees=trees,
        total_count=int(total[0].total) if count and total else None,
    )
