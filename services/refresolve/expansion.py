"""Inline expansion of workspace-reference mentions in issue/task detail text (REF-EXP-1).

Recognized occurrences: a Markdown inline link ``[label](mention://workspace-reference/...)``
(the span covers the whole link) and a bare ``mention://workspace-reference/...`` URI (the
span ends at the first whitespace). Spans are UTF-16 code unit offsets (the HOST-MENT-3
convention). Each distinct URI is resolved once with the shared :class:`Resolver`; one
mention failing does not fail the others, it carries its typed failure instead.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from domainerrors import (
    DeadlineExceeded,
    DomainError,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
)
from services.refresolve.backends import Deadline
from services.refresolve.mention_uri import REFERENCE_URI_PREFIX, parse_mention
from services.refresolve.references import ReferenceHandle, Resolution, ResolveRequest
from services.refresolve.resolver import Resolver, effective_limit

__all__ = [
    "MAX_MENTIONS",
    "MAX_TEXT_BYTES",
    "Expansion",
    "ExpansionFailure",
    "Occurrence",
    "expand_mentions",
    "find_occurrences",
]

MAX_TEXT_BYTES = 1024 * 1024
MAX_MENTIONS = 100
_CONCURRENT_MENTIONS = 4

_PREFIX = re.escape(REFERENCE_URI_PREFIX)
_OCCURRENCE = re.compile(
    rf"\[(?P<label>[^\[\]\n]*)\]\((?P<link>{_PREFIX}[^\s)]*)\)|(?P<bare>{_PREFIX}\S*)"
)


@dataclass(frozen=True)
class Occurrence:
    """One mention in the text; ``start``/``end`` in UTF-16 code units, ``end`` exclusive."""

    start: int
    end: int
    uri: str
    label: str | None


@dataclass(frozen=True)
class ExpansionFailure:
    """The typed error of one occurrence: the status name (``NOT_FOUND`` ...) and reason."""

    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class Expansion:
    """An occurrence with its parsed handle and exactly one of resolution or failure."""

    occurrence: Occurrence
    handle: ReferenceHandle | None
    resolution: Resolution | None
    failure: ExpansionFailure | None


def _utf16_length(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def find_occurrences(text: str) -> list[Occurrence]:
    """Every workspace-reference occurrence in ``text``, in text order."""
    found: list[Occurrence] = []
    offset = 0  # UTF-16 offset of `position`, advanced incrementally
    position = 0
    for match in _OCCURRENCE.finditer(text):
        offset += _utf16_length(text[position : match.start()])
        start = offset
        offset += _utf16_length(match.group(0))
        position = match.end()
        if match.group("bare") is not None:
            found.append(Occurrence(start, offset, match.group("bare"), None))
        else:
            found.append(Occurrence(start, offset, match.group("link"), match.group("label")))
    return found


def _failure(error: DomainError) -> ExpansionFailure:
    return ExpansionFailure(error.status, error.reason, error.message)


async def _resolve_one(
    resolver: Resolver,
    workspace_id: str,
    uri: str,
    limit: int | None,
    deadline: Deadline,
    slots: asyncio.Semaphore,
) -> tuple[ReferenceHandle | None, Resolution | ExpansionFailure]:
    handle: ReferenceHandle | None = None
    try:
        handle = parse_mention(uri).handle
        if handle.workspace_id != workspace_id:
            raise PermissionDenied(
                f"the mention's workspace {handle.workspace_id!r} is not {workspace_id!r}",
                reason="WORKSPACE_SCOPE_MISMATCH",
            )
        request = ResolveRequest(
            workspace_id=workspace_id,
            source=handle.source,
            id=handle.id,
            group_id=handle.group_id,
            limit=limit,
        )
        async with slots:
            return handle, await resolver.resolve(request, deadline)
    except DomainError as error:
        return handle, _failure(error)


async def expand_mentions(
    resolver: Resolver,
    workspace_id: str,
    text: str,
    limit_per_mention: int | None,
    deadline: Deadline,
) -> list[Expansion]:
    """Find and resolve every workspace-reference occurrence of ``text``.

    Raises:
        InvalidArgument: ``text`` over 1 MiB or a negative ``limit_per_mention``.
        ResourceExhausted: ``TOO_MANY_MENTIONS`` (more than 100 occurrences).
        DeadlineExceeded: the deadline expired while resolving.
    """
    if len(text.encode("utf-8")) > MAX_TEXT_BYTES:
        raise InvalidArgument.for_field("text", "must be at most 1 MiB (UTF-8)")
    effective_limit(limit_per_mention, field="limit_per_mention")
    occurrences = find_occurrences(text)
    if len(occurrences) > MAX_MENTIONS:
        raise ResourceExhausted(
            f"the text has {len(occurrences)} reference mentions; at most {MAX_MENTIONS}",
            reason="TOO_MANY_MENTIONS",
            metadata={"limit": str(MAX_MENTIONS)},
        )
    uris = list(dict.fromkeys(o.uri for o in occurrences))
    slots = asyncio.Semaphore(_CONCURRENT_MENTIONS)
    outcomes = dict(
        zip(
            uris,
            await asyncio.gather(
                *(
                    _resolve_one(resolver, workspace_id, uri, limit_per_mention, deadline, slots)
                    for uri in uris
                )
            ),
            strict=True,
        )
    )
    expansions: list[Expansion] = []
    for occurrence in occurrences:
        handle, outcome = outcomes[occurrence.uri]
        if isinstance(outcome, ExpansionFailure):
            if outcome.status == DeadlineExceeded.status:
                raise DeadlineExceeded(outcome.message, reason=outcome.reason)
            expansions.append(Expansion(occurrence, handle, None, outcome))
        else:
            expansions.append(Expansion(occurrence, handle, outcome, None))
    return expansions
