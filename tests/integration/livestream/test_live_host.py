"""The live protocol against a real Host, on SQLite and Postgres: variants, attachments
with baselines read from Host, and business values carried byte-for-byte."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2
from agentactivity.livestream.v1 import livestream_pb2
from tests.integration.host_activity import DEVICE, WS, HostUnderTest, start_host
from tests.integration.livestream.link_client import Link, attach_request, hello, start_livestream
from tests.support.rpc_errors import error_details
from tests.support.runtime_client import ScriptedRuntime, interaction, text_message, turn_patch
from tests.support.servers import LiveServer

RUNNING = canonical_pb2.TURN_PHASE_RUNNING
Reason = livestream_pb2.DiscontinuityReason
Delivery = livestream_pb2.Delivery


@pytest.fixture
def suite(
    live_server: Callable[..., LiveServer], migrated_db_url: str
) -> tuple[HostUnderTest, LiveServer]:
    host = start_host(live_server, migrated_db_url)
    return host, start_livestream(live_server, host.server)


@pytest.fixture
def links() -> Iterator[list[Link]]:
    opened: list[Link] = []
    yield opened
    for link in opened:
        link.cancel()


def _open(live: LiveServer, links: list[Link], **kwargs: object) -> Link:
    link = Link(live.channel, hello(**kwargs))  # type: ignore[arg-type]
    links.append(link)
    link.wait_ready()
    return link


def _running_turn(host: HostUnderTest, runtime: ScriptedRuntime, submit_id: str) -> str:
    turn_id = host.send("hello", submit_id).turn.turn_id
    runtime.ack(runtime.next_command().command_id)
    runtime.report(WS, "s1", f"run-{turn_id}", turn_patch(turn_id, RUNNING, occurred_at_unix_ms=1))
    return turn_id


def _kind(name: str) -> Callable[[Delivery], bool]:
    return lambda delivery: delivery.WhichOneof("kind") == name


@pytest.mark.spec("LIVE-VAR-1")
def test_host_events_become_the_four_variants_with_scoped_keys_and_lifecycle_reasons(
    suite: tuple[HostUnderTest, LiveServer], links: list[Link]
) -> None:
    host, live = suite
    link = _open(live, links)
    runtime = host.runtime()
    turn_id = _running_turn(host, runtime, "c1")
    update = link.wait_for(
        lambda d: d.HasField("turn_update") and d.turn_update.turn.phase == RUNNING
    ).turn_update
    assert update.turn.turn_id == turn_id
    assert update.active_turn_id == turn_id
    runtime.report(WS, "s1", "r-msg", text_message("msg-1", turn_id, "done"))
    message = link.wait_for(
        lambda d: (
            d.HasField("discontinuity")
            and d.discontinuity.reason == Reason.DISCONTINUITY_REASON_MESSAGE_UPDATE
            and d.discontinuity.keys.message_id == "msg-1"
        )
    )
    assert message.discontinuity.keys == livestream_pb2.ReconcileKeys(
        workspace_id=WS, session_id="s1", turn_id=turn_id, message_id="msg-1"
    )
    host.stub.DeleteSessions(
        host_pb2.DeleteSessionsRequest(workspace_id=WS, session_ids=["s1"]), metadata=DEVICE
    )
    deleted = link.wait_for(
        lambda d: (
            d.HasField("discontinuity")
            and d.discontinuity.reason == Reason.DISCONTINUITY_REASON_SESSION_DELETED
        )
    )
    assert deleted.discontinuity.keys == livestream_pb2.ReconcileKeys(
        workspace_id=WS, session_id="s1"
    )
    host.stub.RestoreDeletedSession(
        host_pb2.RestoreDeletedSessionRequest(workspace_id=WS, session_id="s1"), metadata=DEVICE
    )
    restored = link.wait_for(
        lambda d: (
            d.HasField("discontinuity")
            and d.discontinuity.reason == Reason.DISCONTINUITY_REASON_SESSION_RESTORED
        )
    )
    assert restored.discontinuity.keys.session_id == "s1"
    assert [d.sequence for d in link.deliveries] == list(range(1, len(link.deliveries) + 1))


@pytest.mark.spec("LIVE-ATT-1")
@pytest.mark.spec("LIVE-CTL-1")
def test_attach_publishes_a_host_baseline_and_a_barrier_echoing_its_identity(
    suite: tuple[HostUnderTest, LiveServer], links: list[Link]
) -> None:
    host, live = suite
    runtime = host.runtime()
    first = _running_turn(host, runtime, "c1")
    runtime.report(WS, "s1", "r-int", interaction(first, "req-1"))
    link = _open(live, links)
    link.send(attach_request("screen", 1, "s1", caller_turn_id=first))
    barrier = link.wait_for(_kind("attachment_caught_up"))
    baseline = link.deliveries[: link.deliveries.index(barrier) + 1]
    assert baseline[0].attachment_changed == livestream_pb2.AttachmentChanged(
        binding_id="screen", revision=1, workspace_id=WS, session_id="s1", caller_turn_id=first
    )
    turns = [d.turn_update for d in baseline if d.HasField("turn_update")]
    assert [t.turn.turn_id for t in turns] == [first]
    assert all(t.active_turn_id == first for t in turns)
    (snapshot,) = [d.interaction_snapshot for d in baseline if d.HasField("interaction_snapshot")]
    assert snapshot.root_turn_id == first
    assert [(i.turn_id, i.request_id) for i in snapshot.interactions] == [(first, "req-1")]
    assert barrier.attachment_caught_up == livestream_pb2.AttachmentCaughtUp(
        binding_id="screen",
        revision=1,
        workspace_id=WS,
        session_id="s1",
        canonical_turn_ids=[first],
        current_interaction_root_turn_id=first,
        caller_turn_id=first,
    )


@pytest.mark.spec("LIVE-ATT-1")
def test_a_replacement_attach_after_reconnect_reruns_the_baseline_from_host(
    suite: tuple[HostUnderTest, LiveServer], links: list[Link]
) -> None:
    host, live = suite
    link = _open(live, links)
    link.send(attach_request("screen", 1, "s1"))
    barrier = link.wait_for(_kind("attachment_caught_up")).attachment_caught_up
    assert list(barrier.canonical_turn_ids) == []
    assert not barrier.HasField("current_interaction_root_turn_id")
    empty = next(d for d in link.deliveries if d.HasField("interaction_snapshot"))
    assert not empty.interaction_snapshot.HasField("root_turn_id")
    link.cancel()
    # Host changes while the device is away; the replacement attach reads it again.
    turn_id = _running_turn(host, host.runtime(), "c2")
    again = _open(live, links)  # no cursor: a fresh epoch forgets attachments
    again.send(attach_request("screen", 2, "s1"))
    replay = again.wait_for(_kind("attachment_caught_up")).attachment_caught_up
    assert list(replay.canonical_turn_ids) == [turn_id]
    assert replay.current_interaction_root_turn_id == turn_id
    assert replay.revision == 2


@pytest.mark.spec("LIVE-ATT-1")
def test_attach_refusals_are_typed(
    suite: tuple[HostUnderTest, LiveServer], links: list[Link]
) -> None:
    _, live = suite
    link = _open(live, links)
    link.send(attach_request("b", 1, "no-such-session"))
    rejected = link.wait_for(_kind("attachment_rejected")).attachment_rejected
    assert rejected.reason == livestream_pb2.ATTACHMENT_REJECTED_REASON_SESSION_NOT_FOUND
    assert (rejected.binding_id, rejected.revision, rejected.session_id) == (
        "b",
        1,
        "no-such-session",
    )
    link.send(attach_request("b", 1, "s1"))  # not greater than the binding's last
    code, reason, fields = error_details(link.wait_error())
    assert (code, reason, fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "PROTOCOL_VIOLATION",
        {"attach.revision"},
    )
    outside = _open(live, links, device_id="phone-2")
    outside.send(attach_request("b", 1, "s1", workspace_id="ws-2"))
    code, reason, _ = error_details(outside.wait_error())
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "WORKSPACE_SCOPE_MISMATCH")


@pytest.mark.spec("LIVE-PROJ-1")
def test_business_values_travel_byte_for_byte(
    suite: tuple[HostUnderTest, LiveServer], links: list[Link]
) -> None:
    host, live = suite
    link = _open(live, links)
    runtime = host.runtime()
    turn_id = _running_turn(host, runtime, "c1")
    raw = (
        '{"n": 123456789012345678901234567890, "path": "C:\\\\Users\\\\ü\\\\a b.txt", "f": 1.0e400}'
    )
    runtime.report(WS, "s1", "r-int", interaction(turn_id, "req-9", input_json=raw))
    update = link.wait_for(_kind("interaction_update")).interaction_update
    assert update.input_json == raw
    assert (update.workspace_id, update.session_id, update.turn_id) == (WS, "s1", turn_id)


@pytest.mark.spec("LIVE-LINK-1")
def test_a_device_may_only_name_its_own_workspaces(
    suite: tuple[HostUnderTest, LiveServer], links: list[Link]
) -> None:
    _, live = suite
    link = Link(live.channel, hello(workspaces=("ws-1", "ws-2")))
    links.append(link)
    code, reason, _ = error_details(link.wait_error())
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "WORKSPACE_SCOPE_MISMATCH")
