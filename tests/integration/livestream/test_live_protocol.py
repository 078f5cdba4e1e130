"""The live protocol through a real livestream server fed by a scripted Host source.

The source implements the narrow Host interface livestream reads through, so these tests
produce what real Host sends rarely or never on demand: upstream drops, expired cursors,
late deltas for settled Turns, oversized operations and bursts read together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.livestream.v1 import livestream_pb2, livestream_pb2_grpc
from services.livestream.deliveries import SettledTurnFence, coalesce
from services.livestream.link import CURRENT_REVISION
from tests.integration.livestream.link_client import Link, hello
from tests.integration.livestream.scripted_source import ScriptedSource, delta_event, turn_event
from tests.support.rpc_errors import error_details
from tests.support.servers import LiveServer, auth_metadata

MIB = 1024 * 1024
TOOL = canonical_pb2.DELTA_TARGET_TOOL_OUTPUT
SET = canonical_pb2.DELTA_OPERATION_SET
APPEND = canonical_pb2.DELTA_OPERATION_APPEND_TEXT
Reason = livestream_pb2.DiscontinuityReason


@pytest.fixture
def source() -> ScriptedSource:
    return ScriptedSource()


@pytest.fixture
def start(
    live_server: Callable[..., LiveServer], source: ScriptedSource
) -> Callable[..., LiveServer]:
    def run(**overrides: object) -> LiveServer:
        return live_server("livestream", build=source.build, **overrides)

    return run


@pytest.fixture
def live(start: Callable[..., LiveServer]) -> LiveServer:
    return start()


@pytest.fixture
def links() -> Iterator[list[Link]]:
    opened: list[Link] = []
    yield opened
    for link in opened:
        link.cancel()


def _open(live: LiveServer, links: list[Link], *args: object, **kwargs: object) -> Link:
    link = Link(live.channel, hello(*args, **kwargs))  # type: ignore[arg-type]
    links.append(link)
    link.wait_ready()
    return link


def _deltas(link: Link) -> list[canonical_pb2.MessageDelta]:
    return [d.message_delta for d in link.deliveries if d.WhichOneof("kind") == "message_delta"]


def _at(sequence: int) -> Callable[[livestream_pb2.Delivery], bool]:
    return lambda delivery: delivery.sequence == sequence


def _error_metadata(error: grpc.RpcError) -> dict[str, str]:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return dict(info.metadata)
    return {}


def _contiguous(link: Link) -> None:
    assert [d.sequence for d in link.deliveries] == list(range(1, len(link.deliveries) + 1))


@pytest.mark.spec("LIVE-LINK-1")
@pytest.mark.spec("LIVE-CTL-1")
def test_hello_binds_a_fresh_epoch_and_stream_ready_announces_the_limits(
    live: LiveServer, links: list[Link], source: ScriptedSource
) -> None:
    link = _open(live, links)
    ready = link.ready
    assert ready is not None
    assert ready.protocol_revision == CURRENT_REVISION
    assert ready.epoch
    assert not ready.resumed
    assert ready.latest_sequence == 0
    assert ready.limits.safe_delivery_bytes == MIB
    assert ready.limits.max_frame_bytes == 2 * MIB
    assert ready.limits.replay_budget_bytes == 8 * MIB
    assert ready.limits.publisher_retention_ms == 600_000
    # The subscription existed before stream_ready: what Host sends right after is not lost.
    assert source.watches == [("ws-1", None)]
    source.push(delta_event("a"))
    assert link.wait_for(lambda d: d.HasField("message_delta")).sequence == 1


@pytest.mark.spec("LIVE-LINK-1")
def test_a_second_call_of_the_same_device_supersedes_the_first(
    live: LiveServer, links: list[Link]
) -> None:
    first = _open(live, links)
    second = _open(live, links, cursor=(first.epoch, 0))
    code, reason, _ = error_details(first.wait_error())
    assert (code, reason) == (grpc.StatusCode.ABORTED, "LINK_SUPERSEDED")
    assert second.ready is not None
    assert second.ready.resumed


@pytest.mark.spec("LIVE-REV-1")
@pytest.mark.parametrize("revision", [0, 1, 3, 99])  # 1: the released, older revision
def test_another_revision_is_rejected_never_converted(
    live: LiveServer, links: list[Link], revision: int
) -> None:
    link = Link(live.channel, hello(revision=revision))
    links.append(link)
    error = link.wait_error()
    code, reason, _ = error_details(error)
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "PROTOCOL_REVISION_MISMATCH")
    assert _error_metadata(error) == {
        "client_revision": str(revision),
        "server_revision": str(int(CURRENT_REVISION)),
    }


@pytest.mark.spec("LIVE-LINK-1")
@pytest.mark.parametrize(
    ("first", "field"),
    [
        (
            livestream_pb2.DeviceLinkRequest(
                hello=livestream_pb2.ClientHello(
                    protocol_revision=CURRENT_REVISION,
                    workspace_ids=["ws-1"],
                )
            ),
            "hello.device_id",
        ),
        (hello(cursor=("e", -1)), "hello.resume_cursor.last_sequence"),
        (hello(cursor=("", 3)), "hello.resume_cursor.epoch"),
    ],
)
def test_a_malformed_hello_is_a_protocol_violation(
    live: LiveServer, links: list[Link], first: livestream_pb2.DeviceLinkRequest, field: str
) -> None:
    link = Link(live.channel, first)
    links.append(link)
    code, reason, fields = error_details(link.wait_error())
    assert (code, reason, fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "PROTOCOL_VIOLATION",
        {field},
    )


@pytest.mark.spec("LIVE-LINK-1")
def test_a_second_hello_or_an_unset_kind_ends_the_call(live: LiveServer, links: list[Link]) -> None:
    for request in (hello(), livestream_pb2.DeviceLinkRequest()):
        link = _open(live, links, device_id=f"d-{len(links)}")
        link.send(request)
        code, reason, _ = error_details(link.wait_error())
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "PROTOCOL_VIOLATION")


@pytest.mark.spec("LIVE-RESUME-1")
def test_resume_inside_the_window_replays_every_later_delivery_once_in_order(
    live: LiveServer, links: list[Link], source: ScriptedSource
) -> None:
    link = _open(live, links)
    source.push(*(delta_event(str(i)) for i in range(3)), turn_event(1))
    link.wait_for(lambda d: d.HasField("turn_update"))
    cursor = (link.epoch, link.deliveries[0].sequence)
    link.cancel()
    source.push(turn_event(2, version=2), delta_event("x", message_id="m2"))
    again = _open(live, links, cursor=cursor)
    ready = again.ready
    assert ready is not None
    assert ready.resumed
    assert ready.epoch == cursor[0]
    replayed = [d.sequence for d in again.deliveries]
    assert replayed == list(range(cursor[1] + 1, ready.latest_sequence + 1))
    assert ready.latest_sequence == 4 or ready.latest_sequence >= 3


@pytest.mark.spec("LIVE-RESUME-1")
@pytest.mark.parametrize(
    ("cursor_of", "reason"),
    [
        (lambda epoch: (epoch, 1), livestream_pb2.RESUME_REJECTED_REASON_CURSOR_OUTSIDE_WINDOW),
        (lambda epoch: (epoch, 10_000), livestream_pb2.RESUME_REJECTED_REASON_CURSOR_AHEAD),
        (lambda epoch: ("not-an-epoch", 1), livestream_pb2.RESUME_REJECTED_REASON_EPOCH_UNKNOWN),
    ],
    ids=["outside-window", "ahead", "unknown-epoch"],
)
def test_a_cursor_that_cannot_be_honoured_gets_resume_rejected_and_a_fresh_epoch(
    start: Callable[..., LiveServer],
    links: list[Link],
    source: ScriptedSource,
    cursor_of: Callable[[str], tuple[str, int]],
    reason: int,
) -> None:
    live = start(live_replay_budget_bytes=8192)
    link = _open(live, links)
    for i in range(40):  # one at a time: a burst above the budget would close the call
        source.push(delta_event("y" * 500, message_id=f"m{i}"))
        link.wait_for(_at(i + 1))
    epoch = link.epoch
    link.cancel()
    cursor = cursor_of(epoch)
    again = _open(live, links, cursor=cursor)
    assert again.ready is not None
    assert not again.ready.resumed
    assert again.ready.epoch != epoch
    assert again.ready.latest_sequence == 1
    first = again.deliveries[0]
    assert first.sequence == 1
    assert first.resume_rejected.reason == reason
    rejected = first.resume_rejected.rejected_cursor
    assert (rejected.epoch, rejected.last_sequence) == cursor
    again.cancel()
    # The replaced epoch is now known as ended.
    ended = _open(live, links, cursor=(epoch, 40))
    assert ended.deliveries[0].resume_rejected.reason == (
        livestream_pb2.RESUME_REJECTED_REASON_EPOCH_ENDED
    )


@pytest.mark.spec("LIVE-UP-1")
def test_an_upstream_drop_resubscribes_from_the_last_event_id_with_a_workspace_discontinuity(
    start: Callable[..., LiveServer], links: list[Link], source: ScriptedSource
) -> None:
    live = start(live_upstream_retry_seconds=0.05)
    link = _open(live, links)
    source.push(turn_event(7))
    link.wait_for(lambda d: d.HasField("turn_update"))
    source.drop()
    source.wait_watches(2)
    assert source.watches[1] == ("ws-1", 7)
    gap = link.wait_for(lambda d: d.HasField("discontinuity"))
    assert gap.discontinuity.reason == Reason.DISCONTINUITY_REASON_UPSTREAM_RESUBSCRIBED
    assert gap.discontinuity.keys == livestream_pb2.ReconcileKeys(workspace_id="ws-1")
    source.push(turn_event(8, version=2))
    link.wait_for(lambda d: d.HasField("turn_update") and d.turn_update.turn.version == 2)
    _contiguous(link)


@pytest.mark.spec("LIVE-UP-1")
def test_an_expired_host_cursor_ends_the_epoch_and_a_resume_into_it_is_rejected(
    start: Callable[..., LiveServer], links: list[Link], source: ScriptedSource
) -> None:
    live = start(live_upstream_retry_seconds=0.05)
    link = _open(live, links)
    source.push(turn_event(3))
    link.wait_for(lambda d: d.HasField("turn_update"))
    old = (link.epoch, link.last_sequence)
    source.expire()
    # In band: the call continues in a fresh epoch whose first delivery says why.
    rejected = link.wait_for(lambda d: d.HasField("resume_rejected"))
    assert rejected.sequence == 1
    assert link.epoch != old[0]
    assert rejected.resume_rejected.reason == livestream_pb2.RESUME_REJECTED_REASON_EPOCH_ENDED
    assert (
        rejected.resume_rejected.rejected_cursor.epoch,
        rejected.resume_rejected.rejected_cursor.last_sequence,
    ) == old
    source.wait_watches(2)
    assert source.watches[1] == ("ws-1", None)  # from the head: the old cursor is gone
    link.cancel()
    again = _open(live, links, device_id="phone-1", cursor=old)
    assert (
        again.deliveries[0].resume_rejected.reason
        == livestream_pb2.RESUME_REJECTED_REASON_EPOCH_ENDED
    )


@pytest.mark.spec("LIVE-FENCE-1")
def test_late_deltas_for_a_settled_turn_become_scoped_discontinuities(
    live: LiveServer, links: list[Link], source: ScriptedSource
) -> None:
    link = _open(live, links)
    source.push(
        delta_event("before"),
        turn_event(1, phase=canonical_pb2.TURN_PHASE_SETTLED),
        delta_event("late"),
    )
    late = link.wait_for(lambda d: d.HasField("discontinuity"))
    assert late.discontinuity.reason == Reason.DISCONTINUITY_REASON_LATE_DELTA_FOR_SETTLED_TURN
    assert late.discontinuity.keys == livestream_pb2.ReconcileKeys(
        workspace_id="ws-1", session_id="s1", turn_id="t1", message_id="m1"
    )
    assert [d.text for d in _deltas(link)] == ["before"]


@pytest.mark.spec("LIVE-FENCE-1")
def test_the_fence_is_bounded_and_forgets_the_oldest_turn_first() -> None:
    fence = SettledTurnFence(3)
    for turn in ("a", "b", "c", "d"):
        fence.settle(turn)
    assert len(fence) == 3
    assert "a" not in fence
    assert all(t in fence for t in "bcd")


@pytest.mark.spec("LIVE-COAL-1")
def test_adjacent_pure_appends_coalesce_within_the_limit_and_nothing_else_does(
    live: LiveServer, links: list[Link], source: ScriptedSource
) -> None:
    link = _open(live, links)
    source.push(
        *(delta_event(f"{i},") for i in range(50)),
        delta_event("other", message_id="m2"),
        delta_event("", operation=SET),
        delta_event("o1", target=TOOL, message_id="tool", operation=SET),
        delta_event("o2", target=TOOL, message_id="tool", offset=2),
        delta_event("o3", target=TOOL, message_id="tool", offset=4),
        delta_event("gap", target=TOOL, message_id="tool", offset=99),
        turn_event(1),
    )
    link.wait_for(lambda d: d.HasField("turn_update"))
    deltas = [(d.message_id, d.operation, d.text, d.offset_bytes) for d in _deltas(link)]
    assert deltas == [
        ("m1", APPEND, "".join(f"{i}," for i in range(50)), 0),
        ("m2", APPEND, "other", 0),
        ("m1", SET, "", 0),
        ("tool", SET, "o1", 0),
        ("tool", APPEND, "o2o3", 2),
        ("tool", APPEND, "gap", 99),
    ]


@pytest.mark.spec("LIVE-COAL-1")
def test_coalescing_never_exceeds_the_safe_size() -> None:
    many = [
        livestream_pb2.Delivery(message_delta=delta_event("z" * 1000).message_delta.delta)
        for _ in range(100)
    ]
    merged = coalesce(many, 10_000)
    assert "".join(d.message_delta.text for d in merged) == "z" * 100_000
    assert all(d.ByteSize() + 10 <= 10_000 for d in merged)
    assert len(merged) >= 10


@pytest.mark.spec("LIVE-FRAME-1")
def test_oversized_tool_output_arrives_as_set_and_contiguous_appends_within_bounds(
    live: LiveServer, links: list[Link], source: ScriptedSource
) -> None:
    link = _open(live, links)
    text = ("ascii-" * 200_000) + ("ü€𝄞" * 300_000)  # 1.2 MB + 2.7 MB, multi-byte at the cuts
    source.push(delta_event(text, target=TOOL, message_id="tool", operation=SET), turn_event(1))
    sizes: list[int] = []
    while not any(d.HasField("turn_update") for d in link.deliveries):
        frame = link.next_frame()
        sizes.append(frame.ByteSize())
        link.pump(frame)
    pieces = _deltas(link)
    assert len(pieces) >= 4
    assert pieces[0].operation == SET
    assert all(p.operation == APPEND for p in pieces[1:])
    offset = len(pieces[0].text.encode())
    for piece in pieces[1:]:
        assert piece.offset_bytes == offset
        offset += len(piece.text.encode())
    assert "".join(p.text for p in pieces) == text
    assert all(d.ByteSize() <= MIB for d in link.deliveries)
    assert max(sizes) <= 2 * MIB
    _contiguous(link)


@pytest.mark.spec("LIVE-FRAME-1")
def test_an_indivisible_oversized_delivery_becomes_delivery_too_large_with_keys(
    live: LiveServer, links: list[Link], source: ScriptedSource
) -> None:
    link = _open(live, links)
    source.push(delta_event("t" * (MIB + 10), turn_id="t9", message_id="m9"), turn_event(1))
    link.wait_for(lambda d: d.HasField("turn_update"))
    too_large = link.deliveries[0].discontinuity
    assert too_large.reason == Reason.DISCONTINUITY_REASON_DELIVERY_TOO_LARGE
    assert too_large.keys == livestream_pb2.ReconcileKeys(
        workspace_id="ws-1", session_id="s1", turn_id="t9", message_id="m9"
    )


@pytest.mark.spec("LIVE-FLOW-1")
def test_a_client_that_stops_reading_is_closed_slow_consumer_and_others_are_unaffected(
    start: Callable[..., LiveServer], links: list[Link], source: ScriptedSource
) -> None:
    live = start(live_link_queue_bytes=256 * 1024)
    stub = livestream_pb2_grpc.DeviceLinkServiceStub(live.channel)
    # A call whose responses are never read: only the transport's windows buffer.
    stalled = stub.DeviceLink(
        iter([hello(device_id="stalled")]), metadata=auth_metadata("ws1-device")
    )
    healthy = _open(live, links, device_id="healthy")
    chunk = "x" * 60_000
    for i in range(20):  # 240 KB bursts: within the healthy call's queue, 4.8 MB in all
        source.push(*(delta_event(chunk, message_id=f"m{i}-{j}") for j in range(4)))
        healthy.wait_for(_at(4 * (i + 1)))
    _contiguous(healthy)
    with pytest.raises(grpc.RpcError) as raised:
        for _ in stalled:
            pass
    code, reason, _ = error_details(raised.value)
    assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "SLOW_CONSUMER")


@pytest.mark.spec("LIVE-FLOW-1")
def test_an_idle_link_gets_server_heartbeats_carrying_the_latest_sequence(
    start: Callable[..., LiveServer], links: list[Link], source: ScriptedSource
) -> None:
    live = start(live_heartbeat_interval_seconds=0.2)
    link = _open(live, links)
    source.push(delta_event("a"), delta_event("b", message_id="m2"))
    link.wait_for(lambda d: d.sequence == 2)
    while True:
        frame = link.next_frame()
        if frame.HasField("heartbeat"):
            break
        link.pump(frame)
    assert frame.heartbeat.epoch == link.epoch
    assert frame.heartbeat.latest_sequence == 2


@pytest.mark.spec("LIVE-PUB-1")
def test_a_publisher_outlives_its_call_for_the_retention_period_then_is_discarded(
    start: Callable[..., LiveServer], links: list[Link], source: ScriptedSource
) -> None:
    live = start(live_publisher_retention_seconds=1.0)
    stub = livestream_pb2_grpc.DeviceLinkServiceStub(live.channel)
    link = _open(live, links)
    source.push(delta_event("a"))
    link.wait_for(lambda d: d.sequence == 1)
    link.cancel()
    listed = stub.ListPublishers(
        livestream_pb2.ListPublishersRequest(), metadata=auth_metadata("admin")
    )
    while listed.publishers and listed.publishers[0].connected:
        listed = stub.ListPublishers(
            livestream_pb2.ListPublishersRequest(), metadata=auth_metadata("admin")
        )
    (info,) = listed.publishers
    assert (info.device_id, list(info.workspace_ids), info.principal_id) == (
        "phone-1",
        ["ws-1"],
        "ws1-device",
    )
    assert info.latest_sequence == 1
    assert info.replay_bytes > 0
    assert info.HasField("retained_until_unix_ms")
    # Another device principal sees nothing of it.
    other = stub.ListPublishers(
        livestream_pb2.ListPublishersRequest(), metadata=auth_metadata("ws2-device")
    )
    assert not other.publishers
    resumed = _open(live, links, cursor=(info.epoch, 0))
    assert resumed.ready is not None
    assert resumed.ready.resumed
    assert resumed.last_sequence == 1
    resumed.cancel()
    import time

    deadline = time.monotonic() + 30
    while stub.ListPublishers(
        livestream_pb2.ListPublishersRequest(), metadata=auth_metadata("admin")
    ).publishers:
        assert time.monotonic() < deadline, "publisher not discarded after its retention"
        time.sleep(0.1)
    late = _open(live, links, cursor=(info.epoch, 1))
    assert (
        late.deliveries[0].resume_rejected.reason
        == livestream_pb2.RESUME_REJECTED_REASON_EPOCH_UNKNOWN
    )


@pytest.mark.spec("LIVE-PUB-1")
def test_publishers_are_bounded_per_principal(
    start: Callable[..., LiveServer], links: list[Link]
) -> None:
    live = start(live_max_publishers_per_principal=2)
    a = _open(live, links, device_id="a")
    _open(live, links, device_id="b")
    refused = Link(live.channel, hello(device_id="c"))
    links.append(refused)
    code, reason, _ = error_details(refused.wait_error())
    assert (code, reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "PUBLISHER_LIMIT_EXCEEDED")
    a.cancel()
    # A disconnected publisher makes room for the new one.
    _open(live, links, device_id="c")


def test_drain_ends_device_links_with_draining(
    start: Callable[..., LiveServer], links: list[Link]
) -> None:
    live = start()
    link = _open(live, links)
    live.stop(grace=5.0)
    code, reason, _ = error_details(link.wait_error())
    assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "DRAINING")


@pytest.mark.spec("LIVE-LINK-1")
@pytest.mark.parametrize(
    "first",
    [
        livestream_pb2.DeviceLinkRequest(
            attach=livestream_pb2.ClientAttach(binding_id="b", revision=1, session_id="s1")
        ),
        livestream_pb2.DeviceLinkRequest(),
        hello(workspaces=()),
    ],
    ids=["attach-first", "unset-kind", "empty-scope"],
)
def test_a_first_request_that_is_not_a_hello_naming_a_scope_is_a_protocol_violation(
    live: LiveServer, links: list[Link], first: livestream_pb2.DeviceLinkRequest
) -> None:
    link = Link(live.channel, first)
    links.append(link)
    code, reason, fields = error_details(link.wait_error())
    assert (code, reason, fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "PROTOCOL_VIOLATION",
        {"hello.workspace_ids"},
    )
