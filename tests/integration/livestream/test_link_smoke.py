"""Smoke: a device link against a real Host."""

from __future__ import annotations

from collections.abc import Callable

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import runtime_pb2
from tests.integration.host_activity import start_host
from tests.integration.livestream.link_client import Link, hello, start_livestream
from tests.support.runtime_client import turn_patch
from tests.support.servers import LiveServer


def test_deltas_reach_a_device(
    live_server: Callable[..., LiveServer], migrated_db_url: str
) -> None:
    host = start_host(live_server, migrated_db_url)
    live = start_livestream(live_server, host.server)
    link = Link(live.channel, hello())
    ready = link.wait_ready()
    assert ready.latest_sequence == 0
    runtime = host.runtime()
    turn_id = host.send("hello", "c1").turn.turn_id
    runtime.ack(runtime.next_command().command_id)
    runtime.report(
        "ws-1",
        "s1",
        "r1",
        turn_patch(turn_id, canonical_pb2.TURN_PHASE_RUNNING, occurred_at_unix_ms=1),
    )
    runtime.send(
        runtime_pb2.RuntimeLinkRequest(
            deltas=runtime_pb2.MessageDeltaBatch(
                deltas=[
                    canonical_pb2.MessageDelta(
                        workspace_id="ws-1",
                        session_id="s1",
                        turn_id=turn_id,
                        message_id="m1",
                        target=canonical_pb2.DELTA_TARGET_TEXT,
                        operation=canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
                        text="hi",
                    )
                ]
            )
        )
    )
    delta = link.wait_for(lambda d: d.WhichOneof("kind") == "message_delta")
    assert delta.message_delta.text == "hi"
    print([d.WhichOneof("kind") for d in link.deliveries])
    assert [d.sequence for d in link.deliveries] == list(range(1, len(link.deliveries) + 1))
