"""A missing acknowledgement is not a rejection: disposition queries (HOST-INT-6).

A delivered answer with no disposition within ``interaction_disposition_query_seconds``, or
whose link was lost, stays ``resolving`` while Host asks the runtime with
``query_interaction_disposition`` for the exact (Turn, request), through the durable outbox
and with backoff, also after a reconnect or a Host restart. Authoritative answers complete
the operation, ``pending`` re-dispatches the same answer, and a failed query, an unknown
record or ``resolving`` keep it resolving.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from sqlalchemy import ColumnElement, Table, insert, select

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, runtime_pb2
from services.host import app as host_app
from services.host.settings import Settings as HostSettings
from store.engine import create_sync_engine_for
from store.models import (
    Interaction,
    InteractionResponseOperation,
    RuntimeCommandOutbox,
    Session,
    Turn,
)
from tests.integration.host_activity import WS, HostUnderTest, start_host
from tests.support.host_activity_calls import response_operation, submit_response
from tests.support.polling import eventually
from tests.support.runtime_client import (
    ScriptedRuntime,
    interaction_disposition,
)
from tests.support.servers import LiveServer

COMPLETED = host_pb2.INTERACTION_RESPONSE_OPERATION_STATUS_COMPLETED
RESOLVING = host_pb2.INTERACTION_RESPONSE_OPERATION_STATUS_RESOLVING
WINDOW_SECONDS = 0.3
_TABLES = Session.metadata.tables


def _delivered(
    host: HostUnderTest,
) -> tuple[ScriptedRuntime, str, str, runtime_pb2.RuntimeCommand]:
    """A pending Interaction ``q1`` answered under ``k1``, its delivery acknowledged.

    Returns the runtime, the Turn id, the operation id and the delivery command.
    """
    runtime, turn_id = host.pending_interaction()
    operation = submit_response(host.stub, turn_id, "k1", payload_json='{"n":1}').operation
    delivery = runtime.next_command()
    assert delivery.WhichOneof("command") == "deliver_interaction_response"
    runtime.ack(delivery.command_id)  # accepted, but the disposition never comes
    assert eventually(lambda: _outbox_state(host, delivery.command_id) == "completed")
    return runtime, turn_id, operation.operation_id, delivery


def _outbox_state(host: HostUnderTest, command_id: str) -> str | None:
    """The outbox state of a command (an acknowledgement is a fire-and-forget frame)."""
    engine = create_sync_engine_for(host.url)
    try:
        with engine.connect() as connection:
            state = connection.execute(
                select(RuntimeCommandOutbox.state).where(
                    RuntimeCommandOutbox.command_id == command_id
                )
            ).scalar_one_or_none()
    finally:
        engine.dispose()
    return None if state is None else str(state)


def _next_query(
    runtime: ScriptedRuntime, turn_id: str, operation_id: str
) -> runtime_pb2.RuntimeCommand:
    command = runtime.next_command()
    assert command.WhichOneof("command") == "query_interaction_disposition", command
    query = command.query_interaction_disposition
    assert (query.operation_id, query.turn_id, query.request_id) == (operation_id, turn_id, "q1")
    return command


def _answer(
    runtime: ScriptedRuntime,
    turn_id: str,
    operation_id: str,
    command: runtime_pb2.RuntimeCommand,
    disposition: int,
) -> None:
    """Acknowledge ``command`` and report ``disposition`` for it."""
    runtime.ack(command.command_id)
    result = runtime.report(
        WS,
        "s1",
        f"r-{command.command_id}",
        interaction_disposition(
            turn_id, "q1", disposition, operation_id=operation_id, command_id=command.command_id
        ),
    )
    assert result.outcome in (
        runtime_pb2.REPORT_OUTCOME_APPLIED,
        runtime_pb2.REPORT_OUTCOME_ALREADY_APPLIED,
    ), result


@pytest.mark.spec("HOST-INT-6", "HOST-RT-5")
def test_a_lost_disposition_is_queried_after_a_host_restart(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    # The first Host never waits long enough to query: only durable state carries over.
    first = start_host(live_server, migrated_db_url, interaction_disposition_query_seconds=3600)
    runtime, turn_id, operation_id, _ = _delivered(first)
    assert response_operation(first.stub, operation_id).status == RESOLVING
    runtime.cancel()
    first.server.stop()

    second = HostUnderTest(
        live_server(
            "host", database_url=migrated_db_url, interaction_disposition_query_seconds=3600
        ),
        migrated_db_url,
    )
    assert response_operation(second.stub, operation_id).status == RESOLVING
    again = second.runtime()  # the runtime reconnects: Host asks about the delivered answer
    query = _next_query(again, turn_id, operation_id)
    _answer(again, turn_id, operation_id, query, canonical_pb2.INTERACTION_STATUS_ANSWERED)

    done = response_operation(second.stub, operation_id)
    assert (done.status, done.disposition) == (COMPLETED, canonical_pb2.INTERACTION_STATUS_ANSWERED)
    assert done.interaction.status == canonical_pb2.INTERACTION_STATUS_ANSWERED
    assert done.dispatch_attempts == 1  # the answer itself was not sent again
    again.close()


@pytest.mark.spec("HOST-INT-6", "HOST-INT-3")
def test_an_unanswered_delivery_is_queried_with_backoff_until_an_authoritative_answer(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(
        live_server, migrated_db_url, interaction_disposition_query_seconds=WINDOW_SECONDS
    )
    delivered_at = time.monotonic()
    runtime, turn_id, operation_id, delivery = _delivered(host)

    # 1. No disposition within the window: a query, not a rejection.
    first = _next_query(runtime, turn_id, operation_id)
    first_at = time.monotonic()
    assert first_at - delivered_at >= WINDOW_SECONDS * 0.9
    # The runtime has no record of the request: unknown is no answer, the wait goes on.
    _answer(runtime, turn_id, operation_id, first, canonical_pb2.INTERACTION_STATUS_UNSPECIFIED)
    assert response_operation(host.stub, operation_id).status == RESOLVING

    # 2. Asked again; the query itself fails: still resolving.
    second = _next_query(runtime, turn_id, operation_id)
    second_at = time.monotonic()
    runtime.ack(second.command_id, runtime_pb2.COMMAND_ACK_STATUS_FAILED)

    # 3. Asked again, later each time (backoff from the operation's age); "resolving" waits.
    third = _next_query(runtime, turn_id, operation_id)
    third_at = time.monotonic()
    assert third_at - second_at >= 2 * WINDOW_SECONDS * 0.9
    assert third.command_id not in (first.command_id, second.command_id)
    _answer(runtime, turn_id, operation_id, third, canonical_pb2.INTERACTION_STATUS_RESOLVING)
    view = response_operation(host.stub, operation_id)
    assert (view.status, view.dispatch_attempts) == (RESOLVING, 1)
    assert view.interaction.status == canonical_pb2.INTERACTION_STATUS_RESOLVING

    # 4. "pending": the provider never got the answer. The claim is released and the same
    # answer goes out again under a new command.
    fourth = _next_query(runtime, turn_id, operation_id)
    _answer(runtime, turn_id, operation_id, fourth, canonical_pb2.INTERACTION_STATUS_PENDING)
    redelivery = runtime.next_command()
    assert redelivery.WhichOneof("command") == "deliver_interaction_response"
    assert redelivery.command_id != delivery.command_id
    assert redelivery.deliver_interaction_response == delivery.deliver_interaction_response
    view = response_operation(host.stub, operation_id)
    assert (view.status, view.dispatch_attempts) == (RESOLVING, 2)

    # The re-delivered answer is applied: that completes the operation, and queries stop.
    _answer(runtime, turn_id, operation_id, redelivery, canonical_pb2.INTERACTION_STATUS_ANSWERED)
    done = response_operation(host.stub, operation_id)
    assert (done.status, done.disposition) == (COMPLETED, canonical_pb2.INTERACTION_STATUS_ANSWERED)
    while not runtime.commands.empty():  # a query sent before the answer arrived
        runtime.commands.get_nowait()
    time.sleep(WINDOW_SECONDS * 3)  # several windows: a query would be due by now
    assert runtime.commands.empty()
    runtime.close()


@pytest.mark.spec("HOST-INT-6")
def test_a_superseded_answer_to_a_query_completes_the_operation(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(
        live_server, migrated_db_url, interaction_disposition_query_seconds=WINDOW_SECONDS
    )
    runtime, turn_id, operation_id, _ = _delivered(host)
    query = _next_query(runtime, turn_id, operation_id)
    _answer(runtime, turn_id, operation_id, query, canonical_pb2.INTERACTION_STATUS_SUPERSEDED)
    done = response_operation(host.stub, operation_id)
    assert (done.status, done.disposition) == (
        COMPLETED,
        canonical_pb2.INTERACTION_STATUS_SUPERSEDED,
    )
    assert done.interaction.status == canonical_pb2.INTERACTION_STATUS_SUPERSEDED
    runtime.close()


@pytest.mark.spec("HOST-INT-6", "HOST-RT-5")
def test_a_terminal_disposition_removes_the_open_query(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(
        live_server, migrated_db_url, interaction_disposition_query_seconds=WINDOW_SECONDS
    )
    runtime, turn_id, operation_id, delivery = _delivered(host)
    query = _next_query(runtime, turn_id, operation_id)
    assert _outbox_state(host, query.command_id) == "dispatched"
    # The delivery's disposition arrives before the query is answered: nothing is left to ask.
    _answer(runtime, turn_id, operation_id, delivery, canonical_pb2.INTERACTION_STATUS_ANSWERED)
    assert _outbox_state(host, query.command_id) is None
    runtime.ack(query.command_id)  # its late acknowledgement finds no row and is ignored
    assert response_operation(host.stub, operation_id).status == COMPLETED
    runtime.close()


def _unserved_resolving_operations(host: HostUnderTest, turn_id: str, count: int) -> None:
    """``count`` dispatched, resolving operations of a Session of a provider no link serves.

    Their queries come due before the delivered answer's, but not within the test. The rows
    are read first and written in a transaction of its own: a SQLite transaction that read
    before the Host's last write cannot write (``database is locked`` at once).
    """
    engine = create_sync_engine_for(host.url)
    try:
        with engine.connect() as connection:

            def read(table: Table, *where: ColumnElement[bool]) -> dict[str, object]:
                return dict(connection.execute(select(table).where(*where)).mappings().one())

            session = read(_TABLES["sessions"], Session.session_id == "s1")
            turn = read(_TABLES["turns"], Turn.turn_id == turn_id)
            request = read(_TABLES["interactions"], Interaction.turn_id == turn_id)
            operation = read(
                _TABLES["interaction_response_operations"],
                InteractionResponseOperation.turn_id == turn_id,
            )
        due = int(time.time() * 1000) + 600_000  # before the delivered answer's hour
        other = {"session_id": "s-other"}
        with engine.begin() as connection:
            connection.execute(
                insert(_TABLES["sessions"]).values(
                    {**session, **other, "provider": "other-provider", "active_turn_id": None}
                )
            )
            connection.execute(insert(_TABLES["turns"]).values({**turn, **other}))
            connection.execute(insert(_TABLES["interactions"]).values({**request, **other}))
            connection.execute(
                insert(_TABLES["interaction_response_operations"]),
                [
                    {
                        **operation,
                        **other,
                        "operation_id": f"op-other-{n}",
                        "idempotency_key": f"k-other-{n}",
                        "next_attempt_at_unix_ms": due + n,
                    }
                    for n in range(count)
                ],
            )
    finally:
        engine.dispose()


@pytest.mark.spec("HOST-INT-6", "HOST-RT-5")
def test_a_reconnect_queries_its_own_answers_at_once_whatever_else_resolves(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    # An hour's window: only the reconnect can make the query due, and the sweep polls every
    # 5 s, so a query within 2.5 s was sent because the reconnect woke it.
    host = start_host(live_server, migrated_db_url, interaction_disposition_query_seconds=3600)
    runtime, turn_id, operation_id, _ = _delivered(host)
    # More resolving answers than one sweep reads, due earlier, in a Session the link does
    # not serve: they neither hide this link's answer nor get queried on its behalf.
    _unserved_resolving_operations(host, turn_id, 150)
    runtime.cancel()

    again = host.runtime()
    started = time.monotonic()
    query = _next_query(again, turn_id, operation_id)
    assert time.monotonic() - started < 2.5
    _answer(again, turn_id, operation_id, query, canonical_pb2.INTERACTION_STATUS_ANSWERED)
    assert response_operation(host.stub, operation_id).status == COMPLETED
    assert again.commands.empty()  # nothing was queried for the unserved Session
    again.close()


@pytest.mark.spec("HOST-INT-6", "HOST-RT-5")
def test_a_reconnect_resends_an_open_query_instead_of_replacing_it(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    window = 1.0
    host = start_host(live_server, migrated_db_url, interaction_disposition_query_seconds=window)
    runtime, turn_id, operation_id, _ = _delivered(host)
    query = _next_query(runtime, turn_id, operation_id)
    runtime.cancel()  # the link is lost before the query is acknowledged

    again = host.runtime()
    resent = _next_query(again, turn_id, operation_id)
    assert resent.command_id == query.command_id  # the same command, re-sent
    # No second query replaces it (the next scheduled one is a window or more away).
    time.sleep(window / 3)
    assert again.commands.empty()
    again.ack(resent.command_id)
    assert eventually(lambda: _outbox_state(host, resent.command_id) is None)
    again.close()


def _querier_tasks() -> list[asyncio.Task[object]]:
    return [
        task
        for task in asyncio.all_tasks()
        if not task.done() and "DispositionQuerier._run" in repr(task.get_coro())
    ]


@pytest.mark.spec("HOST-INT-6", "OPS-3")
def test_the_querier_stops_when_host_drains(migrated_db_url: str) -> None:
    definition = host_app.build(HostSettings(database_url=migrated_db_url))

    async def lifecycle() -> None:
        for hook in definition.on_start:
            await hook()
        assert len(_querier_tasks()) == 1
        for hook in definition.on_drain:
            await hook()
        assert _querier_tasks() == []  # no query is queued while links shut down
        for hook in reversed(definition.on_stop):
            await hook()  # the stop in on_stop finds nothing left to stop

    asyncio.run(lifecycle())
