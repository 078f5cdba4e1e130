"""The shared live lane between two Host processes on one live log (SCALE-3, ADR 0041).

Two :class:`SharedLane` instances with brokers of their own share one real in-process live
log, as two replicas share JetStream; the wire codec is checked against the contract.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from agentactivity.host.v1 import activity_pb2
from livelog.codec import ItemDecodeError
from livelog.inprocess import InProcessLiveLog
from livelog.interface import LogPosition
from services.host.activity import shared_lane
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
        # The first replica's own fence comes back after the log's copies of its deltas:
        # once it is through, a copy not skipped would be in its broker already.
        await first.lane.fence(WS, 1)
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


def test_an_unexpected_failure_resubscribes_after_the_last_item(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failure while delivering ends neither the workspace's lane nor skips what follows."""
    monkeypatch.setattr(shared_lane, "_RETRY_SECONDS", 0.01)

    async def scenario() -> tuple[list[str], list[LogPosition | None]]:
        log = _log()
        first, second = _Replica(log), _Replica(log)
        asked: list[LogPosition | None] = []
        subscribe = log.subscribe

        async def recording(workspace_id: str, after: LogPosition | None) -> Any:
            asked.append(after)
            return await subscribe(workspace_id, after)

        monkeypatch.setattr(log, "subscribe", recording)
        publish = second.broker.publish_delta
        calls = iter(range(1_000))

        def failing_once(live: LiveDelta) -> None:
            if next(calls) == 0:
                raise RuntimeError("a broken observer")
            publish(live)

        monkeypatch.setattr(second.broker, "publish_delta", failing_once)
        await first.start()
        await second.start()
        for text in ("a", "b", "c"):
            await first.lane.send_delta(_delta(text))
        await first.lane.settle(WS, "s1")
        await second.lane.fence(WS, 1)
        texts = await second.texts()
        await first.lane.stop()
        await second.lane.stop()
        return texts, asked

    texts, asked = asyncio.run(scenario())
    assert texts == ["b", "c"]  # "a" failed; the rest came, once each
    # Each replica subscribed once from now; the second again, after "a" (the last it saw).
    assert [None if after is None else after.sequence for after in asked] == [None, None, 1]


def test_items_naming_another_workspace_are_dropped(caplog: pytest.LogCaptureFixture) -> None:
    """M5: an item counts only on its own workspace's subject."""

    async def scenario() -> tuple[list[str], list[str]]:
        log = _log()
        first, second = _Replica(log), _Replica(log)
        await first.start()
        await second.start()
        foreign = LiveDelta(MessageDelta("ws-2", "s1", "t1", "m1", "text", "append_text", "x"), 7)
        await log.publish(WS, foreign, "intruder:1")
        await log.publish(WS, CommitHint("ws-2", 41, 9), "intruder:2")
        await first.lane.send_delta(_delta("ok"))
        await first.lane.settle(WS, "s1")
        await second.lane.fence(WS, 1)
        texts = await second.texts()
        await first.lane.stop()
        await second.lane.stop()
        return texts, second.woken

    with caplog.at_level(logging.WARNING, logger=shared_lane.__name__):
        texts, woken = asyncio.run(scenario())
    assert texts == ["ok"]
    assert woken == []  # the foreign hint woke nothing
    dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) == 4  # two items, on each of the two replicas


def test_a_workspace_no_longer_watched_keeps_no_announced_sequence() -> None:
    """M2: the announced sequences are kept only for watched workspaces."""

    async def scenario() -> tuple[int, int, int]:
        log = _log()
        replica = _Replica(log)
        await replica.start()
        stored = StoredEvent(41, WS, "s1", "turn_update", b"", 1, workspace_seq=9)
        other = StoredEvent(42, "ws-2", "s1", "turn_update", b"", 1, workspace_seq=3)
        replica.broker.publish_batch(CommittedBatch(WS, 8, (stored,)))
        replica.broker.publish_batch(CommittedBatch("ws-2", 2, (other,)))
        watched = len(replica.lane._announced)
        replica.lane.unwatch(WS)
        after = len(replica.lane._announced)
        await replica.lane.stop()
        return watched, after, log.last_sequence

    watched, after, published = asyncio.run(scenario())
    assert watched == 1  # ws-2 is not watched here: its hint goes out, nothing is kept
    assert after == 0
    assert published == 2  # both hints were published


def test_a_delta_sent_but_never_settled_by_a_report_is_released_by_settle() -> None:
    """M2: settling a Session's key (the link does at close) leaves nothing behind."""

    async def scenario() -> tuple[int, int, int, int]:
        log = _log()
        lane = SharedLane(log, ActivityBroker())
        await lane.send_delta(_delta("x", session_id="s9"))
        pending = lane._barrier.pending((WS, "s9"))
        await log.close()
        await lane.send_delta(_delta("y", session_id="s9"))
        lost = await lane.settle(WS, "s9")
        return pending, lost, lane._barrier.pending((WS, "s9")), len(lane._dropped)

    pending, lost, left, dropped = asyncio.run(scenario())
    assert pending == 1
    assert lost == 1  # "y" was dropped; "x" was acknowledged
    assert left == 0
    assert dropped == 0
