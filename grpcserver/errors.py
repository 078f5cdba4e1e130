"""Map domain errors to ``google.rpc.Status`` with typed details (CON-5, SEC-2).

``ErrorInfo`` always carries the stable ``reason``; ``BadRequest`` lists field
violations of an ``InvalidArgument``; ``RetryInfo`` is added when a retry can succeed.
Unexpected exceptions become a bare ``INTERNAL`` with no stack trace on the wire.
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from domainerrors import DomainError, Internal, InvalidArgument

MESSAGE_LIMIT = 512
"""Characters of a status message or field description sent; the rest is cut."""

VALUE_LIMIT = 256
"""Characters of an ``ErrorInfo`` metadata value or a field path sent."""

VIOLATIONS_LIMIT = 16
"""Field violations sent; a refusal names the first ones."""


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, saying how much was cut.

    The cut falls on a character boundary.
    A refusal often echoes what the caller sent (a workspace id, a field value); echoed
    whole, a hostile 64 KiB id would push the status trailers past the 8 KiB a client
    accepts, and the caller would see an untyped transport error instead (SEC-4). Bytes,
    not characters, are what the trailers hold.
    """
    data = text.encode()
    if len(data) <= limit:
        return text
    kept = data[:limit].decode(errors="ignore")
    return f"{kept}… ({len(text) - len(kept)} more characters)"


def to_status_proto(error: DomainError, *, domain: str) -> status_pb2.Status:
    """Build the ``google.rpc.Status`` for ``error`` (echoed text is bounded: :func:`clip`)."""
    status = status_pb2.Status(
        code=code_pb2.Code.Value(error.status), message=clip(error.message, MESSAGE_LIMIT)
    )
    info = error_details_pb2.ErrorInfo(reason=error.reason, domain=domain)
    info.metadata.update({key: clip(value, VALUE_LIMIT) for key, value in error.metadata.items()})
    _pack(status, info)
    if isinstance(error, InvalidArgument) and error.field_violations:
        bad_request = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=clip(violation.field, VALUE_LIMIT),
                    description=clip(violation.description, MESSAGE_LIMIT),
                )
                for violation in error.field_violations[:VIOLATIONS_LIMIT]
            ]
        )
        _pack(status, bad_request)
    if error.retry_after_seconds is not None:
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(int(error.retry_after_seconds * 1000))
        _pack(status, error_details_pb2.RetryInfo(retry_delay=delay))
    return status


def to_grpc_status(error: DomainError, *, domain: str) -> grpc.Status:
    """Build the ``grpc.Status`` to pass to ``context.abort_with_status``."""
    return rpc_status.to_status(to_status_proto(error, domain=domain))


def internal_error() -> Internal:
    """The error sent for an unexpected exception: no internals cross the wire."""
    return Internal("internal error; see the server log", reason="INTERNAL")


def _pack(status: status_pb2.Status, detail: object) -> None:
    packed = any_pb2.Any()
    packed.Pack(detail)  # type: ignore[arg-type]
    status.details.append(packed)
