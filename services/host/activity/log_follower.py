"""Cross-process wake-ups of the activity feed: the durable log is the truth (SCALE-1).

A ``WatchActivity`` stream learns of events its own process commits from the in-process
broker, right after the commit (HOST-OBS-1). Events another Host replica commits never pass
through this process's broker, so one :class:`LogFollower` per process follows the durable log
of every workspace watched here:

* it remembers, per watched workspace, the highest ``workspace_seq`` that reached the broker
  (its own commits, as the broker's observer, and what it read itself);
* every ``poll_seconds`` — or at once when :meth:`LogFollower.wake` is called — it reads the
  head rows of all watched workspaces in one statement and, for each that moved, the events
  after what it saw, page by page, and publishes them to the broker as a
  :class:`~services.host.activity.broker.CommittedBatch` (``local=False``).

With a fence (the shared live lane, ADR 0041 §6) it fences every moved workspace once per
round, all at once, before reading through the head it fenced; and a batch of this process's
that lands past a gap does not move it past the gap: it reads the gap itself, behind the
fence, while the subscribers park that batch.

Subscribers order, deduplicate and gap-fill by ``workspace_seq`` exactly as for their own
process's batches, so an event reaches each subscriber once and in order whichever path
brought it. A followed batch enters the subscriber's FIFO after the event committed; a delta
the same runtime link published before that commit is already ahead of it (HOST-OBS-2).

Wake hints: :class:`WakeHints` is the port a cross-replica bus plugs into (a subscriber of
per-workspace commit notices calls ``wake(workspace_id)``); without one the bounded poll alone
delivers other replicas' events within ``poll_seconds``. Postgres ``NOTIFY`` is deliberately not
used: it takes a cluster-wide lock at commit (ADR 0037).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from services.host.activity.broker import ActivityBroker, CommittedBatch
from services.host.repository import unit_of_work
from services.host.repository.activity_events import StoredEvent
from services.host.repository.unit_of_work import HostTransaction
from store.database import Database

__all__ = ["LogFollower", "WakeHints"]

_log = logging.getLogger(__name__)

_PAGES_PER_ROUND = 4
"""Pages one workspace may read per round before the others get their turn."""


class WakeHints(Protocol):
    """A source of "workspace X has new committed events" hints from other processes.

    The follower calls :meth:`watch` / :meth:`unwatch` as workspaces gain their first and lose
    their last subscriber here; the source calls the ``wake`` it was started with for any hint
    it receives. A hint is only a hint: a lost one costs at most ``poll_seconds`` of latency.
    """

    async def start(self, wake: Callable[[str], None]) -> None:
        """Begin delivering hints to ``wake``."""

    def watch(self, workspace_id: str) -> None:
        """Deliver hints for ``workspace_id`` from now on."""

    def unwatch(self, workspace_id: str) -> None:
        """Stop delivering hints for ``workspace_id``."""

    async def stop(self) -> None:
        """Stop delivering hints."""


class LogFollower:
    """Publishes events other processes committed to this process's broker.

    Args:
        broker: The process's broker; the follower observes its local batches and publishes
            the followed ones to its subscribers.
        poll_seconds: Upper bound on how late another process's event is seen without a hint.
        page_size: Events per read.
        hints: Optional cross-process wake-up source.
        fence: Optional wait before another process's events through a sequence are handed
            on (the shared live lane: its deltas stored before them go first, ADR 0041).
    """

    def __init__(
        self,
        broker: ActivityBroker,
        *,
        poll_seconds: float,
        page_size: int,
        hints: WakeHints | None = None,
        fence: Callable[[str, int], Awaitable[None]] | None = None,
    ) -> None:
        self._broker = broker
        self.fence = fence
        self._poll_seconds = poll_seconds
        self._page_size = max(1, page_size)
        self.hints = hints
        self._seen: dict[str, int] = {}
        self._watchers: dict[str, int] = {}
        self._woken = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        broker.add_observer(self._observe)

    async def start(self, database: Database) -> None:
        """Start following (a server start hook)."""
        if self.hints is not None:
            await self.hints.start(self.wake)
        self._task = asyncio.create_task(self._follow(database))

    async def stop(self) -> None:
        """Stop following (a server stop hook)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.hints is not None:
            await self.hints.stop()

    def watch(self, workspace_id: str, head_seq: int) -> None:
        """A subscriber of ``workspace_id`` caught up through ``head_seq``: follow from there.

        The subscriber registered with the broker before it read ``head_seq``, so every event
        after it reaches the subscriber through the broker: committed here, or read by the
        follower (which, for a workspace already followed, may already be past it).
        """
        count = self._watchers.get(workspace_id, 0)
        self._watchers[workspace_id] = count + 1
        if count == 0:
            self._seen[workspace_id] = head_seq
            if self.hints is not None:
                self.hints.watch(workspace_id)
        else:
            self._seen[workspace_id] = min(self._seen[workspace_id], head_seq)

    def unwatch(self, workspace_id: str) -> None:
        """A subscriber of ``workspace_id`` ended."""
        count = self._watchers.get(workspace_id, 0) - 1
        if count > 0:
            self._watchers[workspace_id] = count
            return
        self._watchers.pop(workspace_id, None)
        self._seen.pop(workspace_id, None)
        if self.hints is not None:
            self.hints.unwatch(workspace_id)

    def wake(self, workspace_id: str | None = None) -> None:
        """Read the log now instead of at the next poll (the bus hook)."""
        if workspace_id is None or workspace_id in self._watchers:
            self._woken.set()

    def watched(self) -> dict[str, int]:
        """Per watched workspace, the highest sequence that reached the broker (tests)."""
        return dict(self._seen)

    def _observe(self, batch: CommittedBatch) -> None:
        seen = self._seen.get(batch.workspace_id)
        if seen is None or batch.last_seq <= seen:
            return
        if self.fence is not None and batch.previous_seq > seen:
            # The gap may hold another replica's events: they must go out behind a fence
            # (ADR 0041 §6), so the follower reads it now; subscribers park this batch.
            self._woken.set()
            return
        # Without a fence a batch past a gap still covers it: subscribers read the gap.
        self._seen[batch.workspace_id] = batch.last_seq

    async def _follow(self, database: Database) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), self._poll_seconds)
            self._woken.clear()
            try:
                if await self.poll(database):
                    self._woken.set()  # more pages are waiting: another round at once
            except Exception:  # noqa: BLE001 - the next round retries
                _log.exception("following the activity log failed")

    async def poll(self, database: Database) -> bool:
        """One round over every watched workspace; True when some still have unread events."""
        if not self._seen:
            return False

        async def heads(tx: HostTransaction) -> dict[str, int]:
            return await tx.events.heads(sorted(self._seen))

        moved = [
            (workspace_id, head)
            for workspace_id, head in (await unit_of_work.run(database, heads, write=False)).items()
            if head > self._seen.get(workspace_id, head)
        ]
        up_to: int | None = None
        more = False
        if self.fence is not None and moved:
            # One fence per moved workspace per round, all at once, before the reads: the
            # events through ``head`` committed before it, so their deltas are then in the
            # broker. A hung bus costs one fence timeout per round, not one per workspace.
            fence = self.fence
            await asyncio.gather(*(fence(workspace_id, head) for workspace_id, head in moved))
        for workspace_id, head in moved:
            if self.fence is not None:
                up_to = head  # events past the fenced head wait for the next round
            for _ in range(_PAGES_PER_ROUND):
                seen = self._seen.get(workspace_id)
                if seen is None or seen >= head:
                    break
                page = await self._read(database, workspace_id, seen, up_to)
                if not page:
                    break
                self._publish(workspace_id, page)
            else:
                more = more or self._seen.get(workspace_id, head) < head
        return more

    async def _read(
        self, database: Database, workspace_id: str, after: int, up_to: int | None
    ) -> list[StoredEvent]:
        async def read(tx: HostTransaction) -> list[StoredEvent]:
            return await tx.events.after_seq(
                workspace_id, after, up_to=up_to, limit=self._page_size
            )

        return await unit_of_work.run(database, read, write=False)

    def _publish(self, workspace_id: str, page: list[StoredEvent]) -> None:
        # ``previous_seq`` is the sequence just before the page's first event, never the
        # follower's own position: a page that starts past a pruned range must look like a
        # gap to subscribers, which then find the expiry in the log.
        batch = CommittedBatch(
            workspace_id=workspace_id,
            previous_seq=page[0].workspace_seq - 1,
            events=tuple(page),
            local=False,
        )
        if workspace_id in self._seen:
            self._seen[workspace_id] = max(self._seen[workspace_id], batch.last_seq)
        self._broker.publish_batch(batch)
