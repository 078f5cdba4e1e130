"""GetActivityState through a real host server on both backends (HOST-ACT-1)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import insert

from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from store.engine import create_sync_engine_for
from store.models import Session, Turn
from tests.support.servers import LiveServer, auth_metadata


def _seed(url: str, turns: list[tuple[str, str, str, str]]) -> None:
    """Insert one Session per (workspace, session) and the given Turns."""
    engine = create_sync_engine_for(url)
    try:
        with engine.begin() as connection:
            sessions = {(ws, sid) for ws, sid, _, _ in turns}
            for ws, sid in sorted(sessions):
                connection.execute(
                    insert(Session).values(
                        workspace_id=ws,
                        session_id=sid,
                        root_session_id=sid,
                        provider="demo",
                        rail_section_key="conversations",
                        created_at_unix_ms=1,
                        updated_at_unix_ms=1,
                    )
                )
            for ws, sid, tid, phase in turns:
                connection.execute(
                    insert(Turn).values(
                        workspace_id=ws,
                        session_id=sid,
                        turn_id=tid,
                        phase=phase,
                        outcome="completed" if phase == "settled" else None,
                        origin="user",
                        created_at_unix_ms=1,
                        updated_at_unix_ms=1,
                    )
                )
    finally:
        engine.dispose()


@pytest.mark.spec("HOST-ACT-1")
def test_active_turns_are_counted_overall_and_per_workspace(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    _seed(
        migrated_db_url,
        [
            ("ws-1", "s1", "t1", "running"),
            ("ws-1", "s1", "t0", "settled"),
            ("ws-1", "s2", "t2", "awaiting_interaction"),
            ("ws-2", "s3", "t3", "queued"),
            ("ws-3", "s4", "t4", "settled"),
        ],
    )
    host = live_server("host", database_url=migrated_db_url)
    stub = host_pb2_grpc.HostServiceStub(host.channel)

    everything = stub.GetActivityState(
        host_pb2.GetActivityStateRequest(), metadata=auth_metadata("service"), timeout=5
    )
    assert everything.any_turn_active
    assert everything.active_turn_count == 3
    assert [(w.workspace_id, w.active_turn_count) for w in everything.workspaces] == [
        ("ws-1", 2),
        ("ws-2", 1),
    ]

    one = stub.GetActivityState(
        host_pb2.GetActivityStateRequest(workspace_id="ws-2"),
        metadata=auth_metadata("ws2-device"),
        timeout=5,
    )
    assert (one.any_turn_active, one.active_turn_count) == (True, 1)

    idle = stub.GetActivityState(
        host_pb2.GetActivityStateRequest(workspace_id="ws-3"),
        metadata=auth_metadata("admin"),
        timeout=5,
    )
    assert (idle.any_turn_active, idle.active_turn_count, list(idle.workspaces)) == (False, 0, [])
