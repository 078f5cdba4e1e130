"""Parse and format workspace-reference mention URIs (REF-URI-1).

Canonical form::

    mention://workspace-reference/<id>?count=<n>&groupId=<g>&source=<app|task>&workspaceId=<ws>

``count`` and ``groupId`` are optional. :func:`format_mention` percent-encodes every
character outside RFC 3986 *unreserved* (``A-Z a-z 0-9 - . _ ~``) as UTF-8, and emits
the query keys in lexicographic order; :func:`parse_mention` accepts the keys in any
order, ignores unknown and legacy parameters (``files``, paths, commands) without
decoding them, and round-trips: ``parse_mention(format_mention(h)) == h``. A ``+`` is a
literal plus, not a space (these are URIs, not HTML form data).

Every malformed form raises a typed :class:`MalformedMention` subclass (reason
``MALFORMED_MENTION``); another mention kind raises :class:`MentionKindNotReference`
(reason ``MENTION_KIND_NOT_REFERENCE``). Both are ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote_to_bytes

from domainerrors import FieldViolation, InvalidArgument
from services.refresolve.references import ReferenceHandle, Source

__all__ = [
    "MAX_MENTION_LENGTH",
    "MENTION_KIND",
    "MENTION_SCHEME",
    "REFERENCE_URI_PREFIX",
    "BadPercentEncoding",
    "BadSource",
    "DuplicatedParameter",
    "MalformedMention",
    "MentionKindNotReference",
    "MentionTooLong",
    "MissingId",
    "MissingWorkspace",
    "ParsedMention",
    "UnexpectedUriShape",
    "WrongScheme",
    "format_mention",
    "mention_kind",
    "parse_mention",
]

MENTION_SCHEME = "mention"
MENTION_KIND = "workspace-reference"
REFERENCE_URI_PREFIX = f"{MENTION_SCHEME}://{MENTION_KIND}/"
"""Every workspace-reference mention starts with this prefix (the routing key, REF-SKILL-1)."""

MAX_MENTION_LENGTH = 4096

_KNOWN_KEYS = ("count", "groupId", "source", "workspaceId")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


class MalformedMention(InvalidArgument):
    """The text is not a well-formed workspace-reference mention."""

    default_reason = "MALFORMED_MENTION"

    def __init__(self, description: str, *, field: str = "uri") -> None:
        super().__init__(
            f"{field}: {description}",
            field_violations=[FieldViolation(field, description)],
            reason="MALFORMED_MENTION",
        )
        self.description = description


class MentionTooLong(MalformedMention):
    """The URI exceeds :data:`MAX_MENTION_LENGTH` characters."""


class WrongScheme(MalformedMention):
    """Not a ``mention://`` URI."""


class UnexpectedUriShape(MalformedMention):
    """A ``mention://`` URI with no kind, several path segments, or a fragment."""


class MissingId(MalformedMention):
    """The ``<id>`` path segment is missing or empty."""


class MissingWorkspace(MalformedMention):
    """``workspaceId`` is missing or empty."""


class BadSource(MalformedMention):
    """``source`` is missing or not exactly ``app`` or ``task``."""


class DuplicatedParameter(MalformedMention):
    """A parameter that decides resolution (or ``count``) appears more than once."""


class BadPercentEncoding(MalformedMention):
    """A ``%`` not followed by two hex digits, or escapes that are not UTF-8."""


class MentionKindNotReference(InvalidArgument):
    """A mention of another kind (``workspace-app``, ``agent-session`` ...): not a reference."""

    def __init__(self, kind: str) -> None:
        description = f"mention kind {kind!r} is not a workspace reference"
        super().__init__(
            f"uri: {description}",
            field_violations=[FieldViolation("uri", description)],
            reason="MENTION_KIND_NOT_REFERENCE",
            metadata={"kind": kind},
        )
        self.kind = kind


@dataclass(frozen=True)
class ParsedMention:
    """A parsed mention: the handle plus presentation-only ``count`` (never resolution input)."""

    handle: ReferenceHandle
    count: str | None = None


def _encode(value: str) -> str:
    return quote(value, safe="")


def _decode(raw: str, what: str) -> str:
    if _BAD_PERCENT.search(raw):
        raise BadPercentEncoding(f"{what} has a '%' not followed by two hex digits")
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise BadPercentEncoding(f"{what} percent-escapes are not UTF-8") from None


def format_mention(handle: ReferenceHandle, *, count: str | None = None) -> str:
    """Return the canonical URI of ``handle`` (query keys in lexicographic order).

    Raises:
        MalformedMention: the handle lacks an id or workspace, or has an empty group id.
    """
    if not handle.id:
        raise MissingId("id must not be empty", field="id")
    if not handle.workspace_id:
        raise MissingWorkspace("workspaceId must not be empty", field="workspace_id")
    if handle.group_id is not None and not handle.group_id:
        raise MalformedMention("groupId must not be empty when set", field="group_id")
    values = {
        "count": count,
        "groupId": handle.group_id,
        "source": handle.source.value,
        "workspaceId": handle.workspace_id,
    }
    query = "&".join(
        f"{key}={_encode(value)}" for key in sorted(values) if (value := values[key]) is not None
    )
    return f"{REFERENCE_URI_PREFIX}{_encode(handle.id)}?{query}"


def mention_kind(uri: str) -> str | None:
    """The kind (authority) of a ``mention://`` URI, or ``None`` for any other text."""
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme.lower() != MENTION_SCHEME:
        return None
    return re.split(r"[/?#]", rest, maxsplit=1)[0]


def parse_mention(uri: str) -> ParsedMention:
    """Parse a workspace-reference mention URI.

    Raises:
        MentionKindNotReference: a well-formed mention of another kind.
        MalformedMention: any malformed form (see the subclasses).
    """
    path, query = _reference_path_and_query(uri)
    if path in ("", "/"):
        raise MissingId("the reference id path segment is missing")
    if "/" in path[1:]:
        raise UnexpectedUriShape("the reference id must be one path segment (encode '/' as %2F)")
    reference_id = _decode(path[1:], "the reference id")
    params = _parse_query(query)
    if not reference_id:
        raise MissingId("the reference id is empty")
    return ParsedMention(_handle_of(reference_id, params), params.get("count"))


def _reference_path_and_query(uri: str) -> tuple[str, str]:
    """The raw path and query of a ``mention://reference`` URI, checked up to its shape."""
    if len(uri) > MAX_MENTION_LENGTH:
        raise MentionTooLong(f"must be at most {MAX_MENTION_LENGTH} characters")
    kind = mention_kind(uri)
    if kind is None:
        raise WrongScheme("must be a mention:// URI")
    if not kind:
        raise UnexpectedUriShape("mention URI names no kind")
    if kind != MENTION_KIND:
        raise MentionKindNotReference(kind)
    rest = uri.split("://", 1)[1][len(kind) :]
    if "#" in rest:
        raise UnexpectedUriShape("a mention URI has no fragment")
    path, _, query = rest.partition("?")
    return path, query


def _handle_of(reference_id: str, params: dict[str, str]) -> ReferenceHandle:
    """The handle a parsed mention names: its source, workspace and optional group."""
    source = params.get("source")
    if source is None:
        raise BadSource("source is required (app or task)")
    if source not in (Source.APP.value, Source.TASK.value):
        raise BadSource(f"source must be exactly 'app' or 'task', got {source!r}")
    workspace_id = params.get("workspaceId")
    if not workspace_id:
        raise MissingWorkspace("workspaceId is required")
    group_id = params.get("groupId")
    if group_id is not None and not group_id:
        raise MalformedMention("groupId must not be empty when present")
    return ReferenceHandle(Source(source), reference_id, workspace_id, group_id)


def _parse_query(query: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for piece in query.split("&"):
        if not piece:
            continue
        raw_key, _, raw_value = piece.partition("=")
        key = _decode(raw_key, "a query key")
        if key not in _KNOWN_KEYS:
            continue  # legacy or unknown: never decides resolution, never decoded
        if key in params:
            raise DuplicatedParameter(f"parameter {key!r} appears more than once")
        params[key] = _decode(raw_value, f"parameter {key!r}")
    return params
