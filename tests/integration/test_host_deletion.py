"""Canonical delete, restore, purge and the cleanup outbox through a real host server.

Every test runs on SQLite and Postgres (HOST-DEL-1..11, HOST-CLEAN-1, HOST-PROJ-1).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from sqlalchemy import Engine, update

from agentactivity.host.v1 import activity_pb2, host_pb2
from domainerrors import Aborted
from services.host.context import HostContext
from services.host.deletion import delete as deletion
from services.host.deletion import purge, restore
from services.host.wire.command_codec import ProtoCommandCodec
from store.database import Database
from store.legacy_tombstones import mark_legacy_tombstones
from store.models import Interaction, Message, Session, Turn
from tests.support.host_sessions import WS1, HostClient, error_of
from tests.support.servers import LiveServer, auth_metadata
from tests.support.session_trees import (
    add_active_turn,
    add_messages,
    add_tree,
    cleanup_rows,
    commands,
    events,
    sessions,
)

WS2 = auth_metadata("ws2-device")
SERVICE = auth_metadata("service")
WS1_SERVICE = auth_metadata("ws1-service")
"""Permanent purge and cleanup are service/admin only (SEC-3): a service scoped to ws-1."""


@pytest.fixture
def engine(sync_engine: Engine) -> Engine:
    """The test database's sync engine, under the short name these tests use."""
    return sync_engine


@pytest.fixture
def host(migrated_db_url: str, live_server: Callable[..., LiveServer]) -> HostClient:
    client = HostClient(live_server("host", database_url=migrated_db_url))
    client.register()
    return client


def delete(host: HostClient, *ids: str, ws: str = "ws-1", md: Any = WS1) -> Any:
    request = host_pb2.DeleteSessionsRequest(workspace_id=ws, session_ids=list(ids))
    return host.call("DeleteSessions", request, md).result


def restore_rpc(host: HostClient, session_id: str) -> list[str]:
    response = host.call(
        "RestoreDeletedSession",
        host_pb2.RestoreDeletedSessionRequest(workspace_id="ws-1", session_id=session_id),
    )
    return [s.session_id for s in response.restored]


def listing(host: HostClient, **fields: Any) -> Any:
    fields.setdefault("workspace_id", "ws-1")
    return host.call("ListDeletedSessions", host_pb2.ListDeletedSessionsRequest(**fields))


def purge_rpc(host: HostClient, md: Any = SERVICE, **fields: Any) -> Any:
    return host.call("PurgeDeletedSessions", host_pb2.PurgeDeletedSessionsRequest(**fields), md)


def tombstones(engine: Engine) -> dict[str, tuple[int | None, str | None, int | None]]:
    return {
        sid: (row.deleted_at_unix_ms, row.deletion_generation, row.component_size)
        for sid, row in sessions(engine).items()
    }


# ------------------------------------------------------------------------------ delete


@pytest.mark.spec("HOST-DEL-1", "HOST-DEL-3")
def test_delete_tombstones_the_closure_as_one_component_without_rewriting_metadata(
    host: HostClient, engine: Engine
) -> None:
    add_tree(engine, {"r": None, "a": "r", "b": "a"}, updated_at={"r": 7, "a": 8, "b": 9})
    result = delete(host, "r")
    assert [(d.session_id, d.requested) for d in result.deleted] == [
        ("r", True),
        ("a", False),
        ("b", False),
    ]
    assert result.deleted[1].parent_session_id == "r"
    stones = {d.tombstone.generation for d in result.deleted}
    assert len(stones) == 1
    assert stones != {""}
    assert {d.tombstone.component_size for d in result.deleted} == {3}
    assert len({d.tombstone.deleted_at_unix_ms for d in result.deleted}) == 1
    rows = sessions(engine)
    assert {sid: row.updated_at_unix_ms for sid, row in rows.items()} == {"r": 7, "a": 8, "b": 9}
    assert {row.rail_section_key for row in rows.values()} == {"conversations"}
    code, reason, _, _ = error_of(
        lambda: host.call(
            "GetSession", host_pb2.GetSessionRequest(workspace_id="ws-1", session_id="a")
        )
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "SESSION_DELETED")


@pytest.mark.spec("HOST-DEL-1")
def test_an_unknown_id_fails_the_whole_call_before_any_change(
    host: HostClient, engine: Engine
) -> None:
    add_tree(engine, {"r": None})
    add_tree(engine, {"other": None}, workspace_id="ws-2")
    for ids in (["r", "missing"], ["r", "other"]):
        code, reason, _, _ = error_of(lambda ids=ids: delete(host, *ids))  # type: ignore[misc]
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")
    assert tombstones(engine)["r"] == (None, None, None)
    code, _, fields, _ = error_of(lambda: delete(host))
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, {"session_ids"})
    code, reason, _, _ = error_of(lambda: delete(host, "r", ws="ws-2"))
    assert code == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.spec("HOST-DEL-2")
def test_delete_quiesces_active_work_and_keeps_history(host: HostClient, engine: Engine) -> None:
    add_tree(engine, {"r": None, "c": "r"}, updated_at={"r": 5, "c": 6})
    add_active_turn(engine, "r", "t-root", pending_interactions=2)
    add_active_turn(engine, "c", "t-child", pending_interactions=1, root_turn_id="t-root")
    add_messages(engine, ["r", "c"], 3)
    result = delete(host, "r")
    assert sorted(result.interrupted_turn_ids) == ["t-child", "t-root"]
    assert result.superseded_interaction_count == 3
    with engine.connect() as connection:
        turns = {
            t.turn_id: (t.phase, t.outcome) for t in connection.execute(Turn.__table__.select())
        }
        statuses = {i.status for i in connection.execute(Interaction.__table__.select())}
        message_count = len(connection.execute(Message.__table__.select()).all())
    assert turns == {"t-root": ("settled", "interrupted"), "t-child": ("settled", "interrupted")}
    assert statuses == {"superseded"}
    assert message_count == 6  # history is preserved
    rows = sessions(engine)
    assert (rows["r"].updated_at_unix_ms, rows["c"].updated_at_unix_ms) == (5, 6)
    assert {row.active_turn_id for row in rows.values()} == {None}
    sent = commands(engine)
    assert ("r", "start_turn", "failed") in sent
    assert ("c", "start_turn", "failed") in sent
    assert {(s, k) for s, k, _ in sent if k == "interrupt_turn"} == {
        ("r", "interrupt_turn"),
        ("c", "interrupt_turn"),
    }


@pytest.mark.spec("HOST-DEL-3", "HOST-DEL-8")
def test_sibling_subtrees_deleted_in_one_batch_restore_independently(
    host: HostClient, engine: Engine
) -> None:
    add_tree(engine, {"p": None, "c1": "p", "g1": "c1", "c2": "p"})
    result = delete(host, "c1", "c2")
    by_id = {d.session_id: d.tombstone for d in result.deleted}
    assert set(by_id) == {"c1", "g1", "c2"}
    assert by_id["c1"].generation == by_id["g1"].generation != by_id["c2"].generation
    assert (by_id["c1"].component_size, by_id["c2"].component_size) == (2, 1)
    assert restore_rpc(host, "c1") == ["c1", "g1"]
    items = listing(host).items
    assert [(i.session.session_id, i.restorable, i.tree_size) for i in items] == [("c2", True, 1)]
    assert restore_rpc(host, "c2") == ["c2"]
    assert set(tombstones(engine).values()) == {(None, None, None)}


@pytest.mark.spec("HOST-DEL-4")
def test_a_repeated_delete_is_a_no_op_and_keeps_deleted_at(
    host: HostClient, engine: Engine
) -> None:
    add_tree(engine, {"r": None, "c": "r"})
    delete(host, "r")
    before = tombstones(engine)
    again = delete(host, "r", "c")
    assert list(again.deleted) == []
    assert list(again.absorbed) == []
    assert list(again.already_deleted_session_ids) == ["r", "c"]
    assert tombstones(engine) == before
    assert len(events(engine, "session_deleted")) == 2


@pytest.mark.spec("HOST-DEL-5", "HOST-DEL-6")
def test_deleting_an_ancestor_absorbs_a_complete_deleted_child_component(
    host: HostClient, engine: Engine
) -> None:
    add_tree(engine, {"p": None, "c": "p", "g": "c", "s": "p"})
    first = delete(host, "c")
    assert {d.session_id for d in first.deleted} == {"c", "g"}
    second = delete(host, "p")
    assert {d.session_id for d in second.deleted} == {"p", "s"}
    assert [a.session_id for a in second.absorbed] == ["c", "g"]
    stones = {d.tombstone.generation for d in (*second.deleted, *second.absorbed)}
    assert len(stones) == 1
    assert first.deleted[0].tombstone.generation not in stones
    assert {d.tombstone.component_size for d in second.deleted} == {4}
    # One session_deleted per newly deleted Session; absorbed members are not repeated.
    deleted_events = [sid for sid, _ in events(engine, "session_deleted")]
    assert sorted(deleted_events) == ["c", "g", "p", "s"]
    event = activity_pb2.ActivityEvent.FromString(events(engine, "session_deleted")[-1][1])
    assert event.WhichOneof("event") == "session_deleted"
    assert event.session_deleted.generation in stones
    assert [i.session.session_id for i in listing(host).items] == ["p"]
    assert sorted(restore_rpc(host, "p")) == ["c", "g", "p", "s"]
    restored = events(engine, "session_restored")
    assert sorted(sid for sid, _ in restored) == ["c", "g", "p", "s"]


@pytest.mark.spec("HOST-DEL-5", "HOST-DEL-8", "HOST-DEL-9", "HOST-DEL-10")
def test_a_legacy_descendant_is_not_upgraded_and_only_the_manual_purge_removes_it(
    host: HostClient, engine: Engine
) -> None:
    add_tree(engine, {"p": None, "c": "p", "g": "c"})
    mark_legacy_tombstones(engine, "ws-1", ["c", "g"], 50)
    result = delete(host, "p")
    assert [d.session_id for d in result.deleted] == ["p"]
    assert list(result.absorbed) == []
    rows = sessions(engine)
    assert (rows["c"].tombstone_legacy, rows["c"].deletion_generation) == (True, None)
    (item,) = listing(host).items
    assert (item.session.session_id, item.restorable) == ("p", False)
    assert item.not_restorable_reason == host_pb2.NOT_RESTORABLE_REASON_LEGACY
    assert item.tree_size == 3
    code, reason, _, _ = error_of(lambda: restore_rpc(host, "p"))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "COMPONENT_NOT_RESTORABLE")
    skipped = purge_rpc(host, cutoff_unix_ms=2**53)
    assert (skipped.purged_tree_count, list(skipped.purged)) == (0, [])
    manual = host.call(
        "PurgeWorkspaceTombstones",
        host_pb2.PurgeWorkspaceTombstonesRequest(workspace_id="ws-1", session_id="p"),
        WS1_SERVICE,
    )
    assert sorted(manual.purged_session_ids) == ["c", "g", "p"]
    assert sessions(engine) == {}
    assert cleanup_rows(engine) == {("ws-1", "c"), ("ws-1", "g"), ("ws-1", "p")}


def _async_ctx(url: str) -> tuple[asyncio.AbstractEventLoop, HostContext, Database]:
    loop = asyncio.new_event_loop()
    database = Database(url)
    loop.run_until_complete(database.start())
    return loop, HostContext(database=database, command_codec=ProtoCommandCodec()), database


@pytest.mark.spec("HOST-DEL-1")
def test_a_child_created_after_the_plan_makes_the_delete_stale(
    migrated_db_url: str, engine: Engine
) -> None:
    add_tree(engine, {"r": None, "a": "r"})
    loop, ctx, database = _async_ctx(migrated_db_url)
    try:
        plan = loop.run_until_complete(deletion.make_plan(ctx, "ws-1", ["r"]))
        add_tree(engine, {"late": "a"})
        with pytest.raises(Aborted) as caught:
            loop.run_until_complete(deletion.commit_plan(ctx, plan))
        assert caught.value.reason == "STALE_DELETE_PLAN"
        assert caught.value.retry_after_seconds is not None
        assert set(tombstones(engine).values()) == {(None, None, None)}
        # A retry re-plans and includes the new child.
        result = loop.run_until_complete(deletion.delete_sessions(ctx, "ws-1", ["r"]))
        assert {d.session_id for d in result.deleted} == {"r", "a", "late"}
    finally:
        loop.run_until_complete(database.stop())
        loop.close()


# ----------------------------------------------------------------------------- listing


@pytest.mark.spec("HOST-DEL-7")
def test_listing_shows_topmost_tombstones_filtered_ordered_and_paged(
    host: HostClient, engine: Engine
) -> None:
    add_tree(
        engine,
        {"a": None, "a1": "a", "b": None, "c": None, "d": None, "live": None, "lc": "live"},
        updated_at={"a": 40, "b": 30, "c": 30, "d": 10, "live": 5, "lc": 5},
        titles={"a": "Alpha report", "b": "beta", "c": "REPORT c", "d": "delta"},
    )
    add_tree(engine, {"p1": None}, section_key="proj-x", updated_at={"p1": 20})
    delete(host, "a", "b", "c", "d", "p1", "lc")
    page = listing(host, limit=2, include_total_count=True)
    assert [i.session.session_id for i in page.items] == ["a", "b"]
    assert page.total_count == 6
    assert page.next_cursor
    # Without include_total_count the same page comes back uncounted (ADR 0024).
    uncounted = listing(host, limit=2)
    assert [i.session.session_id for i in uncounted.items] == ["a", "b"]
    assert (uncounted.total_count, uncounted.next_cursor) == (0, page.next_cursor)
    filtered = listing(host, title_filter="report", include_total_count=True)
    assert [i.session.session_id for i in filtered.items] == ["a", "c"]
    assert filtered.total_count == 2
    rest = listing(host, cursor=page.next_cursor, limit=10)
    assert [i.session.session_id for i in rest.items] == ["c", "p1", "d", "lc"]
    assert rest.next_cursor == ""
    assert page.items[0].tree_size == 2
    assert page.items[0].session.tombstone.component_size == 2
    titled = listing(host, title_filter="report")
    assert [i.session.session_id for i in titled.items] == ["a", "c"]
    sectioned = listing(host, section_key="proj-x")
    assert [i.session.session_id for i in sectioned.items] == ["p1"]
    code, reason, _, _ = error_of(
        lambda: host.call(
            "ListDeletedSessions",
            host_pb2.ListDeletedSessionsRequest(workspace_id="ws-2", cursor=page.next_cursor),
            WS2,
        )
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CURSOR")


@pytest.mark.spec("HOST-DEL-8")
def test_restore_validates_the_component_and_starts_no_runtime(
    host: HostClient, engine: Engine
) -> None:
    add_tree(engine, {"r": None, "c": "r", "g": "c"})
    add_active_turn(engine, "g", "t-g")
    delete(host, "r")
    before = commands(engine)
    for target, expected in (
        ("c", "NOT_TOPMOST_TOMBSTONE"),
        ("missing", "SESSION_NOT_FOUND"),
    ):
        code, reason, _, _ = error_of(lambda target=target: restore_rpc(host, target))  # type: ignore[misc]
        assert reason == expected
    with engine.begin() as connection:  # an incomplete component (size mismatch)
        connection.execute(
            update(Session).where(Session.session_id == "g").values(component_size=9)
        )
    code, reason, _, _error = error_of(lambda: restore_rpc(host, "r"))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "COMPONENT_NOT_RESTORABLE")
    with engine.begin() as connection:
        connection.execute(
            update(Session).where(Session.session_id == "g").values(component_size=3)
        )
    assert restore_rpc(host, "r") == ["r", "c", "g"]
    # Nothing started or resumed; the release of "g" (it ran) that no runtime received is
    # withdrawn (ADR 0016 §14).
    assert ("g", "release_session", "pending") in before
    assert commands(engine) == [c for c in before if c[1] != "release_session"]
    code, reason, _, _ = error_of(lambda: restore_rpc(host, "r"))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "SESSION_NOT_DELETED")


# ------------------------------------------------------------------------------- purge


@pytest.mark.spec("HOST-DEL-9", "SEC-3")
def test_purge_removes_whole_old_trees_keeps_blocked_ones_and_respects_bounds(
    host: HostClient, engine: Engine
) -> None:
    add_tree(engine, {"old": None, "old1": "old", "new": None, "other": None, "o1": "other"})
    add_messages(engine, ["old", "old1", "other"], 4)
    delete(host, "old", "other")
    with engine.begin() as connection:  # "other" gets one too-new member
        connection.execute(
            update(Session)
            .where(Session.session_id.in_(["old", "old1"]))
            .values(deleted_at_unix_ms=100)
        )
        connection.execute(
            update(Session).where(Session.session_id == "other").values(deleted_at_unix_ms=100)
        )
        connection.execute(
            update(Session).where(Session.session_id == "o1").values(deleted_at_unix_ms=10**12)
        )
    delete(host, "new")
    dry = purge_rpc(host, workspace_id="ws-1", cutoff_unix_ms=1000, dry_run=True, md=WS1_SERVICE)
    assert {p.session_id for p in dry.purged} == {"old", "old1"}
    assert len(sessions(engine)) == 5
    assert cleanup_rows(engine) == set()
    # The first eligible tree is taken even though it exceeds max_rows.
    done = purge_rpc(host, cutoff_unix_ms=1000, max_rows=1)
    assert {(p.workspace_id, p.session_id) for p in done.purged} == {
        ("ws-1", "old"),
        ("ws-1", "old1"),
    }
    assert (done.purged_tree_count, done.blocked_tree_count) == (1, 1)
    assert done.purged_row_count == 2 + 8
    assert done.purged_bytes == 8 * len('{"text":"hello"}')
    assert set(sessions(engine)) == {"new", "other", "o1"}  # blocked tree kept whole
    assert cleanup_rows(engine) == {("ws-1", "old"), ("ws-1", "old1")}
    with engine.connect() as connection:
        left = {m.session_id for m in connection.execute(Message.__table__.select())}
    assert left == {"other"}
    for fields in ({}, {"workspace_id": "ws-1"}):  # permanent purge: service/admin (SEC-3)
        code, reason, _, _ = error_of(
            lambda fields=fields: purge_rpc(host, cutoff_unix_ms=1, md=WS1, **fields)  # type: ignore[misc]
        )
        assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED")


@pytest.mark.spec("HOST-DEL-9")
def test_purge_bounds_report_more_remaining(host: HostClient, engine: Engine) -> None:
    add_tree(engine, {f"t{i}": None for i in range(3)})
    delete(host, "t0", "t1", "t2")
    first = purge_rpc(host, cutoff_unix_ms=2**53, max_trees=2)
    assert (first.purged_tree_count, first.more_remaining) == (2, True)
    second = purge_rpc(host, cutoff_unix_ms=2**53, max_trees=2)
    assert (second.purged_tree_count, second.more_remaining) == (1, False)


@pytest.mark.spec("HOST-DEL-9")
def test_a_session_restored_and_deleted_again_after_selection_is_not_purged(
    migrated_db_url: str, engine: Engine
) -> None:
    add_tree(engine, {"r": None, "c": "r"})
    loop, ctx, database = _async_ctx(migrated_db_url)
    clock = iter(range(1_000, 10**6, 1_000))
    ctx.clock = lambda: next(clock)
    try:
        loop.run_until_complete(deletion.delete_sessions(ctx, "ws-1", ["r"]))
        (item,) = loop.run_until_complete(purge.scan_trees(ctx, "ws-1", 10**7))
        assert item.selection is not None
        loop.run_until_complete(restore.restore_deleted_session(ctx, "ws-1", "r"))
        loop.run_until_complete(deletion.delete_sessions(ctx, "ws-1", ["r"]))
        assert loop.run_until_complete(purge.purge_tree(ctx, item.selection)) is False
        assert set(sessions(engine)) == {"r", "c"}
        assert cleanup_rows(engine) == set()
    finally:
        loop.run_until_complete(database.stop())
        loop.close()


@pytest.mark.spec("HOST-DEL-10")
def test_manual_purge_checks_the_physical_boundary(host: HostClient, engine: Engine) -> None:
    add_tree(engine, {"a": None, "a1": "a", "b": None, "b1": "b", "c": None})
    delete(host, "a", "b", "c")
    with engine.begin() as connection:  # a live Session under a tombstone
        connection.execute(
            update(Session)
            .where(Session.session_id == "b1")
            .values(deleted_at_unix_ms=None, deletion_generation=None, component_size=None)
        )
    mark_legacy_tombstones(engine, "ws-1", ["c"], 5)

    def manual(**fields: Any) -> Any:
        fields.setdefault("workspace_id", "ws-1")
        return host.call(
            "PurgeWorkspaceTombstones",
            host_pb2.PurgeWorkspaceTombstonesRequest(**fields),
            WS1_SERVICE,
        )

    for target, expected in (
        ("b", "PURGE_BOUNDARY_VIOLATION"),
        ("a1", "NOT_TOPMOST_TOMBSTONE"),
        ("b1", "SESSION_NOT_DELETED"),
        ("zz", "SESSION_NOT_FOUND"),
    ):
        _, reason, _, _ = error_of(lambda target=target: manual(session_id=target))  # type: ignore[misc]
        assert reason == expected
    dry = manual(dry_run=True)
    assert sorted(dry.purged_session_ids) == ["a", "a1", "c"]
    assert len(sessions(engine)) == 5
    bounded = manual(max_components=1)
    assert (bounded.purged_component_count, bounded.more_remaining) == (1, True)
    rest = manual()
    assert rest.blocked_component_count == 1
    assert set(sessions(engine)) == {"b", "b1"}


@pytest.mark.spec("HOST-DEL-11", "HOST-CLEAN-1", "SEC-3")
def test_cleanup_rows_fence_creation_until_completed(host: HostClient, engine: Engine) -> None:
    host.create(session_id="dup")
    host.create(workspace_id="ws-2", session_id="shared")
    host.create(session_id="shared")
    delete(host, "dup", "shared")
    purge_rpc(host, cutoff_unix_ms=2**53)
    for ws in ("ws-1", "ws-2"):
        code, reason, _, _ = error_of(lambda ws=ws: host.create(workspace_id=ws, session_id="dup"))  # type: ignore[misc]
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "RESOURCE_CLEANUP_PENDING")
    pending = host.call(
        "ListPendingResourceCleanups", host_pb2.ListPendingResourceCleanupsRequest(), SERVICE
    )
    facts = {
        c.session_id: (c.workspace_id, c.id_owned_anywhere, c.live_owner_in_other_workspace)
        for c in pending.cleanups
    }
    assert facts == {"dup": ("ws-1", False, False), "shared": ("ws-1", True, True)}
    paged = host.call(
        "ListPendingResourceCleanups",
        host_pb2.ListPendingResourceCleanupsRequest(workspace_id="ws-1", limit=1),
        WS1_SERVICE,
    )
    assert len(paged.cleanups) == 1
    assert paged.next_cursor
    after = host.call(
        "ListPendingResourceCleanups",
        host_pb2.ListPendingResourceCleanupsRequest(workspace_id="ws-1", cursor=paged.next_cursor),
        WS1_SERVICE,
    )
    assert len(after.cleanups) == 1
    for request in (
        host_pb2.ListPendingResourceCleanupsRequest(),
        host_pb2.ListPendingResourceCleanupsRequest(workspace_id="ws-1"),
    ):
        code, reason, _, _ = error_of(
            lambda request=request: host.call("ListPendingResourceCleanups", request, WS1)  # type: ignore[misc]
        )
        assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED")
    # A ws-1 service leaving the workspace unset sees only ws-1's rows (SEC-1).
    scoped = host.call(
        "ListPendingResourceCleanups", host_pb2.ListPendingResourceCleanupsRequest(), WS1_SERVICE
    )
    assert {c.workspace_id for c in scoped.cleanups} == {"ws-1"}
    done = host.call(
        "CompleteResourceCleanup",
        host_pb2.CompleteResourceCleanupRequest(workspace_id="ws-1", session_id="dup"),
        WS1_SERVICE,
    )
    assert (done.completed, done.fence_lifted) == (True, True)
    again = host.call(
        "CompleteResourceCleanup",
        host_pb2.CompleteResourceCleanupRequest(workspace_id="ws-1", session_id="dup"),
        WS1_SERVICE,
    )
    assert (again.completed, again.fence_lifted) == (False, True)
    assert host.create(workspace_id="ws-2", session_id="dup").session_id == "dup"


@pytest.mark.spec("HOST-PROJ-1", "HOST-DEL-1")
def test_remove_project_deletes_live_unpinned_roots_then_rehomes(
    host: HostClient, engine: Engine
) -> None:
    host.call(
        "AddProject",
        host_pb2.AddProjectRequest(
            workspace_id="ws-1", section_key="p-app", label="App", path="/work/app"
        ),
    )
    for sid in ("live", "pinned"):
        host.create(session_id=sid, cwd="/work/app")
    add_tree(engine, {"kid": "live"}, section_key="p-app")
    host.call(
        "SetSessionPinned",
        host_pb2.SetSessionPinnedRequest(workspace_id="ws-1", session_id="pinned", pinned=True),
    )
    removed = host.call(
        "RemoveProject", host_pb2.RemoveProjectRequest(workspace_id="ws-1", section_key="p-app")
    )
    assert [d.session_id for d in removed.deletion.deleted] == ["live", "kid"]
    assert sorted(removed.rehomed_session_ids) == ["kid", "live", "pinned"]
    rows = sessions(engine)
    assert {row.rail_section_key for row in rows.values()} == {"conversations"}
    assert rows["pinned"].deleted_at_unix_ms is None
    assert [i.session.session_id for i in listing(host).items] == ["live"]
