"""SendInput, StopTurn and ListSessionTurns through a real host on both backends."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable

import grpc
import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2
from tests.integration.host_activity import DEVICE, WS, error_reason, start_host
from tests.support.servers import LiveServer


@pytest.mark.spec("HOST-RT-1", "HOST-TURN-1")
def test_submit_without_a_connected_runtime_is_unavailable_and_persists_nothing(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    with pytest.raises(grpc.RpcError) as caught:
        host.send("hello", "c1")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_reason(caught.value) == "RUNTIME_UNAVAILABLE"
    assert host.counts() == (0, 0)


@pytest.mark.spec("HOST-TURN-1", "HOST-RT-1")
def test_submit_persists_turn_and_user_row_then_replays_and_detects_conflicts(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    first = host.send("hello", "c1")
    assert first.turn.client_submit_id == "c1"
    assert first.turn.phase == canonical_pb2.TURN_PHASE_QUEUED
    assert first.user_message.message_id == "client-submit:user:c1"
    assert first.user_message.turn_id == first.turn.turn_id
    assert first.user_message.user_visible_assistant_response is False
    assert first.session.active_turn_id == first.turn.turn_id
    assert not first.replayed
    command = runtime.next_command()
    assert command.WhichOneof("command") == "start_turn"
    assert command.start_turn.turn_id == first.turn.turn_id
    assert command.start_turn.user_message_id == "client-submit:user:c1"
    assert command.start_turn.session.runtime_target_ref == "demo:default"

    replay = host.send("hello", "c1")
    assert replay.replayed
    assert replay.turn.turn_id == first.turn.turn_id
    assert host.counts() == (1, 1)

    with pytest.raises(grpc.RpcError) as caught:
        host.send("something else", "c1")
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert error_reason(caught.value) == "CLIENT_SUBMIT_CONFLICT"
    runtime.close()


@pytest.mark.spec("HOST-TURN-2")
def test_new_turn_while_active_is_turn_active_and_leaves_the_submit_id_unused(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    host.send("first", "c1")
    with pytest.raises(grpc.RpcError) as caught:
        host.send("second", "c2")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(caught.value) == "TURN_ACTIVE"
    assert host.counts() == (1, 1)
    runtime.close()


@pytest.mark.spec("HOST-TURN-3")
def test_guidance_goes_only_to_the_exact_active_turn(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    active = host.send("first", "c1").turn
    runtime.next_command()
    with pytest.raises(grpc.RpcError) as missing:
        host.send("steer", "g0", delivery=canonical_pb2.DELIVERY_MODE_GUIDANCE)
    assert missing.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as stray:
        host.send("x", "g0", target_turn_id=active.turn_id)
    assert stray.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as wrong:
        host.send(
            "steer", "g1", delivery=canonical_pb2.DELIVERY_MODE_GUIDANCE, target_turn_id="other"
        )
    assert wrong.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(wrong.value) == "GUIDANCE_TARGET_NOT_ACTIVE"
    assert host.counts() == (1, 1)
    assert runtime.commands.empty()

    guided = host.send(
        "steer", "g2", delivery=canonical_pb2.DELIVERY_MODE_GUIDANCE, target_turn_id=active.turn_id
    )
    assert guided.turn.turn_id == active.turn_id
    assert guided.user_message.turn_id == active.turn_id
    command = runtime.next_command()
    assert command.guidance.target_turn_id == active.turn_id
    replay = host.send(
        "steer", "g2", delivery=canonical_pb2.DELIVERY_MODE_GUIDANCE, target_turn_id=active.turn_id
    )
    assert replay.replayed
    # The released id g1 may be used again.
    host.send(
        "again", "g1", delivery=canonical_pb2.DELIVERY_MODE_GUIDANCE, target_turn_id=active.turn_id
    )
    runtime.close()


@pytest.mark.spec("HOST-TURN-2", "HOST-TURN-5")
def test_interrupt_stops_the_active_turn_then_starts_the_new_one(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    old = host.send("first", "c1").turn
    new = host.send("instead", "c2", delivery=canonical_pb2.DELIVERY_MODE_INTERRUPT)
    assert new.interrupted_turn_id == old.turn_id
    assert new.session.active_turn_id == new.turn.turn_id
    turns = host.stub.ListSessionTurns(
        host_pb2.ListSessionTurnsRequest(workspace_id=WS, session_id="s1"), metadata=DEVICE
    ).turns
    assert [t.turn_id for t in turns] == [old.turn_id, new.turn.turn_id]
    assert turns[0].outcome == canonical_pb2.TURN_OUTCOME_CANCELED
    assert turns[0].version > old.version
    kinds = [runtime.next_command().WhichOneof("command") for _ in range(3)]
    assert kinds == ["start_turn", "interrupt_turn", "start_turn"]
    runtime.close()


@pytest.mark.spec("HOST-TURN-2")
def test_interrupt_needs_the_capability(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime(interrupt=False)
    with pytest.raises(grpc.RpcError) as caught:
        host.send("x", "c1", delivery=canonical_pb2.DELIVERY_MODE_INTERRUPT)
    assert error_reason(caught.value) == "DELIVERY_MODE_UNSUPPORTED"
    assert host.counts() == (0, 0)
    runtime.close()


@pytest.mark.spec("HOST-TURN-4", "HOST-MENT-3")
def test_stop_turn_cancels_once_and_restores_the_typed_command(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    sent = host.send("ask @explorer to look", "c1")
    assert sent.user_message.command == "ask @explorer to look"
    assert [m.name for m in sent.user_message.agent_mentions] == ["explorer"]
    start = runtime.next_command().start_turn
    assert start.prompt != "ask @explorer to look"  # the model-facing prompt
    stop = host.stub.StopTurn(
        host_pb2.StopTurnRequest(workspace_id=WS, session_id="s1", turn_id=sent.turn.turn_id),
        metadata=DEVICE,
    )
    assert not stop.already_settled
    assert stop.turn.outcome == canonical_pb2.TURN_OUTCOME_CANCELED
    assert stop.turn.result_resolved_empty
    assert stop.restored_input == "ask @explorer to look"
    assert runtime.next_command().stop_turn.turn_id == sent.turn.turn_id
    again = host.stub.StopTurn(
        host_pb2.StopTurnRequest(workspace_id=WS, session_id="s1", turn_id=sent.turn.turn_id),
        metadata=DEVICE,
    )
    assert again.already_settled
    assert again.turn.version == stop.turn.version
    with pytest.raises(grpc.RpcError) as caught:
        host.stub.StopTurn(
            host_pb2.StopTurnRequest(workspace_id=WS, session_id="s1", turn_id="nope"),
            metadata=DEVICE,
        )
    assert error_reason(caught.value) == "TURN_NOT_FOUND"
    runtime.close()


@pytest.mark.spec("HOST-TURN-1", "HOST-LANE-1")
def test_concurrent_submits_with_one_client_submit_id_create_one_turn(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: host.send("same", "c1"), range(4)))
    assert len({r.turn.turn_id for r in results}) == 1
    assert sum(not r.replayed for r in results) == 1
    assert host.counts() == (1, 1)
    runtime.close()


@pytest.mark.spec("HOST-TURN-2", "HOST-LANE-1")
def test_concurrent_new_turns_leave_one_active_turn_and_one_turn_active_error(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()

    def submit(submit_id: str) -> str:
        try:
            host.send("go", submit_id)
        except grpc.RpcError as error:
            return error_reason(error)
        return "ok"

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        outcomes = sorted(pool.map(submit, ["a", "b"]))
    assert outcomes == ["TURN_ACTIVE", "ok"]
    assert host.counts() == (1, 1)
    runtime.close()


@pytest.mark.spec("HOST-TURN-5")
def test_list_session_turns_pages_with_a_cursor(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    ids = []
    for index in range(3):
        turn = host.send(f"t{index}", f"c{index}").turn
        host.stub.StopTurn(
            host_pb2.StopTurnRequest(workspace_id=WS, session_id="s1", turn_id=turn.turn_id),
            metadata=DEVICE,
        )
        ids.append(turn.turn_id)
    seen: list[str] = []
    cursor = ""
    while True:
        page = host.stub.ListSessionTurns(
            host_pb2.ListSessionTurnsRequest(
                workspace_id=WS, session_id="s1", limit=2, cursor=cursor
            ),
            metadata=DEVICE,
        )
        seen += [t.turn_id for t in page.turns]
        cursor = page.next_cursor
        if not cursor:
            break
    assert seen == ids
    runtime.close()
