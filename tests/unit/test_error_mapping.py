"""Domain errors -> google.rpc.Status details (CON-5)."""

from __future__ import annotations

import pytest
from google.rpc import code_pb2, error_details_pb2

from domainerrors import FailedPrecondition, FieldViolation, InvalidArgument, NotFound
from grpcserver.errors import internal_error, to_status_proto


@pytest.mark.spec("CON-5")
def test_error_info_carries_reason_domain_and_metadata() -> None:
    status = to_status_proto(
        NotFound("no such session", reason="SESSION_NOT_FOUND", metadata={"session_id": "s1"}),
        domain="host.agentactivity",
    )
    assert status.code == code_pb2.NOT_FOUND
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert (info.reason, info.domain, dict(info.metadata)) == (
        "SESSION_NOT_FOUND",
        "host.agentactivity",
        {"session_id": "s1"},
    )


@pytest.mark.spec("CON-5", "SEC-2")
def test_invalid_argument_lists_field_violations() -> None:
    status = to_status_proto(
        InvalidArgument(
            "bad", field_violations=[FieldViolation("a", "x"), FieldViolation("b.c", "y")]
        ),
        domain="d",
    )
    assert status.code == code_pb2.INVALID_ARGUMENT
    bad = error_details_pb2.BadRequest()
    assert status.details[1].Unpack(bad)
    assert [(v.field, v.description) for v in bad.field_violations] == [("a", "x"), ("b.c", "y")]


@pytest.mark.spec("CON-5")
def test_retry_info_when_a_retry_can_succeed() -> None:
    status = to_status_proto(
        FailedPrecondition("busy", reason="AGENT_ACTIVE", retry_after_seconds=1.5), domain="d"
    )
    retry = error_details_pb2.RetryInfo()
    assert status.details[-1].Unpack(retry)
    assert retry.retry_delay.ToMilliseconds() == 1500


@pytest.mark.spec("SEC-2")
def test_internal_error_reveals_nothing() -> None:
    status = to_status_proto(internal_error(), domain="d")
    assert status.code == code_pb2.INTERNAL
    assert "Traceback" not in status.message
    assert status.message == "internal error; see the server log"
