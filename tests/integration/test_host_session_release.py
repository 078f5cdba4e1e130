"""``release_session`` for deleted Sessions, through a real host, on SQLite and Postgres.

A delete writes one ``release_session`` command (reason ``session_deleted``) per deleted
Session that ran, in the delete's transaction; it reaches the runtime serving the Session and is
re-sent on every reconnect until acknowledged; a restore withdraws the ones not yet
acknowledged, and the restored Session resumes through its next ``start_turn`` (ADR 0016 §14).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, event, select

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, runtime_pb2
from domainerrors import Aborted
from services.host.context import HostContext
from services.host.deletion import delete
from services.host.wire.command_codec import ProtoCommandCodec
from store.database import Database
from store.models import Interaction, RuntimeCommandOutbox
from tests.integration.host_activity import DEVICE, TARGET_ID, WS, HostUnderTest, start_host
from tests.support.polling import eventually
from tests.support.runtime_client import ScriptedRuntime, turn_patch
from tests.support.servers import LiveServer
from tests.support.session_trees import add_active_turn, add_tree, commands

RUNNING = canonical_pb2.TURN_PHASE_RUNNING
SETTLED = canonical_pb2.TURN_PHASE_SETTLED
COMPLETED = canonical_pb2.TURN_OUTCOME_COMPLETED


def _outbox(engine: Engine) -> dict[str, tuple[str, str, str]]:
    """``command_id -> (session_id, kind, state)`` of every outbox row."""
    with engine.connect() as connection:
        rows = connection.execute(
            select(
                RuntimeCommandOutbox.command_id,
                RuntimeCommandOutbox.session_id,
                RuntimeCommandOutbox.command_kind,
                RuntimeCommandOutbox.state,
            )
        ).all()
    return {str(r[0]): (str(r[1]), str(r[2]), str(r[3])) for r in rows}


_eventually = eventually


def _delete(host: HostUnderTest, *session_ids: str) -> host_pb2.DeleteSessionsResponse:
    response: host_pb2.DeleteSessionsResponse = host.stub.DeleteSessions(
        host_pb2.DeleteSessionsRequest(workspace_id=WS, session_ids=list(session_ids)),
        metadata=DEVICE,
    )
    return response


def _restore(host: HostUnderTest, session_id: str) -> None:
    host.stub.RestoreDeletedSession(
        host_pb2.RestoreDeletedSessionRequest(workspace_id=WS, session_id=session_id),
        metadata=DEVICE,
    )


def _create(host: HostUnderTest, session_id: str) -> None:
    host.stub.CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id=WS,
            agent_target_id=TARGET_ID,
            session_id=session_id,
            title=session_id,
            cwd="/nonexistent/workspace",
        ),
        metadata=DEVICE,
    )


def _started(host: HostUnderTest, runtime: ScriptedRuntime, submit_id: str) -> str:
    """Send a Turn, acknowledge its ``start_turn`` and report it running."""
    turn_id = host.send("hello", submit_id).turn.turn_id
    start = runtime.next_command()
    assert start.WhichOneof("command") == "start_turn"
    runtime.ack(start.command_id)
    runtime.report(WS, "s1", f"r-{submit_id}", turn_patch(turn_id, RUNNING))
    return turn_id


def _session_patch(**fields: Any) -> runtime_pb2.ReportItem:
    return runtime_pb2.ReportItem(session_patch=runtime_pb2.SessionPatch(**fields))


@pytest.mark.spec("HOST-RT-5", "HOST-DEL-2")
def test_a_delete_releases_every_session_of_the_tree_that_ran(
    migrated_db_url: str, live_server: Callable[..., LiveServer], sync_engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    _create(host, "idle")  # never ran: nothing to release
    runtime = host.runtime()
    turn_id = _started(host, runtime, "c1")
    # The runtime spawns a child Session (a subagent) under s1.
    runtime.report(
        WS,
        "child",
        "r-child",
        _session_patch(parent_session_id="s1", parent_turn_id=turn_id, title="explorer"),
    )

    result = _delete(host, "s1", "idle")

    assert {d.session_id for d in result.result.deleted} == {"s1", "child", "idle"}
    # Written and dispatched in the delete's own transaction, before DeleteSessions returned.
    rows = _outbox(sync_engine)
    assert sorted(v for v in rows.values() if v[1] == "release_session") == [
        ("child", "release_session", "dispatched"),
        ("s1", "release_session", "dispatched"),
    ]
    sent = [runtime.next_command() for _ in range(3)]
    assert [(c.session_id, c.WhichOneof("command")) for c in sent] == [
        ("s1", "interrupt_turn"),  # the interrupt first, then the releases
        ("s1", "release_session"),
        ("child", "release_session"),
    ]
    assert {c.release_session.reason for c in sent[1:]} == {"session_deleted"}
    for command in sent:
        runtime.ack(command.command_id)
    assert _eventually(lambda: not _outbox(sync_engine)), _outbox(sync_engine)
    runtime.close()


@pytest.mark.spec("HOST-RT-5")
def test_a_release_waits_for_the_runtime_and_is_resent_until_acknowledged(
    migrated_db_url: str, live_server: Callable[..., LiveServer], sync_engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    turn_id = _started(host, runtime, "c1")
    runtime.report(WS, "s1", "r-end", turn_patch(turn_id, SETTLED, outcome=COMPLETED))
    runtime.cancel()  # the runtime goes away; the Session stays deleted meanwhile

    _delete(host, "s1")
    (release_id,) = [k for k, v in _outbox(sync_engine).items() if v[1] == "release_session"]

    again = host.runtime()  # a reconnecting link receives it ...
    assert again.next_command().command_id == release_id
    again.cancel()  # ... and, unacknowledged, once more after the next reconnect
    third = host.runtime()
    assert third.next_command().command_id == release_id
    third.ack(release_id)
    assert _eventually(lambda: release_id not in _outbox(sync_engine))
    third.cancel()

    last = host.runtime()
    _create(host, "s2")
    host.send("next", "c2", session_id="s2")
    # Acknowledged means gone: the first command of the next link is the new Turn's start.
    assert last.next_command().WhichOneof("command") == "start_turn"
    last.close()


@pytest.mark.spec("HOST-DEL-8", "HOST-RT-5")
def test_a_restore_withdraws_an_undelivered_release_and_the_next_turn_resumes(
    migrated_db_url: str, live_server: Callable[..., LiveServer], sync_engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    turn_id = _started(host, runtime, "c1")
    runtime.report(
        WS,
        "s1",
        "r-end",
        _session_patch(provider_session_ref="provider-session-1"),
        turn_patch(turn_id, SETTLED, outcome=COMPLETED),
    )
    runtime.cancel()
    _delete(host, "s1")
    assert [v[1] for v in _outbox(sync_engine).values()] == ["release_session"]

    _restore(host, "s1")

    assert _outbox(sync_engine) == {}  # withdrawn in the restore's transaction
    again = host.runtime()
    host.send("again", "c2")
    start = again.next_command()  # no release ahead of it
    assert start.WhichOneof("command") == "start_turn"
    # The restored Session resumes through start_turn with its preserved identity.
    assert start.start_turn.session.provider_session_ref == "provider-session-1"
    again.close()


@pytest.mark.spec("HOST-DEL-8", "HOST-RT-5")
def test_a_release_in_flight_at_the_restore_is_withdrawn_and_its_late_ack_ignored(
    migrated_db_url: str, live_server: Callable[..., LiveServer], sync_engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    turn_id = _started(host, runtime, "c1")
    runtime.report(WS, "s1", "r-end", turn_patch(turn_id, SETTLED, outcome=COMPLETED))
    _delete(host, "s1")
    release = runtime.next_command()
    assert release.WhichOneof("command") == "release_session"

    _restore(host, "s1")  # before the runtime acknowledged it

    assert _outbox(sync_engine) == {}
    runtime.ack(release.command_id)  # a late acknowledgement finds nothing: ignored
    host.send("again", "c2")
    start = runtime.next_command()  # the link is still up and serves the Session
    assert start.WhichOneof("command") == "start_turn"
    assert [v[1] for v in _outbox(sync_engine).values()] == ["start_turn"]
    runtime.close()


@pytest.mark.spec("HOST-RT-5", "HOST-DEL-1")
def test_a_delete_that_does_not_commit_releases_nothing(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    add_tree(sync_engine, {"r": None, "a": "r"})
    add_active_turn(sync_engine, "r", "t-r")

    async def scenario() -> list[tuple[str, str, str]]:
        database = Database(migrated_db_url)
        await database.start()
        try:
            ctx = HostContext(database=database, command_codec=ProtoCommandCodec())
            plan = await delete.make_plan(ctx, WS, ["r"])
            add_tree(sync_engine, {"late": "a"})
            with pytest.raises(Aborted):
                await delete.commit_plan(ctx, plan)
            stale = [c for c in commands(sync_engine) if c[1] == "release_session"]
            assert stale == []  # the stale plan rolled back with nothing written
            await delete.delete_sessions(ctx, WS, ["r"])
            return [c for c in commands(sync_engine) if c[1] == "release_session"]
        finally:
            await database.stop()

    # No runtime is connected: the releases wait, pending, for one.
    assert sorted(asyncio.run(scenario())) == [
        ("a", "release_session", "pending"),
        ("late", "release_session", "pending"),
        ("r", "release_session", "pending"),
    ]


@contextmanager
def _outbox_inserts() -> Iterator[list[Any]]:
    """Parameters of every ``runtime_command_outbox`` insert any engine in the process runs."""
    seen: list[Any] = []

    def record(*args: Any) -> None:
        statement, parameters = str(args[2]), args[3]
        if statement.startswith("INSERT INTO runtime_command_outbox"):
            seen.append(parameters)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", record)


@pytest.mark.spec("HOST-RT-1", "HOST-RT-5")
def test_the_demo_runtime_accepts_the_release_of_a_deleted_session(
    migrated_db_url: str, live_server: Callable[..., LiveServer], sync_engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    live_server(
        "demoruntime",
        host_address=host.server.address,
        service_token="token-service",
        demo_step_delay_seconds=0.0,
    )
    host.stub.CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id=WS,
            agent_target_id="demo",
            session_id="d1",
            title="demo",
            cwd="/nonexistent/workspace",
        ),
        metadata=DEVICE,
    )
    host.send("please ask permission first", "c1", session_id="d1")

    def asked() -> bool:
        with sync_engine.connect() as connection:
            statuses = connection.execute(
                select(Interaction.status).where(Interaction.session_id == "d1")
            ).all()
        return [row[0] for row in statuses] == ["pending"]

    assert _eventually(asked)  # the demo holds a Turn waiting for the answer
    with _outbox_inserts() as inserts:
        _delete(host, "d1")
    assert "release_session" in str(inserts)
    # Interrupt and release delivered and accepted over the live link: both rows are gone.
    assert _eventually(lambda: not _outbox(sync_engine), timeout=20), _outbox(sync_engine)
