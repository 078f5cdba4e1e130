"""The single-node live log: a bounded ring in this process (the default, ``TUTTI_BUS=inprocess``).

Same contract as the JetStream log (one parametrized suite checks both): one sequence for the
whole log, FIFO eviction by count, bytes and age, deduplication by message id within the
duplicate window. Items are handed to subscribers as the objects themselves (no encoding).
Subscribers read the ring by cursor, so a slow subscriber holds no copies: when it falls
behind what the ring retains it is told with a ``CURSOR_EVICTED`` discontinuity.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from bisect import bisect_left
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from livelog.cursor import start_after
from livelog.interface import (
    Discontinuity,
    DiscontinuityReason,
    LiveLogUnavailable,
    LogEntry,
    LogPosition,
    PublishAck,
)
from livelog.subjects import workspace_token

__all__ = ["InProcessLiveLog", "item_size"]

T = TypeVar("T")


def item_size(item: object) -> int:
    """Bytes an item counts against ``max_bytes``: its length when it is bytes, else 0."""
    if isinstance(item, bytes | bytearray | memoryview):
        return len(item)
    return 0


@dataclass(frozen=True)
class _Stored(Generic[T]):
    sequence: int
    workspace_id: str
    msg_id: str
    item: T
    size: int
    stored_at: float


class _WorkspaceRing(Generic[T]):
    """A workspace's retained items in sequence order (a list with a moving head)."""

    def __init__(self) -> None:
        self.items: list[_Stored[T]] = []
        self.head = 0
        self.evicted_through = 0
        """The highest sequence of this workspace the log evicted (0: none)."""
        self.subscribers: set[_InProcessSubscription[T]] = set()

    def __len__(self) -> int:
        return len(self.items) - self.head

    def drop_oldest(self) -> None:
        self.evicted_through = self.items[self.head].sequence
        self.head += 1
        # Compact once the dead prefix is the larger half: amortized O(1) per eviction.
        if self.head * 2 > len(self.items):
            del self.items[: self.head]
            self.head = 0

    def index_from(self, sequence: int) -> int:
        return bisect_left(self.items, sequence, lo=self.head, key=lambda stored: stored.sequence)


class InProcessLiveLog(Generic[T]):
    """The live log of one process: bounded like the stream, gone with the process.

    Its epoch is a fresh UUID per instance, so a cursor from an earlier process is told
    apart (``EPOCH_CHANGED``) instead of being read against a new history.
    """

    def __init__(
        self,
        *,
        max_msgs: int,
        max_bytes: int,
        max_age_seconds: float,
        duplicate_window_seconds: float,
        size_of: Callable[[T], int] = item_size,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.epoch = f"inprocess@{uuid.uuid4().hex}"
        self._max_msgs = max_msgs
        self._max_bytes = max_bytes
        self._max_age = max_age_seconds
        self._dedup_window = duplicate_window_seconds
        self._size_of = size_of
        self._clock = clock
        self._last_sequence = 0
        self._entries: deque[_Stored[T]] = deque()
        self._bytes = 0
        self._rings: dict[str, _WorkspaceRing[T]] = {}
        self._seen: dict[str, tuple[LogPosition, float]] = {}
        self._seen_order: deque[tuple[float, str]] = deque()
        self._closed = False

    @property
    def first_sequence(self) -> int:
        """The oldest retained sequence (``last_sequence + 1`` when empty)."""
        return self._entries[0].sequence if self._entries else self._last_sequence + 1

    @property
    def last_sequence(self) -> int:
        """The newest sequence assigned (0: none)."""
        return self._last_sequence

    async def publish(self, workspace_id: str, item: T, msg_id: str) -> PublishAck:
        """Append the item (held as soon as this returns); see :class:`~livelog.LiveLog`."""
        workspace_token(workspace_id)  # the same ids as the bus accepts
        if self._closed:
            raise LiveLogUnavailable("the live log is closed")
        now = self._clock()
        self._forget_old_ids(now)
        seen = self._seen.get(msg_id)
        if seen is not None:
            return PublishAck(seen[0], duplicate=True)
        self._last_sequence += 1
        position = LogPosition(self.epoch, self._last_sequence)
        stored = _Stored(self._last_sequence, workspace_id, msg_id, item, self._size_of(item), now)
        self._entries.append(stored)
        self._bytes += stored.size
        ring = self._rings.get(workspace_id)
        if ring is None:
            ring = self._rings[workspace_id] = _WorkspaceRing()
        ring.items.append(stored)
        self._seen[msg_id] = (position, now)
        self._seen_order.append((now, msg_id))
        self._evict(now)
        for subscription in ring.subscribers:
            subscription.wake()
        return PublishAck(position, duplicate=False)

    async def send(self, workspace_id: str, item: T, msg_id: str) -> Awaitable[PublishAck]:
        """Append the item at once; the acknowledgement is already there."""
        ack = await self.publish(workspace_id, item, msg_id)
        done: asyncio.Future[PublishAck] = asyncio.get_running_loop().create_future()
        done.set_result(ack)
        return done

    async def subscribe(
        self, workspace_id: str, after: LogPosition | None
    ) -> _InProcessSubscription[T]:
        """Subscribe to the workspace after ``after``; see :class:`~livelog.LiveLog`."""
        workspace_token(workspace_id)
        if self._closed:
            raise LiveLogUnavailable("the live log is closed")
        self._evict(self._clock())
        ring = self._rings.get(workspace_id)
        if ring is None:
            ring = self._rings[workspace_id] = _WorkspaceRing()
        reason, next_sequence = start_after(
            after,
            epoch=self.epoch,
            first_sequence=self.first_sequence,
            last_sequence=self._last_sequence,
        )
        if reason is None and after is not None and ring.evicted_through > after.sequence:
            reason, next_sequence = DiscontinuityReason.CURSOR_EVICTED, self.first_sequence
        subscription = _InProcessSubscription(self, workspace_id, ring, next_sequence, after)
        if reason is not None:
            subscription.pending.append(Discontinuity(workspace_id, reason, after))
        ring.subscribers.add(subscription)
        return subscription

    async def close(self) -> None:
        """End every subscription; later calls raise ``LiveLogUnavailable``."""
        self._closed = True
        for ring in tuple(self._rings.values()):
            for subscription in tuple(ring.subscribers):
                subscription.end()

    def _read(self, subscription: _InProcessSubscription[T]) -> LogEntry[T] | Discontinuity | None:
        """The subscription's next event, or None when it is caught up."""
        self._evict(self._clock())
        ring = subscription.ring
        if ring.evicted_through >= subscription.next_sequence:
            # Items this subscriber had not read were evicted: it fell behind the bounds.
            subscription.next_sequence = ring.evicted_through + 1
            return Discontinuity(
                subscription.workspace_id, DiscontinuityReason.CURSOR_EVICTED, subscription.last
            )
        index = ring.index_from(subscription.next_sequence)
        if index >= len(ring.items):
            return None
        stored = ring.items[index]
        subscription.next_sequence = stored.sequence + 1
        position = LogPosition(self.epoch, stored.sequence)
        subscription.last = position
        return LogEntry(stored.workspace_id, position, stored.msg_id, stored.item)

    def _unsubscribe(self, subscription: _InProcessSubscription[T]) -> None:
        ring = subscription.ring
        ring.subscribers.discard(subscription)
        if (
            not ring.subscribers
            and not len(ring)
            and self._rings.get(subscription.workspace_id) is ring
        ):
            del self._rings[subscription.workspace_id]

    def _evict(self, now: float) -> None:
        """Drop the oldest items while any bound is exceeded (FIFO, like the stream)."""
        entries = self._entries
        while entries and (
            len(entries) > self._max_msgs
            or self._bytes > self._max_bytes
            or now - entries[0].stored_at > self._max_age
        ):
            oldest = entries.popleft()
            self._bytes -= oldest.size
            ring = self._rings[oldest.workspace_id]
            ring.drop_oldest()
            if not len(ring) and not ring.subscribers:
                del self._rings[oldest.workspace_id]

    def _forget_old_ids(self, now: float) -> None:
        order = self._seen_order
        while order and now - order[0][0] > self._dedup_window:
            _, msg_id = order.popleft()
            seen = self._seen.get(msg_id)
            if seen is not None and now - seen[1] > self._dedup_window:
                del self._seen[msg_id]


class _InProcessSubscription(Generic[T]):
    """A cursor over one workspace's ring, woken by publications."""

    def __init__(
        self,
        log: InProcessLiveLog[T],
        workspace_id: str,
        ring: _WorkspaceRing[T],
        next_sequence: int,
        after: LogPosition | None,
    ) -> None:
        self.workspace_id = workspace_id
        self.ring = ring
        self.next_sequence = next_sequence
        self.last = after
        self.pending: deque[Discontinuity] = deque()
        self._log = log
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False

    def wake(self) -> None:
        """A publication arrived (called by the log)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def end(self) -> None:
        """End iteration (the log closed)."""
        self._ended = True
        self._log._unsubscribe(self)
        self.wake()

    def __aiter__(self) -> AsyncIterator[LogEntry[T] | Discontinuity]:
        return self

    async def __anext__(self) -> LogEntry[T] | Discontinuity:
        while True:
            if self._ended:
                raise StopAsyncIteration
            if self.pending:
                return self.pending.popleft()
            event = self._log._read(self)
            if event is not None:
                return event
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def close(self) -> None:
        """Stop the subscription; iteration ends."""
        self.end()
