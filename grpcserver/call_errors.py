"""What a refused outgoing call said: its code and ``google.rpc.Status`` details (CON-5).

Every caller in the suite that reacts to another service's typed refusal (maintenance passing
Host's refusal through, refresolve mapping a backend's ``NOT_FOUND``, livestream telling an
expired cursor from a transport loss, the CLI printing a reason and its retry delay) reads the
same three details from the ``grpc-status-details-bin`` trailer: ``ErrorInfo`` (reason and
metadata), ``RetryInfo`` and ``BadRequest``. :func:`call_error` reads them once, from a sync
``grpc.RpcError`` or a caught ``grpc.aio.AioRpcError`` alike (``grpc_status``'s aio helper
refuses a caught ``AioRpcError``, STYLE "Errors"). A garbled trailer only loses the details;
the code still stands.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from domainerrors import FieldViolation

__all__ = ["STATUS_DETAILS_KEY", "CallError", "call_error"]

STATUS_DETAILS_KEY = "grpc-status-details-bin"
"""The trailer that carries the serialized ``google.rpc.Status``."""


@dataclass(frozen=True)
class CallError:
    """A refused call's code and details.

    Attributes:
        code: The gRPC status code.
        message: The status message ("" when none).
        reason: ``ErrorInfo.reason`` ("" when the call had none).
        metadata: ``ErrorInfo.metadata``.
        retry_after_seconds: ``RetryInfo.retry_delay``, when sent.
        field_violations: ``BadRequest`` field violations, in order.
    """

    code: grpc.StatusCode
    message: str = ""
    reason: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    retry_after_seconds: float | None = None
    field_violations: tuple[FieldViolation, ...] = ()


def _status(error: Any) -> status_pb2.Status | None:
    for key, value in error.trailing_metadata() or ():
        if key == STATUS_DETAILS_KEY and isinstance(value, bytes):
            try:
                return status_pb2.Status.FromString(value)
            except DecodeError:
                return None
    return None


def call_error(error: grpc.RpcError) -> CallError:
    """The code and details of a failed call (sync or aio)."""
    call: Any = error
    reason, metadata, retry, violations = "", {}, None, []
    status = _status(call)
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, metadata = str(info.reason), dict(info.metadata)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            delay = error_details_pb2.RetryInfo()
            detail.Unpack(delay)
            retry = delay.retry_delay.seconds + delay.retry_delay.nanos / 1e9
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations = [FieldViolation(v.field, v.description) for v in bad.field_violations]
    return CallError(
        code=call.code(),
        message=call.details() or "",
        reason=reason,
        metadata=metadata,
        retry_after_seconds=retry,
        field_violations=tuple(violations),
    )
