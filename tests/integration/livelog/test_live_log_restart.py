"""The JetStream live log across a nats-server restart (SCALE-3): never a silent gap.

Each test restarts a server of its own (``private_nats``), never the shared one.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from livelog.codec import BytesCodec
from livelog.interface import (
    Discontinuity,
    DiscontinuityReason,
    LiveLogUnavailable,
    LogEntry,
    PublishAck,
)
from livelog.jetstream import JetStreamLiveLog
from livelog.settings import LiveLogSettings
from tests.integration.livelog.collect import payloads, take
from tests.integration.livelog.conftest import live_log_settings
from tests.support.nats_server import NatsServer

pytestmark = [pytest.mark.spec("SCALE-3"), pytest.mark.slow]


async def _publish_when_back(
    log: JetStreamLiveLog[bytes], workspace: str, item: bytes, msg_id: str
) -> PublishAck:
    """Retry one publication (same message id) until the server takes it."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return await log.publish(workspace, item, msg_id)
        except LiveLogUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _connect_when_back(settings: LiveLogSettings) -> JetStreamLiveLog[bytes]:
    deadline = time.monotonic() + 20
    while True:
        try:
            return await JetStreamLiveLog.connect(settings, BytesCodec())
        except LiveLogUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def test_restart_mid_stream_fails_publishes_typed_and_subscribers_resume_exactly(
    private_nats: NatsServer,
) -> None:
    """File storage keeps the window: subscribers resume after their cursor, in order, once;
    the publications that failed meanwhile reach them as a ``PUBLISH_FAILED`` discontinuity."""
    settings = live_log_settings(private_nats.url, live_log_storage="file")

    async def scenario() -> None:
        publisher = await JetStreamLiveLog.connect(settings, BytesCodec())
        reader = await JetStreamLiveLog.connect(settings, BytesCodec())
        subscription = await reader.subscribe("ws", None)
        before = [await publisher.publish("ws", f"before-{n}".encode(), f"b{n}") for n in range(10)]
        # Half read before the outage, the other half is read after the restart.
        assert payloads(await take(subscription, 5)) == [f"before-{n}".encode() for n in range(5)]

        private_nats.stop()
        with pytest.raises(LiveLogUnavailable):
            await publisher.publish("ws", b"lost", "lost-1")
        with pytest.raises(LiveLogUnavailable):
            await publisher.publish("ws", b"lost too", "lost-2")
        with pytest.raises(LiveLogUnavailable):
            await publisher.send("ws", b"not even sent", "lost-3")
        private_nats.start()

        first_after = await _publish_when_back(publisher, "ws", b"after-0", "a0")
        after = [first_after] + [
            await publisher.publish("ws", f"after-{n}".encode(), f"a{n}") for n in range(1, 5)
        ]
        events = await take(subscription, 10, deadline_seconds=30)
        assert payloads(events) == [f"before-{n}".encode() for n in range(5, 10)] + [
            f"after-{n}".encode() for n in range(5)
        ]
        gaps = [event for event in events if isinstance(event, Discontinuity)]
        assert [gap.reason for gap in gaps] == [DiscontinuityReason.PUBLISH_FAILED]
        # The gap sits exactly where the failed publications would have been.
        gap_index = events.index(gaps[0])
        assert events[gap_index - 1].position == before[-1].position
        assert events[gap_index + 1].position == first_after.position
        positions = [event.position for event in events if isinstance(event, LogEntry)]
        assert positions == [ack.position for ack in before[5:] + after]
        assert len({position.epoch for position in positions}) == 1, "file storage keeps the epoch"
        await publisher.close()
        await reader.close()

    asyncio.run(scenario())


def test_a_restart_that_loses_the_stream_is_an_epoch_change(private_nats: NatsServer) -> None:
    """Memory storage: the restarted server recreates the stream, so cursors of the old one
    are told (``EPOCH_CHANGED``) instead of being read against a new history."""
    settings = live_log_settings(private_nats.url, live_log_storage="memory")

    async def scenario() -> None:
        publisher = await JetStreamLiveLog.connect(settings, BytesCodec())
        reader = await JetStreamLiveLog.connect(settings, BytesCodec())
        subscription = await reader.subscribe("ws", None)
        old = [await publisher.publish("ws", f"old-{n}".encode(), f"o{n}") for n in range(3)]
        assert payloads(await take(subscription, 3)) == [b"old-0", b"old-1", b"old-2"]

        private_nats.stop()
        private_nats.start()
        new = await _publish_when_back(publisher, "ws", b"new-0", "n0")
        assert new.position.epoch != old[0].position.epoch
        events = await take(subscription, 1, deadline_seconds=30)
        assert events[0] == Discontinuity("ws", DiscontinuityReason.EPOCH_CHANGED, old[-1].position)
        assert events[-1] == LogEntry("ws", new.position, "n0", b"new-0")
        # A first attempt that found no stream yet failed typed: its gap record may precede.
        assert all(
            isinstance(event, Discontinuity) and event.reason is DiscontinuityReason.PUBLISH_FAILED
            for event in events[1:-1]
        )
        await publisher.close()
        await reader.close()

    asyncio.run(scenario())


def test_a_new_only_subscriber_misses_nothing_published_while_it_was_reconnecting(
    private_nats: NatsServer,
) -> None:
    """A subscription that has no entry yet resumes from where it was established, not from
    the log's head at its reconnect (which would skip what was published meanwhile)."""
    settings = live_log_settings(private_nats.url)

    async def scenario() -> None:
        publisher = await JetStreamLiveLog.connect(settings, BytesCodec())
        reader = await JetStreamLiveLog.connect(settings, BytesCodec())
        subscription = await reader.subscribe("ws", None)
        private_nats.stop()
        private_nats.start()
        acks = [await _publish_when_back(publisher, "ws", b"first", "m0")]
        acks += [await publisher.publish("ws", f"item-{n}".encode(), f"m{n}") for n in (1, 2)]
        # Only now does the reader look: it must still get all three.
        events = await take(subscription, 3, deadline_seconds=30)
        assert payloads(events) == [b"first", b"item-1", b"item-2"]
        assert [e.position for e in events if isinstance(e, LogEntry)] == [
            ack.position for ack in acks
        ]
        await publisher.close()
        await reader.close()

    asyncio.run(scenario())


def test_a_quiet_workspace_resumes_past_other_workspaces_evicted_items(
    private_nats: NatsServer,
) -> None:
    """Heartbeats move a quiet subscriber's resume point past the busy workspaces' items, so
    a reconnect after they were evicted reports nothing missing (nothing of its own was)."""
    settings = live_log_settings(private_nats.url, live_log_max_msgs=5)

    async def scenario() -> None:
        log = await JetStreamLiveLog.connect(settings, BytesCodec())
        reader = await JetStreamLiveLog.connect(settings, BytesCodec())
        quiet = await reader.subscribe("quiet", None)
        await log.publish("quiet", b"hello", "q0")
        assert payloads(await take(quiet, 1)) == [b"hello"]
        busy = [await log.publish("busy", b"x", f"b{n}") for n in range(20)]

        events: list[object] = []
        reading = asyncio.create_task(_read_into(quiet, events))
        deadline = time.monotonic() + 10
        while (quiet.resume_position or busy[0].position).sequence < busy[-1].position.sequence:
            assert time.monotonic() < deadline, "no heartbeat advanced the resume point"
            await asyncio.sleep(0.05)

        private_nats.stop()  # the quiet subscriber re-establishes after the restart
        private_nats.start()
        # A connection made after the restart: no failed attempt, so no gap record either.
        fresh = await _connect_when_back(settings)
        back = await fresh.publish("quiet", b"again", "q1")
        deadline = time.monotonic() + 30
        while not events:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        reading.cancel()
        assert events == [LogEntry("quiet", back.position, "q1", b"again")]
        await fresh.close()
        await log.close()
        await reader.close()

    asyncio.run(scenario())


async def _read_into(subscription: object, events: list[object]) -> None:
    async for event in subscription:  # type: ignore[attr-defined]
        events.append(event)
