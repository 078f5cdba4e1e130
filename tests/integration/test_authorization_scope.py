"""An unset workspace is the caller's own workspaces, never every workspace (SEC-1, SEC-3).

The regressions of issue 11: a ``service`` or ``admin`` token scoped to one workspace that
leaves the optional ``workspace_id`` unset purged, listed and counted every workspace.
Each test seeds the same data in ``ws-1`` and ``ws-2`` and calls a real Host as principals
scoped to ``ws-1``, then as a deployment-wide one, on SQLite and Postgres.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from sqlalchemy import Engine

from agentactivity.host.v1 import host_pb2
from tests.support.host_sessions import HostClient, error_of
from tests.support.servers import LiveServer, auth_metadata
from tests.support.session_trees import add_active_turn, add_tree, cleanup_rows, sessions

WORKSPACES = ("ws-1", "ws-2")
WS1_SERVICE = auth_metadata("ws1-service")
WS1_ADMIN = auth_metadata("ws1-admin")
SERVICE = auth_metadata("service")
ADMIN = auth_metadata("admin")


@pytest.fixture
def host(migrated_db_url: str, live_server: Callable[..., LiveServer]) -> HostClient:
    client = HostClient(live_server("host", database_url=migrated_db_url))
    client.register()
    return client


def _tombstones(host: HostClient, engine: Engine) -> None:
    """``old`` tombstoned in both workspaces (and ``live`` left live)."""
    for ws in WORKSPACES:
        add_tree(engine, {"old": None, "live": None}, workspace_id=ws)
        host.call(
            "DeleteSessions",
            host_pb2.DeleteSessionsRequest(workspace_id=ws, session_ids=["old"]),
            ADMIN,
        )


@pytest.mark.spec("SEC-1", "SEC-3", "HOST-DEL-9")
@pytest.mark.parametrize("principal", [WS1_SERVICE, WS1_ADMIN], ids=["ws1-service", "ws1-admin"])
def test_a_scoped_purge_without_a_workspace_purges_only_its_own(
    host: HostClient, sync_engine: Engine, principal: tuple[tuple[str, str], ...]
) -> None:
    _tombstones(host, sync_engine)
    everything = host_pb2.PurgeDeletedSessionsRequest(cutoff_unix_ms=2**53 - 1, max_trees=1000)
    dry = host.call(
        "PurgeDeletedSessions",
        host_pb2.PurgeDeletedSessionsRequest(
            cutoff_unix_ms=2**53 - 1, max_trees=1000, dry_run=True
        ),
        principal,
    )
    assert [(p.workspace_id, p.session_id) for p in dry.purged] == [("ws-1", "old")]
    report = host.call("PurgeDeletedSessions", everything, principal)
    assert [(p.workspace_id, p.session_id) for p in report.purged] == [("ws-1", "old")]
    assert set(sessions(sync_engine, "ws-1")) == {"live"}
    assert set(sessions(sync_engine, "ws-2")) == {"old", "live"}, "ws-2 kept its tombstone"
    assert cleanup_rows(sync_engine) == {("ws-1", "old")}

    code, reason, _, _ = error_of(
        lambda: host.call(
            "PurgeDeletedSessions",
            host_pb2.PurgeDeletedSessionsRequest(workspace_id="ws-2", cutoff_unix_ms=2**53 - 1),
            principal,
        )
    )
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "WORKSPACE_SCOPE_MISMATCH")
    assert set(sessions(sync_engine, "ws-2")) == {"old", "live"}

    # Only a deployment-wide principal spans the deployment.
    wide = host.call("PurgeDeletedSessions", everything, SERVICE)
    assert [(p.workspace_id, p.session_id) for p in wide.purged] == [("ws-2", "old")]
    assert cleanup_rows(sync_engine) == {("ws-1", "old"), ("ws-2", "old")}


@pytest.mark.spec("SEC-1", "SEC-3", "HOST-CLEAN-1")
def test_a_scoped_cleanup_listing_without_a_workspace_lists_only_its_own(
    host: HostClient, sync_engine: Engine
) -> None:
    _tombstones(host, sync_engine)
    host.call(
        "PurgeDeletedSessions",
        host_pb2.PurgeDeletedSessionsRequest(cutoff_unix_ms=2**53 - 1, max_trees=1000),
        SERVICE,
    )
    assert cleanup_rows(sync_engine) == {("ws-1", "old"), ("ws-2", "old")}
    for principal in (WS1_SERVICE, WS1_ADMIN):
        rows = host.call(
            "ListPendingResourceCleanups", host_pb2.ListPendingResourceCleanupsRequest(), principal
        )
        assert [(c.workspace_id, c.session_id) for c in rows.cleanups] == [("ws-1", "old")]
        # Paging stays inside the scope: a cursor of the scoped listing continues it.
        first = host.call(
            "ListPendingResourceCleanups",
            host_pb2.ListPendingResourceCleanupsRequest(limit=1),
            principal,
        )
        assert [c.workspace_id for c in first.cleanups] == ["ws-1"]
        assert first.next_cursor == ""
    everything = host.call(
        "ListPendingResourceCleanups", host_pb2.ListPendingResourceCleanupsRequest(), SERVICE
    )
    assert sorted(c.workspace_id for c in everything.cleanups) == ["ws-1", "ws-2"]
    code, reason, _, _ = error_of(
        lambda: host.call(
            "CompleteResourceCleanup",
            host_pb2.CompleteResourceCleanupRequest(workspace_id="ws-2", session_id="old"),
            WS1_SERVICE,
        )
    )
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "WORKSPACE_SCOPE_MISMATCH")
    assert cleanup_rows(sync_engine) == {("ws-1", "old"), ("ws-2", "old")}


@pytest.mark.spec("SEC-1", "SEC-3", "HOST-ACT-1")
def test_a_scoped_activity_state_without_a_workspace_counts_only_its_own(
    host: HostClient, sync_engine: Engine
) -> None:
    for ws in WORKSPACES:
        add_tree(sync_engine, {"busy": None}, workspace_id=ws)
        add_active_turn(sync_engine, "busy", "t-1", workspace_id=ws)
    for principal in (WS1_SERVICE, WS1_ADMIN, auth_metadata("ws1-device")):
        state = host.call("GetActivityState", host_pb2.GetActivityStateRequest(), principal)
        assert state.active_turn_count == 1
        assert [(w.workspace_id, w.active_turn_count) for w in state.workspaces] == [("ws-1", 1)]
    wide = host.call("GetActivityState", host_pb2.GetActivityStateRequest(), SERVICE)
    assert wide.active_turn_count == 2
    assert [w.workspace_id for w in wide.workspaces] == ["ws-1", "ws-2"]


@pytest.mark.spec("SEC-3", "HOST-TGT-1")
def test_a_workspace_admin_may_not_change_deployment_wide_targets(host: HostClient) -> None:
    code, reason, _, _ = error_of(
        lambda: host.call(
            "SetAgentTargetEnabled",
            host_pb2.SetAgentTargetEnabledRequest(agent_target_id="demo", enabled=False),
            WS1_ADMIN,
        )
    )
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "DEPLOYMENT_SCOPE_REQUIRED")
    (target,) = host.call("ListAgentTargets", host_pb2.ListAgentTargetsRequest(), WS1_ADMIN).targets
    assert target.enabled, "nothing changed"
