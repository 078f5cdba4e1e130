"""``RemoveProject`` racing Session creation, through real host servers on both backends.

HOST-PROJ-1 (amended): the removal repeats delete rounds until its compare-and-finalize
finds no live unpinned root, and gives up with ``ABORTED STALE_DELETE_PLAN`` only after
``TUTTI_PROJECT_REMOVAL_MAX_ROUNDS`` rounds (3 here).

The deterministic races run a creator *between* a round's delete and its finalize: the
delete command of the running host is wrapped (the server runs in this process) so that,
after the real delete committed, a client creates a Session in the project over gRPC from
another thread while the server's event loop keeps serving. The last test races a free
running creator thread instead.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import pytest
from sqlalchemy import Engine

from agentactivity.host.v1 import host_pb2
from grpcserver.call_errors import call_error
from services.host.context import HostContext
from services.host.deletion import delete as deletion
from tests.support.host_sessions import HostClient, error_of
from tests.support.servers import LiveServer
from tests.support.session_trees import add_tree, sessions

MAX_ROUNDS = 3


@pytest.fixture
def host(migrated_db_url: str, live_server: Callable[..., LiveServer]) -> HostClient:
    server = live_server(
        "host", database_url=migrated_db_url, project_removal_max_rounds=MAX_ROUNDS
    )
    client = HostClient(server)
    client.register()
    client.call(
        "AddProject",
        host_pb2.AddProjectRequest(
            workspace_id="ws-1", section_key="p-app", label="App", path="/work/app"
        ),
    )
    client.create(session_id="first", cwd="/work/app")
    client.create(session_id="pinned", cwd="/work/app")
    client.call(
        "SetSessionPinned",
        host_pb2.SetSessionPinnedRequest(workspace_id="ws-1", session_id="pinned", pinned=True),
    )
    return client


def remove(host: HostClient) -> host_pb2.RemoveProjectResponse:
    response: host_pb2.RemoveProjectResponse = host.call(
        "RemoveProject", host_pb2.RemoveProjectRequest(workspace_id="ws-1", section_key="p-app")
    )
    return response


def project_keys(host: HostClient) -> list[str]:
    listed = host.call("ListProjects", host_pb2.ListProjectsRequest(workspace_id="ws-1"))
    return [p.section_key for p in listed.projects]


def placement(engine: Engine) -> dict[str, tuple[str, bool]]:
    """``session_id -> (rail_section_key, live)`` of every Session of ws-1."""
    return {
        sid: (row.rail_section_key, row.deleted_at_unix_ms is None)
        for sid, row in sessions(engine).items()
    }


class RacingCreator:
    """Wraps the delete command: after each real delete, a client creates a root in p-app.

    ``races`` bounds how many deletes are raced (``None``: every one). Creations alternate
    between an explicit placement and placement by ``cwd`` inside the project's path.
    """

    def __init__(self, host: HostClient, races: int | None) -> None:
        self.host = host
        self.races = races
        self.batches: list[list[str]] = []
        self.created: list[str] = []
        self.real = deletion.delete_sessions

    async def delete_sessions(
        self, ctx: HostContext, workspace_id: str, session_ids: Sequence[str]
    ) -> deletion.DeletionResult:
        self.batches.append(list(session_ids))
        result = await self.real(ctx, workspace_id, session_ids)
        if self.races is None or len(self.created) < self.races:
            session_id = f"racer-{len(self.created)}"
            placed: dict[str, Any] = (
                {"rail_section_key": "p-app"} if len(self.created) % 2 == 0 else {}
            )
            # A real CreateSession over the socket, from another thread: the server's
            # loop stays free to serve it while this round waits to finalize.
            await asyncio.to_thread(
                self.host.create, session_id=session_id, cwd="/work/app/src", **placed
            )
            self.created.append(session_id)
        return result


@pytest.mark.spec("HOST-PROJ-1")
def test_remove_project_converges_when_creations_race_its_first_rounds(
    host: HostClient, sync_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    racer = RacingCreator(host, races=MAX_ROUNDS - 1)
    monkeypatch.setattr(deletion, "delete_sessions", racer.delete_sessions)

    removed = remove(host)

    # Round 1 deleted "first" and lost to racer-0; round 2 deleted racer-0 and lost to
    # racer-1; round 3 deleted racer-1 and finalized.
    assert racer.created == ["racer-0", "racer-1"]
    assert racer.batches == [["first"], ["racer-0"], ["racer-1"]]
    assert [d.session_id for d in removed.deletion.deleted] == ["first", "racer-0", "racer-1"]
    assert sorted(removed.rehomed_session_ids) == ["first", "pinned", "racer-0", "racer-1"]
    assert placement(sync_engine) == {
        "first": ("conversations", False),
        "racer-0": ("conversations", False),
        "racer-1": ("conversations", False),
        "pinned": ("conversations", True),
    }
    assert project_keys(host) == []


@pytest.mark.spec("HOST-PROJ-1")
def test_remove_project_gives_up_after_its_rounds_with_retry_info_and_no_finalize(
    host: HostClient, sync_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    racer = RacingCreator(host, races=None)
    monkeypatch.setattr(deletion, "delete_sessions", racer.delete_sessions)

    code, reason, _, error = error_of(lambda: remove(host))

    assert (code, reason) == (grpc.StatusCode.ABORTED, "STALE_DELETE_PLAN")
    retry = call_error(error).retry_after_seconds
    assert retry is not None
    assert retry > 0
    assert racer.batches == [["first"], ["racer-0"], ["racer-1"]]  # exactly MAX_ROUNDS
    # Each round's delete stands; no finalize ran: nothing was rehomed, the project stays.
    assert project_keys(host) == ["p-app"]
    assert placement(sync_engine) == {
        "first": ("p-app", False),
        "racer-0": ("p-app", False),
        "racer-1": ("p-app", False),
        "racer-2": ("p-app", True),
        "pinned": ("p-app", True),
    }

    # Once nothing races it, a retry finishes the job.
    monkeypatch.undo()
    removed = remove(host)
    assert [d.session_id for d in removed.deletion.deleted] == ["racer-2"]
    assert sorted(removed.rehomed_session_ids) == [
        "first",
        "pinned",
        "racer-0",
        "racer-1",
        "racer-2",
    ]
    assert {key for key, _ in placement(sync_engine).values()} == {"conversations"}
    assert project_keys(host) == []


@pytest.mark.spec("HOST-PROJ-1", "HOST-DEL-1")
def test_a_stale_delete_plan_is_re_planned_in_the_next_round(
    host: HostClient, sync_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_make_plan = deletion.make_plan
    plans: list[tuple[str, ...]] = []

    async def plan_then_grow_the_tree(
        ctx: HostContext, workspace_id: str, requested: Sequence[str]
    ) -> deletion.DeletePlan:
        plan = await real_make_plan(ctx, workspace_id, requested)
        plans.append(plan.newly)
        if len(plans) == 1:
            # A child Session (as a runtime report would add it) appears after planning.
            await asyncio.to_thread(add_tree, sync_engine, {"kid": "first"}, section_key="p-app")
        return plan

    monkeypatch.setattr(deletion, "make_plan", plan_then_grow_the_tree)
    removed = remove(host)

    assert plans == [("first",), ("first", "kid")]  # the stale plan, then the re-plan
    assert [d.session_id for d in removed.deletion.deleted] == ["first", "kid"]
    assert sorted(removed.rehomed_session_ids) == ["first", "kid", "pinned"]
    assert placement(sync_engine) == {
        "first": ("conversations", False),
        "kid": ("conversations", False),
        "pinned": ("conversations", True),
    }


@pytest.mark.spec("HOST-PROJ-1", "HOST-DEL-1")
def test_a_later_batch_going_stale_keeps_the_earlier_batches_in_the_result(
    host: HostClient, sync_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 1 commits, batch 2's plan goes stale: the response still reports batch 1."""
    host.create(session_id="second", cwd="/work/app")
    monkeypatch.setattr(deletion, "MAX_DELETE_IDS", 1)  # one root per DeleteSessions batch
    real_make_plan = deletion.make_plan
    plans: list[tuple[str, ...]] = []

    async def plan_then_grow_the_second_tree(
        ctx: HostContext, workspace_id: str, requested: Sequence[str]
    ) -> deletion.DeletePlan:
        plan = await real_make_plan(ctx, workspace_id, requested)
        plans.append(plan.newly)
        if plan.newly == ("second",):
            # A child of "second" appears after its batch planned: that batch goes stale
            # after the "first" batch of the same round already committed.
            await asyncio.to_thread(add_tree, sync_engine, {"kid": "second"}, section_key="p-app")
        return plan

    monkeypatch.setattr(deletion, "make_plan", plan_then_grow_the_second_tree)
    removed = remove(host)

    # Round 1: "first" committed, "second" stale; round 2 re-planned "second" with its child.
    assert [sorted(plan) for plan in plans] == [["first"], ["second"], ["kid", "second"]]
    assert sorted(d.session_id for d in removed.deletion.deleted) == ["first", "kid", "second"]
    assert sorted(removed.rehomed_session_ids) == ["first", "kid", "pinned", "second"]
    assert placement(sync_engine) == {
        "first": ("conversations", False),
        "second": ("conversations", False),
        "kid": ("conversations", False),
        "pinned": ("conversations", True),
    }


@pytest.mark.spec("HOST-PROJ-1", "HOST-SES-2")
def test_remove_project_against_a_free_running_creator_leaves_no_orphan(
    host: HostClient, sync_engine: Engine
) -> None:
    """A creator thread keeps placing roots in p-app while the caller retries the removal.

    Whatever the interleaving: every root that was created is deleted and rehomed, and once
    the project is gone a creation naming it is refused, so no Session keeps its key.
    """
    created: list[str] = []
    refused: list[tuple[str, str]] = []  # (session id, reason), checked by the test thread
    started = threading.Event()
    stop = threading.Event()

    def creator() -> None:
        for index in range(40):
            if stop.is_set():
                return
            session_id = f"c-{index:02d}"
            try:
                host.create(session_id=session_id, rail_section_key="p-app")
            except grpc.RpcError as error:
                refused.append((session_id, call_error(error).reason))
                return
            created.append(session_id)
            started.set()
            stop.wait(0.005)  # a steady stream, so the removal's rounds overlap it

    thread = threading.Thread(target=creator, daemon=True)
    thread.start()
    try:
        assert started.wait(10)
        for _ in range(50):  # the creator makes at most 40 roots: retries get through
            try:
                removed = remove(host)
                break
            except grpc.RpcError as error:
                said = call_error(error)
                assert (said.code, said.reason) == (grpc.StatusCode.ABORTED, "STALE_DELETE_PLAN")
        else:
            pytest.fail("RemoveProject never finalized")
    finally:
        stop.set()
        thread.join(30)
    assert project_keys(host) == []
    rows = placement(sync_engine)
    assert {key for key, _ in rows.values()} == {"conversations"}
    assert all(not rows[sid][1] for sid in created)  # every created root was deleted
    assert set(created) | {"first", "pinned"} <= set(removed.rehomed_session_ids)
    assert set(rows) == set(created) | {"first", "pinned"}
    # A creation after the removal names a project that is gone: refused, nothing stored.
    assert all(reason == "PROJECT_NOT_FOUND" for _, reason in refused), refused
    assert not {sid for sid, _ in refused} & set(rows)
