"""The port through which the resolver reads AppCenter and IssueManager (REF-APP-1, REF-TASK-1).

The resolver depends only on :class:`ReferenceBackends`; the gRPC adapter
(:mod:`services.refresolve.grpc_backends`) implements it over the backends' contracts,
and tests substitute fakes. Implementations raise domain errors only:

* ``NotFound`` with the backend's reason (``APP_NOT_FOUND``, ``GROUP_NOT_FOUND``,
  ``TOPIC_NOT_FOUND``, ``ISSUE_NOT_FOUND``) for a missing container;
* ``PermissionDenied`` with the backend's reason for an inaccessible source;
* ``DeadlineExceeded`` when the :class:`Deadline` expires before the backend answers;
* ``Unavailable`` (reason ``BACKEND_UNAVAILABLE``, with a retry delay) for anything else.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from domainerrors import DeadlineExceeded
from services.refresolve.references import ReferenceItem

__all__ = ["AppPage", "Deadline", "IssueOutputs", "ReferenceBackends", "TopicPage"]


@dataclass(frozen=True)
class AppPage:
    """One page of an app container: child group ids and files, in backend order."""

    group_ids: tuple[str, ...]
    files: tuple[ReferenceItem, ...]
    next_page_token: str


@dataclass(frozen=True)
class IssueOutputs:
    """An issue's latest outputs; ``truncated`` when the backend cut the list at its bound."""

    items: tuple[ReferenceItem, ...]
    truncated: bool


@dataclass(frozen=True)
class TopicPage:
    """One page of a topic's latest outputs, newest first."""

    items: tuple[ReferenceItem, ...]
    next_page_token: str


class Deadline:
    """An absolute point in time (monotonic clock) by which a resolution must finish.

    The servicer builds it from the caller's gRPC deadline, capped by the configured
    resolution timeout, and every backend call gets the time remaining (REF-FAIL-1).
    """

    def __init__(
        self, seconds_from_now: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._at = clock() + seconds_from_now

    def remaining(self) -> float:
        """Seconds left; may be zero or negative once expired."""
        return self._at - self._clock()

    def expired(self) -> bool:
        """Whether no time is left."""
        return self.remaining() <= 0

    def require_time(self) -> float:
        """Return the seconds left for a backend call.

        Raises:
            DeadlineExceeded: no time is left.
        """
        left = self.remaining()
        if left <= 0:
            raise DeadlineExceeded(
                "the deadline expired before resolution finished", reason="DEADLINE_EXCEEDED"
            )
        return left


class ReferenceBackends(Protocol):
    """What the resolver needs from AppCenter and IssueManager."""

    async def list_app_page(
        self,
        workspace_id: str,
        app_id: str,
        group_id: str | None,
        page_token: str,
        deadline: Deadline,
    ) -> AppPage:
        """One page of the direct children of the app root (``group_id`` None) or a group."""
        ...

    async def issue_outputs(
        self, workspace_id: str, topic_id: str, issue_id: str, deadline: Deadline
    ) -> IssueOutputs:
        """The latest outputs of an issue that must belong to ``topic_id``."""
        ...

    async def search_topic_page(
        self, workspace_id: str, topic_id: str, page_token: str, deadline: Deadline
    ) -> TopicPage:
        """One page of the latest outputs of every issue in a topic."""
        ...
