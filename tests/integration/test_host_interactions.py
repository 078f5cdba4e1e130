"""Interaction response operations, attention items, message paging (HOST-INT-3/4, MSG-2)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import grpc
import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2
from tests.integration.host_activity import WS, error_reason, start_host
from tests.support.host_activity_calls import (
    attention_items,
    response_operation,
    session_messages,
    submit_response,
)
from tests.support.runtime_client import (
    interaction_disposition,
    text_message,
    turn_patch,
)
from tests.support.servers import LiveServer


@pytest.mark.spec("HOST-INT-3", "HOST-INT-4", "HOST-INT-1", "HOST-INT-6")
def test_a_response_is_a_durable_operation_completed_by_the_runtime(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, turn_id = host.pending_interaction()
    items = attention_items(host.stub)
    assert len(items) == 1
    item = items[0]
    assert (item.session_id, item.turn_id, item.request_id) == ("s1", turn_id, "q1")
    assert item.interaction_kind == canonical_pb2.INTERACTION_KIND_PERMISSION
    assert (item.root_session_id, item.provider, item.title) == ("s1", "demo", "title of s1")
    assert item.summary == "The agent wants to run ls"

    first = submit_response(host.stub, turn_id, "k1", payload_json='{"remember": true}')
    operation = first.operation
    assert not first.replayed
    assert operation.status in (
        host_pb2.INTERACTION_RESPONSE_OPERATION_STATUS_PENDING,
        host_pb2.INTERACTION_RESPONSE_OPERATION_STATUS_RESOLVING,
    )
    assert operation.interaction.status == canonical_pb2.INTERACTION_STATUS_RESOLVING
    assert operation.interaction.answer.action == "allow"
    command = runtime.next_command()
    assert command.deliver_interaction_response.payload_json == '{"remember": true}'
    runtime.ack(command.command_id)
    # A claimed Interaction is no longer an attention item.
    assert not attention_items(host.stub)

    replay = submit_response(host.stub, turn_id, "k1", payload_json='{"remember": true}')
    assert replay.replayed
    assert replay.operation.operation_id == operation.operation_id
    assert runtime.commands.empty()  # a replay never re-sends
    with pytest.raises(grpc.RpcError) as changed:
        submit_response(host.stub, turn_id, "k1", action="deny")
    assert changed.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert error_reason(changed.value) == "IDEMPOTENCY_KEY_CONFLICT"
    # Another key is a competing responder (HOST-INT-5): its own operation, never sent.
    other_key = submit_response(host.stub, turn_id, "k2").operation
    assert other_key.operation_id != operation.operation_id
    assert other_key.status == host_pb2.INTERACTION_RESPONSE_OPERATION_STATUS_COMPLETED
    assert other_key.disposition == canonical_pb2.INTERACTION_STATUS_SUPERSEDED  # other payload
    assert runtime.commands.empty()

    # The runtime's "pending" releases the claim: the same answer is re-dispatched under a
    # new command, and the Interaction stays claimed.
    runtime.report(
        WS,
        "s1",
        "r2",
        interaction_disposition(
            turn_id,
            "q1",
            canonical_pb2.INTERACTION_STATUS_PENDING,
            operation_id=operation.operation_id,
            command_id=command.command_id,
        ),
    )
    again = runtime.next_command()
    assert again.command_id != command.command_id
    assert again.deliver_interaction_response == command.deliver_interaction_response
    view = response_operation(host.stub, operation.operation_id)
    assert view.status == host_pb2.INTERACTION_RESPONSE_OPERATION_STATUS_RESOLVING
    assert view.dispatch_attempts == 2
    assert view.interaction.status == canonical_pb2.INTERACTION_STATUS_RESOLVING

    # The runtime's disposition may differ from the provisional claim.
    runtime.report(
        WS,
        "s1",
        "r3",
        interaction_disposition(
            turn_id,
            "q1",
            canonical_pb2.INTERACTION_STATUS_SUPERSEDED,
            operation_id=operation.operation_id,
            command_id=command.command_id,
        ),
    )
    done = submit_response(
        host.stub, turn_id, "k1", payload_json='{"remember": true}', wait_timeout_ms=2000
    )
    assert done.operation.status == host_pb2.INTERACTION_RESPONSE_OPERATION_STATUS_COMPLETED
    assert done.operation.disposition == canonical_pb2.INTERACTION_STATUS_SUPERSEDED
    assert done.operation.interaction.status == canonical_pb2.INTERACTION_STATUS_SUPERSEDED
    runtime.close()


@pytest.mark.spec("HOST-INT-3")
def test_a_response_waits_for_the_runtime_disposition(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    import threading

    host = start_host(live_server, migrated_db_url)
    runtime, turn_id = host.pending_interaction()

    def answer() -> None:
        command = runtime.next_command()
        runtime.ack(command.command_id)
        op_id = command.deliver_interaction_response.operation_id
        runtime.report(
            WS,
            "s1",
            "r9",
            interaction_disposition(
                turn_id,
                "q1",
                canonical_pb2.INTERACTION_STATUS_ANSWERED,
                operation_id=op_id,
                command_id=command.command_id,
            ),
        )

    worker = threading.Thread(target=answer)
    worker.start()
    done = submit_response(host.stub, turn_id, "k1", wait_timeout_ms=5000)
    worker.join(timeout=30)
    assert not worker.is_alive(), "the scripted runtime did not finish answering"
    assert done.operation.status == host_pb2.INTERACTION_RESPONSE_OPERATION_STATUS_COMPLETED
    assert done.operation.disposition == canonical_pb2.INTERACTION_STATUS_ANSWERED
    assert done.operation.dispatch_attempts == 1
    runtime.close()


@pytest.mark.spec("HOST-INT-3")
def test_unknown_interactions_and_operations_are_not_found(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    with pytest.raises(grpc.RpcError) as missing:
        submit_response(host.stub, "t-x", "k1")
    assert error_reason(missing.value) == "INTERACTION_NOT_FOUND"
    with pytest.raises(grpc.RpcError) as op:
        response_operation(host.stub, "op")
    assert error_reason(op.value) == "OPERATION_NOT_FOUND"


@pytest.mark.spec("HOST-MSG-1", "HOST-MSG-2", "CON-4")
def test_messages_page_both_ways_by_version(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    turn = host.send("hello", "c1").turn
    runtime.report(
        WS,
        "s1",
        "r1",
        turn_patch(turn.turn_id, canonical_pb2.TURN_PHASE_RUNNING),
        *[text_message(f"m{i}", turn.turn_id, f"part {i}") for i in range(5)],
    )
    # Rewriting m0 gives it the newest version; its sequence never changes.
    runtime.report(WS, "s1", "r2", text_message("m0", turn.turn_id, "rewritten"))

    page = partial(session_messages, host.stub)

    everything = page()
    assert everything.latest_version == 7
    assert [m.version for m in everything.messages] == [1, 3, 4, 5, 6, 7]
    m0 = next(m for m in everything.messages if m.message_id == "m0")
    assert (m0.sequence, m0.version) == (2, 7)
    first = page(limit=2)
    assert [m.version for m in first.messages] == [1, 3]
    assert first.has_more
    second = page(limit=2, after_version=3)
    assert [m.version for m in second.messages] == [4, 5]
    newest = page(limit=2, order=host_pb2.MESSAGE_ORDER_DESC)
    assert [m.version for m in newest.messages] == [7, 6]
    assert newest.has_more
    older = page(limit=10, order=host_pb2.MESSAGE_ORDER_DESC, before_version=6)
    assert [m.version for m in older.messages] == [5, 4, 3, 1]
    assert not older.has_more
    for bad in ({"after_version": 2**53}, {"limit": -1}, {"before_version": -1}):
        with pytest.raises(grpc.RpcError) as caught:
            page(**bad)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    runtime.close()
