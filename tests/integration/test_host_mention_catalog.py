"""``GetMentionCatalog`` through a real host server on both backends (HOST-MENT-1)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2
from tests.support.host_sessions import HostClient, demo_target, error_of
from tests.support.servers import LiveServer


@pytest.fixture
def host(migrated_db_url: str, live_server: Callable[..., LiveServer]) -> HostClient:
    client = HostClient(live_server("host", database_url=migrated_db_url))
    target = demo_target()
    target.subagents.add(name="reviewer", description="Reviews")
    client.register(target)
    return client


@pytest.mark.spec("HOST-MENT-1")
def test_the_launch_catalog_minus_shadowed_names(host: HostClient, tmp_path: Path) -> None:
    (tmp_path / "reviewer").mkdir()
    host.create(session_id="s-1", cwd=str(tmp_path))
    # Re-registering the target later does not change what the Session launched with.
    host.register(demo_target())
    menu = host.call(
        "GetMentionCatalog",
        host_pb2.GetMentionCatalogRequest(workspace_id="ws-1", session_id="s-1"),
    )
    assert [a.name for a in menu.agents] == ["explorer"]
    assert list(menu.shadowed_names) == ["reviewer"]

    before = host.call(
        "GetMentionCatalog",
        host_pb2.GetMentionCatalogRequest(
            workspace_id="ws-1", agent_target_id="demo", cwd=str(tmp_path)
        ),
    )
    assert [a.name for a in before.agents] == ["explorer"]  # the target's current catalog
    plan = host.call(
        "GetMentionCatalog",
        host_pb2.GetMentionCatalogRequest(
            workspace_id="ws-1", session_id="s-1", mode=canonical_pb2.COMPOSER_MODE_PLAN
        ),
    )
    assert (list(plan.agents), list(plan.shadowed_names)) == ([], [])


@pytest.mark.spec("HOST-MENT-1", "SEC-2")
def test_scope_errors(host: HostClient) -> None:
    code, reason, _, _ = error_of(
        lambda: host.call(
            "GetMentionCatalog",
            host_pb2.GetMentionCatalogRequest(workspace_id="ws-1", agent_target_id="nope"),
        )
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "AGENT_TARGET_NOT_FOUND")
    code, _, fields, _ = error_of(
        lambda: host.call(
            "GetMentionCatalog", host_pb2.GetMentionCatalogRequest(workspace_id="ws-1")
        )
    )
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, {"scope"})
    code, reason, _, _ = error_of(
        lambda: host.call(
            "GetMentionCatalog",
            host_pb2.GetMentionCatalogRequest(workspace_id="ws-1", session_id="missing"),
        )
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")
