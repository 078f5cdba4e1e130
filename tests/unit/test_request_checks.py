"""The generic request checks of ``grpcserver.request_checks`` (SEC-2, SEC-4), and the
CON-4 bound on an encoded ``latest_message_version``."""

from __future__ import annotations

import pytest
from google.protobuf import struct_pb2

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, runtime_pb2
from domainerrors import InvalidArgument, OutOfRange
from grpcserver.request_checks import (
    MAX_VIOLATIONS,
    check_request,
    mapped_enum,
    request_violations,
)
from services.host.activity.events import MessageUpdate
from services.host.wire.activity_codec import ProtoEventCodec
from services.host.wire.runtime_codec import report_from_proto
from store.integrity import store_refusal


def _fields(message: object) -> list[str]:
    return [v.field for v in request_violations(message)]  # type: ignore[arg-type]


@pytest.mark.spec("SEC-2")
def test_defined_values_and_unset_fields_pass() -> None:
    request = host_pb2.SendInputRequest(
        workspace_id="ws",
        delivery=canonical_pb2.DELIVERY_MODE_NEW_TURN,
        mode=canonical_pb2.COMPOSER_MODE_UNSPECIFIED,
        content="plain text, ünïcode",
    )
    assert request_violations(request) == []
    check_request(request)


@pytest.mark.spec("SEC-2")
def test_unknown_enum_numbers_are_found_at_their_path() -> None:
    request = host_pb2.CreateSessionRequest(workspace_id="ws")
    request.initial_input.mode = 17  # type: ignore[assignment]
    assert _fields(request) == ["initial_input.mode"]
    report = runtime_pb2.RuntimeReport(report_id="r")
    report.items.add().turn_patch.phase = canonical_pb2.TURN_PHASE_RUNNING
    report.items.add().turn_patch.outcome = -1  # type: ignore[assignment]
    report.items.add().message_snapshot.tool_call.steps.add().steps.add().phase = 5  # type: ignore[assignment]
    assert _fields(report) == [
        "items[1].turn_patch.outcome",
        "items[2].message_snapshot.tool_call.steps[0].steps[0].phase",
    ]


@pytest.mark.spec("SEC-2", "SEC-4")
def test_nul_characters_in_strings_repeated_strings_and_map_keys_are_found() -> None:
    request = host_pb2.CreateSessionRequest(workspace_id="ws", title="a\x00")
    assert _fields(request) == ["title"]
    hello = runtime_pb2.RuntimeHello(providers=["ok", "bad\x00"])
    assert _fields(hello) == ["providers[1]"]
    struct = struct_pb2.Struct()
    struct.fields["k\x00"].string_value = "v"
    struct.fields["fine"].string_value = "v\x00"
    assert sorted(_fields(struct)) == ["fields", "fields['fine'].string_value"]


@pytest.mark.spec("SEC-2", "SEC-4")
def test_deep_nesting_is_walked_without_recursion() -> None:
    call = runtime_pb2.ToolCallSnapshot()
    current = call
    for _ in range(2_000):  # far past Python's recursion limit
        current = current.steps.add()
    current.phase = 77  # type: ignore[assignment]
    [violation] = request_violations(call)
    assert violation.field.endswith(".phase")
    assert violation.field.count("steps[0]") == 2_000


@pytest.mark.spec("SEC-2")
def test_violations_are_capped_and_raised_as_invalid_argument() -> None:
    hello = runtime_pb2.RuntimeHello(providers=["\x00"] * (MAX_VIOLATIONS + 5))
    with pytest.raises(InvalidArgument) as raised:
        check_request(hello)
    assert len(raised.value.field_violations) == MAX_VIOLATIONS
    assert raised.value.reason == "INVALID_ARGUMENT"


@pytest.mark.spec("SEC-2", "HOST-MENT-1")
def test_mapped_enum_refuses_instead_of_defaulting() -> None:
    modes = {canonical_pb2.COMPOSER_MODE_AGENT: "agent"}
    assert mapped_enum(modes, canonical_pb2.COMPOSER_MODE_AGENT, field="mode") == "agent"
    with pytest.raises(InvalidArgument) as raised:
        mapped_enum(modes, canonical_pb2.COMPOSER_MODE_PLAN, field="mode")
    assert [v.field for v in raised.value.field_violations] == ["mode"]


@pytest.mark.spec("SEC-2", "HOST-RT-1")
def test_a_decoded_report_lists_its_invalid_values_per_item() -> None:
    report = runtime_pb2.RuntimeReport(report_id="r", workspace_id="ws", session_id="s")
    report.items.add().session_patch.title = "fine"
    report.items.add().interaction_transition.kind = 40  # type: ignore[assignment]
    decoded = report_from_proto(report)
    assert [(f.index, f.field) for f in decoded.invalid_fields] == [
        (1, "items[1].interaction_transition.kind")
    ]


@pytest.mark.spec("CON-4")
def test_an_event_with_a_latest_message_version_above_2_53_is_never_encoded() -> None:
    codec = ProtoEventCodec()
    assert codec.encode("ws", 1, MessageUpdate("s", (), 2**53 - 1))
    with pytest.raises(OutOfRange) as raised:
        codec.encode("ws", 1, MessageUpdate("s", (), 2**53))
    assert raised.value.reason == "CURSOR_BOUND_EXCEEDED"


@pytest.mark.spec("SEC-4")
def test_only_store_refusals_are_mapped() -> None:
    assert store_refusal(ValueError("not a store error")) is None
