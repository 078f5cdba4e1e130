"""The event log at the store seam: observer failure, slow consumers, rollback (HOST-OBS-1/2)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from domainerrors import ResourceExhausted
from services.host.activity.broker import CommittedBatch, LiveDelta
from services.host.activity.events import MessageDelta
from services.host.activity.feed import ActivityFeed, FeedSettings, WatchReady, watch_activity
from services.host.repository import unit_of_work
from services.host.repository.activity_events import AppendedRun, NewEventRow
from services.host.repository.unit_of_work import HostTransaction
from services.host.wire.activity_codec import ProtoEventCodec
from store.database import Database
from store.models import ActivityEvent


async def _count(database: Database) -> int:
    async with AsyncSession(database.engine) as db:
        return int((await db.execute(select(func.count()).select_from(ActivityEvent))).scalar_one())


@pytest.mark.spec("HOST-OBS-1")
def test_observer_failure_never_undoes_the_commit_and_rollback_writes_nothing(
    migrated_db_url: str,
) -> None:
    async def scenario() -> None:
        database = Database(migrated_db_url)
        await database.start()
        feed = ActivityFeed(lambda: 1_000, ProtoEventCodec())
        await feed.start(database)
        seen: list[CommittedBatch] = []

        def broken(batch: CommittedBatch) -> None:
            seen.append(batch)
            raise RuntimeError("observer down")

        feed.broker.add_observer(broken)

        async def change(tx: HostTransaction) -> str:
            tx.session_rows.request_reconcile("ws-1", "s1")
            return "committed"

        assert await unit_of_work.run(database, change, outbox=feed.log) == "committed"
        assert await _count(database) == 1
        assert seen
        assert seen[0].events[0].event_type == "session_reconcile_required"

        async def failing(tx: HostTransaction) -> None:
            tx.session_rows.request_reconcile("ws-1", "s2")
            raise ValueError("the command fails")

        with pytest.raises(ValueError, match="command fails"):
            await unit_of_work.run(database, failing, outbox=feed.log)
        assert await _count(database) == 1  # no event without its change
        await feed.stop(database)
        await database.stop()

    asyncio.run(scenario())


@pytest.mark.spec("HOST-OBS-2")
def test_a_slow_consumer_gets_a_typed_error_not_unbounded_memory(migrated_db_url: str) -> None:
    async def scenario() -> None:
        database = Database(migrated_db_url)
        await database.start()
        feed = ActivityFeed(lambda: 1_000, ProtoEventCodec(), FeedSettings(queue_max_items=5))
        await feed.start(database)
        stream = watch_activity(feed, database, "ws-1", None)
        assert isinstance(await anext(stream), WatchReady)
        delta = MessageDelta("ws-1", "s1", "t1", "m1", "text", "append_text", "x")
        for _ in range(10):
            feed.broker.publish_delta(LiveDelta(delta, 1))
        with pytest.raises(ResourceExhausted) as failure:
            await anext(stream)
        assert failure.value.reason == "WATCH_CONSUMER_TOO_SLOW"
        await stream.aclose()
        assert feed.broker.subscriber_count() == 0
        await feed.stop(database)
        await database.stop()

    asyncio.run(scenario())


@pytest.mark.spec("HOST-OBS-1", "SCALE-1")
def test_one_append_of_many_rows_keeps_their_order_and_each_workspace_previous_seq(
    migrated_db_url: str,
) -> None:
    """The rows of one append go in as one ``INSERT``; ids and per-workspace sequence numbers
    follow the rows' order, and each workspace's previous sequence is its last one."""

    def row(workspace_id: str, index: int) -> NewEventRow:
        return NewEventRow(workspace_id, f"s{index}", "turn_update", f"{index}".encode(), index)

    async def append(database: Database, rows: list[NewEventRow]) -> dict[str, AppendedRun]:
        async def command(tx: HostTransaction) -> dict[str, AppendedRun]:
            return await tx.events.append(rows)

        return await unit_of_work.run(database, command)

    async def scenario() -> None:
        database = Database(migrated_db_url)
        await database.start()
        first = [row("ws-a", 0)]
        assert await append(database, first) == {"ws-a": AppendedRun(0, [1])}
        # Two workspaces interleaved in one append.
        second = [row("ws-b" if index % 3 == 0 else "ws-a", index) for index in range(1, 12)]
        appended = await append(database, second)
        assert appended["ws-a"].previous_seq == 1  # the previous append's last number
        assert appended["ws-b"].previous_seq == 0
        ids = {ws: iter(run.ids) for ws, run in appended.items()}
        expected = [(next(ids[item.workspace_id]), item.payload) for item in second]
        # Row i of the append got the i-th id: ascending in input order.
        assert [event_id for event_id, _ in expected] == list(range(2, 13))
        async with AsyncSession(database.engine) as db:
            stored = (
                await db.execute(
                    select(ActivityEvent.id, ActivityEvent.payload)
                    .where(ActivityEvent.id > 1)
                    .order_by(ActivityEvent.id)
                )
            ).all()
            numbered = (
                await db.execute(
                    select(ActivityEvent.workspace_id, ActivityEvent.workspace_seq).order_by(
                        ActivityEvent.id
                    )
                )
            ).all()
        assert [(event_id, bytes(payload)) for event_id, payload in stored] == expected
        # Each workspace's numbers are 1, 2, 3 ... in row order, whatever the interleaving.
        per_workspace: dict[str, list[int]] = {}
        for workspace_id, seq in numbered:
            per_workspace.setdefault(workspace_id, []).append(seq)
        assert per_workspace == {"ws-a": list(range(1, 10)), "ws-b": [1, 2, 3]}
        third = await append(database, [row("ws-b", 20), row("ws-a", 21)])
        assert third == {"ws-b": AppendedRun(3, [13]), "ws-a": AppendedRun(9, [14])}
        await database.stop()

    asyncio.run(scenario())
