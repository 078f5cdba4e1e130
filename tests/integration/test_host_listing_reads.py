"""The listing pages as direct reads return what the ORM listing query returns (ADR 0039).

``repository.listing_reads`` reads a page, its latest Turns, its pending Interaction counts and
its total in one statement (Postgres) or one statement per part (SQLite). These tests seed a
workspace with the cases a listing must get right — pinned roots, children and tombstoned
children, tombstoned roots and topmost child tombstones, ties on ``updated_at``, retracted and
tied Turns, pending Interactions in live and tombstoned tree members, titles with ``LIKE``
wildcards, two agent targets — and walk every listing page by page through both forms of the
direct read and through the ORM query (``SessionRepository`` / ``DeletionRepository``), which
must agree on every page, cursor position and total, on SQLite and Postgres.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar, cast

import pytest
from sqlalchemy import Engine, Table, insert

from services.host.context import HostContext
from services.host.repository import listing_reads
from services.host.repository.deletion import DeletedListingQuery
from services.host.repository.listing_reads import ListingPage
from services.host.repository.sessions import RootSessionQuery
from services.host.repository.unit_of_work import HostTransaction
from services.host.sessions import listing
from services.host.wire.command_codec import ProtoCommandCodec
from store.database import Database
from store.direct_reads import DirectReads, ReadConnection
from store.models import Interaction, Session, Turn, UserProject

_S = cast(Table, Session.__table__)
_T = cast(Table, Turn.__table__)
_I = cast(Table, Interaction.__table__)
_P = cast(Table, UserProject.__table__)

WS = "ws-1"
ResultT = TypeVar("ResultT")


def _session(session_id: str, **values: Any) -> dict[str, Any]:
    return {
        "workspace_id": WS,
        "session_id": session_id,
        "root_session_id": session_id,
        "agent_target_id": "demo",
        "provider": "demo",
        "title": f"title {session_id}",
        "cwd": "/work",
        "rail_section_key": "conversations",
        "settings_json": '{"model": "m"}',
        "capabilities_json": "{}",
        "message_version": 0,
        "next_message_sequence": 1,
        "created_at_unix_ms": 1,
        "updated_at_unix_ms": 1,
        "tombstone_legacy": False,
        # Every row names every column: they are inserted together (executemany).
        "parent_session_id": None,
        "pinned_at_unix_ms": None,
        "deleted_at_unix_ms": None,
        "deletion_generation": None,
        "component_size": None,
        **values,
    }


def _turn(session_id: str, turn_id: str, created: int, **values: Any) -> dict[str, Any]:
    return {
        "workspace_id": WS,
        "session_id": session_id,
        "turn_id": turn_id,
        "client_submit_id": f"submit-{turn_id}",
        "phase": "settled",
        "outcome": "completed",
        "origin": "user",
        "version": 1,
        "created_at_unix_ms": created,
        "updated_at_unix_ms": created,
        "result_resolved_empty": False,
        "retracted_at_unix_ms": None,
        **values,
    }


def _interaction(session_id: str, turn_id: str, request_id: str, **values: Any) -> dict[str, Any]:
    return {
        "workspace_id": WS,
        "session_id": session_id,
        "turn_id": turn_id,
        "request_id": request_id,
        "kind": "approval",
        "status": "pending",
        "actionable": True,
        "version": 1,
        "occurred_at_unix_ms": 1,
        "created_at_unix_ms": 1,
        "updated_at_unix_ms": 1,
        **values,
    }


def seed(engine: Engine) -> None:
    """Roots over two projects and conversations, with every case a page must get right."""
    sessions: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    interactions: list[dict[str, Any]] = []
    sections = ("proj-a", "proj-b", "conversations")
    tomb = {"deletion_generation": "g", "component_size": 1}
    for index in range(23):
        sid = f"r{index:02d}"
        values: dict[str, Any] = {
            "rail_section_key": sections[index % 3],
            # Ties on updated_at: pages must break them by session_id across cursors.
            "updated_at_unix_ms": 100 - index // 2,
            "agent_target_id": "demo" if index % 4 else "other",
            "title": ("Report 50%_done " if index % 5 == 0 else "Plain ") + sid,
        }
        if index % 6 == 0:
            values["pinned_at_unix_ms"] = 500 + index
        if index % 7 == 3:
            values.update(deleted_at_unix_ms=900 + index, **tomb)
        sessions.append(_session(sid, **values))
        if index % 3 != 1:  # some roots have no Turn at all
            turns.append(_turn(sid, f"{sid}-t1", 10))
            turns.append(_turn(sid, f"{sid}-t2", 20))
            # Same creation time: the higher turn_id is the latest.
            turns.append(_turn(sid, f"{sid}-t3", 20))
            if index % 2:
                # A retracted newest Turn is not the latest effective one.
                turns.append(_turn(sid, f"{sid}-t4", 30, retracted_at_unix_ms=31))
        if index % 3 == 0:
            interactions.append(_interaction(sid, f"{sid}-t1", "q1"))
            interactions.append(_interaction(sid, f"{sid}-t2", "q2", actionable=False))
            interactions.append(_interaction(sid, f"{sid}-t2", "q3", status="answered"))
    # Trees: a live child with pending Interactions (counted for its root), a tombstoned
    # child with pending ones (not counted; a topmost tombstone of a live parent), and a
    # tombstoned grandchild under it (not topmost).
    for root in ("r00", "r04", "r09"):
        child = {"root_session_id": root, "parent_session_id": root, "updated_at_unix_ms": 1000}
        sessions.append(_session(f"{root}-c", **child))
        turns.append(_turn(f"{root}-c", f"{root}-c-t", 5))
        interactions.append(_interaction(f"{root}-c", f"{root}-c-t", "qc1"))
        interactions.append(_interaction(f"{root}-c", f"{root}-c-t", "qc2"))
        gone = {**child, "deleted_at_unix_ms": 950, "deletion_generation": "h"}
        sessions.append(_session(f"{root}-x", **gone, component_size=2))
        turns.append(_turn(f"{root}-x", f"{root}-x-t", 5))
        interactions.append(_interaction(f"{root}-x", f"{root}-x-t", "qx"))
        sessions.append(
            _session(
                f"{root}-xx",
                **{**gone, "parent_session_id": f"{root}-x", "updated_at_unix_ms": 960},
                component_size=2,
            )
        )
    # A deleted root tree whose verdict is not restorable (size mismatch) and a legacy one.
    sessions.append(
        _session("dead", deleted_at_unix_ms=800, deletion_generation="k", component_size=5)
    )
    sessions.append(_session("legacy", deleted_at_unix_ms=800, tombstone_legacy=True))
    with engine.begin() as connection:
        connection.execute(
            insert(_P),
            [
                {
                    "workspace_id": WS,
                    "project_key": key,
                    "label": label,
                    "path": f"/work/{key}",
                    "created_at_unix_ms": 1,
                    "updated_at_unix_ms": 1,
                }
                for key, label in (("proj-b", "Alpha"), ("proj-a", "Bravo"))
            ],
        )
        # Parents first: the foreign key of a child names its parent.
        ordered = sorted(sessions, key=lambda row: row["session_id"].count("-"))
        connection.execute(insert(_S), ordered)
        connection.execute(insert(_T), turns)
        connection.execute(insert(_I), interactions)


async def _direct(url: str, read: Callable[[ReadConnection], ResultT]) -> list[ResultT]:
    """``read`` with its unions as one statement, then as one statement per part."""
    results = []
    for one in (True, False):
        reads = DirectReads(url, connections=1, unions_as_one_statement=one)
        try:
            results.append(await reads.run(read, one_statement=True))
        finally:
            await reads.close()
    return results


async def _orm(url: str, command: Callable[[HostTransaction], Any]) -> Any:
    database = Database(url)
    await database.start()
    try:
        ctx = HostContext(database=database, command_codec=ProtoCommandCodec())
        return await ctx.transact(command, write=False)
    finally:
        await database.stop()


def _orm_page(
    query: RootSessionQuery, after: tuple[int, str] | None, limit: int
) -> Callable[[HostTransaction], Any]:
    async def command(repos: HostTransaction) -> ListingPage:
        result = await repos.sessions.root_sessions(query, after=after, limit=limit)
        ids = [s.session_id for s in result.sessions]
        return ListingPage(
            sessions=result.sessions,
            latest_turns=await repos.sessions.latest_turns(query.workspace_id, ids),
            pending_counts=await repos.sessions.pending_interaction_counts(query.workspace_id, ids),
            total_count=result.total_count,
            has_more=result.has_more,
        )

    return command


QUERIES = {
    "section": RootSessionQuery(WS, section_key="proj-a", pinned=False),
    "conversations": RootSessionQuery(WS, section_key="conversations", pinned=False),
    "pinned": RootSessionQuery(WS, pinned=True),
    "section by target": RootSessionQuery(
        WS, section_key="proj-b", pinned=False, agent_target_id="demo"
    ),
    "pinned by target": RootSessionQuery(WS, pinned=True, agent_target_id="other"),
    "search": RootSessionQuery(WS, title_contains="report"),
    "search with wildcards": RootSessionQuery(WS, title_contains="50%_d"),
    "wildcards match literally": RootSessionQuery(WS, title_contains="5%0"),
    "search in a section by target": RootSessionQuery(
        WS, section_key="conversations", pinned=False, title_contains="r", agent_target_id="demo"
    ),
    "empty section": RootSessionQuery(WS, section_key="proj-none", pinned=False),
}


@pytest.mark.spec("HOST-SES-4")
@pytest.mark.parametrize("name", sorted(QUERIES))
def test_every_page_of_a_listing_is_the_orm_querys_page(
    migrated_db_url: str, sync_engine: Engine, name: str
) -> None:
    seed(sync_engine)
    query = QUERIES[name]
    after: tuple[int, str] | None = None
    seen: list[str] = []
    for _ in range(30):
        position = after
        one, parts = asyncio.run(
            _direct(
                migrated_db_url,
                lambda conn, at=position: listing_reads.listing_page(  # type: ignore[misc]
                    conn, query, after=at, limit=2
                ),
            )
        )
        orm = asyncio.run(_orm(migrated_db_url, _orm_page(query, position, 2)))
        assert one == parts
        assert one == orm
        seen.extend(s.session_id for s in one.sessions)
        if not one.has_more:
            break
        last = one.sessions[-1]
        after = (last.updated_at_unix_ms, last.session_id)
    assert len(seen) == len(set(seen))
    assert len(seen) == orm.total_count
    if name == "pinned":
        assert seen
    if name == "section":
        # r00 (pinned) is not here; r03 is proj-a but tombstoned; r09's tree counts its live
        # child's two pending Interactions and not its tombstoned child's.
        assert "r03" not in seen
        assert "r00" not in seen
    if name == "wildcards match literally":
        assert seen == []
    if name == "search with wildcards":
        assert seen


@pytest.mark.spec("HOST-SES-4")
def test_pending_counts_and_latest_turns_cover_the_live_tree(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    seed(sync_engine)
    query = RootSessionQuery(WS, section_key="proj-a", pinned=False)
    page = asyncio.run(
        _direct(
            migrated_db_url,
            lambda conn: listing_reads.listing_page(conn, query, after=None, limit=50),
        )
    )[0]
    ids = [s.session_id for s in page.sessions]
    assert "r09" in ids
    # r09: its own q1, its live child's qc1 and qc2; not the tombstoned child's qx, nor the
    # non-actionable or answered ones.
    assert page.pending_counts["r09"] == 3
    assert page.latest_turns["r09"].turn_id == "r09-t3"  # r09-t4 is retracted
    assert "r10" not in page.latest_turns  # r10 has no Turn (index % 3 == 1)


def _orm_deleted(
    query: DeletedListingQuery, after: tuple[int, str] | None, limit: int, count: bool
) -> Callable[[HostTransaction], Any]:
    async def command(repos: HostTransaction) -> listing_reads.DeletedRows:
        rows, total = await repos.deletion.deleted_page(
            query, after=after, limit=limit, count=count
        )
        ids = [row.session_id for row in rows]
        roots = {row.root_session_id for row in rows}
        return listing_reads.DeletedRows(
            sessions=await repos.deletion.records(WS, ids),
            trees=await repos.deletion.tree_rows(WS, roots),
            total_count=total,
        )

    return command


DELETED_QUERIES = {
    "all": DeletedListingQuery(WS),
    "section": DeletedListingQuery(WS, section_key="conversations"),
    "title": DeletedListingQuery(WS, title_contains="PLAIN"),
    "wildcards": DeletedListingQuery(WS, title_contains="%_"),
}


@pytest.mark.spec("HOST-DEL-7")
@pytest.mark.parametrize("count", [False, True])
@pytest.mark.parametrize("name", sorted(DELETED_QUERIES))
def test_every_page_of_the_deleted_listing_is_the_orm_querys_page(
    migrated_db_url: str, sync_engine: Engine, name: str, count: bool
) -> None:
    seed(sync_engine)
    query = DELETED_QUERIES[name]
    after: tuple[int, str] | None = None
    seen: list[str] = []
    for _ in range(30):
        position = after
        one, parts = asyncio.run(
            _direct(
                migrated_db_url,
                lambda conn, at=position: listing_reads.deleted_page(  # type: ignore[misc]
                    conn, query, after=at, limit=3, count=count
                ),
            )
        )
        orm = asyncio.run(_orm(migrated_db_url, _orm_deleted(query, position, 3, count)))
        assert one.sessions == parts.sessions == orm.sessions
        key = lambda row: row.session_id  # noqa: E731
        assert sorted(one.trees, key=key) == sorted(parts.trees, key=key)
        assert sorted(one.trees, key=key) == sorted(orm.trees, key=key)
        assert one.total_count == parts.total_count == orm.total_count
        seen.extend(s.session_id for s in one.sessions)
        if len(one.sessions) < 3:
            break
        last = one.sessions[-1]
        after = (last.updated_at_unix_ms, last.session_id)
    assert len(seen) == len(set(seen))
    if name == "all":
        # Topmost only: child tombstones of live parents, never the grandchildren below them.
        assert {"r00-x", "r04-x", "r09-x", "dead", "legacy"} <= set(seen)
        assert not any(s.endswith("-xx") for s in seen)


@pytest.mark.spec("HOST-SES-4")
@pytest.mark.parametrize("target", [None, "demo"])
def test_the_rail_is_the_same_through_the_direct_read_and_the_orm_query(
    migrated_db_url: str, sync_engine: Engine, target: str | None
) -> None:
    """``ListSessionSections`` without an id set (direct read) and with the set of every
    Session (the ORM query) describe the same rail: same sections, items, cursors, totals."""
    seed(sync_engine)
    every = frozenset(f"r{i:02d}" for i in range(23)) | {f"{r}-c" for r in ("r00", "r04", "r09")}

    async def both() -> tuple[listing.RailSections, listing.RailSections]:
        database = Database(migrated_db_url)
        await database.start()
        try:
            ctx = HostContext(database=database, command_codec=ProtoCommandCodec())
            direct = await listing.list_sections(
                ctx, WS, listing.ListFilter(agent_target_id=target), 2
            )
            orm = await listing.list_sections(
                ctx,
                WS,
                listing.ListFilter(agent_target_id=target, authorized_session_ids=every),
                2,
            )
            return direct, orm
        finally:
            await database.stop()

    direct, orm = asyncio.run(both())
    assert [s.section_key for s in direct.sections] == ["proj-b", "proj-a", "conversations"]
    assert direct == orm
    assert direct.pinned.items
    assert all(s.first_page.next_cursor for s in direct.sections)


class _WriterAfterTheFirstStatement:
    """A read connection that lets a writer commit right after the read's first statement."""

    def __init__(self, conn: ReadConnection, write: Callable[[], None]) -> None:
        self._conn = conn
        self._write = write

    def all(self, query: Any, params: Any = None) -> list[Any]:
        rows = self._conn.all(query, params)
        self._write()
        return rows

    def union(self, union: Any, params: Any) -> dict[str, list[Any]]:
        return self._conn.union(union, params)


@pytest.mark.spec("HOST-SES-4")
def test_the_rail_reads_one_committed_state_while_a_writer_commits(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    """Every page of ``ListSessionSections`` describes the state its first statement saw."""
    seed(sync_engine)
    scope = RootSessionQuery(WS)

    def write() -> None:
        with sync_engine.begin() as connection:
            connection.execute(
                insert(_S),
                [
                    _session("late", rail_section_key="proj-a", updated_at_unix_ms=10_000),
                    _session("late-pin", updated_at_unix_ms=10_000, pinned_at_unix_ms=10_000),
                ],
            )

    def rail(conn: ReadConnection, writer: bool) -> listing_reads.RailRows:
        reader = _WriterAfterTheFirstStatement(conn, write) if writer else conn
        return listing_reads.rail(
            cast(ReadConnection, reader), scope, conversations_key="conversations", limit=50
        )

    async def reads() -> tuple[listing_reads.RailRows, listing_reads.RailRows]:
        direct = DirectReads(migrated_db_url, connections=1)
        try:
            during = await direct.run(lambda conn: rail(conn, True))
            after = await direct.run(lambda conn: rail(conn, False))
            return during, after
        finally:
            await direct.close()

    during, after = asyncio.run(reads())
    proj_a = [p.section_key for p in during.projects].index("proj-a")

    def ids(page: ListingPage) -> list[str]:
        return [s.session_id for s in page.sessions]

    assert "late" not in ids(during.project_pages[proj_a])
    assert "late-pin" not in ids(during.pinned)
    assert ids(after.project_pages[proj_a])[0] == "late"
    assert ids(after.pinned)[0] == "late-pin"
    # The totals of the same read agree with its rows, not with the writer's commit.
    assert during.project_pages[proj_a].total_count == len(ids(during.project_pages[proj_a]))
    assert after.project_pages[proj_a].total_count == during.project_pages[proj_a].total_count + 1
    assert after.pinned.total_count == during.pinned.total_count + 1
