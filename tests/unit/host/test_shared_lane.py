"""The shared live lane between two Host processes on one live log (SCALE-3, ADR 0041).

Two :class:`SharedLane` instances with brokers of their own share one real in-process live
log, as two replicas share JetStream; the wire codec is checked against the contract.
"""

from __future__ import annotations

import asyncio

import pytest

from agentactivity.host.v1 import activity_pb2
from livelog.codec import ItemDecodeError
from livelog.inprocess import InProcessLiveLog
from services.host.activity.broker import ActivityBroker, CommittedBatch, LiveDelta
from services.host.activity.events import MessageDelta
from services.host.activity.shared_lane import CommitHint, FenceItem, LaneItem, SharedLane
from services.host.repository.activity_events import StoredEvent
from services.host.wire.live_lane_codec import LiveLaneCodec

pytestmark = [pytest.mark.spec("SCALE-3")]

WS = "ws-1"


def _log() -> InProcessLiveLog[LaneItem]:
    return InProcessLiveLog(
        max_msgs=10_000, max_bytes=1 << 24, max_age_seconds=60, duplicate_window_seconds=60
    )


def _delta(text: str, session_id: str = "s1") -> LiveDelta:
    return LiveDelta(MessageDelta(WS, session_id, "t1", "m1", "text", "append_text", text), 7)


class _Replica:
    """A broker, its lane and one watcher's subscription."""

    def __init__(self, log: InProcessLiveLog[LaneItem]) -> None:
        self.broker = ActivityBroker()
        self.lane = SharedLane(log, self.broker, fence_timeout_seconds=5)
        self.woken: list[str] = []
        self.watch = self.broker.subscribe(WS, max_items=1000)

    async def start(self) -> None:
        await self.lane.start(self.woken.append)
        self.lane.watch(WS)
        assert await self.lane.ready(WS, 5)

    async def texts(self) -> list[str]:
        items = []
        while self.watch.pending():
            items.append(await self.watch.next(0))
        return [item.delta.text for item in items if isinstance(item, LiveDelta)]


def test_the_fence_hands_the_other_replicas_deltas_on_before_its_events() -> None:
    async def scenario() -> tuple[list[str], list[str], list[str], int]:
        log = _log()
        first, second = _Replica(log), _Replica(log)
        await first.start()
        await second.start()
        for text in ("a", "b", "c"):
            live = _delta(text)
            first.broker.publish_delta(live)  # the delta lane's own path
            await first.lane.send_delta(live)
        lost = await first.lane.settle(WS, "s1")
        # The log holds them, but the other replica's subscription has not run yet: this
        # is the window in which its follower could read the confirming commit first.
        before = await second.texts()
        await second.lane.fence(WS, 1)
        after = await second.texts()
        await asyncio.sleep(0.05)
        own = await first.texts()
        await first.lane.stop()
        await second.lane.stop()
        return before, after, own, lost

    before, after, own, lost = asyncio.run(scenario())
    assert lost == 0
    assert before == []
    assert after == ["a", "b", "c"]
    assert own == ["a", "b", "c"]  # its own deltas once: the log's copies are skipped


def test_a_commit_hint_wakes_the_other_replica_and_stands_in_for_a_fence() -> None:
    async def scenario() -> tuple[list[str], list[str], int]:
        log = _log()
        first, second = _Replica(log), _Replica(log)
        await first.start()
        await second.start()
        stored = StoredEvent(41, WS, "s1", "turn_update", b"", 1, workspace_seq=9)
        first.broker.publish_batch(CommittedBatch(WS, 8, (stored,)))
        for _ in range(100):
            if second.woken:
                break
            await asyncio.sleep(0.01)
        published = log.last_sequence
        await second.lane.fence(WS, 9)  # covered by the hint: nothing is published
        fenced = log.last_sequence - published
        await first.lane.stop()
        await second.lane.stop()
        return first.woken, second.woken, fenced

    first_woken, second_woken, fenced = asyncio.run(scenario())
    assert second_woken == [WS]
    assert first_woken == []  # its own hint: the events already went through its broker
    assert fenced == 0


def test_a_delta_the_log_does_not_take_is_counted_against_its_session() -> None:
    async def scenario() -> tuple[bool, int, int]:
        log = _log()
        lane = SharedLane(log, ActivityBroker())
        await log.close()  # the bus is gone
        taken = await lane.send_delta(_delta("x"))
        return taken, await lane.settle(WS, "s1"), await lane.settle(WS, "s1")

    taken, lost, again = asyncio.run(scenario())
    assert taken is False
    assert lost == 1
    assert again == 0  # reported once, to the report that follows


def test_lane_items_travel_as_activity_events() -> None:
    codec = LiveLaneCodec()
    delta = _delta("héllo")
    for item in (delta, CommitHint(WS, 41, 9), FenceItem(WS, "tok")):
        assert codec.decode(codec.encode(item)) == item
    wire = activity_pb2.ActivityEvent.FromString(codec.encode(delta))
    assert wire.message_delta.delta.text == "héllo"
    assert wire.occurred_at_unix_ms == 7
    durable = activity_pb2.ActivityEvent(workspace_id=WS)
    durable.session_reconcile_required.session_id = "s1"
    with pytest.raises(ItemDecodeError):
        codec.decode(durable.SerializeToString())
    with pytest.raises(ItemDecodeError):
        codec.decode(b"\xff\xff")
