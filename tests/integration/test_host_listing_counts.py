"""The maintained listing counts behind ``total_count`` stay exact on every write path (ADR 0024).

``session_listing_counts`` is kept by triggers on ``sessions`` (migration
``0007_listing_counts``). These tests change membership through every kind of write — create,
pin and unpin, delete, restore, purge, project removal, and direct row writes no RPC makes — and
after each step compare the counts with a fresh ``GROUP BY`` of the rows and with the
``total_count`` the listing RPCs return, on SQLite and Postgres.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, delete, func, insert, select, update

from agentactivity.host.v1 import host_pb2
from services.host.repository.sessions import RootSessionQuery, live_roots_clauses, page_source
from store import migrate
from store.engine import create_sync_engine_for
from store.models import CONVERSATIONS_SECTION_KEY, Session, SessionListingCount
from tests.migrations.rows import WORKSPACE, session_row
from tests.support.host_sessions import HostClient, demo_target
from tests.support.servers import LiveServer, auth_metadata

SERVICE = auth_metadata("service")
Key = tuple[str, str, str, bool]


@pytest.fixture
def host(migrated_db_url: str, live_server: Callable[..., LiveServer]) -> HostClient:
    client = HostClient(live_server("host", database_url=migrated_db_url))
    client.register()
    client.register(demo_target("other"))
    return client


def row(session_id: str, agent_target_id: str | None = None, **overrides: Any) -> dict[str, Any]:
    """A Session row (``tests.migrations.rows``) with an agent target."""
    return {**session_row(session_id, **overrides), "agent_target_id": agent_target_id}


def recount(engine: Engine) -> dict[Key, int]:
    """Live root Sessions per listing key, counted from the rows."""
    target = func.coalesce(Session.agent_target_id, "")
    pinned = Session.pinned_at_unix_ms.is_not(None)
    with engine.connect() as connection:
        rows = connection.execute(
            select(Session.workspace_id, Session.rail_section_key, target, pinned, func.count())
            .where(Session.deleted_at_unix_ms.is_(None), Session.parent_session_id.is_(None))
            .group_by(Session.workspace_id, Session.rail_section_key, target, pinned)
        ).all()
    return {(r[0], r[1], r[2], bool(r[3])): int(r[4]) for r in rows}


def maintained(engine: Engine) -> dict[Key, int]:
    """The maintained counts; a key that dropped to 0 keeps its row, so zeros are left out."""
    table = SessionListingCount.__table__
    with engine.connect() as connection:
        rows = connection.execute(select(table)).all()
    counts: dict[Key, int] = {}
    for row in rows:
        assert row.live_roots >= 0, f"negative count {row}"
        if row.live_roots:
            key = (row.workspace_id, row.rail_section_key, row.agent_target_id, bool(row.pinned))
            counts[key] = int(row.live_roots)
    return counts


def section_total(host: HostClient, section_key: str, **filter_fields: Any) -> int:
    page = host.call(
        "ListSessionSectionPage",
        host_pb2.ListSessionSectionPageRequest(
            workspace_id="ws-1",
            section_key=section_key,
            limit=1,
            filter=host_pb2.SessionListFilter(**filter_fields),
        ),
    ).page
    return int(page.total_count)


def assert_exact(host: HostClient, engine: Engine) -> None:
    """The counts equal the rows, and every listing's total_count equals the rows' count."""
    truth = recount(engine)
    assert maintained(engine) == truth

    def expected(section: str | None, pinned: bool, target: str | None = None) -> int:
        return sum(
            n
            for (ws, key, tid, pin), n in truth.items()
            if ws == "ws-1"
            and (section is None or key == section)
            and pin == pinned
            and (target is None or tid == target)
        )

    rail = host.call(
        "ListSessionSections", host_pb2.ListSessionSectionsRequest(workspace_id="ws-1")
    )
    for section in rail.sections:
        assert section.first_page.total_count == expected(section.section_key, False)
    assert rail.pinned.total_count == expected(None, True)
    for target in ("demo", "other"):
        assert section_total(host, CONVERSATIONS_SECTION_KEY, agent_target_id=target) == expected(
            CONVERSATIONS_SECTION_KEY, False, target
        )
    pinned_demo = host.call(
        "ListPinnedSessionsPage",
        host_pb2.ListPinnedSessionsPageRequest(
            workspace_id="ws-1", filter=host_pb2.SessionListFilter(agent_target_id="demo")
        ),
    ).page
    assert pinned_demo.total_count == expected(None, True, "demo")


def pin(host: HostClient, session_id: str, pinned: bool) -> None:
    host.call(
        "SetSessionPinned",
        host_pb2.SetSessionPinnedRequest(workspace_id="ws-1", session_id=session_id, pinned=pinned),
    )


def delete_rpc(host: HostClient, *session_ids: str) -> None:
    host.call(
        "DeleteSessions",
        host_pb2.DeleteSessionsRequest(workspace_id="ws-1", session_ids=list(session_ids)),
    )


@pytest.mark.spec("HOST-SES-4")
def test_counts_follow_every_membership_change(host: HostClient, sync_engine: Engine) -> None:
    engine = sync_engine
    host.call(
        "AddProject",
        host_pb2.AddProjectRequest(
            workspace_id="ws-1", section_key="p-app", label="App", path="/work/app"
        ),
    )
    for n in range(5):
        host.create(session_id=f"c-{n}")
    for n in range(3):
        host.create(session_id=f"o-{n}", agent_target_id="other")
    for n in range(4):
        host.create(session_id=f"p-{n}", cwd="/work/app")
    host.create("ws-2", session_id="c-0")  # another workspace's Session with the same id
    assert_exact(host, engine)
    assert section_total(host, CONVERSATIONS_SECTION_KEY) == 8

    pin(host, "c-0", True)
    pin(host, "p-0", True)
    pin(host, "o-0", True)
    assert_exact(host, engine)
    pin(host, "o-0", False)
    assert_exact(host, engine)

    # A child Session never counts, live or deleted.
    with engine.begin() as connection:
        connection.execute(
            insert(Session).values(
                row(
                    "c-1-child",
                    workspace_id="ws-1",
                    parent_session_id="c-1",
                    root_session_id="c-1",
                    agent_target_id="demo",
                )
            )
        )
    assert_exact(host, engine)

    delete_rpc(host, "c-1", "o-1", "c-0")  # a tree with its child, and a pinned root
    assert_exact(host, engine)
    assert section_total(host, CONVERSATIONS_SECTION_KEY) == 5
    restored = host.call(
        "RestoreDeletedSession",
        host_pb2.RestoreDeletedSessionRequest(workspace_id="ws-1", session_id="c-1"),
    ).restored
    assert {s.session_id for s in restored} == {"c-1", "c-1-child"}
    assert_exact(host, engine)

    host.call(
        "PurgeWorkspaceTombstones",
        host_pb2.PurgeWorkspaceTombstonesRequest(workspace_id="ws-1"),
        SERVICE,
    )
    assert_exact(host, engine)

    # Removing the project deletes its unpinned roots and rehomes the pinned one.
    host.call(
        "RemoveProject", host_pb2.RemoveProjectRequest(workspace_id="ws-1", section_key="p-app")
    )
    assert_exact(host, engine)

    # Writes no RPC makes: a move, a target change, a raw delete and a raw tombstone insert.
    with engine.begin() as connection:
        connection.execute(
            update(Session)
            .where(Session.workspace_id == "ws-1", Session.session_id == "c-2")
            .values(rail_section_key="elsewhere", agent_target_id=None)
        )
        connection.execute(
            delete(Session).where(Session.workspace_id == "ws-1", Session.session_id == "c-3")
        )
        connection.execute(
            insert(Session).values(
                row(
                    "t-1",
                    workspace_id="ws-1",
                    deleted_at_unix_ms=1,
                    deletion_generation="g",
                    component_size=1,
                )
            )
        )
        # An update that moves nothing (the hot path of every submit) changes no count.
        connection.execute(
            update(Session)
            .where(Session.workspace_id == "ws-1", Session.session_id == "c-4")
            .values(updated_at_unix_ms=5, title="renamed")
        )
    assert_exact(host, engine)
    assert recount(engine)[("ws-1", "elsewhere", "", False)] == 1


@pytest.mark.spec("HOST-SES-4", "STORE-1")
def test_the_migration_counts_the_existing_sessions(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, "0006_activity_event_retention")
    engine = create_sync_engine_for(empty_db_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                insert(Session),
                [
                    row("a"),
                    row("b", agent_target_id="demo", pinned_at_unix_ms=3),
                    row("c", rail_section_key="p-x", agent_target_id="demo"),
                    row("d", rail_section_key="p-x", agent_target_id="demo"),
                    row("kid", parent_session_id="c", root_session_id="c"),
                    row("gone", deleted_at_unix_ms=1, deletion_generation="g", component_size=1),
                ],
            )
        migrate.upgrade(empty_db_url)
        assert (
            maintained(engine)
            == recount(engine)
            == {
                (WORKSPACE, CONVERSATIONS_SECTION_KEY, "", False): 1,
                (WORKSPACE, CONVERSATIONS_SECTION_KEY, "demo", True): 1,
                (WORKSPACE, "p-x", "demo", False): 2,
            }
        )
        # And the triggers run from then on.
        with engine.begin() as connection:
            connection.execute(insert(Session).values(row("e", rail_section_key="p-x")))
        assert maintained(engine) == recount(engine)
    finally:
        engine.dispose()


@pytest.mark.spec("HOST-SES-4")
def test_pages_read_the_listing_indexes_even_with_planner_statistics(
    backend: str, sync_engine: Engine
) -> None:
    """After ``ANALYZE`` SQLite would read the workspace through ``ix_sessions_parent``."""
    if backend != "sqlite":
        pytest.skip("INDEXED BY is SQLite's; Postgres plans from real NULL statistics")
    # The shape that misleads the planner: thousands of roots, a few with a child.
    roots = [
        row(
            f"s-{n:04d}",
            rail_section_key=f"p-{n % 3}",
            pinned_at_unix_ms=n if n % 50 == 0 else None,
        )
        for n in range(2000)
    ]
    children = [
        row(f"c-{n:04d}", parent_session_id=f"s-{n:04d}", root_session_id=f"s-{n:04d}")
        for n in range(1, 2000, 20)
    ]
    with sync_engine.begin() as connection:
        connection.execute(insert(Session), roots)
        connection.execute(insert(Session), children)
        connection.exec_driver_sql("ANALYZE")
    for query, index, misled in (
        (
            RootSessionQuery("ws-1", section_key="p-1", pinned=False),
            "ix_sessions_unpinned_roots",
            True,
        ),
        (RootSessionQuery("ws-1", pinned=True), "ix_sessions_pinned_roots", False),
    ):
        source = page_source(query)
        statement = (
            select(source)
            .where(*live_roots_clauses(query, source))
            .order_by(source.updated_at_unix_ms.desc(), source.session_id.asc())
            .limit(51)
        )
        with sync_engine.connect() as connection:
            sql = str(
                statement.compile(
                    dialect=connection.dialect, compile_kwargs={"literal_binds": True}
                )
            )
            plan = " ".join(
                str(r[-1]) for r in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}")
            )
            # Without the hint the same statement goes through ix_sessions_parent and sorts.
            unhinted = sql.replace(f" INDEXED BY {index}", "")
            bare = " ".join(
                str(r[-1]) for r in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {unhinted}")
            )
        assert index in plan, plan
        assert "TEMP B-TREE" not in plan, plan
        if misled:  # shows the test can fail: what the section page would read unhinted
            assert index not in bare, "the statistics no longer mislead; is the hint needed?"
