"""The hand-over wire format: a publisher's state, its request, chunks and refusals.

Everything a replica receives from the bus is hostile input: :func:`decode_state`,
:func:`decode_request` and :class:`Reassembly` validate every field and raise
:class:`HandoverRefused` (with a reason for the log) instead of failing anywhere else. The
format is versioned: a message naming another version is refused, never converted.

A state is ``MAGIC | version | header length | header JSON | entries``, each entry a 4-byte
length and one encoded ``Delivery`` whose sequence must be the next expected one. It travels
as chunks of at most :data:`MAX_CHUNK_BYTES`, each ``MAGIC | version | kind | index | total
| payload``.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from typing import Annotated, Final

from google.protobuf.message import DecodeError
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from agentactivity.livestream.v1 import livestream_pb2

__all__ = [
    "FORMAT_VERSION",
    "MAX_CHUNK_BYTES",
    "HandedBinding",
    "HandoverRefused",
    "HandoverRequest",
    "PublisherState",
    "Reassembly",
    "Refusal",
    "decode_refusal",
    "decode_request",
    "decode_state",
    "encode_refusal",
    "encode_request",
    "encode_state",
    "is_epoch_token",
    "split",
]

MAGIC: Final = b"TLPH"
FORMAT_VERSION: Final = 1
MAX_CHUNK_BYTES: Final = 1024 * 1024
"""Largest hand-over message (NATS' default ``max_payload`` is 1 MiB)."""
CHUNK_HEADER: Final = struct.Struct(">4sBBII")
KIND_CHUNK: Final = 1
KIND_REFUSAL: Final = 2
MAX_CHUNKS: Final = 100_000
MAX_SEQUENCE: Final = 2**53 - 1
MAX_ENTRIES: Final = 1_000_000
MAX_BINDINGS: Final = 256
MAX_SCOPE: Final = 64

_EPOCH = re.compile(r"^[0-9a-f]{32}$")

Id = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Epoch = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
Sequence = Annotated[int, Field(ge=0, le=MAX_SEQUENCE)]


def is_epoch_token(epoch: str) -> bool:
    """Whether ``epoch`` has the shape this service gives epochs (safe in a NATS subject)."""
    return bool(_EPOCH.match(epoch))


class HandoverRefused(Exception):
    """A hand-over message is invalid, or the owner refused the hand-over.

    ``reason`` is a short code for the log (``BAD_FORMAT``, ``KEY_MISMATCH`` ...);
    ``resume_rejected`` the ``ResumeRejectedReason`` the device should get, when precise.
    """

    def __init__(self, reason: str, detail: str = "", resume_rejected: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.resume_rejected = resume_rejected


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class HandoverRequest(_Strict):
    """What a replica asks the owner of ``epoch`` for (the device's hello and cursor)."""

    v: Annotated[int, Field(ge=1)]
    principal: Id
    device_id: Id
    workspace_ids: Annotated[tuple[Id, ...], Field(min_length=1, max_length=MAX_SCOPE)]
    epoch: Epoch
    last_sequence: Sequence


class HandedBinding(_Strict):
    """One binding of the handed-over publisher (LIVE-ATT-1)."""

    binding_id: Id
    revision: Annotated[int, Field(ge=0, le=MAX_SEQUENCE)]
    workspace_id: Annotated[str, StringConstraints(max_length=256)] = ""
    session_id: Id | None = None
    caller_turn_id: Id | None = None
    caught_up: bool = False


class _StateHeader(_Strict):
    v: Annotated[int, Field(ge=1)]
    principal: Id
    device_id: Id
    workspace_ids: Annotated[tuple[Id, ...], Field(min_length=1, max_length=MAX_SCOPE)]
    epoch: Epoch
    epoch_started_at: Annotated[float, Field(ge=0)]
    ended_epochs: Annotated[tuple[Epoch, ...], Field(max_length=64)] = ()
    latest_sequence: Sequence
    acked_sequence: Sequence
    first_sequence: Annotated[int, Field(ge=1, le=MAX_SEQUENCE + 1)]
    entry_count: Annotated[int, Field(ge=0, le=MAX_ENTRIES)]
    bindings: Annotated[tuple[HandedBinding, ...], Field(max_length=MAX_BINDINGS)] = ()
    positions: dict[Id, Annotated[int, Field(ge=0, le=2**63 - 1)] | None]


@dataclass(frozen=True)
class PublisherState:
    """A publisher as handed over: identity, epoch, sequence, replay tail and positions.

    ``entries`` are the encoded deliveries ``first_sequence .. latest_sequence`` (the ones
    after the device's cursor); ``positions`` maps each workspace of the scope to the last
    Host event id the publisher consumed (``None``: its feed had not subscribed yet).
    """

    principal: str
    device_id: str
    workspace_ids: tuple[str, ...]
    epoch: str
    epoch_started_at: float
    latest_sequence: int
    acked_sequence: int
    first_sequence: int
    entries: tuple[bytes, ...]
    positions: dict[str, int | None]
    bindings: tuple[HandedBinding, ...] = ()
    ended_epochs: tuple[str, ...] = field(default=())

    @property
    def replay_bytes(self) -> int:
        """Bytes the entries take in a replay buffer."""
        return sum(len(entry) for entry in self.entries)


def _refuse_invalid(error: ValidationError) -> HandoverRefused:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return HandoverRefused("BAD_FORMAT", f"{where}: {first['msg']}")


def encode_request(request: HandoverRequest) -> bytes:
    """The request's bytes."""
    return request.model_dump_json().encode()


def decode_request(data: bytes) -> HandoverRequest:
    """A validated request.

    Raises:
        HandoverRefused: ``BAD_FORMAT`` or ``UNSUPPORTED_VERSION``.
    """
    try:
        request = HandoverRequest.model_validate_json(data)
    except ValidationError as error:
        raise _refuse_invalid(error) from None
    if request.v != FORMAT_VERSION:
        raise HandoverRefused("UNSUPPORTED_VERSION", f"request version {request.v}")
    return request


def encode_state(state: PublisherState) -> bytes:
    """The state's bytes (see the module docstring)."""
    header = (
        _StateHeader(
            v=FORMAT_VERSION,
            principal=state.principal,
            device_id=state.device_id,
            workspace_ids=state.workspace_ids,
            epoch=state.epoch,
            epoch_started_at=state.epoch_started_at,
            ended_epochs=state.ended_epochs,
            latest_sequence=state.latest_sequence,
            acked_sequence=state.acked_sequence,
            first_sequence=state.first_sequence,
            entry_count=len(state.entries),
            bindings=state.bindings,
            positions=state.positions,
        )
        .model_dump_json()
        .encode()
    )
    parts = [MAGIC, bytes([FORMAT_VERSION]), struct.pack(">I", len(header)), header]
    for entry in state.entries:
        parts += (struct.pack(">I", len(entry)), entry)
    return b"".join(parts)


def _decode_header(data: bytes) -> tuple[_StateHeader, int]:
    """The validated header and the offset of the first entry."""
    if len(data) < 9 or data[:4] != MAGIC:
        raise HandoverRefused("BAD_FORMAT", "not a hand-over state")
    if data[4] != FORMAT_VERSION:
        raise HandoverRefused("UNSUPPORTED_VERSION", f"state version {data[4]}")
    (header_length,) = struct.unpack_from(">I", data, 5)
    offset = 9 + header_length
    if offset > len(data):
        raise HandoverRefused("BAD_FORMAT", "truncated header")
    try:
        header = _StateHeader.model_validate_json(data[9:offset])
    except ValidationError as error:
        raise _refuse_invalid(error) from None
    if header.v != FORMAT_VERSION:
        raise HandoverRefused("UNSUPPORTED_VERSION", f"header version {header.v}")
    if header.first_sequence + header.entry_count - 1 != header.latest_sequence:
        raise HandoverRefused("BAD_FORMAT", "entries do not end at the latest sequence")
    if header.acked_sequence > header.latest_sequence:
        raise HandoverRefused("BAD_FORMAT", "acknowledged past the latest sequence")
    if set(header.positions) != set(header.workspace_ids):
        raise HandoverRefused("BAD_FORMAT", "positions do not name the scope's workspaces")
    return header, offset


def _decode_entries(
    data: bytes, offset: int, header: _StateHeader, max_replay_bytes: int
) -> list[bytes]:
    """The entries, each a delivery carrying the next sequence, and nothing after them."""
    entries: list[bytes] = []
    replay_bytes = 0
    for sequence in range(header.first_sequence, header.latest_sequence + 1):
        if offset + 4 > len(data):
            raise HandoverRefused("BAD_FORMAT", "truncated entries")
        (length,) = struct.unpack_from(">I", data, offset)
        entry = data[offset + 4 : offset + 4 + length]
        if len(entry) != length:
            raise HandoverRefused("BAD_FORMAT", "truncated entry")
        replay_bytes += length
        if replay_bytes > max_replay_bytes:
            raise HandoverRefused("TOO_LARGE", f"replay tail over {max_replay_bytes} bytes")
        try:
            delivery = livestream_pb2.Delivery.FromString(entry)
        except DecodeError:
            raise HandoverRefused("BAD_FORMAT", f"entry {sequence} is not a delivery") from None
        if delivery.sequence != sequence or delivery.WhichOneof("kind") is None:
            raise HandoverRefused("BAD_FORMAT", f"entry {sequence} is out of sequence")
        entries.append(entry)
        offset += 4 + length
    if offset != len(data):
        raise HandoverRefused("BAD_FORMAT", "trailing bytes")
    return entries


def decode_state(data: bytes, max_replay_bytes: int) -> PublisherState:
    """A validated state.

    Checks the version, every header field, that the entries are exactly the deliveries
    ``first_sequence .. latest_sequence`` (each decodes and carries its sequence) and that
    they take at most ``max_replay_bytes``.

    Raises:
        HandoverRefused: ``BAD_FORMAT``, ``UNSUPPORTED_VERSION`` or ``TOO_LARGE``.
    """
    header, offset = _decode_header(data)
    entries = _decode_entries(data, offset, header, max_replay_bytes)
    return PublisherState(
        principal=header.principal,
        device_id=header.device_id,
        workspace_ids=header.workspace_ids,
        epoch=header.epoch,
        epoch_started_at=header.epoch_started_at,
        latest_sequence=header.latest_sequence,
        acked_sequence=header.acked_sequence,
        first_sequence=header.first_sequence,
        entries=tuple(entries),
        positions=dict(header.positions),
        bindings=header.bindings,
        ended_epochs=header.ended_epochs,
    )


def split(data: bytes, max_chunk_bytes: int = MAX_CHUNK_BYTES) -> list[bytes]:
    """``data`` as chunk messages of at most ``max_chunk_bytes`` each."""
    room = max_chunk_bytes - CHUNK_HEADER.size
    pieces = [data[i : i + room] for i in range(0, len(data), room)] or [b""]
    return [
        CHUNK_HEADER.pack(MAGIC, FORMAT_VERSION, KIND_CHUNK, index, len(pieces)) + piece
        for index, piece in enumerate(pieces)
    ]


@dataclass(frozen=True)
class Refusal:
    """The owner's refusal of a hand-over (the reason and, when precise, the resume reason)."""

    reason: str
    resume_rejected: int | None = None


def encode_refusal(refusal: Refusal) -> bytes:
    """A refusal message."""
    body = json.dumps({"reason": refusal.reason, "resume_rejected": refusal.resume_rejected})
    return CHUNK_HEADER.pack(MAGIC, FORMAT_VERSION, KIND_REFUSAL, 0, 1) + body.encode()


_RESUME_REASONS: Final = frozenset(
    {
        livestream_pb2.RESUME_REJECTED_REASON_EPOCH_UNKNOWN,
        livestream_pb2.RESUME_REJECTED_REASON_EPOCH_ENDED,
        livestream_pb2.RESUME_REJECTED_REASON_CURSOR_OUTSIDE_WINDOW,
        livestream_pb2.RESUME_REJECTED_REASON_CURSOR_AHEAD,
    }
)


def decode_refusal(payload: bytes) -> Refusal:
    """A validated refusal body (what follows the chunk header)."""
    try:
        body = json.loads(payload)
        reason = body["reason"]
        resume = body.get("resume_rejected")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise HandoverRefused("BAD_FORMAT", "refusal is not valid") from None
    if not isinstance(reason, str) or len(reason) > 64:
        raise HandoverRefused("BAD_FORMAT", "refusal reason is not valid")
    if resume is not None and resume not in _RESUME_REASONS:
        raise HandoverRefused("BAD_FORMAT", "refusal names an unknown resume reason")
    return Refusal(reason, resume)


class Reassembly:
    """Collects one state's chunks, in order, within a byte bound.

    :meth:`add` returns the whole state's bytes after the last chunk, ``None`` before it.
    A refusal message raises :class:`HandoverRefused` with the owner's reason.
    """

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._parts: list[bytes] = []
        self._size = 0
        self._total: int | None = None

    def add(self, message: bytes) -> bytes | None:
        """Take the next message.

        Raises:
            HandoverRefused: a refusal, or a message that is not the next valid chunk.
        """
        if len(message) < CHUNK_HEADER.size:
            raise HandoverRefused("BAD_FORMAT", "short chunk")
        magic, version, kind, index, total = CHUNK_HEADER.unpack_from(message)
        if magic != MAGIC:
            raise HandoverRefused("BAD_FORMAT", "not a hand-over message")
        if version != FORMAT_VERSION:
            raise HandoverRefused("UNSUPPORTED_VERSION", f"chunk version {version}")
        payload = message[CHUNK_HEADER.size :]
        if kind == KIND_REFUSAL:
            refusal = decode_refusal(payload)
            raise HandoverRefused(refusal.reason, "refused by the owner", refusal.resume_rejected)
        if kind != KIND_CHUNK:
            raise HandoverRefused("BAD_FORMAT", f"unknown message kind {kind}")
        if self._total is None:
            if not 1 <= total <= MAX_CHUNKS:
                raise HandoverRefused("TOO_LARGE", f"{total} chunks")
            self._total = total
        if total != self._total or index != len(self._parts):
            raise HandoverRefused("BAD_FORMAT", f"chunk {index}/{total} out of order")
        self._size += len(payload)
        if self._size > self._max_bytes:
            raise HandoverRefused("TOO_LARGE", f"state over {self._max_bytes} bytes")
        self._parts.append(payload)
        if len(self._parts) == self._total:
            return b"".join(self._parts)
        return None
