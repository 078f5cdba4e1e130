"""The live log's interface, on the in-process ring and on a real nats-server (SCALE-3).

Every test runs on both engines (``make_engine`` is parametrized): handles opened by
``Engine.open`` are separate NATS connections on JetStream and the one ring in-process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from livelog.interface import (
    Discontinuity,
    DiscontinuityReason,
    LiveLog,
    LogEntry,
    LogPosition,
)
from tests.integration.livelog.collect import payloads, take
from tests.integration.livelog.conftest import Engine, delete_stream, live_log_settings

pytestmark = [pytest.mark.spec("SCALE-3")]

MakeEngine = Callable[..., Engine]


def test_two_publishers_two_subscribers_see_each_workspace_once_in_one_order(
    make_engine: MakeEngine,
) -> None:
    """Concurrent publishers on their own connections; subscribers on theirs agree exactly."""
    engine = make_engine()
    per_publisher = 60

    async def scenario() -> None:
        pub_a, pub_b = await engine.open(), await engine.open()
        sub_log_1, sub_log_2 = await engine.open(), await engine.open()
        first = await sub_log_1.subscribe("ws-1", None)
        second = await sub_log_2.subscribe("ws-1", None)
        other = await sub_log_2.subscribe("ws-2", None)

        async def publish(log: LiveLog[bytes], name: str) -> list[LogPosition]:
            positions = []
            for index in range(per_publisher):
                ack = await log.publish("ws-1", f"{name}-{index}".encode(), f"{name}:{index}")
                assert not ack.duplicate
                positions.append(ack.position)
                # Every tenth item is published a second time with the same id: one copy.
                if index % 10 == 0:
                    again = await log.publish("ws-1", b"copy", f"{name}:{index}")
                    assert again.duplicate
                    assert again.position == ack.position
                await log.publish("ws-2", f"{name}-other-{index}".encode(), f"{name}:o:{index}")
            return positions

        acked_a, acked_b = await asyncio.gather(publish(pub_a, "a"), publish(pub_b, "b"))
        seen_1 = await take(first, 2 * per_publisher)
        seen_2 = await take(second, 2 * per_publisher)
        seen_other = await take(other, 2 * per_publisher)

        # A sentinel published now is the very next entry: nothing else (no copy) was queued.
        await pub_a.publish("ws-1", b"sentinel", "sentinel")
        for subscription in (first, second):
            assert payloads(await take(subscription, 1)) == [b"sentinel"]

        assert all(isinstance(event, LogEntry) for event in seen_1 + seen_2 + seen_other)
        items_1 = payloads(seen_1)
        assert items_1 == payloads(seen_2), "both subscribers see one order"
        assert len(items_1) == len(set(items_1)) == 2 * per_publisher
        assert b"copy" not in items_1
        for name in ("a", "b"):
            mine = [item for item in items_1 if item.startswith(f"{name}-".encode())]
            assert mine == [f"{name}-{index}".encode() for index in range(per_publisher)]
        positions = [event.position for event in seen_1 if isinstance(event, LogEntry)]
        assert positions == sorted(positions, key=lambda p: p.sequence)
        assert sorted(positions, key=lambda p: p.sequence) == sorted(
            acked_a + acked_b, key=lambda p: p.sequence
        )
        assert {event.msg_id for event in seen_1 if isinstance(event, LogEntry)} == {
            f"{name}:{index}" for name in ("a", "b") for index in range(per_publisher)
        }
        assert all(item.startswith((b"a-other-", b"b-other-")) for item in payloads(seen_other))
        await engine.close()

    asyncio.run(scenario())


def test_subscribe_after_a_position_replays_what_follows_it(make_engine: MakeEngine) -> None:
    engine = make_engine()

    async def scenario() -> None:
        log = await engine.open()
        acks = [await log.publish("ws", f"item-{n}".encode(), f"m{n}") for n in range(5)]
        await log.publish("elsewhere", b"not mine", "x")

        replay = await log.subscribe("ws", acks[1].position)
        events = await take(replay, 3)
        assert payloads(events) == [b"item-2", b"item-3", b"item-4"]
        assert [event.position for event in events if isinstance(event, LogEntry)] == [
            ack.position for ack in acks[2:]
        ]

        start = LogPosition(acks[0].position.epoch, 0)
        everything = await log.subscribe("ws", start)
        assert payloads(await take(everything, 5)) == [f"item-{n}".encode() for n in range(5)]

        new_only = await log.subscribe("ws", None)
        await log.publish("ws", b"item-5", "m5")
        assert payloads(await take(new_only, 1)) == [b"item-5"]
        await engine.close()

    asyncio.run(scenario())


def test_an_evicted_start_is_a_typed_discontinuity_then_the_retained_items(
    make_engine: MakeEngine,
) -> None:
    engine = make_engine(live_log_max_msgs=4)

    async def scenario() -> None:
        log = await engine.open()
        acks = [await log.publish("ws", f"item-{n}".encode(), f"m{n}") for n in range(10)]
        subscription = await log.subscribe("ws", acks[2].position)
        events = await take(subscription, 4)
        assert events[0] == Discontinuity(
            "ws", DiscontinuityReason.CURSOR_EVICTED, acks[2].position
        )
        assert payloads(events) == [f"item-{n}".encode() for n in range(6, 10)]

        # The last retained-but-read cursor is exact: nothing is missing after it.
        exact = await log.subscribe("ws", acks[5].position)
        events = await take(exact, 4)
        assert not [event for event in events if isinstance(event, Discontinuity)]
        assert payloads(events) == [f"item-{n}".encode() for n in range(6, 10)]
        await engine.close()

    asyncio.run(scenario())


def test_a_cursor_of_another_epoch_or_ahead_of_the_log_is_a_typed_discontinuity(
    make_engine: MakeEngine,
) -> None:
    engine = make_engine()

    async def scenario() -> None:
        log = await engine.open()
        acks = [await log.publish("ws", f"item-{n}".encode(), f"m{n}") for n in range(3)]
        epoch = acks[0].position.epoch

        stale = LogPosition("some-older-log@2020", 2)
        from_other_epoch = await log.subscribe("ws", stale)
        events = await take(from_other_epoch, 3)
        assert events[0] == Discontinuity("ws", DiscontinuityReason.EPOCH_CHANGED, stale)
        assert payloads(events) == [b"item-0", b"item-1", b"item-2"]

        future = LogPosition(epoch, acks[-1].position.sequence + 50)
        ahead = await log.subscribe("ws", future)
        await log.publish("ws", b"item-3", "m3")
        events = await take(ahead, 1)
        assert events == [
            Discontinuity("ws", DiscontinuityReason.CURSOR_AHEAD, future),
            LogEntry("ws", LogPosition(epoch, acks[-1].position.sequence + 1), "m3", b"item-3"),
        ]
        await engine.close()

    asyncio.run(scenario())


def test_a_subscriber_that_falls_behind_the_in_process_bounds_is_told() -> None:
    """Items evicted before a live subscriber read them: a discontinuity, then the rest.

    In-process only: the ring is read by cursor, so a slow subscriber can fall behind its
    bounds. JetStream pushes to the subscriber's connection as items arrive; a subscriber
    over its client-side limits resubscribes from its cursor, which the evicted-start test
    covers on both engines.
    """
    engine = Engine("inprocess", live_log_settings("nats://unused", live_log_max_msgs=5))

    async def scenario() -> None:
        log = await engine.open()
        subscription = await log.subscribe("ws", None)
        acks = [await log.publish("ws", f"item-{n}".encode(), f"m{n}") for n in range(8)]
        events = await take(subscription, 5)
        assert events[0] == Discontinuity("ws", DiscontinuityReason.CURSOR_EVICTED, None)
        assert payloads(events) == [f"item-{n}".encode() for n in range(3, 8)]
        assert acks[-1].position == events[-1].position
        await engine.close()

    asyncio.run(scenario())


def test_the_duplicate_window_forgets_ids_after_it(make_engine: MakeEngine) -> None:
    # Wide enough that two round trips on a busy machine stay inside it.
    window = 2.5
    engine = make_engine(live_log_duplicate_window_seconds=window)

    async def scenario() -> None:
        log = await engine.open()
        first = await log.publish("ws", b"one", "same-id")
        inside = await log.publish("ws", b"two", "same-id")  # right after the first
        assert inside.duplicate
        assert inside.position == first.position
        await asyncio.sleep(window + 1.0)  # the window itself is what is tested
        after = await log.publish("ws", b"three", "same-id")
        assert not after.duplicate
        assert after.position.sequence > first.position.sequence
        await engine.close()

    asyncio.run(scenario())


def test_closing_a_subscription_ends_its_iteration(make_engine: MakeEngine) -> None:
    engine = make_engine()

    async def scenario() -> None:
        log = await engine.open()
        subscription = await log.subscribe("ws", None)

        seen: list[object] = []
        first_seen = asyncio.Event()

        async def drain_into() -> None:
            async for event in subscription:
                seen.append(event)
                first_seen.set()

        reader = asyncio.create_task(drain_into())
        await log.publish("ws", b"one", "m1")
        await asyncio.wait_for(first_seen.wait(), 5)
        await subscription.close()
        await log.publish("ws", b"two", "m2")
        await asyncio.wait_for(reader, 5)
        assert payloads(seen) == [b"one"]  # type: ignore[arg-type]
        await engine.close()

    asyncio.run(scenario())


def test_a_jetstream_subscriber_over_its_client_buffer_resumes_from_its_cursor(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deliveries the client dropped (pending limit) are fetched again: exact, no gap."""
    import livelog.jetstream as jetstream_module

    monkeypatch.setattr(jetstream_module, "_PENDING_MSGS", 8)
    engine = Engine("jetstream", live_log_settings(nats_url))

    async def scenario() -> None:
        publisher = await engine.open()
        reader = await engine.open()
        subscription = await reader.subscribe("ws", None)
        acks = [await publisher.publish("ws", f"item-{n}".encode(), f"m{n}") for n in range(200)]
        events = await take(subscription, 200, deadline_seconds=30)
        assert not [event for event in events if isinstance(event, Discontinuity)]
        assert [e.position for e in events if isinstance(e, LogEntry)] == [
            ack.position for ack in acks
        ]
        await engine.close()

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(delete_stream(nats_url, engine.settings.live_log_stream))
