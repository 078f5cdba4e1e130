"""The submit as one write function: its events and its dispatch (ADR 0034, HOST-TURN-1, OBS-1).

A ``new_turn`` or ``guidance`` submit runs as a direct write that appends the events of what
it wrote from the state it wrote (no read); the ORM path reads that state through its
transaction. Both go through one synchronous builder (``event_log.event_set``). Here both run
on the same changes of real submits on the real store: the event sets are equal, the rows the
direct write appended are exactly the ORM path's events encoded, and the published batch
carries the same redundant texts. The command is dispatched in the submit's own commit, after
the Session's older ``pending`` command.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from sqlalchemy import func, insert, select

from services.host.activity.broker import CommittedBatch
from services.host.activity.event_log import EventSet, event_set, resolve_state
from services.host.activity.events import MessageUpdate, TurnUpdate
from services.host.activity.feed import ActivityFeed
from services.host.context import HostContext, wall_clock_ms
from services.host.repository import unit_of_work
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.registry import RuntimeIdentity, RuntimeLinkHandle
from services.host.turns.submission import Submission, send_input
from services.host.turns.submit_write import ActiveTurnToSettle, SubmitWrite, write_submission
from services.host.wire.activity_codec import ProtoEventCodec
from services.host.wire.command_codec import ProtoCommandCodec
from store.database import Database
from store.models import ActivityEvent, RuntimeCommandOutbox, Session

WS = "ws-1"
SID = "s-submit"
IDENTITY = RuntimeIdentity(
    "rt",
    "i1",
    frozenset({"demo"}),
    frozenset(),
    {"guidance": True, "interrupt": True},
    frozenset({"*"}),
)


async def _host(url: str) -> tuple[HostContext, RuntimeLinkHandle, list[CommittedBatch]]:
    database = Database(url)
    await database.start()
    codec = ProtoEventCodec()
    ctx = HostContext(
        database=database,
        command_codec=ProtoCommandCodec(),
        activity=ActivityFeed(wall_clock_ms, codec=codec),
    )
    link = RuntimeLinkHandle(IDENTITY)
    ctx.runtimes.attach(link)
    published: list[CommittedBatch] = []
    ctx.activity.broker.add_observer(published.append)
    async with database.engine.begin() as connection:
        await connection.execute(
            insert(Session).values(
                workspace_id=WS,
                session_id=SID,
                root_session_id=SID,
                provider="demo",
                rail_section_key="conversations",
                capabilities_json=json.dumps({"guidance": True, "interrupt": True}),
                launch_subagents_json=json.dumps([{"name": "explorer", "description": "x"}]),
                created_at_unix_ms=1,
                updated_at_unix_ms=1,
            )
        )
    return ctx, link, published


def _submission(submit_id: str, content: str, *, guide: str | None = None) -> Submission:
    return Submission(
        workspace_id=WS,
        session_id=SID,
        client_submit_id=submit_id,
        delivery="guidance" if guide else "new_turn",
        target_turn_id=guide,
        mode="agent",
        content=content,
    )


async def _direct(ctx: HostContext, submission: Submission) -> SubmitWrite:
    """The submit as ``send_input`` runs it for ``new_turn`` and ``guidance``."""
    now = ctx.clock()
    return await ctx.write_activity(
        lambda conn: write_submission(conn, ctx, submission, now, dispatch=True)
    )


async def _orm_event_set(ctx: HostContext, written: SubmitWrite) -> EventSet:
    """The events the ORM path builds for the rows ``written`` names, as they are stored."""

    async def build(tx: HostTransaction) -> EventSet:
        for turn in written.turns:
            row = await tx.turns.get(WS, SID, turn.turn_id)
            assert row is not None
            tx.changes.turn(row)
        for message in written.messages:
            stored = await tx.messages.get(WS, SID, message.message_id)
            assert stored is not None
            tx.changes.message(stored)
        tx.changes.session(WS, SID, written.session_fields)
        changes = tx.changes.snapshot()
        return event_set(changes, await resolve_state(changes, tx))

    return await unit_of_work.run(ctx.database, build, write=False)


async def _last_event_id(ctx: HostContext) -> int:
    async with ctx.database.engine.connect() as connection:
        found = (await connection.execute(select(func.max(ActivityEvent.id)))).scalar_one()
    return int(found or 0)


async def _stored_events(ctx: HostContext, after_id: int) -> list[tuple[int, bytes, int]]:
    async with ctx.database.engine.connect() as connection:
        rows = await connection.execute(
            select(ActivityEvent.id, ActivityEvent.payload, ActivityEvent.created_at_unix_ms)
            .where(ActivityEvent.id > after_id)
            .order_by(ActivityEvent.id)
        )
        return [(int(r[0]), bytes(r[1]), int(r[2])) for r in rows]


async def _check_same_events(
    ctx: HostContext, written: SubmitWrite, after_id: int, batch: CommittedBatch
) -> EventSet:
    direct = event_set(*written.activity())
    orm = await _orm_event_set(ctx, written)
    assert direct == orm
    stored = await _stored_events(ctx, after_id)
    codec = ProtoEventCodec()
    assert [payload for _, payload, _ in stored] == [
        codec.encode(ws, created, item)
        for (ws, item), (_, _, created) in zip(orm.events, stored, strict=True)
    ]
    expected_redundant = {
        stored[position][0]: texts for position, texts in orm.redundant_by_position.items()
    }
    assert dict(batch.redundant_texts) == expected_redundant
    assert [event.event_id for event in batch.events] == [event_id for event_id, _, _ in stored]
    return orm


@pytest.mark.spec("HOST-OBS-1", "HOST-TURN-1", "HOST-TURN-3")
def test_direct_submits_append_exactly_the_events_the_orm_path_builds(
    migrated_db_url: str,
) -> None:
    async def scenario() -> None:
        ctx, _, published = await _host(migrated_db_url)
        try:
            before = await _last_event_id(ctx)
            content = "look @explorer /skill:review now"
            started = await _direct(ctx, _submission("c1", content))
            assert not started.replayed
            assert len(published) == 1
            events = await _check_same_events(ctx, started, before, published[-1])
            turn_id = started.turns[0].turn_id
            assert [type(item) for _, item in events.events] == [TurnUpdate, MessageUpdate]
            first = events.events[0][1]
            assert isinstance(first, TurnUpdate)
            assert first.active_turn_id == turn_id
            # The queued Turn's user text is live text: a streamer that sent it may skip it.
            assert events.redundant_by_position == {1: {"client-submit:user:c1": content}}

            before = await _last_event_id(ctx)
            guided = await _direct(ctx, _submission("c2", "and also this", guide=turn_id))
            assert guided.turns == ()
            assert len(published) == 2
            events = await _check_same_events(ctx, guided, before, published[-1])
            assert [type(item) for _, item in events.events] == [MessageUpdate]
            update = events.events[0][1]
            assert isinstance(update, MessageUpdate)
            assert update.latest_message_version == guided.messages[0].version == 2
            assert events.redundant_by_position == {0: {"client-submit:user:c2": "and also this"}}

            before = await _last_event_id(ctx)
            replayed = await _direct(ctx, _submission("c1", content))
            assert replayed.replayed
            assert len(published) == 2
            assert await _last_event_id(ctx) == before  # a replay appends nothing
        finally:
            await ctx.database.stop()

    asyncio.run(scenario())


@pytest.mark.spec("HOST-RT-1", "HOST-TURN-1")
def test_a_direct_submit_dispatches_its_command_after_the_older_pending_one_in_its_commit(
    migrated_db_url: str,
) -> None:
    async def scenario() -> None:
        ctx, link, _ = await _host(migrated_db_url)
        try:
            # A command an earlier failed acknowledgement put back to ``pending``.
            async with ctx.database.engine.begin() as connection:
                await connection.execute(
                    insert(RuntimeCommandOutbox).values(
                        workspace_id=WS,
                        session_id=SID,
                        command_id="cmd-older",
                        command_kind="stop_turn",
                        payload_json="{}",
                        state="pending",
                        attempts=1,
                        next_attempt_at_unix_ms=1,
                        created_at_unix_ms=1,
                        updated_at_unix_ms=1,
                    )
                )
            written = await _direct(ctx, _submission("c1", "hello"))
            assert written.dispatched is not None
            assert link.outbound.empty()
            written.dispatched.send()
            sent = [link.outbound.get_nowait() for _ in range(link.outbound.qsize())]
            assert [c.kind if c else None for c in sent] == ["stop_turn", "start_turn"]
            assert sent[0] is not None
            assert sent[0].command_id == "cmd-older"
            async with ctx.database.engine.connect() as connection:
                rows = (
                    await connection.execute(
                        select(
                            RuntimeCommandOutbox.command_id,
                            RuntimeCommandOutbox.state,
                            RuntimeCommandOutbox.attempts,
                        ).order_by(RuntimeCommandOutbox.id)
                    )
                ).all()
            new_id = sent[1].command_id if sent[1] else ""
            assert [tuple(row) for row in rows] == [
                ("cmd-older", "dispatched", 2),
                (new_id, "dispatched", 1),
            ]
        finally:
            await ctx.database.stop()

    asyncio.run(scenario())


@pytest.mark.spec("HOST-TURN-2", "HOST-TURN-5")
def test_an_interrupt_of_an_active_turn_leaves_the_direct_path_unwritten_for_the_orm_one(
    migrated_db_url: str,
) -> None:
    async def scenario() -> None:
        ctx, link, _ = await _host(migrated_db_url)
        try:
            started = await _direct(ctx, _submission("c1", "first"))
            assert started.dispatched is not None
            started.dispatched.send()
            before = (await _last_event_id(ctx), link.outbound.qsize())
            interrupt = Submission(WS, SID, "c2", "interrupt", None, "agent", "second")
            with pytest.raises(ActiveTurnToSettle) as found:
                await _direct(ctx, interrupt)
            assert found.value.turn_id == started.turns[0].turn_id
            assert (await _last_event_id(ctx), link.outbound.qsize()) == before
            # What send_input does next: the same function on the ORM transaction.
            result = await send_input(ctx, interrupt)
            assert result.interrupted_turn_id == started.turns[0].turn_id
            assert result.turn.phase == "queued"
            sent = [link.outbound.get_nowait() for _ in range(link.outbound.qsize())]
            assert [c.kind if c else None for c in sent][-2:] == ["interrupt_turn", "start_turn"]
        finally:
            await ctx.database.stop()

    asyncio.run(scenario())
