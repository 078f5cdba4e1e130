"""What a refused call said: its code, ``ErrorInfo`` reason and ``BadRequest`` fields."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

__all__ = ["error_details"]


def error_details(error: grpc.RpcError) -> tuple[grpc.StatusCode, str, set[str]]:
    """The call's status code, its ``ErrorInfo`` reason ("" when it has none) and the field
    paths of its ``BadRequest`` violations, read from the ``google.rpc.Status`` trailer."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    reason, fields = "", set()
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason = str(info.reason)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields |= {str(v.field) for v in bad.field_violations}
    return error.code(), reason, fields
