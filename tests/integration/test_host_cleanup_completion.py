"""Completing many resource-cleanup rows in one call (HOST-CLEAN-1, HOST-DEL-11): each row as
``CompleteResourceCleanup`` would, the creation fence judged after the whole call, refusals
that change nothing. Real Host server, both backends."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from sqlalchemy import Engine

from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from tests.support.rpc_errors import error_details
from tests.support.servers import LiveServer, auth_metadata
from tests.support.session_trees import add_tree, cleanup_rows

SERVICE = auth_metadata("service")


def _key(workspace_id: str, session_id: str) -> host_pb2.ResourceCleanupKey:
    return host_pb2.ResourceCleanupKey(workspace_id=workspace_id, session_id=session_id)


@pytest.fixture
def host(
    migrated_db_url: str, live_server: Callable[..., LiveServer], sync_engine: Engine
) -> host_pb2_grpc.HostServiceStub:
    server = live_server("host", database_url=migrated_db_url)
    stub = host_pb2_grpc.HostServiceStub(server.channel)
    for workspace_id in ("ws-1", "ws-2"):
        add_tree(
            sync_engine, {"dup": None, "solo-" + workspace_id: None}, workspace_id=workspace_id
        )
        stub.DeleteSessions(
            host_pb2.DeleteSessionsRequest(
                workspace_id=workspace_id, session_ids=["dup", "solo-" + workspace_id]
            ),
            metadata=SERVICE,
        )
        stub.PurgeWorkspaceTombstones(
            host_pb2.PurgeWorkspaceTombstonesRequest(workspace_id=workspace_id), metadata=SERVICE
        )
    return stub


@pytest.mark.spec("HOST-CLEAN-1", "HOST-DEL-11")
def test_one_call_completes_rows_across_workspaces_and_lifts_fences_once_none_remain(
    host: host_pb2_grpc.HostServiceStub, sync_engine: Engine
) -> None:
    assert cleanup_rows(sync_engine) == {
        ("ws-1", "dup"),
        ("ws-2", "dup"),
        ("ws-1", "solo-ws-1"),
        ("ws-2", "solo-ws-2"),
    }
    first = host.CompleteResourceCleanups(
        host_pb2.CompleteResourceCleanupsRequest(
            cleanups=[_key("ws-1", "dup"), _key("ws-1", "solo-ws-1")]
        ),
        metadata=SERVICE,
    )
    # ws-2's row for "dup" still fences the id; "solo-ws-1" had its only row.
    assert [(r.completed, r.fence_lifted) for r in first.results] == [(True, False), (True, True)]

    second = host.CompleteResourceCleanups(
        host_pb2.CompleteResourceCleanupsRequest(
            cleanups=[_key("ws-2", "dup"), _key("ws-1", "dup"), _key("ws-2", "solo-ws-2")]
        ),
        metadata=SERVICE,
    )
    assert [(r.completed, r.fence_lifted) for r in second.results] == [
        (True, True),
        (False, True),
        (True, True),
    ]
    assert cleanup_rows(sync_engine) == set()


@pytest.mark.spec("HOST-CLEAN-1", "SEC-3", "SEC-4")
@pytest.mark.parametrize(
    ("principal", "request_fields", "expected"),
    [
        (
            "ws1-service",
            {"cleanups": [_key("ws-1", "dup"), _key("ws-2", "dup")]},
            (grpc.StatusCode.PERMISSION_DENIED, "WORKSPACE_SCOPE_MISMATCH", set()),
        ),
        (
            "service",
            {"workspace_id": "ws-1", "cleanups": [_key("ws-1", "dup"), _key("ws-2", "dup")]},
            (grpc.StatusCode.PERMISSION_DENIED, "WORKSPACE_SCOPE_MISMATCH", set()),
        ),
        (
            "ws1-device",
            {"cleanups": [_key("ws-1", "dup")]},
            (grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED", set()),
        ),
        (
            "service",
            {"cleanups": []},
            (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", {"cleanups"}),
        ),
        (
            "service",
            {"cleanups": [_key("ws-1", f"id-{i}") for i in range(1001)]},
            (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", {"cleanups"}),
        ),
        (
            "service",
            {"cleanups": [_key("ws-1", "dup"), _key("ws-1", "")]},
            (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", {"cleanups[1].session_id"}),
        ),
        (
            "service",
            {"cleanups": [_key("ws-1", "dup"), _key("", "dup")]},
            (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", {"cleanups[1].workspace_id"}),
        ),
    ],
)
def test_a_refused_call_completes_nothing(
    host: host_pb2_grpc.HostServiceStub,
    sync_engine: Engine,
    principal: str,
    request_fields: dict[str, object],
    expected: tuple[grpc.StatusCode, str, set[str]],
) -> None:
    before = cleanup_rows(sync_engine)
    with pytest.raises(grpc.RpcError) as refused:
        host.CompleteResourceCleanups(
            host_pb2.CompleteResourceCleanupsRequest(**request_fields),  # type: ignore[arg-type]
            metadata=auth_metadata(principal),
        )
    assert error_details(refused.value) == expected
    assert cleanup_rows(sync_engine) == before
