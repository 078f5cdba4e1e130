"""Request bytes that do not decode: typed refusals instead of ``UNKNOWN`` (SEC-4).

gRPC decodes a request before any interceptor code runs, and a
``google.protobuf.message.DecodeError`` there (invalid UTF-8 in a string field, a
truncated varint, a length past the end, messages nested deeper than
:data:`MAX_DECODE_DEPTH` levels) would answer ``UNKNOWN`` with the exception's text and log
a traceback, before authentication. :func:`tolerant_deserializer` wraps a method's
deserializer so such bytes become an :class:`UndecodableRequest` value instead; the
interceptor authenticates the caller first and then refuses the call (or, on a stream, ends
it) with :func:`undecodable_error`: ``INVALID_ARGUMENT``, reason ``UNDECODABLE_REQUEST``, a
``BadRequest`` field violation naming the field where :func:`locate_decode_failure` can find
it, and one WARNING log line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from domainerrors import FieldViolation, InvalidArgument

__all__ = [
    "MAX_DECODE_DEPTH",
    "UNDECODABLE_REQUEST",
    "DecodeFailure",
    "UndecodableRequest",
    "locate_decode_failure",
    "tolerant_deserializer",
    "undecodable_error",
]

UNDECODABLE_REQUEST = "UNDECODABLE_REQUEST"
"""``ErrorInfo.reason`` of a request whose bytes are not a valid message of its type."""

MAX_DECODE_DEPTH = 100
"""Deepest message nesting the protobuf runtime (upb) decodes, the request message itself
counted as level 1; a deeper request is undecodable."""

_LOCATE_BUDGET = 100_000
"""Most fields :func:`locate_decode_failure` reads before it gives up (it runs only on
bytes that already failed to decode, so a hostile request cannot make it expensive)."""

_SHOWN_SEGMENTS = 6
"""Path segments shown in a violation before the rest is elided (deep nesting)."""


@dataclass(frozen=True)
class DecodeFailure:
    """Where and why bytes failed to decode.

    Attributes:
        field: Dotted path of the offending field (``apps[0].app_id``), ``""`` when the
            problem is not inside a known field.
        description: What is wrong, in words a caller can act on.
    """

    field: str
    description: str


@dataclass(frozen=True)
class UndecodableRequest:
    """Stands in for a request (or stream message) whose bytes did not decode.

    Attributes:
        message_type: Full proto name of the expected message.
        size_bytes: Length of the bytes received.
        failure: Where and why, as far as it could be found.
    """

    message_type: str
    size_bytes: int
    failure: DecodeFailure


def tolerant_deserializer(
    deserializer: Callable[[bytes], Any] | None,
) -> Callable[[bytes], Any] | None:
    """Wrap ``deserializer`` so undecodable bytes give an :class:`UndecodableRequest`.

    The deserializer of a generated servicer is the message class's ``FromString``; any
    exception from it means the caller sent bytes that are not such a message.
    """
    if deserializer is None:
        return None
    message_class = getattr(deserializer, "__self__", None)
    descriptor = getattr(message_class, "DESCRIPTOR", None)
    if not isinstance(descriptor, Descriptor):
        descriptor = None

    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as error:  # noqa: BLE001 - bytes from the caller: refused, typed
            name = descriptor.full_name if descriptor is not None else "request"
            failure = None
            if descriptor is not None:
                try:
                    failure = locate_decode_failure(descriptor, raw)
                except Exception:  # noqa: BLE001 - a best-effort hint must never fail the refusal
                    failure = None
            if failure is None:
                failure = DecodeFailure("", _cause(error))
            return UndecodableRequest(name, len(raw), failure)

    return deserialize


def undecodable_error(request: UndecodableRequest) -> InvalidArgument:
    """The refusal sent for ``request``: ``INVALID_ARGUMENT`` ``UNDECODABLE_REQUEST``."""
    failure = request.failure
    where = f"{failure.field}: " if failure.field else ""
    return InvalidArgument(
        f"the request is not a valid {request.message_type}: {where}{failure.description}",
        field_violations=[FieldViolation(failure.field, failure.description)]
        if failure.field
        else (),
        reason=UNDECODABLE_REQUEST,
        metadata={"message_type": request.message_type, "size_bytes": str(request.size_bytes)},
    )


def _cause(error: Exception) -> str:
    text = str(error)
    if "MaxDepth" in text:
        return f"messages nest more than {MAX_DECODE_DEPTH} levels deep"
    if "UTF-8" in text:
        return "a string field is not valid UTF-8"
    return "the bytes are not a valid protobuf encoding"


class _Corrupt(Exception):
    def __init__(self, failure: DecodeFailure) -> None:
        super().__init__(failure.description)
        self.failure = failure


class _GiveUp(Exception):
    """The walk met something it does not model (groups) or ran out of budget."""


def _join(path: list[str]) -> str:
    if len(path) <= _SHOWN_SEGMENTS:
        return ".".join(path)
    return ".".join(path[:_SHOWN_SEGMENTS]) + ".…"


def locate_decode_failure(descriptor: Descriptor, data: bytes) -> DecodeFailure | None:
    """Find the field where ``data`` stops being a valid ``descriptor`` message.

    A small wire-format walk that checks what the protobuf runtime checks: tags, varints,
    lengths, UTF-8 of string fields, and nesting depth (:data:`MAX_DECODE_DEPTH`, checked
    before descending). It reads at most a fixed number of fields.

    Returns:
        The failure, or ``None`` when the walk finds nothing wrong or gives up.
    """
    walker = _Walker()
    try:
        walker.message(descriptor, memoryview(data), [], depth=1)
    except _Corrupt as corrupt:
        return corrupt.failure
    except _GiveUp:
        return None
    return None


class _Walker:
    def __init__(self) -> None:
        self.budget = _LOCATE_BUDGET

    def message(
        self, descriptor: Descriptor, data: memoryview, path: list[str], *, depth: int
    ) -> None:
        position = 0
        seen: dict[int, int] = {}
        while position < len(data):
            self.budget -= 1
            if self.budget < 0:
                raise _GiveUp
            tag, position = _varint(data, position, path, "a field tag is truncated")
            number, wire_type = tag >> 3, tag & 7
            if number == 0:
                raise _Corrupt(DecodeFailure(_join(path), "holds a field with number 0"))
            field = descriptor.fields_by_number.get(number)
            if field is None:
                where = path
            else:
                index = seen.get(number, 0)
                seen[number] = index + 1
                segment = f"{field.name}[{index}]" if _is_repeated(field) else field.name
                where = [*path, segment]
            if wire_type == 0:
                _, position = _varint(data, position, where, "a varint is truncated")
            elif wire_type == 1:
                position = _skip(data, position, 8, where)
            elif wire_type == 5:
                position = _skip(data, position, 4, where)
            elif wire_type == 2:
                length, position = _varint(data, position, where, "a length is truncated")
                end = _skip(data, position, length, where)
                self.value(field, data[position:end], where, depth=depth)
                position = end
            elif wire_type in (3, 4):
                raise _GiveUp  # groups: proto2 only, never in our contracts
            else:
                raise _Corrupt(DecodeFailure(_join(where), f"uses invalid wire type {wire_type}"))

    def value(
        self, field: FieldDescriptor | None, data: memoryview, path: list[str], *, depth: int
    ) -> None:
        if field is None:
            return
        if field.type == FieldDescriptor.TYPE_STRING:
            try:
                str(data, "utf-8")
            except UnicodeDecodeError:
                raise _Corrupt(DecodeFailure(_join(path), "is not valid UTF-8")) from None
        elif field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None:
            # Checked before descending, so the walk itself never goes deeper than the limit.
            if depth + 1 > MAX_DECODE_DEPTH:
                raise _Corrupt(
                    DecodeFailure(
                        _join(path), f"messages nest more than {MAX_DECODE_DEPTH} levels deep"
                    )
                )
            self.message(field.message_type, data, path, depth=depth + 1)


def _is_repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated and not (
        field.message_type is not None and field.message_type.GetOptions().map_entry
    )


def _varint(data: memoryview, position: int, path: list[str], problem: str) -> tuple[int, int]:
    value = 0
    for shift in range(0, 70, 7):
        if position >= len(data):
            raise _Corrupt(DecodeFailure(_join(path), problem))
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
    raise _Corrupt(DecodeFailure(_join(path), "a varint is longer than 10 bytes"))


def _skip(data: memoryview, position: int, length: int, path: list[str]) -> int:
    end = position + length
    if end > len(data):
        raise _Corrupt(DecodeFailure(_join(path), "runs past the end of its message"))
    return end
