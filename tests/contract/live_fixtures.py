"""The golden wire fixtures of the live device protocol, and what checks them.

The fixtures are data under ``tests/contract/fixtures/livestream/live-protocol-<n>/``
(one directory per ``LiveProtocolRevision``; see its ``README.md``). This module loads
them and holds the checks shared by the offline tests (``tests/contract/test_live_wire.py``)
and the live-server tests (``tests/integration/livestream/test_live_contract.py``):

* :func:`closed_protocol_violations` — the closed-vocabulary rules of LIVE-REV-1 / CON-6
  applied to one decoded frame, as a client of the current revision applies them;
* :func:`schema_of` — the revision's schema (messages, field numbers, kinds, enums) as
  data, compared with ``schema.json``;
* :func:`normalised` / :func:`shape` — a frame with volatile values (epochs, generated
  ids, clocks) replaced, and the set of field paths it carries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format, unknown_fields
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from agentactivity.livestream.v1 import livestream_pb2
from services.livestream.link import CURRENT_REVISION

__all__ = [
    "FIXTURES",
    "MAX_SEQUENCE",
    "REVISION_DIR",
    "GoldenMessage",
    "Refusal",
    "closed_protocol_violations",
    "load_frames",
    "load_protocol_errors",
    "load_refusals",
    "load_requests",
    "normalised",
    "schema_of",
    "shape",
]

FIXTURES = Path(__file__).parent / "fixtures" / "livestream"
REVISION_DIR = FIXTURES / f"live-protocol-{int(CURRENT_REVISION)}"
"""The fixtures of the current revision; released revisions keep theirs, frozen."""
MAX_SEQUENCE = 2**53 - 1
LIVE_PACKAGE = "agentactivity.livestream.v1"


@dataclass(frozen=True)
class GoldenMessage:
    """One golden message: its exact bytes and its readable (proto3 JSON) form."""

    name: str
    description: str
    spec: tuple[str, ...]
    data: bytes
    readable: dict[str, Any]


@dataclass(frozen=True)
class Refusal:
    """A DeviceLink call that must end with one typed error.

    ``send`` are the request bytes in order (``readable`` their JSON form, ``None`` for
    bytes that are no valid request); the call stays open after them (a half-close does
    not end a link), so the error is what ends it.
    """

    name: str
    spec: tuple[str, ...]
    principal: str
    send: tuple[bytes, ...]
    readable: tuple[dict[str, Any] | None, ...]
    code: str
    reason: str | None
    metadata: dict[str, str] | None
    fields: frozenset[str]


def _document(name: str, directory: Path = REVISION_DIR) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((directory / name).read_text(encoding="utf-8"))
    return document


def _golden(entries: list[dict[str, Any]]) -> list[GoldenMessage]:
    return [
        GoldenMessage(
            name=entry["name"],
            description=entry["description"],
            spec=tuple(entry["spec"]),
            data=bytes.fromhex(entry["hex"]),
            readable=entry["json"],
        )
        for entry in entries
    ]


def load_frames(directory: Path = REVISION_DIR) -> list[GoldenMessage]:
    """``frames.json``: golden ``DeviceLinkResponse`` frames."""
    return _golden(_document("frames.json", directory)["frames"])


def load_requests(directory: Path = REVISION_DIR) -> list[GoldenMessage]:
    """``requests.json``: golden ``DeviceLinkRequest`` messages."""
    return _golden(_document("requests.json", directory)["requests"])


def load_refusals(directory: Path = REVISION_DIR) -> list[Refusal]:
    """``refusals.json``: typed refusals of ``DeviceLink``."""
    cases = []
    for entry in _document("refusals.json", directory)["cases"]:
        error = entry["error"]
        cases.append(
            Refusal(
                name=entry["name"],
                spec=tuple(entry["spec"]),
                principal=entry["principal"],
                send=tuple(bytes.fromhex(request["hex"]) for request in entry["send"]),
                readable=tuple(request["json"] for request in entry["send"]),
                code=error["code"],
                reason=error.get("reason"),
                metadata=error.get("metadata"),
                fields=frozenset(v["field"] for v in error.get("fieldViolations", [])),
            )
        )
    return cases


def load_protocol_errors(directory: Path = REVISION_DIR) -> list[dict[str, Any]]:
    """``protocol_errors.json``: frames a client of the revision must reject."""
    frames: list[dict[str, Any]] = _document("protocol_errors.json", directory)["frames"]
    return frames


# --------------------------------------------------------------------- closed protocol


def _live(descriptor: Any) -> bool:  # a Descriptor or EnumDescriptor (upb or Python)
    return str(descriptor.full_name).startswith(LIVE_PACKAGE + ".")


def _is_repeated(field: Any) -> bool:
    return bool(field.is_repeated)


def closed_protocol_violations(
    frame: livestream_pb2.DeviceLinkResponse, revision: int = CURRENT_REVISION
) -> list[tuple[str, str]]:
    """``(kind, path)`` of every rule of the closed protocol the decoded frame breaks.

    The rules a client of ``revision`` applies (LIVE-REV-1, CON-6, LIVE-FRAME-1): every
    oneof of the livestream package is set; no livestream message carries a field this
    revision does not know; every livestream enum holds a known value and a
    ``*_UNSPECIFIED`` one only where it is not a reason or revision; ``stream_ready``
    names the client's own revision (a known older one too is another revision); a batch
    names its epoch and carries at least one delivery, whose sequences are within
    1..2^53-1 and each the previous plus 1. Canonical entities (Turn, Interaction,
    MessageDelta) are not judged here: they carry their own vocabulary (CON-7).
    """
    found: list[tuple[str, str]] = []
    _check(frame, "", found)
    if frame.WhichOneof("kind") == "stream_ready":
        named = int(frame.stream_ready.protocol_revision)
        known = named in livestream_pb2.LiveProtocolRevision.DESCRIPTOR.values_by_number
        if known and named not in (0, revision):  # unknown or unspecified: already found
            found.append(("another_revision", "stream_ready.protocol_revision"))
    if frame.WhichOneof("kind") == "deliveries":
        batch = frame.deliveries
        if not batch.epoch:
            found.append(("missing_epoch", "deliveries.epoch"))
        if not batch.deliveries:
            found.append(("empty_batch", "deliveries.deliveries"))
        previous: int | None = None
        for index, delivery in enumerate(batch.deliveries):
            path = f"deliveries.deliveries[{index}].sequence"
            if not 1 <= delivery.sequence <= MAX_SEQUENCE:
                found.append(("sequence_out_of_range", path))
            elif previous is not None and delivery.sequence != previous + 1:
                found.append(("sequence_gap", path))
            previous = delivery.sequence
    return found


def _check(message: Message, path: str, found: list[tuple[str, str]]) -> None:
    descriptor = message.DESCRIPTOR
    if not _live(descriptor):
        return
    if len(unknown_fields.UnknownFieldSet(message)):
        found.append(("unknown_field", path))
    for oneof in descriptor.oneofs:
        if oneof.name.startswith("_"):
            continue  # a proto3 ``optional`` field, not a choice of kinds
        if message.WhichOneof(oneof.name) is None:
            found.append(("unset_oneof", _join(path, oneof.name)))
    for field in descriptor.fields:
        here = _join(path, field.name)
        if field.enum_type is not None and _live(field.enum_type):
            values = getattr(message, field.name)
            for value in values if _is_repeated(field) else [values]:
                _check_enum(field, int(value), here, found)
        elif field.message_type is not None:
            if _is_repeated(field):
                for index, child in enumerate(getattr(message, field.name)):
                    _check(child, f"{here}[{index}]", found)
            elif message.HasField(field.name):
                _check(getattr(message, field.name), here, found)


def _check_enum(field: Any, value: int, path: str, found: list[tuple[str, str]]) -> None:
    enum = field.enum_type
    assert enum is not None
    if value not in enum.values_by_number:
        found.append(("unknown_enum_value", path))
    elif value == 0:
        found.append(("unspecified_enum_value", path))


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# ------------------------------------------------------------------------------ schema

_TYPE_NAMES = {
    getattr(FieldDescriptor, name): name.removeprefix("TYPE_").lower()
    for name in dir(FieldDescriptor)
    if name.startswith("TYPE_")
}


def schema_of(package: Any = livestream_pb2) -> dict[str, Any]:
    """Every message and enum a DeviceLink carries, as ``schema.json`` records them:
    field numbers, names, types, cardinality, oneof membership, enum values."""
    messages: dict[str, list[dict[str, Any]]] = {}
    enums: dict[str, dict[str, int]] = {}

    def enum(descriptor: EnumDescriptor) -> None:
        enums.setdefault(descriptor.full_name, {v.name: v.number for v in descriptor.values})

    def walk(descriptor: Descriptor) -> None:
        if descriptor.full_name in messages:
            return
        fields: list[dict[str, Any]] = []
        messages[descriptor.full_name] = fields
        for field in descriptor.fields:
            entry: dict[str, Any] = {
                "number": field.number,
                "name": field.name,
                "type": _TYPE_NAMES[field.type],
            }
            oneof = field.containing_oneof
            synthetic = oneof is not None and oneof.name == "_" + field.name
            if _is_repeated(field):
                entry["repeated"] = True
            elif synthetic or (field.has_presence and oneof is None and field.message_type is None):
                entry["optional"] = True
            if field.message_type is not None:
                entry["typeName"] = field.message_type.full_name
            if field.enum_type is not None:
                entry["typeName"] = field.enum_type.full_name
                enum(field.enum_type)
            if oneof is not None and not synthetic:
                entry["oneof"] = oneof.name
            fields.append(entry)
        for field in descriptor.fields:
            if field.message_type is not None:
                walk(field.message_type)

    for name in ("DeviceLinkRequest", "DeviceLinkResponse"):
        walk(package.DESCRIPTOR.message_types_by_name[name])
    for name in ("LiveProtocolRevision", "DeviceLinkErrorReason"):
        enum(package.DESCRIPTOR.enum_types_by_name[name])
    return {"messages": dict(sorted(messages.items())), "enums": dict(sorted(enums.items()))}


def load_schema(directory: Path = REVISION_DIR) -> dict[str, Any]:
    """``schema.json`` without its header."""
    document = _document("schema.json", directory)
    return {"messages": document["messages"], "enums": document["enums"]}


# ----------------------------------------------------------------------- normalising

_VOLATILE_SUFFIX = "UnixMs"


class Names:
    """Stable placeholders for volatile values, numbered in order of first appearance."""

    def __init__(self, patterns: dict[str, str]) -> None:
        self._patterns = {label: re.compile(pattern) for label, pattern in patterns.items()}
        self._seen: dict[str, str] = {}
        self._counts: dict[str, int] = {}

    def __call__(self, value: str, label: str) -> str:
        if value not in self._seen:
            self._counts[label] = self._counts.get(label, 0) + 1
            self._seen[value] = f"<{label}-{self._counts[label]}>"
        return self._seen[value]

    def text(self, value: str) -> str:
        """``value`` with every generated id inside it replaced."""
        for label, pattern in self._patterns.items():
            value = pattern.sub(lambda m, lbl=label: self(m.group(0), lbl), value)  # type: ignore[misc]
        return value


EPOCH_FIELDS = frozenset({"epoch"})


def normalised(readable: Any, names: Names) -> Any:
    """``readable`` (proto3 JSON) with epochs, generated ids and clocks replaced."""
    if isinstance(readable, dict):
        out: dict[str, Any] = {}
        for key, value in readable.items():
            if key in EPOCH_FIELDS and isinstance(value, str):
                out[key] = names(value, "epoch")
            elif key.endswith(_VOLATILE_SUFFIX):
                out[key] = "<time>"
            else:
                out[key] = normalised(value, names)
        return out
    if isinstance(readable, list):
        return [normalised(item, names) for item in readable]
    if isinstance(readable, str):
        return names.text(readable)
    return readable


def shape(readable: Any, prefix: str = "") -> Iterator[str]:
    """The dotted paths of every leaf ``readable`` (proto3 JSON) carries, lists as ``[]``."""
    if isinstance(readable, dict):
        if not readable:
            yield prefix + "{}"
        for key, value in readable.items():
            yield from shape(value, f"{prefix}.{key}" if prefix else key)
    elif isinstance(readable, list):
        for item in readable:
            yield from shape(item, prefix + "[]")
    else:
        yield prefix


def readable_of(message: Message) -> dict[str, Any]:
    """The proto3 JSON form the fixtures use (``json_format`` defaults)."""
    document: dict[str, Any] = json_format.MessageToDict(message)
    return document
