"""The demo runtime's bounded registry of first terminal dispositions (HOST-INT-6).

When a provider request ends (answered, or superseded because its Turn went away), its
first terminal disposition is copied here before the live request is dropped, so a later
``query_interaction_disposition`` or a re-sent answer can still tell ``answered`` from
``superseded`` from "unknown". The registry is size-capped: the oldest entries are evicted,
and an evicted request is unknown again, never ``answered`` because it is gone.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["DEFAULT_CAPACITY", "DispositionRegistry", "RequestKey", "Terminal"]

DEFAULT_CAPACITY = 1024
"""Terminal dispositions kept by default."""

RequestKey = tuple[str, str, str, str]
"""The full request identity: (workspace, Session, Turn, request id)."""


@dataclass(frozen=True)
class Terminal:
    """A request's first terminal disposition and, when answered, the answer applied."""

    disposition: str
    action: str | None = None
    option_id: str | None = None
    payload_json: str | None = None

    def same_answer(self, action: str, option_id: str | None, payload_json: str | None) -> bool:
        """Whether a re-sent answer is the one applied."""
        return (self.action, self.option_id, self.payload_json) == (action, option_id, payload_json)


class DispositionRegistry:
    """First terminal disposition per request, at most ``capacity`` of them (oldest evicted)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._entries: OrderedDict[RequestKey, Terminal] = OrderedDict()

    def record(self, key: RequestKey, terminal: Terminal) -> Terminal:
        """Keep ``terminal`` unless the request already has one; returns the one kept."""
        first = self._entries.get(key)
        if first is not None:
            return first
        self._entries[key] = terminal
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
        return terminal

    def get(self, key: RequestKey) -> Terminal | None:
        """The request's first terminal disposition, or ``None`` (never seen, or evicted)."""
        return self._entries.get(key)

    def forget_session(self, workspace_id: str, session_id: str) -> None:
        """Drop a released Session's entries (Host deleted it; nothing will ask again)."""
        for key in [k for k in self._entries if k[:2] == (workspace_id, session_id)]:
            del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)
