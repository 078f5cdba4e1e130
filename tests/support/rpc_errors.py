"""What a refused call said: its code, ``ErrorInfo`` reason and ``BadRequest`` fields."""

from __future__ import annotations

import grpc

from grpcserver.call_errors import call_error

__all__ = ["error_details"]


def error_details(error: grpc.RpcError) -> tuple[grpc.StatusCode, str, set[str]]:
    """The call's status code, its ``ErrorInfo`` reason ("" when it has none) and the field
    paths of its ``BadRequest`` violations, read from the ``google.rpc.Status`` trailer."""
    said = call_error(error)
    return said.code, said.reason, {v.field for v in said.field_violations}
