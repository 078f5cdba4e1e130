"""The demo runtime against a real Host: activation, file-change snapshots, results, search.

HOST-SES-9 needs a runtime that acknowledges ``resume_session``; HOST-TURN-8 needs one that
reports a snapshot on its Turn patches. The demo runtime does both (``services/demoruntime``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from tests.support.polling import eventually
from tests.support.servers import LiveServer, auth_metadata, token_for

WS = "ws-1"
SID = "s-demo"
DEVICE = auth_metadata("ws1-device")


def _latest(stub: host_pb2_grpc.HostServiceStub) -> canonical_pb2.Turn:
    detail = stub.GetSession(
        host_pb2.GetSessionRequest(workspace_id=WS, session_id=SID), metadata=DEVICE
    )
    return detail.latest_turn


@pytest.mark.spec("HOST-SES-9", "HOST-TURN-8", "HOST-TURN-7", "HOST-SES-8")
def test_the_demo_runtime_accepts_a_resume_and_reports_its_turns_file_changes(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = live_server("host", database_url=migrated_db_url)
    live_server(
        "demoruntime",
        host_address=host.address,
        service_token=token_for("service"),
        demo_step_delay_seconds=0.0,
    )
    stub = host_pb2_grpc.HostServiceStub(host.channel)
    created = stub.CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id=WS,
            agent_target_id="demo",
            session_id=SID,
            title="demo",
            cwd="/nonexistent/demo",
            initial_input=host_pb2.InitialInput(client_submit_id="c1", content="hello"),
        ),
        metadata=DEVICE,
    )
    turn_id = created.turn.turn_id
    assert eventually(lambda: _latest(stub).phase == canonical_pb2.TURN_PHASE_SETTLED, timeout=30)
    settled = _latest(stub)
    assert [(c.path, c.change) for c in settled.file_changes] == [
        ("demo-echo.txt", canonical_pb2.FILE_CHANGE_KIND_MODIFIED)
    ]

    result = stub.GetTurnResult(
        host_pb2.GetTurnResultRequest(workspace_id=WS, session_id=SID, turn_id=turn_id),
        metadata=DEVICE,
    )
    assert result.message.message_id == f"{turn_id}:reply"
    assert not result.legacy_fallback

    found = stub.SearchGeneratedFiles(
        host_pb2.SearchGeneratedFilesRequest(
            workspace_id=WS, section_key=created.session.rail_section_key
        ),
        metadata=DEVICE,
    )
    assert [(f.path, f.session_id, f.turn_id) for f in found.files] == [
        ("demo-echo.txt", SID, turn_id)
    ]

    activated = stub.ActivateSession(
        host_pb2.ActivateSessionRequest(workspace_id=WS, session_id=SID, activation_id="a-1"),
        metadata=DEVICE,
        timeout=15,
    )
    assert not activated.replayed
    assert activated.detail.session.session_id == SID
    assert activated.detail.latest_turn.turn_id == turn_id  # no Turn was started
