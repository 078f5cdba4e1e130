"""Wire bytes of deliveries and frames, composed without re-encoding (LIVE-FRAME-1).

A delivery is encoded once, without its sequence, as a *body*; each publisher writes the
``sequence`` field (field 1, a varint) in front of the body. Protobuf accepts fields in
any order, so ``sequence_tag + varint(sequence) + body`` is a valid ``Delivery``. A frame
(``DeviceLinkResponse.deliveries``) is likewise composed from encoded deliveries, so a
delivery fanned out to many devices is encoded once, not once per device.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentactivity.livestream.v1 import livestream_pb2

__all__ = [
    "FRAME_OVERHEAD_BYTES",
    "batch_frame",
    "body_of",
    "delivery_bytes",
    "delivery_entry_size",
    "frame_bytes",
    "varint",
]

_SEQUENCE_TAG = b"\x08"  # Delivery.sequence: field 1, varint
_LEN_FIELD_1 = b"\x0a"  # field 1, length-delimited
_LEN_FIELD_2 = b"\x12"  # field 2, length-delimited

FRAME_OVERHEAD_BYTES = 1 + 5
"""Bytes a ``DeviceLinkResponse`` adds around its ``DeliveryBatch`` (tag + length)."""


def varint(value: int) -> bytes:
    """The base-128 varint encoding of a non-negative integer."""
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def body_of(delivery: livestream_pb2.Delivery) -> bytes:
    """The encoded delivery without its sequence (``delivery.sequence`` must be 0)."""
    return delivery.SerializeToString()


def delivery_bytes(sequence: int, body: bytes) -> bytes:
    """The encoded ``Delivery`` with ``sequence`` written in front of ``body``."""
    return _SEQUENCE_TAG + varint(sequence) + body


def delivery_entry_size(encoded_delivery_length: int) -> int:
    """Bytes one encoded delivery takes inside a ``DeliveryBatch`` (tag, length, bytes)."""
    return 1 + len(varint(encoded_delivery_length)) + encoded_delivery_length


def batch_frame(epoch: str, deliveries: Sequence[bytes]) -> bytes:
    """An encoded ``DeviceLinkResponse`` carrying ``deliveries`` of ``epoch``."""
    epoch_bytes = epoch.encode()
    parts = [_LEN_FIELD_1, varint(len(epoch_bytes)), epoch_bytes]
    for encoded in deliveries:
        parts += (_LEN_FIELD_2, varint(len(encoded)), encoded)
    batch = b"".join(parts)
    return _LEN_FIELD_1 + varint(len(batch)) + batch


def frame_bytes(response: livestream_pb2.DeviceLinkResponse) -> bytes:
    """An encoded unsequenced frame (``stream_ready``, ``heartbeat``)."""
    return response.SerializeToString()


def batch_header_size(epoch: str) -> int:
    """Bytes of a ``DeliveryBatch`` before its first delivery (the epoch field)."""
    length = len(epoch.encode())
    return 1 + len(varint(length)) + length
