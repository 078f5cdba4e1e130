"""Walk an app's nested artifact groups into one flat, ordered file list (REF-APP-1, REF-BOUND-1).

Fetching is concurrent, the result is not timing-dependent:

1. Containers are fetched level by level (the requested container, then its child
   groups, then theirs ...), up to ``concurrency`` containers at once; each container's
   pages are followed in sequence. A group id is fetched at most once, so a cycle or a
   group listed under several parents cannot loop.
2. The list is assembled afterwards in depth-first pre-order: a container's files in
   backend order, then each child group in backend order; a group already emitted is
   skipped.

Bounds (``RESOURCE_EXHAUSTED`` reason ``TRAVERSAL_BOUND_EXCEEDED``, metadata ``bound``):
``depth`` (a group more than ``max_depth`` levels below the requested container, counted
along the shortest path), ``groups`` (more distinct groups than ``max_groups``) and
``pages`` (more backend pages than ``max_pages``). A failure of any call fails the walk;
nothing partial is returned.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from domainerrors import ResourceExhausted
from services.refresolve.backends import Deadline, ReferenceBackends
from services.refresolve.references import ReferenceItem

__all__ = ["TraversalBounds", "bound_exceeded", "gather_all", "walk_app"]

T = TypeVar("T")


@dataclass(frozen=True)
class TraversalBounds:
    """Configured traversal limits (REF-BOUND-1)."""

    max_depth: int = 16
    max_groups: int = 10_000
    max_pages: int = 2_000
    concurrency: int = 8


def bound_exceeded(bound: str, limit: int) -> ResourceExhausted:
    """The typed failure for an exceeded traversal bound."""
    return ResourceExhausted(
        f"reference traversal exceeded its {bound} bound ({limit})",
        reason="TRAVERSAL_BOUND_EXCEEDED",
        metadata={"bound": bound, "limit": str(limit)},
    )


async def gather_all(awaitables: Sequence[Awaitable[T]]) -> list[T]:
    """Await all; on the first failure cancel the rest and raise it (never a partial result)."""
    tasks = [asyncio.ensure_future(item) for item in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


@dataclass
class _Container:
    group_ids: list[str] = field(default_factory=list)
    files: list[ReferenceItem] = field(default_factory=list)


@dataclass
class _Walk:
    backends: ReferenceBackends
    workspace_id: str
    app_id: str
    bounds: TraversalBounds
    deadline: Deadline
    pages: int = 0
    calls: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self.calls = asyncio.Semaphore(max(1, self.bounds.concurrency))

    async def fetch(self, group_id: str | None) -> _Container:
        container = _Container()
        token = ""
        async with self.calls:
            while True:
                self.pages += 1
                if self.pages > self.bounds.max_pages:
                    raise bound_exceeded("pages", self.bounds.max_pages)
                page = await self.backends.list_app_page(
                    self.workspace_id, self.app_id, group_id, token, self.deadline
                )
                container.group_ids.extend(page.group_ids)
                container.files.extend(page.files)
                token = page.next_page_token
                if not token:
                    return container


async def walk_app(
    backends: ReferenceBackends,
    workspace_id: str,
    app_id: str,
    group_id: str | None,
    bounds: TraversalBounds,
    deadline: Deadline,
) -> tuple[list[ReferenceItem], int]:
    """Return the app's files under ``group_id`` (the whole app when None) in pre-order.

    Returns:
        The flat list (not yet de-duplicated) and the number of backend pages read.

    Raises:
        ResourceExhausted: a traversal bound was exceeded.
        DomainError: whatever a backend call raised (see :mod:`.backends`).
    """
    walk = _Walk(backends, workspace_id, app_id, bounds, deadline)
    containers: dict[str | None, _Container] = {}
    discovered: set[str | None] = {group_id}
    level: list[str | None] = [group_id]
    depth = 0
    while level:
        fetched = await gather_all([walk.fetch(container) for container in level])
        following: list[str | None] = []
        for key, container in zip(level, fetched, strict=True):
            containers[key] = container
            for child in container.group_ids:
                if child in discovered:
                    continue
                discovered.add(child)
                if len(discovered) - 1 > bounds.max_groups:
                    raise bound_exceeded("groups", bounds.max_groups)
                following.append(child)
        if following and depth + 1 > bounds.max_depth:
            raise bound_exceeded("depth", bounds.max_depth)
        level = following
        depth += 1
    return _pre_order(containers, group_id), walk.pages


def _pre_order(containers: dict[str | None, _Container], start: str | None) -> list[ReferenceItem]:
    # Iterative, so a long chain of groups cannot exhaust the interpreter's stack.
    items: list[ReferenceItem] = list(containers[start].files)
    emitted: set[str | None] = {start}
    stack: list[Iterator[str]] = [iter(containers[start].group_ids)]
    while stack:
        child = next(stack[-1], None)
        if child is None:
            stack.pop()
            continue
        if child in emitted:
            continue
        emitted.add(child)
        items.extend(containers[child].files)
        stack.append(iter(containers[child].group_ids))
    return items
