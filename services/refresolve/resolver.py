"""The one reference resolver behind ListReferences, ResolveMention and ExpandMentions.

Processing order (REF-API-1): traverse the source (REF-APP-1 / REF-TASK-1), de-duplicate
by path (the first item seen wins), filter by ``query`` (case-insensitive substring of
the display name), then truncate to the limit. Reaching the limit is not an error. Any
failure fails the whole resolution: never a partial list (REF-BOUND-1, REF-FAIL-1).
"""

from __future__ import annotations

from collections.abc import Iterable

from domainerrors import FieldViolation, InvalidArgument
from services.refresolve.app_traversal import TraversalBounds, bound_exceeded, walk_app
from services.refresolve.backends import Deadline, ReferenceBackends
from services.refresolve.references import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    ReferenceItem,
    Resolution,
    ResolveRequest,
    Source,
)

__all__ = ["MAX_TEXT_FIELD_LENGTH", "Resolver", "effective_limit", "validate_request"]

MAX_TEXT_FIELD_LENGTH = 256
"""Longest ``id``, ``group_id`` or ``query`` accepted."""


def effective_limit(limit: int | None, *, field: str = "limit") -> int:
    """Unset or 0 means the default (1000); larger values are clamped; negative is invalid.

    Raises:
        InvalidArgument: ``limit`` is negative.
    """
    if limit is None or limit == 0:
        return DEFAULT_LIMIT
    if limit < 0:
        raise InvalidArgument.for_field(field, "must not be negative")
    return min(limit, MAX_LIMIT)


def validate_request(request: ResolveRequest) -> None:
    """Raise ``InvalidArgument`` with every field violation of ``request``."""
    violations: list[FieldViolation] = []
    if not request.workspace_id:
        violations.append(FieldViolation("workspace_id", "must name a workspace"))
    if request.source is None:
        violations.append(FieldViolation("source", "must be REFERENCE_SOURCE_APP or _TASK"))
    if not request.id:
        violations.append(FieldViolation("id", "must not be empty"))
    if request.group_id is not None and not request.group_id:
        violations.append(FieldViolation("group_id", "must not be empty when set"))
    for name in ("id", "group_id", "query"):
        value = getattr(request, name)
        if value is not None and len(value) > MAX_TEXT_FIELD_LENGTH:
            violations.append(
                FieldViolation(name, f"must be at most {MAX_TEXT_FIELD_LENGTH} characters")
            )
    if request.limit is not None and request.limit < 0:
        violations.append(FieldViolation("limit", "must not be negative"))
    if violations:
        raise InvalidArgument(
            "; ".join(f"{v.field}: {v.description}" for v in violations),
            field_violations=violations,
        )


def _unique_by_path(items: Iterable[ReferenceItem]) -> list[ReferenceItem]:
    seen: set[str] = set()
    unique: list[ReferenceItem] = []
    for item in items:
        if item.path not in seen:
            seen.add(item.path)
            unique.append(item)
    return unique


def _matching(items: list[ReferenceItem], query: str | None) -> list[ReferenceItem]:
    if not query:
        return items
    needle = query.casefold()
    return [item for item in items if needle in item.display_name.casefold()]


class Resolver:
    """Resolves reference handles through the backends port."""

    def __init__(self, backends: ReferenceBackends, bounds: TraversalBounds) -> None:
        self._backends = backends
        self._bounds = bounds

    async def resolve(self, request: ResolveRequest, deadline: Deadline) -> Resolution:
        """Resolve one handle now (resolution is live, REF-FAIL-1).

        Raises:
            InvalidArgument: see :func:`validate_request`.
            ResourceExhausted: a traversal bound was exceeded.
            NotFound, PermissionDenied, Unavailable, DeadlineExceeded: from the backends.
        """
        validate_request(request)
        limit = effective_limit(request.limit)
        items = await self._collect(request, deadline)
        matching = _matching(_unique_by_path(items), request.query)
        return Resolution(tuple(matching[:limit]), truncated=len(matching) > limit)

    async def _collect(self, request: ResolveRequest, deadline: Deadline) -> list[ReferenceItem]:
        if request.source is Source.APP:
            items, _pages = await walk_app(
                self._backends,
                request.workspace_id,
                request.id,
                request.group_id,
                self._bounds,
                deadline,
            )
            return items
        if request.group_id is not None:
            outputs = await self._backends.issue_outputs(
                request.workspace_id, request.id, request.group_id, deadline
            )
            if outputs.truncated:
                raise bound_exceeded("issue_outputs", len(outputs.items))
            return list(outputs.items)
        return await self._search_topic(request.workspace_id, request.id, deadline)

    async def _search_topic(
        self, workspace_id: str, topic_id: str, deadline: Deadline
    ) -> list[ReferenceItem]:
        items: list[ReferenceItem] = []
        token = ""
        pages = 0
        while True:
            pages += 1
            if pages > self._bounds.max_pages:
                raise bound_exceeded("pages", self._bounds.max_pages)
            page = await self._backends.search_topic_page(workspace_id, topic_id, token, deadline)
            items.extend(page.items)
            token = page.next_page_token
            if not token:
                return items
