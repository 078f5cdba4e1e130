"""Per-Session mutation lanes (HOST-LANE-1).

Activation/resume, ``UpdateSessionSettings``, ``StopTurn`` and delete quiescing of one
Session run one at a time, in arrival order, so none can interleave with another. Lanes
live in the host process (Host runs as a single replica, ADR 0006); a lane's lock is
dropped as soon as nobody holds or waits for it, so memory does not grow with history.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager

SessionKey = tuple[str, str]
"""``(workspace_id, session_id)``."""


class MutationLanes:
    """One FIFO lock per Session, created on demand and released when idle."""

    def __init__(self) -> None:
        self._locks: dict[SessionKey, asyncio.Lock] = {}
        self._users: dict[SessionKey, int] = {}

    @asynccontextmanager
    async def hold(self, workspace_id: str, session_id: str) -> AsyncIterator[None]:
        """Run the body exclusively for this Session."""
        key = (workspace_id, session_id)
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._users[key] -= 1
            if self._users[key] == 0:
                del self._users[key]
                del self._locks[key]

    @asynccontextmanager
    async def hold_many(self, keys: Iterable[SessionKey]) -> AsyncIterator[None]:
        """Hold several lanes at once (delete quiescing), in a fixed order to avoid deadlock."""
        async with AsyncExitStack() as stack:
            for workspace_id, session_id in sorted(set(keys)):
                await stack.enter_async_context(self.hold(workspace_id, session_id))
            yield

    def active(self) -> int:
        """Number of Sessions with a holder or waiter (for tests and metrics)."""
        return len(self._locks)
