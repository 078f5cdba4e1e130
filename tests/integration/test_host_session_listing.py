"""Rail listings through a real host server on both backends (HOST-SES-4)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest
from sqlalchemy import insert, update

from agentactivity.host.v1 import host_pb2
from store.engine import create_sync_engine_for
from store.models import Session
from tests.support.host_sessions import ADMIN, HostClient, demo_target, error_of
from tests.support.servers import LiveServer


@pytest.fixture
def host(migrated_db_url: str, live_server: Callable[..., LiveServer]) -> HostClient:
    client = HostClient(live_server("host", database_url=migrated_db_url))
    client.register()
    client.register(demo_target("other"))
    return client


class Rows:
    """Direct writes standing in for runtime activity (which moves ``updated_at``)."""

    def __init__(self, url: str) -> None:
        self.engine = create_sync_engine_for(url)

    def touch(self, session_id: str, updated_at: int, workspace_id: str = "ws-1") -> None:
        with self.engine.begin() as connection:
            connection.execute(
                update(Session)
                .where(Session.workspace_id == workspace_id, Session.session_id == session_id)
                .values(updated_at_unix_ms=updated_at)
            )

    def tombstone(self, session_id: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                update(Session)
                .where(Session.workspace_id == "ws-1", Session.session_id == session_id)
                .values(deleted_at_unix_ms=1, deletion_generation="g", component_size=1)
            )

    def child(self, session_id: str, parent: str, section: str, updated_at: int) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                insert(Session).values(
                    workspace_id="ws-1",
                    session_id=session_id,
                    parent_session_id=parent,
                    root_session_id=parent,
                    agent_target_id="demo",
                    provider="demo-provider",
                    title="child",
                    rail_section_key=section,
                    created_at_unix_ms=updated_at,
                    updated_at_unix_ms=updated_at,
                )
            )


@pytest.fixture
def rows(migrated_db_url: str) -> Iterator[Rows]:
    created = Rows(migrated_db_url)
    yield created
    created.engine.dispose()


def _section_page(
    host: HostClient, cursor: str = "", limit: int = 4, **filter_fields: object
) -> host_pb2.SessionPage:
    response: host_pb2.ListSessionSectionPageResponse = host.call(
        "ListSessionSectionPage",
        host_pb2.ListSessionSectionPageRequest(
            workspace_id="ws-1",
            section_key="conversations",
            cursor=cursor,
            limit=limit,
            filter=host_pb2.SessionListFilter(**filter_fields),  # type: ignore[arg-type]
        ),
    )
    return response.page


@pytest.mark.spec("HOST-SES-4")
def test_value_cursors_never_skip_or_repeat_under_concurrent_writes(
    host: HostClient, rows: Rows
) -> None:
    ids = [f"s-{n:02d}" for n in range(20)]
    for n, sid in enumerate(ids):
        host.create(session_id=sid)
        rows.touch(sid, 1_000 + (n // 3))  # ties on updated_at: id ASC breaks them
    expected_order = sorted(ids, key=lambda s: (-(1_000 + ids.index(s) // 3), s))

    seen: list[str] = []
    moved: set[str] = set()
    cursor = ""
    step = 0
    while True:
        page = _section_page(host, cursor)
        assert page.total_count >= 20
        seen += [item.session.session_id for item in page.items]
        # Writes between page reads: new Sessions (newest), an already-read Session
        # updated to the front, and an unread one moved ahead of the cursor.
        step += 1
        host.create(session_id=f"new-{step}")
        rows.touch(f"new-{step}", 5_000 + step)
        rows.touch(seen[0], 6_000 + step)
        unread = [s for s in expected_order if s not in seen and s not in moved]
        if step == 2 and unread:
            moved.add(unread[-1])
            rows.touch(unread[-1], 7_000)
        if not page.next_cursor:
            break
        cursor = page.next_cursor

    assert len(seen) == len(set(seen)), "a Session was repeated across pages"
    stable = [s for s in expected_order if s not in moved]
    assert [s for s in seen if s in stable] == stable, "a Session was skipped or reordered"
    assert not any(s.startswith("new-") for s in seen)  # inserted ahead of the cursor


@pytest.mark.spec("HOST-SES-4")
def test_filters_apply_before_paging_counting_and_candidate_selection(
    host: HostClient, rows: Rows
) -> None:
    host.call(
        "AddProject",
        host_pb2.AddProjectRequest(
            workspace_id="ws-1", section_key="p-app", label="App", path="/work/app"
        ),
    )
    for n in range(6):
        host.create(session_id=f"demo-{n}", title=f"Alpha {n}")
        rows.touch(f"demo-{n}", 100 + n)
    for n in range(4):
        host.create(session_id=f"other-{n}", agent_target_id="other", title=f"ALPHA other {n}")
        rows.touch(f"other-{n}", 200 + n)
    host.create(session_id="proj-1", cwd="/work/app", title="alpha in project")
    host.create(session_id="pinned-1", title="Alpha pinned")
    host.call(
        "SetSessionPinned",
        host_pb2.SetSessionPinnedRequest(workspace_id="ws-1", session_id="pinned-1", pinned=True),
    )
    host.create(session_id="dead-1", title="Alpha dead")
    rows.tombstone("dead-1")
    rows.child("kid-1", "demo-0", "conversations", 999)

    page = _section_page(host, limit=2, agent_target_id="demo")
    assert [i.session.session_id for i in page.items] == ["demo-5", "demo-4"]
    assert page.total_count == 6  # the filtered set, not the page, not the workspace
    assert page.next_cursor

    unfiltered = _section_page(host, limit=200)
    assert unfiltered.total_count == 10  # pinned, project, tombstone and child excluded
    assert not unfiltered.next_cursor

    searched = _section_page(host, limit=3, search_query="alpha OTHER")
    assert searched.total_count == 4
    authorized = _section_page(
        host,
        agent_target_id="demo",
        authorized_session_ids=host_pb2.SessionIdSet(session_ids=["demo-1", "other-1", "zzz"]),
    )
    assert [i.session.session_id for i in authorized.items] == ["demo-1"]
    assert authorized.total_count == 1
    nothing = _section_page(host, authorized_session_ids=host_pb2.SessionIdSet())
    assert (list(nothing.items), nothing.total_count) == ([], 0)  # present and empty

    candidates = host.call(
        "ListSectionDeletionCandidates",
        host_pb2.ListSectionDeletionCandidatesRequest(
            workspace_id="ws-1",
            section_key="conversations",
            filter=host_pb2.SessionListFilter(agent_target_id="other"),
        ),
    )
    assert list(candidates.session_ids) == ["other-3", "other-2", "other-1", "other-0"]
    assert candidates.total_count == 4

    pinned = host.call(
        "ListPinnedSessionsPage", host_pb2.ListPinnedSessionsPageRequest(workspace_id="ws-1")
    ).page
    assert [i.session.session_id for i in pinned.items] == ["pinned-1"]

    search = host.call(
        "SearchSessions",
        host_pb2.SearchSessionsRequest(workspace_id="ws-1", search_query="ALPHA", limit=5),
    ).page
    assert search.total_count == 12  # every section, pinned or not; no tombstone, no child
    assert len(search.items) == 5

    rail = host.call(
        "ListSessionSections",
        host_pb2.ListSessionSectionsRequest(
            workspace_id="ws-1",
            page_size=3,
            filter=host_pb2.SessionListFilter(agent_target_id="demo"),
        ),
    )
    assert [(s.section_key, s.is_conversations) for s in rail.sections] == [
        ("p-app", False),
        ("conversations", True),
    ]
    assert rail.sections[0].project.path == "/work/app"
    assert [i.session.session_id for i in rail.sections[0].first_page.items] == ["proj-1"]
    conversations = rail.sections[1].first_page
    assert (len(conversations.items), conversations.total_count) == (3, 6)
    assert rail.pinned.total_count == 1
    follow = _section_page(host, cursor=conversations.next_cursor, limit=3, agent_target_id="demo")
    assert [i.session.session_id for i in follow.items] == ["demo-2", "demo-1", "demo-0"]


@pytest.mark.spec("HOST-SES-4", "SEC-1", "CON-5")
def test_cursors_from_another_workspace_or_listing_are_rejected(
    host: HostClient, rows: Rows
) -> None:
    for n in range(3):
        host.create("ws-2", session_id=f"w2-{n}")
        host.create(session_id=f"w1-{n}")
    other = host.call(
        "ListSessionSectionPage",
        host_pb2.ListSessionSectionPageRequest(
            workspace_id="ws-2", section_key="conversations", limit=1
        ),
        ADMIN,
    ).page
    assert other.next_cursor
    code, reason, fields, _ = error_of(lambda: _section_page(host, cursor=other.next_cursor))
    assert (code, reason, fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_CURSOR",
        {"cursor"},
    )
    own = _section_page(host, limit=1)
    code, reason, _, _ = error_of(
        lambda: host.call(
            "ListPinnedSessionsPage",
            host_pb2.ListPinnedSessionsPageRequest(workspace_id="ws-1", cursor=own.next_cursor),
        )
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CURSOR")
    code, _, fields, _ = error_of(lambda: _section_page(host, limit=-1))
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, {"limit"})
    code, _, fields, _ = error_of(
        lambda: host.call(
            "SearchSessions", host_pb2.SearchSessionsRequest(workspace_id="ws-1", search_query=" ")
        )
    )
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, {"search_query"})
