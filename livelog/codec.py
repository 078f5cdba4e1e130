"""How items become bytes on a bus (only the JetStream engine encodes; ADR 0036).

The in-process log hands the item objects themselves to subscribers (today's cost, no copy);
the JetStream log encodes each item with a codec. Host's items travel as protobuf messages
(the contracts' own wire form), so :class:`ProtobufCodec` is the codec of production use.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from google.protobuf.message import DecodeError, Message

__all__ = ["BytesCodec", "Codec", "ItemDecodeError", "ProtobufCodec"]

T = TypeVar("T")
M = TypeVar("M", bound=Message)


class ItemDecodeError(ValueError):
    """A stored item's bytes are not a valid item of the codec."""


class Codec(Protocol[T]):
    """Turns an item into bytes and back."""

    def encode(self, item: T) -> bytes:
        """The item's bytes."""
        ...

    def decode(self, data: bytes) -> T:
        """The item of ``data``.

        Raises:
            ItemDecodeError: ``data`` is not an item of this codec.
        """
        ...


class BytesCodec:
    """Items that already are bytes."""

    def encode(self, item: bytes) -> bytes:
        """Return the item unchanged."""
        return item

    def decode(self, data: bytes) -> bytes:
        """Return the bytes unchanged."""
        return data


class ProtobufCodec(Generic[M]):
    """Items that are messages of one protobuf type."""

    def __init__(self, message_type: type[M]) -> None:
        self._message_type = message_type

    def encode(self, item: M) -> bytes:
        """The message's wire bytes."""
        return item.SerializeToString()

    def decode(self, data: bytes) -> M:
        """Parse ``data`` as the codec's message type.

        Raises:
            ItemDecodeError: ``data`` is not a valid message.
        """
        message = self._message_type()
        try:
            message.ParseFromString(data)
        except DecodeError as error:
            raise ItemDecodeError(str(error)) from error
        return message
