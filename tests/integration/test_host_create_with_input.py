"""``CreateSession`` with ``initial_input``: the Session and its first Turn, atomically.

Through a real host and a scripted runtime, on both backends (HOST-SES-1, HOST-TURN-1).
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2
from tests.support.host_sessions import WS1, HostClient, error_of
from tests.support.runtime_client import ScriptedRuntime
from tests.support.servers import LiveServer


@pytest.fixture
def server(migrated_db_url: str, live_server: Callable[..., LiveServer]) -> LiveServer:
    return live_server("host", database_url=migrated_db_url)


@pytest.fixture
def host(server: LiveServer) -> HostClient:
    client = HostClient(server)
    client.register()
    return client


def _create(host: HostClient, **fields: object) -> host_pb2.CreateSessionResponse:
    request = host_pb2.CreateSessionRequest(
        workspace_id="ws-1",
        agent_target_id="demo",
        cwd="/work/elsewhere",
        **fields,  # type: ignore[arg-type]
    )
    response: host_pb2.CreateSessionResponse = host.call("CreateSession", request, WS1)
    return response


def _first_input(
    content: str = "Fix the login bug\nand add a test", submit_id: str = "c1"
) -> host_pb2.InitialInput:
    return host_pb2.InitialInput(
        client_submit_id=submit_id, content=content, mode=canonical_pb2.COMPOSER_MODE_AGENT
    )


@pytest.mark.spec("HOST-SES-1", "HOST-TURN-1")
def test_initial_input_creates_the_session_and_its_first_turn(
    host: HostClient, server: LiveServer
) -> None:
    runtime = ScriptedRuntime(server.channel, providers=("demo-provider",))
    created = _create(host, session_id="s-in", initial_input=_first_input())
    assert created.HasField("turn")
    turn = created.turn
    assert turn.client_submit_id == "c1"
    assert turn.phase == canonical_pb2.TURN_PHASE_QUEUED
    assert turn.origin == canonical_pb2.TURN_ORIGIN_USER
    assert created.session.active_turn_id == turn.turn_id
    assert created.session.title == "Fix the login bug"  # derived from the first line
    # The runtime receives the same start command SendInput would send.
    start = runtime.next_command().start_turn
    assert start.turn_id == turn.turn_id
    assert start.client_submit_id == "c1"
    assert start.session.agent_target_id == "demo"
    messages = host.call(
        "ListSessionMessages",
        host_pb2.ListSessionMessagesRequest(workspace_id="ws-1", session_id="s-in"),
    ).messages
    assert [m.message_id for m in messages] == ["client-submit:user:c1"]
    # An identical retry replays: same Session, same Turn, nothing new.
    again = _create(host, session_id="s-in", initial_input=_first_input())
    assert again.turn.turn_id == turn.turn_id
    turns = host.call(
        "ListSessionTurns",
        host_pb2.ListSessionTurnsRequest(workspace_id="ws-1", session_id="s-in"),
    ).turns
    assert len(turns) == 1
    # The same client_submit_id with other content is a conflict, as for SendInput.
    code, reason, _, _ = error_of(
        lambda: _create(host, session_id="s-in", initial_input=_first_input("other"))
    )
    assert (code, reason) == (grpc.StatusCode.ALREADY_EXISTS, "CLIENT_SUBMIT_CONFLICT")
    runtime.close()


@pytest.mark.spec("HOST-SES-1", "HOST-RT-1", "HOST-TURN-1")
def test_without_a_runtime_nothing_is_created(host: HostClient) -> None:
    code, reason, _, _ = error_of(
        lambda: _create(host, session_id="s-none", initial_input=_first_input())
    )
    assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "RUNTIME_UNAVAILABLE")
    code, reason, _, _ = error_of(
        lambda: host.call(
            "GetSession", host_pb2.GetSessionRequest(workspace_id="ws-1", session_id="s-none")
        )
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")


@pytest.mark.spec("HOST-SES-1", "HOST-TURN-1", "SEC-2")
def test_invalid_initial_input_is_reported_on_its_fields(host: HostClient) -> None:
    code, _, fields, _ = error_of(
        lambda: _create(
            host, initial_input=host_pb2.InitialInput(client_submit_id="", content="  ")
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert fields == {"initial_input.client_submit_id", "initial_input.content"}


@pytest.mark.spec("HOST-SES-1")
def test_an_explicit_title_wins_over_the_derived_one(host: HostClient, server: LiveServer) -> None:
    runtime = ScriptedRuntime(server.channel, providers=("demo-provider",))
    created = _create(host, title="Mine", initial_input=_first_input())
    assert created.session.title == "Mine"
    assert created.session.session_id.startswith("ses-")
    runtime.close()
