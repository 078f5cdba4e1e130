"""The runtime command outbox: retention and dispatch (HOST-RT-1, HOST-RT-5, HOST-INT-3, ADR 0013).

Acknowledged commands leave the outbox, except a delivered interaction response whose
operation is still open (a ``pending`` disposition may re-dispatch it); those go once the
operation completes. Unacknowledged commands keep their durable retry.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import select

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import runtime_pb2
from store.engine import create_sync_engine_for
from store.models import RuntimeCommandOutbox
from tests.integration.host_activity import WS, HostUnderTest, start_host
from tests.support.host_activity_calls import submit_response
from tests.support.polling import eventually
from tests.support.runtime_client import interaction, interaction_disposition, turn_patch
from tests.support.servers import LiveServer


def _outbox(host: HostUnderTest) -> dict[str, tuple[str, int]]:
    """``command_id -> (state, attempts)`` of every outbox row."""
    engine = create_sync_engine_for(host.url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                select(
                    RuntimeCommandOutbox.command_id,
                    RuntimeCommandOutbox.state,
                    RuntimeCommandOutbox.attempts,
                )
            ).all()
    finally:
        engine.dispose()
    return {str(r[0]): (str(r[1]), int(r[2])) for r in rows}


def _eventually(
    host: HostUnderTest, check: Callable[[dict[str, tuple[str, int]]], bool]
) -> dict[str, tuple[str, int]]:
    # An acknowledgement is a fire-and-forget frame: wait for its transaction.
    rows: dict[str, tuple[str, int]] = {}

    def holds() -> bool:
        nonlocal rows
        rows = _outbox(host)
        return check(rows)

    eventually(holds)  # on a timeout, the last rows read go to the caller's assertion
    return rows


@pytest.mark.spec("HOST-RT-1", "HOST-RT-5")
def test_acknowledged_commands_leave_the_outbox_and_open_ones_are_retried(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    host.send("hello", "c1")
    command = runtime.next_command()
    # Marked dispatched in the submit's own transaction, before SendInput returned.
    assert _outbox(host) == {command.command_id: ("dispatched", 1)}

    runtime.ack(command.command_id, runtime_pb2.COMMAND_ACK_STATUS_FAILED)
    rows = _eventually(host, lambda rows: rows[command.command_id][0] == "pending")
    assert rows == {command.command_id: ("pending", 1)}  # kept for the retry

    runtime.cancel()
    again = host.runtime()  # a reconnecting link receives every unacknowledged command
    assert again.next_command().command_id == command.command_id
    assert _outbox(host) == {command.command_id: ("dispatched", 2)}

    again.ack(command.command_id, runtime_pb2.COMMAND_ACK_STATUS_REJECTED)
    assert _eventually(host, lambda rows: not rows) == {}  # failed for good: gone
    again.ack(command.command_id)  # a repeated acknowledgement is ignored
    assert again.welcome is not None
    host.send("more", "c2", delivery=canonical_pb2.DELIVERY_MODE_INTERRUPT)
    kinds = [again.next_command().WhichOneof("command") for _ in range(2)]
    assert kinds == ["interrupt_turn", "start_turn"]
    assert all(state == "dispatched" for state, _ in _outbox(host).values())
    again.close()


@pytest.mark.spec("HOST-INT-3", "HOST-RT-5")
@pytest.mark.parametrize(
    ("ack_status", "kept_as"),
    [
        (runtime_pb2.COMMAND_ACK_STATUS_ACCEPTED, "completed"),
        (runtime_pb2.COMMAND_ACK_STATUS_REJECTED, "failed"),
    ],
)
def test_a_delivered_response_stays_until_its_operation_completes(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    ack_status: runtime_pb2.CommandAckStatus.ValueType,
    kept_as: str,
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    turn = host.send("hello", "c1").turn
    start = runtime.next_command()
    runtime.ack(start.command_id)
    assert _eventually(host, lambda rows: not rows) == {}
    runtime.report(
        WS,
        "s1",
        "r1",
        turn_patch(turn.turn_id, canonical_pb2.TURN_PHASE_AWAITING_INTERACTION),
        interaction(turn.turn_id, "q1"),
    )
    operation = submit_response(host.stub, turn.turn_id, "k1").operation
    delivery = runtime.next_command()
    runtime.ack(delivery.command_id, ack_status)
    # Acknowledged, but the operation is open: a ``pending`` disposition may still re-send it.
    rows = _eventually(host, lambda rows: rows[delivery.command_id][0] == kept_as)
    assert rows == {delivery.command_id: (kept_as, 1)}

    runtime.report(
        WS,
        "s1",
        "r2",
        interaction_disposition(
            turn.turn_id,
            "q1",
            canonical_pb2.INTERACTION_STATUS_ANSWERED,
            operation_id=operation.operation_id,
            command_id=delivery.command_id,
        ),
        turn_patch(
            turn.turn_id,
            canonical_pb2.TURN_PHASE_SETTLED,
            outcome=canonical_pb2.TURN_OUTCOME_COMPLETED,
        ),
    )
    # The operation completed; the next acknowledgement prunes the row in its batch.
    host.send("next", "c2")
    follow_up = runtime.next_command()
    runtime.ack(follow_up.command_id)
    assert _eventually(host, lambda rows: not rows) == {}
    runtime.close()
