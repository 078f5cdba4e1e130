"""User projects through a real host server on both backends (HOST-PROJ-1, HOST-SES-2)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from sqlalchemy import update

from agentactivity.host.v1 import host_pb2
from store.engine import create_sync_engine_for
from store.models import Session
from tests.support.host_sessions import HostClient, error_of
from tests.support.servers import LiveServer, auth_metadata


@pytest.fixture
def host(migrated_db_url: str, live_server: Callable[..., LiveServer]) -> HostClient:
    client = HostClient(live_server("host", database_url=migrated_db_url))
    client.register()
    return client


def _add(host: HostClient, key: str | None, label: str, path: str) -> host_pb2.Project:
    request = host_pb2.AddProjectRequest(workspace_id="ws-1", label=label, path=path)
    if key is not None:
        request.section_key = key
    response: host_pb2.AddProjectResponse = host.call("AddProject", request)
    return response.project


@pytest.mark.spec("HOST-PROJ-1")
def test_add_and_list_projects(host: HostClient) -> None:
    b = _add(host, "p-b", "Beta", "/b")
    assert (b.workspace_id, b.section_key, b.label, b.path) == ("ws-1", "p-b", "Beta", "/b")
    assert _add(host, "p-b", "Beta", "/b") == b  # identical replay
    generated = _add(host, None, "Alpha", "/a")
    assert generated.section_key
    listed = host.call("ListProjects", host_pb2.ListProjectsRequest(workspace_id="ws-1"))
    assert [p.label for p in listed.projects] == ["Alpha", "Beta"]
    other = host.call(
        "ListProjects",
        host_pb2.ListProjectsRequest(workspace_id="ws-2"),
        auth_metadata("ws2-device"),
    )
    assert list(other.projects) == []

    code, reason, _, _ = error_of(lambda: _add(host, "p-b", "Beta", "/elsewhere"))
    assert (code, reason) == (grpc.StatusCode.ALREADY_EXISTS, "PROJECT_EXISTS")
    code, _, fields, _ = error_of(lambda: _add(host, "conversations", "C", "/c"))
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, {"section_key"})
    code, _, fields, _ = error_of(lambda: _add(host, "p-x", " ", ""))
    assert fields == {"label", "path"}


@pytest.mark.spec("HOST-PROJ-1", "HOST-SES-2")
def test_remove_project_deletes_live_roots_then_rehomes_the_rest(
    host: HostClient, migrated_db_url: str
) -> None:
    _add(host, "p-app", "App", "/work/app")
    live = host.create(session_id="live", cwd="/work/app")
    pinned = host.create(session_id="pinned", cwd="/work/app")
    gone = host.create(session_id="gone", cwd="/work/app")
    host.call(
        "SetSessionPinned",
        host_pb2.SetSessionPinnedRequest(workspace_id="ws-1", session_id="pinned", pinned=True),
    )
    # "gone" was deleted earlier: it is a recoverable tombstone the finalize rehomes.
    engine = create_sync_engine_for(migrated_db_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                update(Session)
                .where(Session.session_id == gone.session_id)
                .values(deleted_at_unix_ms=9, deletion_generation="gen", component_size=1)
            )
    finally:
        engine.dispose()
    removed = host.call(
        "RemoveProject", host_pb2.RemoveProjectRequest(workspace_id="ws-1", section_key="p-app")
    )
    assert sorted(removed.rehomed_session_ids) == ["gone", "live", "pinned"]
    assert [d.session_id for d in removed.deletion.deleted] == [live.session_id]
    moved = host.call(
        "GetSession", host_pb2.GetSessionRequest(workspace_id="ws-1", session_id="pinned")
    ).session
    assert moved.rail_section_key == "conversations"
    assert moved.updated_at_unix_ms == pinned.updated_at_unix_ms  # nothing else rewritten
    assert (
        list(host.call("ListProjects", host_pb2.ListProjectsRequest(workspace_id="ws-1")).projects)
        == []
    )
    code, reason, _, _ = error_of(
        lambda: host.call(
            "RemoveProject", host_pb2.RemoveProjectRequest(workspace_id="ws-1", section_key="p-app")
        )
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "PROJECT_NOT_FOUND")
    # A stale explicit placement cannot recreate the removed section.
    code, reason, _, _ = error_of(lambda: host.create(rail_section_key="p-app"))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "PROJECT_NOT_FOUND")
