"""Host's shared live lane on a real nats-server: foreign bytes on a subject (SCALE-3).

Anything that can reach the bus can publish on a workspace's subject; an item the lane's
codec cannot decode must be skipped (and logged) without ending the workspace's
subscription, so later deltas still reach the replica.
"""

from __future__ import annotations

import asyncio
import logging

import nats
import pytest

from agentactivity.host.v1 import activity_pb2
from livelog import jetstream
from livelog.jetstream import JetStreamLiveLog
from livelog.subjects import workspace_subject
from services.host.activity.broker import ActivityBroker, LiveDelta
from services.host.activity.events import MessageDelta
from services.host.activity.shared_lane import SharedLane
from services.host.wire.live_lane_codec import LiveLaneCodec
from tests.integration.livelog.conftest import delete_stream, live_log_settings

pytestmark = [pytest.mark.spec("SCALE-3")]

WS = "ws-1"


def _delta(text: str) -> LiveDelta:
    return LiveDelta(MessageDelta(WS, "s1", "t1", "m1", "text", "append_text", text), 7)


def test_an_undecodable_item_is_skipped_and_later_deltas_still_arrive(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = live_log_settings(nats_url)

    async def scenario() -> list[str]:
        sender_log = await JetStreamLiveLog.connect(settings, LiveLaneCodec())
        receiver_log = await JetStreamLiveLog.connect(settings, LiveLaneCodec())
        sender = SharedLane(sender_log, ActivityBroker())
        broker = ActivityBroker()
        watch = broker.subscribe(WS, max_items=100)
        receiver = SharedLane(receiver_log, broker, fence_timeout_seconds=10)
        await receiver.start(lambda _workspace: None)
        receiver.watch(WS)
        assert await receiver.ready(WS, 10)
        await sender.send_delta(_delta("before"))
        await sender.settle(WS, "s1")
        # A plain NATS client stores bytes that are no lane item, and an event of the
        # durable log (a oneof the lane never carries), on the workspace's subject.
        client = await nats.connect(nats_url)
        durable = activity_pb2.ActivityEvent(workspace_id=WS)
        durable.session_reconcile_required.session_id = "s1"
        subject = workspace_subject(settings.live_log_subject_prefix, WS)
        try:
            js = client.jetstream()
            await js.publish(subject, b"\xff\xff not a lane item", headers={"Nats-Msg-Id": "j1"})
            await js.publish(subject, durable.SerializeToString(), headers={"Nats-Msg-Id": "j2"})
        finally:
            await client.close()
        await sender.send_delta(_delta("after"))
        await sender.settle(WS, "s1")
        # The fence goes through the same subscription: it arrives only if that survived.
        await receiver.fence(WS, 1)
        texts = []
        while watch.pending():
            item = await watch.next(0)
            if isinstance(item, LiveDelta):
                texts.append(item.delta.text)
        await sender.stop()
        await receiver.stop()
        return texts

    try:
        with caplog.at_level(logging.WARNING, logger=jetstream.__name__):
            texts = asyncio.run(scenario())
    finally:
        asyncio.run(delete_stream(nats_url, settings.live_log_stream))
    assert texts == ["before", "after"]
    skipped = [r.getMessage() for r in caplog.records if "undecodable" in r.getMessage()]
    assert len(skipped) == 2
    assert "j1" in skipped[0]
    assert "j2" in skipped[1]
