"""The hand-over wire format and adoption within the replay-memory cap (SCALE-4, ADR 0043)."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator

import pytest

from agentactivity.livestream.v1 import livestream_pb2
from grpcserver.auth import Principal, Role
from services.livestream.encoding import body_of, delivery_bytes
from services.livestream.handover.state import (
    CHUNK_HEADER,
    FORMAT_VERSION,
    MAGIC,
    HandedBinding,
    HandoverRefused,
    HandoverRequest,
    PublisherState,
    Reassembly,
    Refusal,
    decode_request,
    decode_state,
    encode_refusal,
    encode_request,
    encode_state,
    is_epoch_token,
    split,
)
from services.livestream.registry import PublisherRegistry
from services.livestream.replay import ReplayBuffer, ReplayMemory
from services.livestream.settings import Settings
from services.livestream.source import Baseline, WatchItem

EPOCH = "0123456789abcdef0123456789abcdef"
Rejected = livestream_pb2.ResumeRejectedReason


def _entry(sequence: int, size: int = 0) -> bytes:
    delivery = livestream_pb2.Delivery(filtered=livestream_pb2.FilteredDelivery())
    if size:
        delivery = livestream_pb2.Delivery(
            discontinuity=livestream_pb2.Discontinuity(
                reason=livestream_pb2.DISCONTINUITY_REASON_MESSAGE_UPDATE,
                keys=livestream_pb2.ReconcileKeys(workspace_id="w" * size),
            )
        )
    return delivery_bytes(sequence, body_of(delivery))


def _state(first: int = 4, latest: int = 6, size: int = 0, **changes: object) -> PublisherState:
    fields: dict[str, object] = {
        "principal": "ws1-device",
        "device_id": "phone-1",
        "workspace_ids": ("ws-1",),
        "epoch": EPOCH,
        "epoch_started_at": 1_700_000_000.5,
        "latest_sequence": latest,
        "acked_sequence": 3,
        "first_sequence": first,
        "entries": tuple(_entry(s, size) for s in range(first, latest + 1)),
        "positions": {"ws-1": 41},
        "bindings": (
            HandedBinding(binding_id="screen", revision=2, workspace_id="ws-1", session_id="s1"),
        ),
        "ended_epochs": ("f" * 32,),
    }
    fields.update(changes)
    return PublisherState(**fields)  # type: ignore[arg-type]


@pytest.mark.spec("SCALE-4")
def test_a_state_survives_encoding_and_chunking_exactly() -> None:
    state = _state(size=3000)
    data = encode_state(state)
    chunks = split(data, 4096)
    assert len(chunks) > 1
    assert all(len(chunk) <= 4096 for chunk in chunks)
    reassembly = Reassembly(len(data))
    assembled = [reassembly.add(chunk) for chunk in chunks]
    assert assembled[:-1] == [None] * (len(chunks) - 1)
    assert assembled[-1] == data
    assert decode_state(data, 1 << 20) == state


@pytest.mark.spec("SCALE-4")
def test_the_default_chunks_stay_within_one_mebibyte() -> None:
    data = encode_state(_state(first=1, latest=300, size=10_000))
    assert len(data) > 2 * 1024 * 1024
    assert all(len(chunk) <= 1024 * 1024 for chunk in split(data))


@pytest.mark.spec("SCALE-4")
def test_an_empty_tail_and_a_feed_not_yet_subscribed_are_valid() -> None:
    state = _state(first=7, latest=6, positions={"ws-1": None})
    assert decode_state(encode_state(state), 1 << 20) == state


def _refused(data: bytes, max_bytes: int = 1 << 20) -> str:
    with pytest.raises(HandoverRefused) as raised:
        decode_state(data, max_bytes)
    return raised.value.reason


def _with_header(**changes: object) -> bytes:
    data = encode_state(_state())
    (length,) = struct.unpack_from(">I", data, 5)
    header = json.loads(data[9 : 9 + length])
    header.update(changes)
    raw = json.dumps(header).encode()
    return data[:5] + struct.pack(">I", len(raw)) + raw + data[9 + length :]


@pytest.mark.spec("SCALE-4")
@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "BAD_FORMAT"),
        (b"garbage-garbage", "BAD_FORMAT"),
        (MAGIC + bytes([2]) + b"\x00\x00\x00\x00", "UNSUPPORTED_VERSION"),
        (MAGIC + bytes([1]) + b"\x00\x00\xff\xff{}", "BAD_FORMAT"),
        (MAGIC + bytes([1]) + b"\x00\x00\x00\x04null", "BAD_FORMAT"),
        (_with_header(v=2), "UNSUPPORTED_VERSION"),
        (_with_header(epoch="../other"), "BAD_FORMAT"),
        (_with_header(latest_sequence=9), "BAD_FORMAT"),
        (_with_header(acked_sequence=99, latest_sequence=99, first_sequence=97), "BAD_FORMAT"),
        (_with_header(positions={"ws-2": 1}), "BAD_FORMAT"),
        (_with_header(extra="field"), "BAD_FORMAT"),
        (_with_header(latest_sequence="6"), "BAD_FORMAT"),
        (_with_header(first_sequence=3, latest_sequence=5), "BAD_FORMAT"),  # wrong sequences
        (encode_state(_state())[:-2], "BAD_FORMAT"),
        (encode_state(_state()) + b"x", "BAD_FORMAT"),
    ],
    ids=[
        "empty",
        "garbage",
        "version",
        "truncated-header",
        "header-not-an-object",
        "header-version",
        "epoch-not-a-token",
        "count-mismatch",
        "acked-ahead",
        "positions-not-the-scope",
        "unknown-field",
        "string-for-int",
        "entries-out-of-sequence",
        "truncated-entry",
        "trailing-bytes",
    ],
)
def test_a_hostile_state_is_refused_typed(data: bytes, reason: str) -> None:
    assert _refused(data) == reason


@pytest.mark.spec("SCALE-4")
def test_a_state_whose_entry_is_not_a_delivery_is_refused() -> None:
    state = _state(first=1, latest=1, entries=(b"\xff\xff\xff",))
    assert _refused(encode_state(state)) == "BAD_FORMAT"


@pytest.mark.spec("SCALE-4")
def test_a_replay_tail_over_the_bound_is_refused_before_it_is_kept() -> None:
    data = encode_state(_state(size=5000))
    assert _refused(data, max_bytes=8000) == "TOO_LARGE"


@pytest.mark.spec("SCALE-4")
def test_chunks_out_of_order_of_another_version_or_too_many_are_refused() -> None:
    chunks = split(encode_state(_state(size=3000)), 2048)
    with pytest.raises(HandoverRefused, match="out of order"):
        Reassembly(1 << 20).add(chunks[1])
    with pytest.raises(HandoverRefused) as raised:
        Reassembly(1 << 20).add(CHUNK_HEADER.pack(MAGIC, 7, 1, 0, 1))
    assert raised.value.reason == "UNSUPPORTED_VERSION"
    with pytest.raises(HandoverRefused) as raised:
        Reassembly(1 << 20).add(CHUNK_HEADER.pack(MAGIC, 1, 1, 0, 10**9))
    assert raised.value.reason == "TOO_LARGE"
    reassembly = Reassembly(3000)
    reassembly.add(chunks[0])
    with pytest.raises(HandoverRefused) as raised:
        reassembly.add(chunks[1])
    assert raised.value.reason == "TOO_LARGE"


@pytest.mark.spec("SCALE-4")
def test_a_refusal_carries_its_resume_reason_and_a_bad_one_is_refused() -> None:
    refusal = encode_refusal(Refusal("CURSOR_AHEAD", Rejected.RESUME_REJECTED_REASON_CURSOR_AHEAD))
    with pytest.raises(HandoverRefused) as raised:
        Reassembly(1 << 20).add(refusal)
    assert raised.value.reason == "CURSOR_AHEAD"
    assert raised.value.resume_rejected == Rejected.RESUME_REJECTED_REASON_CURSOR_AHEAD
    bad = CHUNK_HEADER.pack(MAGIC, 1, 2, 0, 1) + b'{"reason": "X", "resume_rejected": 99}'
    with pytest.raises(HandoverRefused) as raised:
        Reassembly(1 << 20).add(bad)
    assert raised.value.reason == "BAD_FORMAT"


@pytest.mark.spec("SCALE-4")
def test_requests_are_validated_and_only_epoch_tokens_reach_a_subject() -> None:
    request = HandoverRequest(
        v=FORMAT_VERSION,
        principal="p",
        device_id="d",
        workspace_ids=("ws-1",),
        epoch=EPOCH,
        last_sequence=5,
    )
    assert decode_request(encode_request(request)) == request
    for bad in (b"{}", b"not json", encode_request(request).replace(b'"v":1', b'"v":2')):
        with pytest.raises(HandoverRefused):
            decode_request(bad)
    assert is_epoch_token(EPOCH)
    for hostile in ("a.b", "*", ">", EPOCH + " ", EPOCH.upper(), ""):
        assert not is_epoch_token(hostile)


@pytest.mark.spec("SCALE-4", "LIVE-FLOW-1")
def test_restoring_a_tail_makes_room_under_the_process_cap() -> None:
    memory = ReplayMemory(64 * 1024)
    resident = ReplayBuffer(64 * 1024, memory)
    for _ in range(60):
        resident.append(b"r" * 1000)
    adopted = ReplayBuffer(64 * 1024, memory)
    adopted.restore(11, [b"a" * 1000 for _ in range(20)])
    assert memory.used_bytes <= memory.cap_bytes
    assert (adopted.oldest_sequence, adopted.latest_sequence) == (11, 30)
    assert adopted.holds_after(10)
    assert resident.bytes < 60 * 1000  # the largest other buffer gave up its oldest


@pytest.mark.spec("SCALE-4", "LIVE-FLOW-1")
def test_a_tail_larger_than_the_cap_or_budget_is_refused_and_holds_nothing() -> None:
    memory = ReplayMemory(16 * 1024)
    buffer = ReplayBuffer(64 * 1024, memory)
    with pytest.raises(ValueError, match="exceed"):
        buffer.restore(1, [b"x" * 1000 for _ in range(20)])
    assert memory.used_bytes == 0
    small = ReplayBuffer(4 * 1024, ReplayMemory(1 << 20))
    with pytest.raises(ValueError, match="exceed"):
        small.restore(1, [b"x" * 1000 for _ in range(5)])


class _IdleSource:
    """An ActivitySource whose watch registers and then stays quiet."""

    async def watch(
        self, workspace_id: str, after_event_id: int | None
    ) -> AsyncIterator[WatchItem]:
        from agentactivity.host.v1 import activity_pb2

        yield activity_pb2.ActivityStreamReady(head_event_id=after_event_id or 0)
        await asyncio.Event().wait()

    async def read_baseline(self, workspace_id: str, session_id: str) -> Baseline:
        raise NotImplementedError

    async def close(self) -> None:
        return None


def _principal() -> Principal:
    return Principal(subject="ws1-device", role=Role.DEVICE, workspaces=frozenset({"ws-1"}))


@pytest.mark.spec("SCALE-4", "LIVE-RESUME-1")
def test_the_owner_hands_over_exactly_and_the_adopter_continues_the_epoch() -> None:
    async def scenario() -> None:
        settings = Settings(live_replay_memory_bytes=1 << 20)
        owner = PublisherRegistry(settings, _IdleSource())
        adopter = PublisherRegistry(settings, _IdleSource())
        publisher = owner.publisher_for(_principal(), "phone-1", ["ws-1"])
        for _ in range(5):
            publisher.publish(livestream_pb2.Delivery(filtered=livestream_pb2.FilteredDelivery()))
        request = HandoverRequest(
            v=FORMAT_VERSION,
            principal="ws1-device",
            device_id="phone-1",
            workspace_ids=("ws-1",),
            epoch=publisher.epoch,
            last_sequence=2,
        )
        wrong = request.model_copy(update={"device_id": "phone-2"})
        with pytest.raises(HandoverRefused, match="KEY_MISMATCH"):
            owner.hand_over(wrong)
        ahead = request.model_copy(update={"last_sequence": 9})
        with pytest.raises(HandoverRefused) as raised:
            owner.hand_over(ahead)
        assert raised.value.resume_rejected == Rejected.RESUME_REJECTED_REASON_CURSOR_AHEAD
        state = decode_state(encode_state(owner.hand_over(request)), 1 << 20)
        assert not owner.publishers
        assert not owner.by_epoch
        with pytest.raises(HandoverRefused, match="UNKNOWN_EPOCH"):
            owner.hand_over(request)

        adopted = adopter.adopt(_principal(), state)
        assert adopted.epoch == publisher.epoch
        decision = adopted.resume(livestream_pb2.ResumeCursor(epoch=state.epoch, last_sequence=2))
        assert decision.resumed
        assert decision.start_after == 2
        replay = [livestream_pb2.Delivery.FromString(e) for e in adopted.buffer.after(2)]
        assert [d.sequence for d in replay] == [3, 4, 5, 6]
        assert replay[-1].discontinuity.reason == (
            livestream_pb2.DISCONTINUITY_REASON_UPSTREAM_RESUBSCRIBED
        )
        assert adopter.by_epoch == {publisher.epoch: adopted}
        await owner.stop()
        await adopter.stop()

    asyncio.run(scenario())


@pytest.mark.spec("SCALE-4", "LIVE-FLOW-1")
def test_adoption_over_the_replay_cap_is_refused_typed() -> None:
    async def scenario() -> None:
        registry = PublisherRegistry(Settings(live_replay_memory_bytes=1 << 20), _IdleSource())
        state = _state(first=1, latest=200, size=10_000, principal="ws1-device")
        with pytest.raises(HandoverRefused) as raised:
            registry.adopt(_principal(), state)
        assert raised.value.resume_rejected == (
            Rejected.RESUME_REJECTED_REASON_CURSOR_OUTSIDE_WINDOW
        )
        assert not registry.publishers
        assert registry.memory.used_bytes == 0
        await registry.stop()

    asyncio.run(scenario())
