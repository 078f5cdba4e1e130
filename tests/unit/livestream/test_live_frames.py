"""Pure pieces of the livestream server: frame composition, replay bounds, projection."""

from __future__ import annotations

import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.livestream.v1 import livestream_pb2
from grpcserver.auth import Principal, Role
from services.livestream.deliveries import express
from services.livestream.encoding import batch_frame, body_of, delivery_bytes
from services.livestream.link import _pack
from services.livestream.projection import hidden_workspaces, project
from services.livestream.replay import ReplayBuffer, ReplayMemory

Delivery = livestream_pb2.Delivery


def _delta(text: str, workspace_id: str = "ws-1") -> Delivery:
    return Delivery(
        message_delta=canonical_pb2.MessageDelta(
            workspace_id=workspace_id,
            session_id="s1",
            turn_id="t1",
            message_id="m1",
            target=canonical_pb2.DELTA_TARGET_TEXT,
            operation=canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
            text=text,
        )
    )


@pytest.mark.spec("LIVE-FRAME-1")
def test_composed_frames_decode_as_the_protocol_messages() -> None:
    deliveries = [
        _delta("a"),
        _delta("ü" * 300),
        Delivery(filtered=livestream_pb2.FilteredDelivery()),
    ]
    encoded = [delivery_bytes(2**53 - 3 + i, body_of(d)) for i, d in enumerate(deliveries)]
    frame = livestream_pb2.DeviceLinkResponse.FromString(batch_frame("epoch-1", encoded))
    expected = [Delivery() for _ in deliveries]
    for i, (target, source) in enumerate(zip(expected, deliveries, strict=True)):
        target.CopyFrom(source)
        target.sequence = 2**53 - 3 + i
    assert frame.deliveries.epoch == "epoch-1"
    assert list(frame.deliveries.deliveries) == expected


@pytest.mark.spec("LIVE-FRAME-1")
def test_frames_are_packed_within_the_ceiling_and_never_empty() -> None:
    entries = [delivery_bytes(i + 1, body_of(_delta("x" * 1000))) for i in range(100)]
    sent = 0
    while sent < len(entries):
        frame, count = _pack("e", entries[sent:], 10_000)
        assert count >= 1
        assert len(frame) <= 10_000
        assert (
            len(livestream_pb2.DeviceLinkResponse.FromString(frame).deliveries.deliveries) == count
        )
        sent += count


@pytest.mark.spec("LIVE-FRAME-1")
def test_tool_output_pieces_cut_on_utf8_boundaries_and_keep_offsets() -> None:
    text = "a" + "€" * 5000  # 3-byte characters: most cuts fall inside one
    delivery = Delivery(
        message_delta=canonical_pb2.MessageDelta(
            workspace_id="ws-1",
            session_id="s1",
            turn_id="t1",
            message_id="tool",
            target=canonical_pb2.DELTA_TARGET_TOOL_OUTPUT,
            operation=canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
            text=text,
            offset_bytes=7,
        )
    )
    pieces = express("ws-1", delivery, 4096)
    assert len(pieces) > 3
    offset = 7
    for piece in pieces:
        assert piece.ByteSize() + 10 <= 4096
        assert piece.message_delta.offset_bytes == offset
        offset += len(piece.message_delta.text.encode())
    assert "".join(p.message_delta.text for p in pieces) == text


@pytest.mark.spec("LIVE-RESUME-1")
def test_the_replay_buffer_keeps_the_newest_deliveries_within_its_budget() -> None:
    buffer = ReplayBuffer(1000, ReplayMemory(10_000))
    for _ in range(25):
        buffer.append(b"x" * 100)
    assert buffer.latest_sequence == 25
    assert buffer.bytes == 1000
    assert buffer.oldest_sequence == 16
    assert buffer.holds_after(15)
    assert not buffer.holds_after(14)
    assert buffer.after(23) == [b"x" * 100] * 2
    assert buffer.bytes_after(20) == 500


@pytest.mark.spec("LIVE-FLOW-1")
def test_replay_memory_is_capped_across_publishers_taking_from_the_largest_first() -> None:
    memory = ReplayMemory(3000)
    big, small = ReplayBuffer(8000, memory), ReplayBuffer(8000, memory)
    for _ in range(25):
        big.append(b"b" * 100)
    for _ in range(5):
        small.append(b"s" * 100)
    assert memory.used_bytes == 3000
    assert small.bytes == 500  # the larger buffer gave up its oldest deliveries
    assert big.bytes == 2500
    memory.release(big)
    assert memory.used_bytes == 500


@pytest.mark.spec("LIVE-PROJ-1")
def test_a_delivery_of_a_workspace_the_recipient_lacks_is_filtered_at_its_sequence() -> None:
    principal = Principal("d", Role.DEVICE, frozenset({"ws-1"}))
    hidden = hidden_workspaces(("ws-1", "ws-2"), principal)
    assert hidden == {"ws-2"}
    mine = delivery_bytes(4, body_of(_delta("mine")))
    theirs = delivery_bytes(5, body_of(_delta("theirs", workspace_id="ws-2")))
    assert project(mine, hidden) == mine
    filtered = Delivery.FromString(project(theirs, hidden))
    assert filtered.sequence == 5
    assert filtered.WhichOneof("kind") == "filtered"
