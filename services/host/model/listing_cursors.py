"""Opaque listing cursors that encode values, not row ids (HOST-SES-4, SEC-1).

A cursor carries the position after the last row of a page — ``(updated_at_unix_ms,
session_id)`` in the listing order ``updated_at DESC, session_id ASC`` — plus the workspace
and the listing it belongs to. Rows inserted or updated between page reads therefore never
shift the next page (no skips or repeats as with offsets), and a cursor never expires: it
holds no server state.

The token is ``c1.`` + base64url(digest[:12] + JSON). The digest detects corruption and
casual editing so that "not produced by Host" is a typed ``INVALID_CURSOR``; it is not a
security boundary and needs none — a cursor only holds a position, every query is still
scoped to the caller's authorized workspace, and a cursor bound to another workspace or
listing is refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass

from domainerrors import FieldViolation, InvalidArgument

__all__ = ["CursorPosition", "decode_cursor", "encode_cursor"]

_PREFIX = "c1."
_DIGEST_BYTES = 12
_MAX_TOKEN_LENGTH = 4096
_DOMAIN = b"agentactivity.host.session-cursor.v1\x00"


@dataclass(frozen=True, order=True)
class CursorPosition:
    """The last row of a page: the next page starts strictly after it."""

    updated_at_unix_ms: int
    session_id: str


def _digest(payload: bytes) -> bytes:
    return hashlib.sha256(_DOMAIN + payload).digest()[:_DIGEST_BYTES]


def encode_cursor(workspace_id: str, listing: str, position: CursorPosition) -> str:
    """Encode ``position`` as an opaque cursor bound to ``workspace_id`` and ``listing``."""
    payload = json.dumps(
        {
            "w": workspace_id,
            "l": listing,
            "u": position.updated_at_unix_ms,
            "s": position.session_id,
        },
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    token = base64.urlsafe_b64encode(_digest(payload) + payload).rstrip(b"=").decode()
    return _PREFIX + token


def _invalid(why: str, field: str) -> InvalidArgument:
    return InvalidArgument(
        f"{field}: {why}", field_violations=[FieldViolation(field, why)], reason="INVALID_CURSOR"
    )


def decode_cursor(
    token: str, workspace_id: str, listing: str, *, field: str = "cursor"
) -> CursorPosition:
    """Decode a cursor produced by :func:`encode_cursor` for this workspace and listing.

    Raises:
        InvalidArgument: reason ``INVALID_CURSOR`` — malformed, altered, or bound to another
            workspace or listing.
    """
    if len(token) > _MAX_TOKEN_LENGTH or not token.startswith(_PREFIX):
        raise _invalid("not a cursor produced by Host", field)
    body = token[len(_PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise _invalid("not a cursor produced by Host", field) from None
    digest, payload = raw[:_DIGEST_BYTES], raw[_DIGEST_BYTES:]
    if len(digest) != _DIGEST_BYTES or digest != _digest(payload):
        raise _invalid("not a cursor produced by Host", field)
    try:
        data = json.loads(payload)
    except ValueError:
        raise _invalid("not a cursor produced by Host", field) from None
    updated, session_id = data.get("u"), data.get("s")
    if not isinstance(updated, int) or isinstance(updated, bool) or not isinstance(session_id, str):
        raise _invalid("not a cursor produced by Host", field)
    if data.get("w") != workspace_id:
        raise _invalid("the cursor belongs to another workspace", field)
    if data.get("l") != listing:
        raise _invalid("the cursor belongs to another listing", field)
    return CursorPosition(updated, session_id)
