"""Cross-replica order on the shared live lane when a local commit lands past a gap (ADR 0041 §6).

One feed (replica 1) runs with the shared lane on a real in-process live log whose delivery to
replica 1 is held back by a gate; a second :class:`SharedLane` on the same log plays replica 2.
Replica 2 streams deltas (acknowledged by the log) and commits their confirmation; before
replica 1's subscription delivered the deltas, replica 1 commits an event of its own. Its
watcher must still receive replica 2's deltas before replica 2's event (HOST-RT-2).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

import pytest

from livelog.inprocess import InProcessLiveLog
from livelog.interface import Discontinuity, LiveLogSubscription, LogEntry, LogPosition, PublishAck
from services.host.activity.broker import ActivityBroker, LiveDelta
from services.host.activity.events import MessageDelta
from services.host.activity.feed import (
    ActivityFeed,
    FeedSettings,
    WatchDelta,
    WatchItem,
    WatchReady,
    watch_activity,
)
from services.host.activity.hint_relay import HintRelay
from services.host.activity.log_follower import LogFollower
from services.host.activity.shared_lane import FenceItem, LaneItem, SharedLane
from services.host.repository import unit_of_work
from services.host.repository.unit_of_work import HostTransaction
from services.host.wire.activity_codec import ProtoEventCodec
from store.database import Database
from tests.integration.test_activity_log_follower import _append_elsewhere

WS = "ws-1"
WAIT_SECONDS = 30.0
"""Upper bound of a wait for something that must happen; only a failing test reaches it."""


class _GatedSubscription:
    """A subscription whose entries are handed on only once the gate is open."""

    def __init__(self, inner: LiveLogSubscription[LaneItem], gate: asyncio.Event) -> None:
        self._inner = inner
        self._gate = gate
        self.workspace_id = inner.workspace_id

    def __aiter__(self) -> AsyncIterator[LogEntry[LaneItem] | Discontinuity]:
        return self._entries()

    async def _entries(self) -> AsyncIterator[LogEntry[LaneItem] | Discontinuity]:
        async for entry in self._inner:
            await self._gate.wait()
            yield entry

    async def close(self) -> None:
        await self._inner.close()


class _GatedLog:
    """Replica 1's view of the shared log: delivery waits for the gate; fences are seen."""

    def __init__(self, inner: InProcessLiveLog[LaneItem]) -> None:
        self._inner = inner
        self.gate = asyncio.Event()
        self.fence_published = asyncio.Event()

    async def publish(self, workspace_id: str, item: LaneItem, msg_id: str) -> PublishAck:
        ack = await self._inner.publish(workspace_id, item, msg_id)
        if isinstance(item, FenceItem):
            self.fence_published.set()
        return ack

    async def send(self, workspace_id: str, item: LaneItem, msg_id: str) -> Awaitable[PublishAck]:
        return await self._inner.send(workspace_id, item, msg_id)

    async def subscribe(
        self, workspace_id: str, after: LogPosition | None
    ) -> LiveLogSubscription[LaneItem]:
        return _GatedSubscription(await self._inner.subscribe(workspace_id, after), self.gate)

    async def close(self) -> None:
        await self._inner.close()


def _log() -> InProcessLiveLog[LaneItem]:
    return InProcessLiveLog(
        max_msgs=10_000, max_bytes=1 << 24, max_age_seconds=60, duplicate_window_seconds=60
    )


def _delta(text: str) -> LiveDelta:
    return LiveDelta(MessageDelta(WS, "remote", "t1", "m1", "text", "append_text", text), 7)


async def _next(stream: AsyncGenerator[WatchItem, None]) -> WatchItem:
    async with asyncio.timeout(WAIT_SECONDS):
        return await anext(stream)


def _label(item: WatchItem) -> str:
    if isinstance(item, WatchDelta):
        return f"delta:{item.delta.text}"
    assert not isinstance(item, WatchReady)
    return f"event:{item.workspace_seq}:{item.session_id}"


@pytest.mark.spec("HOST-RT-2", "SCALE-3")
def test_a_local_commit_past_a_gap_waits_for_the_other_replicas_deltas(
    migrated_db_url: str,
) -> None:
    async def scenario() -> list[str]:
        here, elsewhere = Database(migrated_db_url), Database(migrated_db_url)
        await here.start()
        await elsewhere.start()
        shared = _log()
        gated = _GatedLog(shared)

        async def open_log() -> _GatedLog:
            return gated

        # A follow interval far beyond the test: only the wake-ups can move the follower.
        feed = ActivityFeed(
            lambda: 1,
            ProtoEventCodec(),
            FeedSettings(idle_check_seconds=600.0),
            live_log=open_log,
        )
        await feed.start(here)
        other = SharedLane(shared, ActivityBroker())
        await other.start(lambda _workspace: None)

        stream = watch_activity(feed, here, WS, None)
        gated.gate.set()  # replica 1 subscribes and reports ready
        ready = await _next(stream)
        assert isinstance(ready, WatchReady)
        gated.gate.clear()  # from here replica 1's subscription lags behind the log

        # Replica 2: deltas acknowledged by the log, then their confirming commit (seq 1).
        for text in ("d1", "d2"):
            assert await other.send_delta(_delta(text))
        assert await other.settle(WS, "remote") == 0
        await _append_elsewhere(elsewhere, WS, ["remote"])

        # Replica 1 commits seq 2 before its subscription delivered replica 2's deltas.
        async def local(tx: HostTransaction) -> None:
            tx.session_rows.request_reconcile(WS, "local")

        await unit_of_work.run(here, local, outbox=feed.log)
        first = asyncio.ensure_future(_next(stream))
        # The follower fences seq 1 in; without that, nothing waits for the lagging lane.
        try:
            async with asyncio.timeout(5):
                await gated.fence_published.wait()
        except TimeoutError:
            pass
        gated.gate.set()
        seen = [_label(await first)]
        while len(seen) < 4:
            seen.append(_label(await _next(stream)))

        await stream.aclose()
        await other.stop()
        await feed.stop(here)
        await here.stop()
        await elsewhere.stop()
        return seen

    seen = asyncio.run(scenario())
    assert seen == ["delta:d1", "delta:d2", "event:1:remote", "event:2:local"]


@pytest.mark.spec("SCALE-1")
def test_the_follower_fences_every_moved_workspace_at_once_and_once_per_round(
    migrated_db_url: str,
) -> None:
    """A hung bus costs one fence timeout per round, not one per workspace and page."""

    async def scenario() -> tuple[list[tuple[str, int]], list[int], int]:
        here, elsewhere = Database(migrated_db_url), Database(migrated_db_url)
        await here.start()
        await elsewhere.start()
        fences: list[tuple[str, int]] = []
        both_waiting = asyncio.Event()

        async def fence(workspace_id: str, through_seq: int) -> None:
            fences.append((workspace_id, through_seq))
            if len(fences) == 2:
                both_waiting.set()
            # A fence on a hung bus: it returns only when the other one is waiting too.
            async with asyncio.timeout(WAIT_SECONDS):
                await both_waiting.wait()

        broker = ActivityBroker()
        follower = LogFollower(broker, poll_seconds=600.0, page_size=1, fence=fence)
        watchers = {workspace: broker.subscribe(workspace, max_items=100) for workspace in "ab"}
        for workspace in watchers:
            follower.watch(workspace, 0)
        await _append_elsewhere(elsewhere, "a", ["a1", "a2", "a3"])
        await _append_elsewhere(elsewhere, "b", ["b1"])
        async with asyncio.timeout(WAIT_SECONDS):
            more = await follower.poll(here)
        assert not more
        delivered: list[int] = []
        while watchers["a"].pending():
            batch = await watchers["a"].next(0)
            assert batch is not None
            assert not isinstance(batch, LiveDelta)
            delivered.extend(event.workspace_seq for event in batch.events)
        await here.stop()
        await elsewhere.stop()
        return sorted(fences), delivered, watchers["b"].pending()

    fences, delivered, b_pending = asyncio.run(scenario())
    assert fences == [("a", 3), ("b", 1)]
    assert delivered == [1, 2, 3]
    assert b_pending == 1


@pytest.mark.spec("SCALE-3")
def test_a_follower_that_fails_to_start_leaves_no_relay_running(
    migrated_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> tuple[bool, set[asyncio.Task[object]]]:
        database = Database(migrated_db_url)
        await database.start()

        async def open_log() -> InProcessLiveLog[LaneItem]:
            return _log()

        feed = ActivityFeed(lambda: 1, ProtoEventCodec(), FeedSettings(), live_log=open_log)
        relays: list[HintRelay] = []
        start_relay: Callable[[HintRelay, Database], None] = HintRelay.start

        def record_start(relay: HintRelay, db: Database) -> None:
            relays.append(relay)
            start_relay(relay, db)

        async def refuse(_database: Database) -> None:
            raise RuntimeError("the follower cannot start")

        monkeypatch.setattr(HintRelay, "start", record_start)
        monkeypatch.setattr(feed.follower, "start", refuse)
        with pytest.raises(RuntimeError):
            await feed.start(database)
        started = bool(relays)
        leftover = {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}
        await database.stop()
        return started, leftover

    started, leftover = asyncio.run(scenario())
    assert started, "the relay was started before the follower"
    assert leftover == set()
