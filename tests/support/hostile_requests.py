"""Hostile requests generated from protobuf descriptors, for the hostile-input suite (SEC-4).

Nothing here knows a service: every strategy walks a message ``Descriptor``, so a new
RPC or field is covered without a change.

* :func:`hostile_message` — a valid-shaped message of any type whose values are hostile:
  empty, huge and odd-Unicode strings, integers at and past their bounds, unknown enum
  numbers, long repeated fields, nested messages; workspace fields mostly name the
  caller's workspace so the call gets past authorization and reaches the handler.
* :func:`undecodable_bytes` — bytes that are not a message of the type: invalid UTF-8 in
  each string field, truncated varints, a length past the end, random bytes.
* :func:`nested_bytes` / :func:`recursion_paths` — a chain of a recursive message type
  nested ``levels`` deep, found generically (``ArtifactGroupTree.groups``,
  ``ToolCallSnapshot.steps``, ``google.protobuf.Struct`` ...).
* :func:`oversize_bytes` — a request whose first string field holds ``size`` bytes.
* :func:`mistyped_bytes` — each field of a message sent with every wire type but its own
  (a parser keeps such a field as an unknown field, so the handler sees it unset).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

__all__ = [
    "HOSTILE_STRINGS",
    "KNOWN_IDS",
    "field_bytes",
    "hostile_message",
    "mistyped_bytes",
    "nested_bytes",
    "oversize_bytes",
    "recursion_paths",
    "undecodable_bytes",
    "varint",
]

HOSTILE_STRINGS: tuple[str, ...] = (
    "",
    " ",
    "\x00",
    "ws-1\x00",
    "\x00\x01\x02\x1b[31m\x7f",
    "\r\n\t\x0b\x0c",
    "\u202etxt.exe",
    "\ufeff",
    "\ufffd",
    "\uffff",
    "\U0010ffff",
    "\u0301" * 64,
    "\U0001f3f3\ufe0f\u200d\U0001f308",
    "\u200b\u200c\u200d\u2060",
    "../../../../etc/passwd",
    "'; DROP TABLE sessions; --",
    '" OR 1=1 --',
    "%s%s%n%x",
    "${jndi:ldap://x}",
    "mention://workspace-reference/../../",
    "null",
    "NaN",
    "-1",
    "9" * 40,
    "*",
    "%",
    "_",
)
"""Strings that have broken parsers, filters, terminals or SQL somewhere."""

_INT_EDGES = (
    0,
    1,
    -1,
    2**31 - 1,
    -(2**31),
    2**31,
    2**32 - 1,
    2**53 - 1,
    2**53,
    2**53 + 1,
    2**62,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
)

_RANGES: dict[int, tuple[int, int]] = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}

KNOWN_IDS: tuple[str, ...] = ("s-1", "s-del", "demo", "ws-1", "explorer", "t-1", "conversations")
"""Ids the hostile-input suite stores before it starts (a target, a live and a deleted
Session in ``ws-1``, a settled Turn of the live one, their rail section)."""

_WORKSPACE_FIELDS = frozenset({"workspace_id", "workspace_ids"})


def _strings() -> st.SearchStrategy[str]:
    huge = st.builds(
        lambda unit, count: unit * count,
        st.sampled_from(["a", "\u00e9", "\U0001f600", "\x00", "\u0301"]),
        st.sampled_from([1_025, 4_097, 65_537, 300_001]),
    )
    text = st.text(st.characters(codec="utf-8"), max_size=40)
    return st.one_of(st.sampled_from(HOSTILE_STRINGS), text, huge)


def _integers(field_type: int) -> st.SearchStrategy[int]:
    low, high = _RANGES[field_type]
    edges = [value for value in _INT_EDGES if low <= value <= high]
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def _floats() -> st.SearchStrategy[float]:
    edges = [0.0, -0.0, math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, 2.0**53]
    return st.one_of(st.sampled_from(edges), st.floats(allow_nan=True))


def _enum_numbers(field: FieldDescriptor) -> st.SearchStrategy[int]:
    enum = field.enum_type
    assert enum is not None
    known = [value.number for value in enum.values]
    unknown = [max(known) + 1, -1, 2**31 - 1, -(2**31), 999]
    if enum.is_closed:
        return st.sampled_from(known)
    return st.one_of(st.sampled_from(known), st.sampled_from(unknown))


def _workspace(workspaces: Sequence[str]) -> st.SearchStrategy[str]:
    # Mostly a workspace of the caller so the handler runs; sometimes hostile.
    return st.one_of(
        st.sampled_from(list(workspaces)),
        st.sampled_from(list(workspaces)),
        st.sampled_from(list(workspaces)),
        _strings(),
    )


def _scalar(field: FieldDescriptor, workspaces: Sequence[str]) -> st.SearchStrategy[Any]:
    kind = field.type
    if field.name in _WORKSPACE_FIELDS and kind == FieldDescriptor.TYPE_STRING:
        return _workspace(workspaces)
    if kind == FieldDescriptor.TYPE_STRING and field.name.endswith(("_id", "_ids")):
        # Ids of stored records now and then, so handlers get past NOT_FOUND.
        return st.one_of(st.sampled_from(KNOWN_IDS), _strings())
    if kind == FieldDescriptor.TYPE_STRING:
        return _strings()
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.just(b"\xff" * 70_000))
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return _floats()
    if kind == FieldDescriptor.TYPE_ENUM:
        return _enum_numbers(field)
    return _integers(kind)


def _count() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(0, 3), st.sampled_from([0, 1, 2, 257, 2_000]))


@st.composite
def _fill(
    draw: st.DrawFn,
    descriptor: Descriptor,
    workspaces: Sequence[str],
    depth: int,
    max_depth: int,
) -> Message:
    message = GetMessageClass(descriptor)()
    for field in descriptor.fields:
        if field.name not in _WORKSPACE_FIELDS and not draw(st.booleans()):
            continue
        if field.message_type is not None:
            if depth >= max_depth:
                continue
            _fill_message_field(draw, message, field, workspaces, depth, max_depth)
            continue
        values = _scalar(field, workspaces)
        if _is_repeated(field):
            count = draw(_count())
            if count > 3:
                # A long list repeats one value: long without costing many draws.
                getattr(message, field.name).extend([draw(values)] * count)
            else:
                getattr(message, field.name).extend(draw(values) for _ in range(count))
        else:
            setattr(message, field.name, draw(values))
    return message


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _fill_message_field(
    draw: st.DrawFn,
    message: Message,
    field: FieldDescriptor,
    workspaces: Sequence[str],
    depth: int,
    max_depth: int,
) -> None:
    child = field.message_type
    assert child is not None
    target = getattr(message, field.name)
    if child.GetOptions().map_entry:
        key_field, value_field = child.fields_by_name["key"], child.fields_by_name["value"]
        for _ in range(draw(st.integers(0, 3))):
            key = draw(_scalar(key_field, workspaces))
            if value_field.message_type is not None:
                target[key].CopyFrom(
                    draw(_fill(value_field.message_type, workspaces, depth + 1, max_depth))
                )
            else:
                target[key] = draw(_scalar(value_field, workspaces))
        return
    nested = _fill(child, workspaces, depth + 1, max_depth)
    if _is_repeated(field):
        count = draw(_count())
        if count > 3:
            one = draw(nested)
            for _ in range(count):
                target.add().CopyFrom(one)
        else:
            for _ in range(count):
                target.add().CopyFrom(draw(nested))
    else:
        target.CopyFrom(draw(nested))


def hostile_message(
    descriptor: Descriptor, workspaces: Sequence[str] = ("ws-1",), max_depth: int = 4
) -> st.SearchStrategy[Message]:
    """Valid-shaped messages of ``descriptor`` with hostile values.

    Args:
        descriptor: The message type.
        workspaces: Workspaces of the caller; ``workspace_id`` fields usually name one.
        max_depth: How many message levels below the top are filled.
    """
    return _fill(descriptor, tuple(workspaces), 0, max_depth)


def varint(value: int) -> bytes:
    """``value`` as a protobuf base-128 varint (two's complement for negatives)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field_bytes(number: int, payload: bytes) -> bytes:
    """One length-delimited field (wire type 2)."""
    return varint((number << 3) | 2) + varint(len(payload)) + payload


def _string_fields(descriptor: Descriptor) -> list[FieldDescriptor]:
    return [field for field in descriptor.fields if field.type == FieldDescriptor.TYPE_STRING]


def undecodable_bytes(descriptor: Descriptor) -> st.SearchStrategy[bytes]:
    """Bytes that are not a valid encoding of ``descriptor`` (and random bytes)."""
    cases: list[bytes] = [
        bytes.fromhex("0880"),  # field 1 varint, continuation promises a byte
        bytes.fromhex("08ffffffffffffffffffff01"),  # an 11-byte varint
        bytes.fromhex("0a05ab"),  # length past the end
        bytes.fromhex("0a"),  # a tag and nothing
        bytes.fromhex("00"),  # field number 0
        bytes.fromhex("0f"),  # wire type 7
        bytes.fromhex("0b0c"),  # a group start and a mismatched end
    ]
    for field in _string_fields(descriptor):
        cases.append(field_bytes(field.number, b"\xff\xfe"))
        cases.append(field_bytes(field.number, b"ok\xc3\x28"))
        cases.append(field_bytes(field.number, b"\xed\xa0\x80"))  # an encoded surrogate
    for field in descriptor.fields:
        if field.message_type is not None:
            cases.append(field_bytes(field.number, bytes.fromhex("0880")))
            for inner in _string_fields(field.message_type):
                cases.append(field_bytes(field.number, field_bytes(inner.number, b"\xff")))
    return st.one_of(st.sampled_from(cases), st.binary(min_size=1, max_size=64))


def recursion_paths(descriptor: Descriptor) -> list[tuple[list[int], list[int]]]:
    """Ways to nest ``descriptor`` deeply: ``(prefix, cycle)`` lists of field numbers.

    ``prefix`` leads from the request to a message type that holds itself again through
    the fields of ``cycle``. One path per recursive type reachable from ``descriptor``.
    """
    found: dict[str, tuple[list[int], list[int]]] = {}

    def cycle_of(start: Descriptor) -> list[int] | None:
        # Breadth-first from ``start`` back to ``start``.
        frontier: list[tuple[Descriptor, list[int]]] = [(start, [])]
        seen: set[str] = set()
        while frontier:
            current, path = frontier.pop(0)
            for field in current.fields:
                child = field.message_type
                if child is None or child.GetOptions().map_entry:
                    continue
                if child.full_name == start.full_name:
                    return [*path, field.number]
                if child.full_name not in seen:
                    seen.add(child.full_name)
                    frontier.append((child, [*path, field.number]))
        return None

    def walk(current: Descriptor, prefix: list[int], visited: set[str]) -> None:
        if current.full_name in visited:
            return
        visited.add(current.full_name)
        if current.full_name not in found:
            cycle = cycle_of(current)
            if cycle is not None:
                found[current.full_name] = (prefix, cycle)
        for field in current.fields:
            child = field.message_type
            if child is not None and not child.GetOptions().map_entry:
                walk(child, [*prefix, field.number], visited)

    walk(descriptor, [], set())
    return list(found.values())


def nested_bytes(prefix: Sequence[int], cycle: Sequence[int], levels: int, head: bytes) -> bytes:
    """``head`` (the request's own fields) plus ``cycle`` repeated ``levels`` times below
    ``prefix``: the request nested ``len(prefix) + levels * len(cycle)`` messages deep."""
    inner = b""
    for _ in range(levels):
        for number in reversed(cycle):
            inner = field_bytes(number, inner)
    for number in reversed(prefix):
        inner = field_bytes(number, inner)
    return head + inner


def oversize_bytes(descriptor: Descriptor, head: bytes, size: int) -> bytes | None:
    """``head`` plus ``size`` bytes of ``a`` in the first string field that is not a
    workspace field (``None`` when the type has none)."""
    for field in _string_fields(descriptor):
        if field.name not in _WORKSPACE_FIELDS:
            return head + field_bytes(field.number, b"a" * size)
    return None


_WIRE_TYPE: dict[int, int] = {
    FieldDescriptor.TYPE_DOUBLE: 1,
    FieldDescriptor.TYPE_FIXED64: 1,
    FieldDescriptor.TYPE_SFIXED64: 1,
    FieldDescriptor.TYPE_FLOAT: 5,
    FieldDescriptor.TYPE_FIXED32: 5,
    FieldDescriptor.TYPE_SFIXED32: 5,
    FieldDescriptor.TYPE_STRING: 2,
    FieldDescriptor.TYPE_BYTES: 2,
    FieldDescriptor.TYPE_MESSAGE: 2,
}
"""Wire type of each field type that is not a varint (wire type 0)."""


def _encoded(number: int, wire_type: int) -> bytes:
    """One field ``number`` of ``wire_type`` with a small, well-formed payload."""
    tag = varint((number << 3) | wire_type)
    if wire_type == 0:
        return tag + varint(2**64 - 1)
    if wire_type == 1:
        return tag + b"\xff" * 8
    if wire_type == 5:
        return tag + b"\xff" * 4
    return field_bytes(number, b"ws-1")


def mistyped_bytes(descriptor: Descriptor) -> list[bytes]:
    """Each field of ``descriptor`` encoded with every wire type (0, 1, 2, 5) but its own.

    The bytes are well formed: the parser keeps a mistyped field as an unknown field, so
    the handler sees the field unset (a packed repeated scalar takes wire type 2 too, so
    it is left out of that one). A server must answer as for the field left unset.
    """
    cases: list[bytes] = []
    for field in descriptor.fields:
        own = _WIRE_TYPE.get(field.type, 0)
        for wire_type in (0, 1, 2, 5):
            if wire_type == own or (wire_type == 2 and _is_repeated(field)):
                continue
            cases.append(_encoded(field.number, wire_type))
    return cases
