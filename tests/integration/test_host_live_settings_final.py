"""A ``failed`` live-settings report is final: the command is withdrawn, never re-sent.

HOST-SES-6 asks that a failed runtime application be reported, not hidden; the report must
also be true afterwards. Once Host reported ``apply_settings`` as ``FAILED`` (timeout, closed
link, failed delivery) the outbox no longer holds it, so no reconnect delivers it later; an
acknowledgement racing the timeout decides the report by whichever commits first (ADR 0013
§11). On SQLite and Postgres, against a real host with a scripted runtime, and at the domain
seam with the race forced into each order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, runtime_pb2
from services.host.context import HostContext
from services.host.model.records import Capabilities, SessionSettingsValue
from services.host.runtime import link as runtime_link
from services.host.runtime.live_settings import LinkedRuntimeSettings
from services.host.runtime.registry import CommandAck, RuntimeIdentity, RuntimeLinkHandle
from services.host.runtime.settings_port import RuntimeSettingsOutcome
from services.host.wire.command_codec import ProtoCommandCodec
from store.database import Database
from store.engine import _WRITE_GATES
from store.models import RuntimeCommandOutbox
from tests.support.host_sessions import HostClient, demo_target
from tests.support.polling import eventually
from tests.support.runtime_client import ScriptedRuntime
from tests.support.servers import LiveServer
from tests.support.session_trees import add_tree

PROVIDER = "demo-provider"


def _outbox(engine: Engine) -> list[tuple[str, str, str]]:
    """``(command_id, kind, state)`` of every outbox row, oldest first."""
    with engine.connect() as connection:
        rows = connection.execute(
            select(
                RuntimeCommandOutbox.command_id,
                RuntimeCommandOutbox.command_kind,
                RuntimeCommandOutbox.state,
            ).order_by(RuntimeCommandOutbox.id)
        ).all()
    return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]


_eventually = eventually


class _Host(HostClient):
    """A host client that keeps its server (for runtime links)."""

    def __init__(self, server: LiveServer) -> None:
        super().__init__(server)
        self.server = server


def _host(live_server: Callable[..., LiveServer], url: str, timeout: float) -> _Host:
    client = _Host(live_server("host", database_url=url, runtime_command_timeout_seconds=timeout))
    target = demo_target()
    target.capabilities.live_settings = True
    client.register(target)
    client.create(session_id="s-1")
    return client


def _update(host: _Host, model: str) -> host_pb2.RuntimeSettingsApplication:
    response: host_pb2.UpdateSessionSettingsResponse = host.call(
        "UpdateSessionSettings",
        host_pb2.UpdateSessionSettingsRequest(
            workspace_id="ws-1",
            session_id="s-1",
            settings=canonical_pb2.SessionSettings(model=model),
        ),
    )
    return response.runtime_application


def _next_turn_is_the_only_command(host: _Host, runtime: ScriptedRuntime, engine: Engine) -> None:
    """After a reconnect: the next Turn's start is all the runtime gets, and nothing is left.

    With the withdrawn command still in the outbox it would be re-sent to this link and stay
    unacknowledged, so the outbox would never drain.
    """
    host.call(
        "SendInput",
        host_pb2.SendInputRequest(
            workspace_id="ws-1",
            session_id="s-1",
            client_submit_id="after",
            delivery=canonical_pb2.DELIVERY_MODE_NEW_TURN,
            content="go on",
        ),
    )
    start = runtime.next_command()
    assert start.WhichOneof("command") == "start_turn"
    # The Turn runs with the saved settings.
    assert start.start_turn.session.settings.model == "plain"
    runtime.ack(start.command_id)
    assert _eventually(lambda: _outbox(engine) == []), _outbox(engine)
    assert runtime.commands.empty()


@pytest.mark.spec("HOST-SES-6", "HOST-RT-5")
def test_a_timed_out_apply_settings_is_withdrawn_and_never_re_sent(
    migrated_db_url: str, live_server: Callable[..., LiveServer], sync_engine: Engine
) -> None:
    host = _host(live_server, migrated_db_url, timeout=0.3)
    runtime = ScriptedRuntime(host.server.channel, providers=(PROVIDER,))  # never acknowledges

    failed = _update(host, "plain")

    assert failed.status == host_pb2.RUNTIME_SETTINGS_STATUS_FAILED
    assert "did not acknowledge" in failed.failure_message
    assert "will not send it again" in failed.failure_message
    assert "may still be applied" in failed.failure_message  # it had reached the link
    stale = runtime.next_command()
    assert stale.WhichOneof("command") == "apply_settings"
    assert _outbox(sync_engine) == []  # withdrawn before the report was made
    runtime.cancel()
    again = ScriptedRuntime(host.server.channel, providers=(PROVIDER,))
    again.ack(stale.command_id)  # a late acknowledgement (on the new link) is ignored
    _next_turn_is_the_only_command(host, again, sync_engine)
    again.close()


@pytest.mark.spec("HOST-SES-6", "HOST-RT-5")
def test_a_link_that_closes_before_the_ack_withdraws_the_command(
    migrated_db_url: str, live_server: Callable[..., LiveServer], sync_engine: Engine
) -> None:
    host = _host(live_server, migrated_db_url, timeout=30)
    runtime = ScriptedRuntime(host.server.channel, providers=(PROVIDER,))
    with ThreadPoolExecutor(1) as pool:
        pending: Future[host_pb2.RuntimeSettingsApplication] = pool.submit(_update, host, "plain")
        assert runtime.next_command().WhichOneof("command") == "apply_settings"
        runtime.cancel()  # the runtime crashes before acknowledging
        failed = pending.result(timeout=20)
    assert failed.status == host_pb2.RUNTIME_SETTINGS_STATUS_FAILED
    assert "disconnected" in failed.failure_message
    assert "will not send it again" in failed.failure_message
    assert _outbox(sync_engine) == []
    again = ScriptedRuntime(host.server.channel, providers=(PROVIDER,))
    _next_turn_is_the_only_command(host, again, sync_engine)
    again.close()


@pytest.mark.spec("HOST-SES-6", "HOST-RT-5")
def test_a_failed_delivery_is_reported_and_not_retried_later(
    migrated_db_url: str, live_server: Callable[..., LiveServer], sync_engine: Engine
) -> None:
    host = _host(live_server, migrated_db_url, timeout=30)
    runtime = ScriptedRuntime(host.server.channel, providers=(PROVIDER,))
    with ThreadPoolExecutor(1) as pool:
        pending: Future[host_pb2.RuntimeSettingsApplication] = pool.submit(_update, host, "plain")
        command = runtime.next_command()
        runtime.send(
            runtime_pb2.RuntimeLinkRequest(
                command_ack=runtime_pb2.CommandAck(
                    command_id=command.command_id,
                    status=runtime_pb2.COMMAND_ACK_STATUS_FAILED,
                    message="provider busy",
                )
            )
        )
        failed = pending.result(timeout=20)
    assert failed.status == host_pb2.RUNTIME_SETTINGS_STATUS_FAILED
    assert "provider busy" in failed.failure_message
    assert "will not send it again" in failed.failure_message
    # A failed delivery used to go back to pending, for the Session's next dispatch.
    assert _outbox(sync_engine) == []
    _next_turn_is_the_only_command(host, runtime, sync_engine)
    runtime.close()


# ------------------------------------------------------------------- the race, forced


@asynccontextmanager
async def _held_store(
    database: Database, command_id: str
) -> AsyncIterator[Callable[[int], asyncio.Future[None]]]:
    """Hold the one thing both the acknowledgement and the withdrawal must take first.

    SQLite: this process's write slot (writers queue in arrival order). Postgres: the outbox
    row's lock, taken by another connection (waiters queue in arrival order). Yields a waiter
    for "``n`` transactions are queued behind it"; the hold ends with the block.
    """
    engine = database.engine
    gate = _WRITE_GATES.get(engine.sync_engine)

    async def queued(count: int) -> None:
        # Nothing to wait on but the queue itself: poll it (bounded by the caller's timeout).
        while True:
            if gate is not None:
                waiting = gate.waiting
            else:
                async with engine.connect() as probe:
                    waiting = int(
                        (
                            await probe.execute(
                                text(
                                    "SELECT count(*) FROM pg_stat_activity "
                                    "WHERE datname = current_database() "
                                    "AND wait_event_type = 'Lock'"
                                )
                            )
                        ).scalar_one()
                    )
            if waiting >= count:
                return
            await asyncio.sleep(0.01)

    def waiter(count: int) -> asyncio.Future[None]:
        return asyncio.ensure_future(asyncio.wait_for(queued(count), 10))

    if gate is not None:
        async with gate.exclusive():
            yield waiter
        return
    connection: AsyncConnection
    async with engine.connect() as connection:
        transaction = await connection.begin()
        await connection.execute(
            select(RuntimeCommandOutbox.id)
            .where(RuntimeCommandOutbox.command_id == command_id)
            .with_for_update()
        )
        try:
            yield waiter
        finally:
            await transaction.rollback()


async def _race(
    url: str, engine: Engine, *, verdict: str, ack_first: bool
) -> tuple[RuntimeSettingsOutcome, list[tuple[str, str, str]]]:
    add_tree(engine, {"s-1": None}, provider=PROVIDER)
    database = Database(url)
    await database.start()
    try:
        ctx = HostContext(
            database=database,
            command_codec=ProtoCommandCodec(),
            runtime_command_timeout_seconds=0.3,
        )
        link = RuntimeLinkHandle(
            RuntimeIdentity(
                runtime_id="rt",
                instance_id="i-1",
                providers=frozenset({PROVIDER}),
                target_ids=frozenset(),
                capabilities={"live_settings": True},
                workspaces=frozenset({"*"}),
            )
        )
        ctx.runtimes.attach(link)

        async def apply_in_lane() -> RuntimeSettingsOutcome:
            # As UpdateSessionSettings calls it: in the Session's lane.
            async with ctx.lanes.hold("ws-1", "s-1"):
                return await LinkedRuntimeSettings(ctx).apply_settings(
                    "ws-1",
                    "s-1",
                    SessionSettingsValue(model="plain"),
                    Capabilities(live_settings=True),
                )

        applying = asyncio.create_task(apply_in_lane())
        command = await asyncio.wait_for(link.outbound.get(), 10)
        assert command is not None
        assert command.kind == "apply_settings"
        ack = CommandAck(command.command_id, verdict, message="not on this plan")
        async with _held_store(database, command.command_id) as queued:
            if ack_first:
                # The acknowledgement queues first; the timeout then fires behind it.
                acking = asyncio.create_task(runtime_link.apply_ack(ctx, link, ack))
                await queued(1)
                await queued(2)
            else:
                # The timeout fires and the withdrawal queues first; the ack arrives after.
                await queued(1)
                acking = asyncio.create_task(runtime_link.apply_ack(ctx, link, ack))
                await queued(2)
        outcome = await asyncio.wait_for(applying, 10)
        await asyncio.wait_for(acking, 10)
        return outcome, _outbox(engine)
    finally:
        await database.stop()


@pytest.mark.spec("HOST-SES-6", "HOST-RT-5")
def test_an_acceptance_that_commits_at_the_timeout_is_reported_applied(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    outcome, left = asyncio.run(
        _race(migrated_db_url, sync_engine, verdict="accepted", ack_first=True)
    )
    assert outcome == RuntimeSettingsOutcome("applied")
    assert left == []


@pytest.mark.spec("HOST-SES-6", "HOST-RT-5")
def test_a_rejection_that_commits_at_the_timeout_is_reported_with_its_reason(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    outcome, left = asyncio.run(
        _race(migrated_db_url, sync_engine, verdict="rejected", ack_first=True)
    )
    assert outcome.status == "failed"
    assert "rejected" in (outcome.failure_message or "")
    assert "not on this plan" in (outcome.failure_message or "")
    assert left == []  # the rejection's row is settled by the report


@pytest.mark.spec("HOST-SES-6", "HOST-RT-5")
def test_a_withdrawal_that_commits_first_stays_failed_and_the_late_ack_is_ignored(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    outcome, left = asyncio.run(
        _race(migrated_db_url, sync_engine, verdict="accepted", ack_first=False)
    )
    assert outcome.status == "failed"
    message = outcome.failure_message or ""
    assert "did not acknowledge" in message
    assert "will not send it again" in message
    assert "may still be applied" in message  # the copy on the link is beyond recall
    assert left == []
