"""Wire-shape rules checked on the compiled descriptors of every contract (CON-4, CON-6)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.livestream.v1 import livestream_pb2
from conformance.runner import import_all_contracts

CURSOR_FIELDS = {
    "message_version",
    "version",
    "sequence",
    "latest_version",
    "after_version",
    "before_version",
}


def _messages() -> Iterator[Descriptor]:
    """Every message (nested included) of every agentactivity contract."""
    import_all_contracts()

    def walk(message: Descriptor) -> Iterator[Descriptor]:
        yield message
        for nested in message.nested_types:
            yield from walk(nested)

    for module in sys.modules.copy().values():
        name = getattr(module, "__name__", "")
        if name.startswith("agentactivity.") and name.endswith("_pb2"):
            for message in module.DESCRIPTOR.message_types_by_name.values():
                yield from walk(message)


@pytest.mark.spec("CON-4")
def test_timestamps_are_int64_unix_ms_and_no_well_known_timestamps() -> None:
    checked = 0
    for message in _messages():
        for field in message.fields:
            if field.name.endswith("_unix_ms"):
                checked += 1
                assert field.type == FieldDescriptor.TYPE_INT64, f"{message.full_name}.{field.name}"
            if field.message_type is not None:
                assert field.message_type.full_name != "google.protobuf.Timestamp", (
                    f"{message.full_name}.{field.name} must be *_unix_ms"
                )
    assert checked > 50


@pytest.mark.spec("CON-4")
def test_identifiers_are_opaque_strings_and_cursors_int64() -> None:
    for message in _messages():
        for field in message.fields:
            # Event ids are durable int64 cursors (HOST-OBS-2), not entity identifiers.
            is_cursor = field.name.endswith("event_id")
            if field.name.endswith("_id") and not is_cursor and field.message_type is None:
                assert field.type == FieldDescriptor.TYPE_STRING, (
                    f"{message.full_name}.{field.name}"
                )
            if field.name in CURSOR_FIELDS:
                assert field.type == FieldDescriptor.TYPE_INT64, f"{message.full_name}.{field.name}"


@pytest.mark.spec("CON-6")
def test_open_vocabularies_are_strings_on_the_wire() -> None:
    session = canonical_pb2.Session.DESCRIPTOR.fields_by_name
    reference = canonical_pb2.ReferenceMeta.DESCRIPTOR.fields_by_name
    assert session["provider"].type == FieldDescriptor.TYPE_STRING
    assert reference["kind"].type == FieldDescriptor.TYPE_STRING
    assert reference["actions"].type == FieldDescriptor.TYPE_STRING
    meta = canonical_pb2.ReferenceMeta(kind="hologram", actions=["teleport"])
    assert canonical_pb2.ReferenceMeta.FromString(meta.SerializeToString()) == meta


@pytest.mark.spec("CON-6", "LIVE-REV-1")
def test_the_live_protocol_is_closed() -> None:
    discontinuity = livestream_pb2.Discontinuity.DESCRIPTOR.fields_by_name["reason"]
    assert discontinuity.enum_type is not None
    delivery = livestream_pb2.Delivery.DESCRIPTOR
    assert delivery.oneofs, "deliveries are a closed oneof of kinds"
    assert livestream_pb2.LIVE_PROTOCOL_REVISION_1 == 1
