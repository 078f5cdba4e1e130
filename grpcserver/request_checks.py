"""Descriptor-driven checks every request message passes at the edge (SEC-2, SEC-4).

Two defects no per-RPC validator can be trusted to catch everywhere, checked generically by
walking the message's descriptor:

* **Unknown enum values.** Contract enums are proto3 (open) enums: protobuf keeps a number
  the contract does not define as a plain ``int`` instead of refusing it, so a mapping with a
  default (``MODES.get(mode, AGENT)``) would silently read it as something else. A value
  that is not a number of the field's enum is a field violation naming the field's path
  (``initial_input.mode``, ``items[2].turn_patch.phase``).
* **NUL characters in strings.** Postgres ``text`` cannot hold U+0000 (the driver refuses
  the value with ``DataError``) while SQLite stores it, so the same request would be an
  internal error on one backend and accepted on the other. No text field of the contracts
  needs one; it is refused on every backend.

The walk is iterative (a deeply nested message never meets Python's recursion limit),
visits only fields that are set (``ListFields``), and skips message types that can hold
neither an enum nor a string. It reports at most :data:`MAX_VIOLATIONS` violations.

Public API:
    request_violations(message, *, prefix="") -> list[FieldViolation]
    check_request(message) -> None: raises ``InvalidArgument`` (the usual reason
        ``INVALID_ARGUMENT`` of a field violation) listing every violation.
    mapped_enum(mapping, value, *, field) -> T: a wire enum value through a mapping; a value
        outside it is an ``InvalidArgument`` instead of a silent default.

The server interceptor calls :func:`check_request` for every unary request after
authentication; streaming handlers call :func:`request_violations` per message.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from functools import cache
from typing import Any, Final, TypeVar

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from domainerrors import FieldViolation, InvalidArgument

__all__ = [
    "MAX_VIOLATIONS",
    "check_request",
    "mapped_enum",
    "request_violations",
]

MAX_VIOLATIONS: Final = 20
"""At most this many violations are reported for one message (the rest are not listed)."""

UNKNOWN_ENUM: Final = "is not a value of {enum}"
HAS_NUL: Final = "must not contain NUL (U+0000) characters"

T = TypeVar("T")


@cache
def _checked(descriptor: Descriptor) -> bool:
    """Whether a message of this type can hold an enum or a string (transitively)."""
    seen: set[str] = set()
    pending = [descriptor]
    while pending:
        current = pending.pop()
        if current.full_name in seen:
            continue
        seen.add(current.full_name)
        for field in current.fields:
            if field.type in (FieldDescriptor.TYPE_ENUM, FieldDescriptor.TYPE_STRING):
                return True
            if field.message_type is not None:
                pending.append(field.message_type)
    return False


def _scalar(field: FieldDescriptor, value: Any) -> str | None:
    """The problem with one scalar value of ``field``, if any."""
    enum = field.enum_type
    if enum is not None:
        if value not in enum.values_by_number:
            return UNKNOWN_ENUM.format(enum=enum.full_name)
    elif field.type == FieldDescriptor.TYPE_STRING and "\x00" in value:
        return HAS_NUL
    return None


def request_violations(message: Message, *, prefix: str = "") -> list[FieldViolation]:
    """Every unknown enum value and NUL-containing string set in ``message``.

    Args:
        message: a decoded request (or stream frame).
        prefix: the path of ``message`` inside its request, prepended to every field path.

    Returns:
        Field violations in field order, at most :data:`MAX_VIOLATIONS`; empty when the
        message is clean.
    """
    violations: list[FieldViolation] = []
    pending: deque[tuple[str, Message]] = deque([(prefix, message)])
    while pending and len(violations) < MAX_VIOLATIONS:
        path, current = pending.popleft()
        if not _checked(current.DESCRIPTOR):
            continue
        for field, value in current.ListFields():
            name = f"{path}.{field.name}" if path else field.name
            _visit_field(field, value, name, violations, pending)
    return violations[:MAX_VIOLATIONS]


def _visit_field(
    field: FieldDescriptor,
    value: Any,
    name: str,
    violations: list[FieldViolation],
    pending: deque[tuple[str, Message]],
) -> None:
    """Check one set field at path ``name``; queue the messages it holds for the walk."""
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        _visit_map(entry, value, name, violations, pending)
    elif entry is not None:
        if field.is_repeated:
            pending.extend((f"{name}[{index}]", item) for index, item in enumerate(value))
        else:
            pending.append((name, value))
    elif field.is_repeated:
        for index, item in enumerate(value):
            if (problem := _scalar(field, item)) is not None:
                violations.append(FieldViolation(f"{name}[{index}]", problem))
    elif (problem := _scalar(field, value)) is not None:
        violations.append(FieldViolation(name, problem))


def _visit_map(
    entry: Descriptor,
    value: Any,
    name: str,
    violations: list[FieldViolation],
    pending: deque[tuple[str, Message]],
) -> None:
    """Check a map field's keys and scalar values; queue its message values for the walk."""
    key_field = entry.fields_by_name["key"]
    value_field = entry.fields_by_name["value"]
    for key, item in value.items():
        at = f"{name}[{key!r}]"
        problem = _scalar(key_field, key)
        if problem is not None:
            violations.append(FieldViolation(name, problem))
        if value_field.message_type is not None:
            pending.append((at, item))
        elif (problem := _scalar(value_field, item)) is not None:
            violations.append(FieldViolation(at, problem))


def check_request(message: Message) -> None:
    """Refuse a request with an unknown enum value or a NUL character (SEC-2).

    Raises:
        InvalidArgument: one field violation per value.
    """
    violations = request_violations(message)
    if violations:
        raise InvalidArgument(
            "; ".join(f"{v.field}: {v.description}" for v in violations),
            field_violations=violations,
        )


def mapped_enum(mapping: Mapping[Any, T], value: int, *, field: str) -> T:
    """``mapping[value]``, or an ``InvalidArgument`` naming ``field`` for any other value.

    For request enums that a handler maps to domain values: a value outside the mapping
    (unknown, or a defined value the RPC does not accept) is refused, never defaulted.

    Raises:
        InvalidArgument: one violation on ``field``.
    """
    try:
        return mapping[value]
    except KeyError:
        raise InvalidArgument.for_field(field, f"{value} is not an accepted value") from None
