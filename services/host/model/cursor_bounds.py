"""The 2^53-1 bound on cursor integers (CON-4).

Cursor values on the wire (Session ``message_version``, message ``version`` and
``sequence``, page ``latest_version``, ``after_version`` / ``before_version``) must stay
exactly representable in an IEEE-754 double, so JavaScript clients never round them.
Stores may keep 64-bit integers; this module is the single check between a stored value
and the wire.

Public API:
    MAX_CURSOR: ``2**53 - 1``, the largest cursor value Host ever emits or accepts.
    checked_cursor(value, *, field) -> int: a stored value about to be emitted; raises
        ``domainerrors.OutOfRange`` (reason ``CURSOR_BOUND_EXCEEDED``) instead of emitting
        a larger (or negative) value.
    parse_cursor_argument(value, *, field) -> int: a cursor received in a request; raises
        ``domainerrors.InvalidArgument`` (reason ``INVALID_CURSOR``, one field violation)
        for a negative value or one above the bound.
"""

from __future__ import annotations

from domainerrors import FieldViolation, InvalidArgument, OutOfRange

__all__ = [
    "CURSOR_BOUND_EXCEEDED",
    "INVALID_CURSOR",
    "MAX_CURSOR",
    "checked_cursor",
    "parse_cursor_argument",
]

MAX_CURSOR = 2**53 - 1
"""Largest cursor integer on the wire (CON-4; SPEC §9 "cursor integer bound")."""

CURSOR_BOUND_EXCEEDED = "CURSOR_BOUND_EXCEEDED"
"""ErrorInfo reason when a stored cursor would exceed :data:`MAX_CURSOR` on the wire."""

INVALID_CURSOR = "INVALID_CURSOR"
"""ErrorInfo reason for a request cursor outside ``[0, MAX_CURSOR]``."""


def checked_cursor(value: int, *, field: str) -> int:
    """Return ``value`` if it may be emitted as a cursor, else fail the response.

    Args:
        value: the stored integer (for example a message ``version``).
        field: the wire field it is emitted as, reported in the error metadata.

    Returns:
        ``value`` unchanged.

    Raises:
        OutOfRange: reason ``CURSOR_BOUND_EXCEEDED`` when ``value`` is negative or above
            :data:`MAX_CURSOR`; the response must fail rather than carry the value.
    """
    # bool is an int subclass; a bool here is a programming error, not a cursor.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"cursor {field} must be an int, got {type(value).__name__}")
    if 0 <= value <= MAX_CURSOR:
        return value
    raise OutOfRange(
        f"{field} {value} is outside the cursor range [0, 2^53-1]",
        reason=CURSOR_BOUND_EXCEEDED,
        metadata={"field": field, "max": str(MAX_CURSOR)},
    )


def parse_cursor_argument(value: int, *, field: str) -> int:
    """Validate a cursor that arrived in a request.

    Args:
        value: the request value (for example ``after_version``).
        field: the request field name, used as the field-violation path.

    Returns:
        ``value`` unchanged when it lies in ``[0, MAX_CURSOR]``.

    Raises:
        InvalidArgument: reason ``INVALID_CURSOR`` with a violation on ``field``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"cursor {field} must be an int, got {type(value).__name__}")
    if 0 <= value <= MAX_CURSOR:
        return value
    description = f"must be between 0 and {MAX_CURSOR} (2^53-1)"
    raise InvalidArgument(
        f"{field}: {description}",
        field_violations=[FieldViolation(field, description)],
        reason=INVALID_CURSOR,
    )
