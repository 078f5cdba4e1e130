"""Commit hints whose post-commit publication was lost, republished (SCALE-3, ADR 0041).

A commit hint that the live log did not take (the bus was unreachable) leaves the other
replicas' followers to find the events at their next poll. This process remembers, per
workspace, the sequence its hints reached the log through, and a
:class:`~livelog.relay.CommittedRelay` republishes a hint for every committed event after it,
read from the durable log, with the message id the first publication used
(``ev:<workspace>:<sequence>``), so copies the log already holds are dropped.

The cursor is recomputed, not durable: a hint carries no event (readers always read the
durable log), so a crash that loses the owed hints costs other replicas at most one poll
interval of latency and never an event; a cursor table would buy nothing for that cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from livelog.interface import LiveLog, LiveLogUnavailable
from livelog.relay import CommittedRelay, DurableEvent
from services.host.activity.shared_lane import CommitHint, LaneItem, hint_msg_id
from services.host.repository import unit_of_work
from services.host.repository.activity_events import StoredEvent
from services.host.repository.unit_of_work import HostTransaction
from store.database import Database

__all__ = ["HintRelay"]

_log = logging.getLogger(__name__)


class _DurableHints:
    """The durable log read as the hints its events deserve."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def read_after(
        self, workspace_id: str, sequence: int, limit: int
    ) -> Sequence[DurableEvent[LaneItem]]:
        """Hints of up to ``limit`` events of the workspace after ``sequence``, in order."""

        async def read(tx: HostTransaction) -> list[StoredEvent]:
            return await tx.events.after_seq(workspace_id, sequence, up_to=None, limit=limit)

        page = await unit_of_work.run(self._database, read, write=False)
        return [
            DurableEvent(
                stored.workspace_seq,
                hint_msg_id(workspace_id, stored.workspace_seq),
                CommitHint(workspace_id, stored.event_id, stored.workspace_seq),
            )
            for stored in page
        ]


class _OwedCursors:
    """Per workspace owing hints, the sequence they reached the log through (in memory)."""

    def __init__(self) -> None:
        self.owed: dict[str, int] = {}
        self._generation: dict[str, int] = {}
        self._loaded: dict[str, int] = {}

    def owe(self, workspace_id: str, through: int) -> None:
        self.owed[workspace_id] = min(self.owed.get(workspace_id, through), through)
        self._generation[workspace_id] = self._generation.get(workspace_id, 0) + 1

    async def load(self, workspace_id: str) -> int:
        self._loaded[workspace_id] = self._generation.get(workspace_id, 0)
        return self.owed.get(workspace_id, 0)

    async def save(self, workspace_id: str, sequence: int) -> None:
        # A hint lost since the pass loaded its cursor may lie before ``sequence``: keep
        # the lower cursor then (the next pass re-sends a few duplicates, which are dropped).
        if self._unchanged(workspace_id) and workspace_id in self.owed:
            self.owed[workspace_id] = max(self.owed[workspace_id], sequence)

    def settle(self, workspace_id: str) -> None:
        """The pass reached the head: nothing is owed unless a hint was lost meanwhile."""
        if self._unchanged(workspace_id):
            self.owed.pop(workspace_id, None)

    def _unchanged(self, workspace_id: str) -> bool:
        return self._loaded.get(workspace_id) == self._generation.get(workspace_id, 0)


class HintRelay:
    """Republishes this process's lost commit hints once the live log takes them again.

    Args:
        log: The shared live log.
        interval_seconds: How often the owed workspaces are retried.
    """

    def __init__(self, log: LiveLog[LaneItem], *, interval_seconds: float) -> None:
        self._log = log
        self._interval = interval_seconds
        self._cursors = _OwedCursors()
        self._task: asyncio.Task[None] | None = None

    def owe(self, workspace_id: str, previous_seq: int) -> None:
        """A hint for events after ``previous_seq`` was lost."""
        self._cursors.owe(workspace_id, previous_seq)

    def owed(self) -> dict[str, int]:
        """Per owing workspace, the sequence its hints reached the log through (tests)."""
        return dict(self._cursors.owed)

    def start(self, database: Database) -> None:
        """Start retrying owed workspaces (a server start hook)."""
        relay = CommittedRelay(self._log, _DurableHints(database), self._cursors)
        self._task = asyncio.get_running_loop().create_task(self._run(relay))

    async def stop(self) -> None:
        """Stop retrying."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self, relay: CommittedRelay[LaneItem]) -> None:
        while True:
            await asyncio.sleep(self._interval)
            for workspace_id in list(self._cursors.owed):
                try:
                    run = await relay.run_once(workspace_id)
                except LiveLogUnavailable:
                    continue  # still unreachable: the next round retries
                except Exception:  # noqa: BLE001 - the next round retries
                    _log.exception("republishing commit hints of %s failed", workspace_id)
                    continue
                self._cursors.settle(workspace_id)
                if run.published:
                    _log.info(
                        "republished %d commit hints of %s through %d",
                        run.published,
                        workspace_id,
                        run.through,
                    )
