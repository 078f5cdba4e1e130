"""Bytes that do not decode become a typed refusal naming the field (SEC-4)."""

from __future__ import annotations

import pytest
from google.rpc import error_details_pb2

from agentactivity.appcenter.v1 import appcenter_pb2
from agentactivity.host.v1 import runtime_pb2
from grpcserver.decoding import (
    MAX_DECODE_DEPTH,
    UNDECODABLE_REQUEST,
    DecodeFailure,
    UndecodableRequest,
    locate_decode_failure,
    tolerant_deserializer,
    undecodable_error,
)
from grpcserver.errors import to_status_proto

LOAD = appcenter_pb2.LoadAppsRequest


def _field(number: int, payload: bytes) -> bytes:
    assert len(payload) < 128
    assert number < 16
    return bytes([(number << 3) | 2, len(payload)]) + payload


def _decode(raw: bytes) -> UndecodableRequest:
    deserialize = tolerant_deserializer(LOAD.FromString)
    assert deserialize is not None
    result = deserialize(raw)
    assert isinstance(result, UndecodableRequest), result
    return result


@pytest.mark.spec("SEC-4")
def test_valid_bytes_decode_as_usual() -> None:
    deserialize = tolerant_deserializer(LOAD.FromString)
    assert deserialize is not None
    request = LOAD(workspace_id="ws-1", apps=[appcenter_pb2.AppTree(app_id="a")])
    assert deserialize(request.SerializeToString()) == request
    assert tolerant_deserializer(None) is None


@pytest.mark.spec("SEC-4")
@pytest.mark.parametrize(
    ("raw", "failure"),
    [
        (bytes.fromhex("0a02fffe"), DecodeFailure("workspace_id", "is not valid UTF-8")),
        (
            _field(2, _field(1, b"\xc3\x28")),
            DecodeFailure("apps[0].app_id", "is not valid UTF-8"),
        ),
        (
            _field(2, b"") + _field(2, _field(1, b"ok") + _field(3, _field(1, b"\xff"))),
            DecodeFailure("apps[1].groups[0].group_id", "is not valid UTF-8"),
        ),
        (
            bytes.fromhex("0a05ab"),
            DecodeFailure("workspace_id", "runs past the end of its message"),
        ),
        (bytes.fromhex("1080"), DecodeFailure("apps[0]", "a varint is truncated")),
        (bytes.fromhex("0e"), DecodeFailure("workspace_id", "uses invalid wire type 6")),
        (
            bytes.fromhex("08" + "ff" * 10 + "01"),
            DecodeFailure("workspace_id", "a varint is longer than 10 bytes"),
        ),
        (bytes.fromhex("07"), DecodeFailure("", "holds a field with number 0")),
    ],
)
def test_the_failure_is_located(raw: bytes, failure: DecodeFailure) -> None:
    request = _decode(raw)
    assert request.failure == failure
    assert request.message_type == "agentactivity.appcenter.v1.LoadAppsRequest"
    assert request.size_bytes == len(raw)


@pytest.mark.spec("SEC-4")
def test_nesting_past_the_decoder_limit_is_located_without_recursing_further() -> None:
    steps = runtime_pb2.ToolCallSnapshot.DESCRIPTOR.fields_by_name["steps"].number
    raw = runtime_pb2.ToolCallSnapshot(call_id="c").SerializeToString()
    for _ in range(MAX_DECODE_DEPTH + 50):
        raw = _varint((steps << 3) | 2) + _varint(len(raw)) + raw
    failure = locate_decode_failure(runtime_pb2.ToolCallSnapshot.DESCRIPTOR, raw)
    assert failure == DecodeFailure(
        "steps[0]." * 5 + "steps[0].…", f"messages nest more than {MAX_DECODE_DEPTH} levels deep"
    )
    deserialize = tolerant_deserializer(runtime_pb2.ToolCallSnapshot.FromString)
    assert deserialize is not None
    assert deserialize(raw).failure == failure


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@pytest.mark.spec("SEC-4", "SEC-2")
def test_the_refusal_is_invalid_argument_with_reason_and_field_violation() -> None:
    status = to_status_proto(
        undecodable_error(_decode(bytes.fromhex("0a02fffe"))), domain="appcenter.agentactivity"
    )
    assert status.code == 3  # INVALID_ARGUMENT
    info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
    assert status.details[0].Unpack(info)
    assert status.details[1].Unpack(bad)
    assert info.reason == UNDECODABLE_REQUEST
    assert dict(info.metadata) == {
        "message_type": "agentactivity.appcenter.v1.LoadAppsRequest",
        "size_bytes": "4",
    }
    assert [(v.field, v.description) for v in bad.field_violations] == [
        ("workspace_id", "is not valid UTF-8")
    ]
    # Without a located field there is no BadRequest, only the reason and a description.
    unlocated = undecodable_error(
        UndecodableRequest("x.v1.Request", 1, DecodeFailure("", "holds a field with number 0"))
    )
    assert not unlocated.field_violations
    assert (
        unlocated.message == "the request is not a valid x.v1.Request: holds a field with number 0"
    )
