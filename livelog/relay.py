"""Republish committed events whose post-commit publication was lost (SCALE-3, ADR 0036).

Host publishes a committed event to the live log after its transaction commits; a crash or a
bus outage between the two loses that publication while the durable row stays. The relay
closes the gap: from a durable cursor ("published through"), it reads the durable log in
order and republishes each event with the message id it was first published with, so the
log's deduplication drops the copies that did arrive (within the duplicate window; beyond
it, readers drop them by the event's durable sequence). The cursor advances only after the
log acknowledged, so a relay that dies resumes without loss.

Host's durable per-workspace sequence and its cursor table plug in through
:class:`DurableEventSource` and :class:`RelayCursorStore`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from livelog.interface import LiveLog

__all__ = ["CommittedRelay", "DurableEvent", "DurableEventSource", "RelayCursorStore", "RelayRun"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True)
class DurableEvent(Generic[T_co]):
    """A committed event as the durable log holds it.

    Attributes:
        sequence: Its gap-free per-workspace sequence (assigned in the committing transaction).
        msg_id: The message id of its live-log publication (the same for every copy).
        item: The item published for it.
    """

    sequence: int
    msg_id: str
    item: T_co


class DurableEventSource(Protocol[T_co]):
    """The durable log of committed events, read by per-workspace sequence."""

    async def read_after(
        self, workspace_id: str, sequence: int, limit: int
    ) -> Sequence[DurableEvent[T_co]]:
        """Up to ``limit`` events of the workspace with a sequence above ``sequence``, in order."""
        ...


class RelayCursorStore(Protocol):
    """Where the relay keeps, per workspace, the sequence it republished through."""

    async def load(self, workspace_id: str) -> int:
        """The sequence republished through (0: none)."""
        ...

    async def save(self, workspace_id: str, sequence: int) -> None:
        """Record that every event up to ``sequence`` is in the live log."""
        ...


@dataclass(frozen=True)
class RelayRun:
    """What one relay pass did for one workspace.

    Attributes:
        published: Events the live log did not have and now holds.
        duplicates: Events the live log already had (deduplicated by message id).
        through: The sequence the cursor now stands at.
    """

    published: int
    duplicates: int
    through: int


class CommittedRelay(Generic[T]):
    """Republishes a workspace's committed events from its durable cursor."""

    def __init__(
        self,
        log: LiveLog[T],
        source: DurableEventSource[T],
        cursors: RelayCursorStore,
        *,
        batch_size: int = 256,
    ) -> None:
        self._log = log
        self._source = source
        self._cursors = cursors
        self._batch_size = max(1, batch_size)

    async def run_once(self, workspace_id: str) -> RelayRun:
        """Republish everything after the workspace's cursor, advancing it batch by batch.

        Raises:
            LiveLogUnavailable: the live log failed; the cursor stands at the last event it
                acknowledged, so the next pass continues there.
        """
        through = await self._cursors.load(workspace_id)
        published = duplicates = 0
        while True:
            events = await self._source.read_after(workspace_id, through, self._batch_size)
            if not events:
                return RelayRun(published, duplicates, through)
            try:
                for event in events:
                    ack = await self._log.publish(workspace_id, event.item, event.msg_id)
                    if ack.duplicate:
                        duplicates += 1
                    else:
                        published += 1
                    through = event.sequence
            finally:
                await self._cursors.save(workspace_id, through)
