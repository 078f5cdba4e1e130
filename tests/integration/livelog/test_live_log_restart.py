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
