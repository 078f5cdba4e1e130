"""Reading a refused call's details on the client side (CON-5)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from domainerrors import FieldViolation
from grpcserver.call_errors import STATUS_DETAILS_KEY, call_error


class _Refused(grpc.RpcError):
    def __init__(self, trailer: Any) -> None:
        self._trailer = trailer

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.FAILED_PRECONDITION

    def details(self) -> str:
        return "an agent Turn is active"

    def trailing_metadata(self) -> Any:
        return self._trailer


def _packed(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


@pytest.mark.spec("CON-5")
def test_reason_metadata_retry_and_fields_are_read_from_the_trailer() -> None:
    status = status_pb2.Status(
        code=9,
        message="an agent Turn is active",
        details=[
            _packed(
                error_details_pb2.ErrorInfo(
                    reason="AGENT_ACTIVE", metadata={"active_workspace_count": "2"}
                )
            ),
            _packed(
                error_details_pb2.RetryInfo(
                    retry_delay=duration_pb2.Duration(seconds=30, nanos=500_000_000)
                )
            ),
            _packed(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(
                            field="session_id", description="required"
                        )
                    ]
                )
            ),
        ],
    )
    said = call_error(_Refused(((STATUS_DETAILS_KEY, status.SerializeToString()),)))
    assert said.code is grpc.StatusCode.FAILED_PRECONDITION
    assert said.message == "an agent Turn is active"
    assert said.reason == "AGENT_ACTIVE"
    assert said.metadata == {"active_workspace_count": "2"}
    assert said.retry_after_seconds == 30.5
    assert said.field_violations == (FieldViolation("session_id", "required"),)


@pytest.mark.spec("CON-5")
@pytest.mark.parametrize("trailer", [None, (), ((STATUS_DETAILS_KEY, b"\xff\xfe garbled"),)])
def test_a_missing_or_garbled_trailer_keeps_the_code(trailer: Any) -> None:
    said = call_error(_Refused(trailer))
    assert said.code is grpc.StatusCode.FAILED_PRECONDITION
    assert (said.reason, said.retry_after_seconds, said.field_violations) == ("", None, ())
