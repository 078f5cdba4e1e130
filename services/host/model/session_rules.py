"""Rules every Host capability shares about a Session reference (HOST-SES-1).

The id validator and the typed NOT_FOUND errors of a Session that is missing or tombstoned:
what a delete, a purge, a message read or a submission checks before it touches anything, kept
apart from the Session commands so those modules need not import them.
"""

from __future__ import annotations

import re

from domainerrors import FieldViolation, InvalidArgument, NotFound
from services.host.model.records import SessionRecord
from store.models import CONVERSATIONS_SECTION_KEY

__all__ = [
    "CONVERSATIONS_SECTION_KEY",
    "MAX_ID_LENGTH",
    "require_live",
    "session_deleted",
    "session_id_violation",
    "session_not_found",
    "validate_session_id",
]

MAX_ID_LENGTH = 128
"""Longest Session id (and other client-chosen ids) in characters."""
_ID = re.compile(r"[^\s\x00-\x1f\x7f]+")


def session_not_found(workspace_id: str, session_id: str) -> NotFound:
    """NOT_FOUND ``SESSION_NOT_FOUND``."""
    return NotFound(
        f"no Session {session_id!r} in workspace {workspace_id!r}",
        reason="SESSION_NOT_FOUND",
        metadata={"session_id": session_id},
    )


def session_deleted(session_id: str) -> NotFound:
    """NOT_FOUND ``SESSION_DELETED``: tombstones are invisible to ordinary reads."""
    return NotFound(
        f"Session {session_id!r} is deleted",
        reason="SESSION_DELETED",
        metadata={"session_id": session_id},
    )


def require_live(record: SessionRecord | None, workspace_id: str, session_id: str) -> SessionRecord:
    """Return the live Session or raise the typed NOT_FOUND."""
    if record is None:
        raise session_not_found(workspace_id, session_id)
    if not record.is_live:
        raise session_deleted(session_id)
    return record


def session_id_violation(session_id: str, field: str = "session_id") -> FieldViolation | None:
    """The field violation of an empty or malformed Session id, or ``None``."""
    if not session_id:
        return FieldViolation(field, "is required")
    if len(session_id) > MAX_ID_LENGTH or not _ID.fullmatch(session_id):
        return FieldViolation(
            field, f"must be 1-{MAX_ID_LENGTH} characters without whitespace or control characters"
        )
    return None


def validate_session_id(session_id: str, field: str = "session_id") -> None:
    """Raise INVALID_ARGUMENT for an empty or malformed Session id."""
    if (violation := session_id_violation(session_id, field)) is not None:
        raise InvalidArgument(violation.description, field_violations=[violation])
