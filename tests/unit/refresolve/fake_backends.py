"""An in-memory :class:`ReferenceBackends` for resolver unit tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from domainerrors import DomainError, NotFound
from services.refresolve.backends import AppPage, Deadline, IssueOutputs, TopicPage
from services.refresolve.references import ReferenceItem


def item(path: str, name: str | None = None) -> ReferenceItem:
    """A reference item named after its path."""
    return ReferenceItem(path, name or path.rsplit("/", 1)[-1], 1, "text/plain", 1)


@dataclass
class FakeBackends:
    """Containers as lists of pages ``(group ids, file paths)``; key ``None`` is the app root."""

    containers: dict[str | None, list[tuple[list[str], list[str]]]] = field(default_factory=dict)
    issue: IssueOutputs | None = None
    topic_pages: list[list[ReferenceItem]] = field(default_factory=list)
    fail_on_call: int | None = None
    failure: DomainError | None = None
    delay: float = 0.0
    calls: int = 0
    max_concurrent: int = 0
    _running: int = 0

    async def _tick(self, deadline: Deadline) -> None:
        deadline.require_time()
        self.calls += 1
        self._running += 1
        self.max_concurrent = max(self.max_concurrent, self._running)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
        finally:
            self._running -= 1
        if self.fail_on_call is not None and self.calls >= self.fail_on_call:
            assert self.failure is not None
            raise self.failure

    async def list_app_page(
        self,
        workspace_id: str,
        app_id: str,
        group_id: str | None,
        page_token: str,
        deadline: Deadline,
    ) -> AppPage:
        await self._tick(deadline)
        if group_id not in self.containers:
            raise NotFound("no group", reason="GROUP_NOT_FOUND")
        pages = self.containers[group_id]
        index = int(page_token or "0")
        groups, paths = pages[index]
        token = str(index + 1) if index + 1 < len(pages) else ""
        return AppPage(tuple(groups), tuple(item(p) for p in paths), token)

    async def issue_outputs(
        self, workspace_id: str, topic_id: str, issue_id: str, deadline: Deadline
    ) -> IssueOutputs:
        await self._tick(deadline)
        assert self.issue is not None
        return self.issue

    async def search_topic_page(
        self, workspace_id: str, topic_id: str, page_token: str, deadline: Deadline
    ) -> TopicPage:
        await self._tick(deadline)
        index = int(page_token or "0")
        token = str(index + 1) if index + 1 < len(self.topic_pages) else ""
        return TopicPage(tuple(self.topic_pages[index]), token)
