"""Typed domain errors shared by every service's domain layer.

Domain code raises these and never imports grpc or protobuf (STYLE.md "Layers"). The
server bootstrap maps each to a gRPC status code with ``google.rpc.Status`` details:
an ``ErrorInfo`` carrying the stable ``reason``, ``BadRequest`` field violations for
``InvalidArgument`` and ``RetryInfo`` when ``retry_after_seconds`` is set (CON-5).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class FieldViolation:
    """One invalid request field.

    Attributes:
        field: Dotted path of the field, e.g. ``"references[0].provenance.created_at"``.
        description: Why the value is invalid, in words a caller can act on.
    """

    field: str
    description: str


class DomainError(Exception):
    """Base of all typed errors; ``status`` names the gRPC code it maps to."""

    status: str = "INTERNAL"
    default_reason: str = "INTERNAL"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
        retry_after_seconds: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata: dict[str, str] = dict(metadata or {})
        self.retry_after_seconds = retry_after_seconds


class InvalidArgument(DomainError):
    """The request is malformed; nothing was changed (SEC-2)."""

    status = "INVALID_ARGUMENT"
    default_reason = "INVALID_ARGUMENT"

    def __init__(
        self,
        message: str,
        *,
        field_violations: Iterable[FieldViolation] = (),
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message, reason=reason, metadata=metadata)
        self.field_violations = tuple(field_violations)

    @classmethod
    def for_field(cls, field: str, description: str) -> InvalidArgument:
        """Build the error for a single invalid field."""
        return cls(f"{field}: {description}", field_violations=[FieldViolation(field, description)])


class Unauthenticated(DomainError):
    """No valid credentials were presented."""

    status = "UNAUTHENTICATED"
    default_reason = "UNAUTHENTICATED"


class PermissionDenied(DomainError):
    """The principal may not act on this resource or workspace."""

    status = "PERMISSION_DENIED"
    default_reason = "PERMISSION_DENIED"


class NotFound(DomainError):
    """The named entity does not exist in the caller's scope."""

    status = "NOT_FOUND"
    default_reason = "NOT_FOUND"


class AlreadyExists(DomainError):
    """An entity with that identity exists with different content."""

    status = "ALREADY_EXISTS"
    default_reason = "ALREADY_EXISTS"


class FailedPrecondition(DomainError):
    """The system is not in a state where the operation may run."""

    status = "FAILED_PRECONDITION"
    default_reason = "FAILED_PRECONDITION"


class Aborted(DomainError):
    """A concurrency conflict; the caller may retry the whole operation."""

    status = "ABORTED"
    default_reason = "ABORTED"


class OutOfRange(DomainError):
    """A cursor or value lies outside the valid or retained range."""

    status = "OUT_OF_RANGE"
    default_reason = "OUT_OF_RANGE"


class ResourceExhausted(DomainError):
    """A bound (size, traversal, quota) was exceeded."""

    status = "RESOURCE_EXHAUSTED"
    default_reason = "RESOURCE_EXHAUSTED"


class Unavailable(DomainError):
    """A dependency is unavailable; retrying later may succeed."""

    status = "UNAVAILABLE"
    default_reason = "UNAVAILABLE"


class DeadlineExceeded(DomainError):
    """A dependency did not answer within the propagated deadline."""

    status = "DEADLINE_EXCEEDED"
    default_reason = "DEADLINE_EXCEEDED"


class Internal(DomainError):
    """An invariant was broken; details are logged, never sent to the caller."""

    status = "INTERNAL"
    default_reason = "INTERNAL"


__all__ = [
    "Aborted",
    "AlreadyExists",
    "DeadlineExceeded",
    "DomainError",
    "FailedPrecondition",
    "FieldViolation",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
]
