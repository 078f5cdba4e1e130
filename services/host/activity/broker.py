"""The in-process live lane of the activity feed (HOST-OBS-1/2, HOST-RT-2).

Two kinds of item travel through it, per workspace, in publication order:

* :class:`LiveDelta` — an ephemeral runtime delta, published as soon as Host accepted it
  (before the runtime's next report is even read), never stored;
* :class:`CommittedBatch` — the post-commit wake hint of one transaction's durable events,
  published by the one commit observer (``services.host.activity.event_log``). It carries the rows
  it announces, so a subscriber usually needs no read, but the durable rows stay the truth:
  a subscriber that sees a gap reads the log.

Each subscriber owns a bounded buffer (``Settings.watch_queue_max_items``); when it is full
the subscription is marked overflowed and its stream ends with a typed error instead of
growing without bound (the consumer resumes from its cursor).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from services.host.activity.events import MessageDelta
from services.host.repository.activity_events import StoredEvent

__all__ = [
    "ActivityBroker",
    "CommittedBatch",
    "LiveDelta",
    "LiveItem",
    "SubscriberOverflow",
    "Subscription",
]

_log = logging.getLogger(__name__)

TurnKey = tuple[str, str, str]
"""``(workspace_id, session_id, turn_id)``."""


@dataclass(frozen=True)
class LiveDelta:
    """An accepted runtime delta and when Host received it."""

    delta: MessageDelta
    received_at_unix_ms: int


@dataclass(frozen=True)
class CommittedBatch:
    """The durable events one transaction appended for one workspace.

    Attributes:
        previous_seq: The workspace's ``workspace_seq`` just before ``events[0]`` (exact: the
            sequence is gap-free), so a subscriber that emitted it can emit ``events`` directly.
        redundant_texts: For a ``message_update`` that only carries non-terminal text or
            reasoning snapshots: ``{event_id: {message_id: text}}``. A subscriber that already
            streamed exactly that text as deltas may skip the event (HOST-RT-2); every
            other update is always published.
        settled_turns: Turns this commit settled (the delta lane fences late deltas).
        tool_call_anchors: ``(workspace, session, message, turn)`` of tool-call messages this
            commit wrote, and whether their payload is terminal.
    """

    workspace_id: str
    previous_seq: int
    events: tuple[StoredEvent, ...]
    redundant_texts: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    settled_turns: tuple[TurnKey, ...] = ()
    tool_call_anchors: tuple[tuple[str, str, str, str, bool], ...] = ()
    local: bool = True
    """Whether this process committed it (False: read from the log by the log follower)."""

    @property
    def last_seq(self) -> int:
        """The highest ``workspace_seq`` of the batch."""
        return self.events[-1].workspace_seq if self.events else self.previous_seq

    @property
    def last_event_id(self) -> int:
        """The highest id of the batch (0 when it is empty)."""
        return self.events[-1].event_id if self.events else 0


LiveItem = LiveDelta | CommittedBatch


class SubscriberOverflow(Exception):
    """The subscriber's buffer filled up: it consumed too slowly."""


class SubscriptionEnded(Exception):
    """The broker ended every subscription: the process is draining."""


class Subscription:
    """One subscriber's bounded FIFO of live items for one workspace."""

    def __init__(self, broker: ActivityBroker, workspace_id: str, max_items: int) -> None:
        self.workspace_id = workspace_id
        self._broker = broker
        self._items: deque[LiveItem] = deque()
        self._max = max(1, max_items)
        # The one waiter of ``next`` (a bare future, not ``Event`` + ``wait_for``: on Python
        # 3.11 ``wait_for`` wraps the wait in a new Task for every wake-up, i.e. per delta).
        self._waiter: asyncio.Future[bool] | None = None
        self.overflowed = False
        self.closed = False
        self.ended = False

    def push(self, item: LiveItem) -> None:
        """Buffer an item (called by the broker); overflow marks the subscription failed."""
        if self.closed or self.overflowed:
            return
        if len(self._items) >= self._max:
            self.overflowed = True
            self._items.clear()
        else:
            self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    async def next(self, idle_seconds: float | None) -> LiveItem | None:
        """The next item, or None after ``idle_seconds`` without one.

        Raises:
            SubscriberOverflow: the buffer overflowed.
            SubscriptionEnded: the broker ended the subscription (drain).
        """
        while not self._items:
            if self.overflowed:
                raise SubscriberOverflow(self.workspace_id)
            if self.ended:
                raise SubscriptionEnded(self.workspace_id)
            if not await self._wait(idle_seconds):
                return None
        if self.overflowed:
            raise SubscriberOverflow(self.workspace_id)
        return self._items.popleft()

    def end(self) -> None:
        """Wake the waiter; ``next`` raises ``SubscriptionEnded`` once the buffer is empty."""
        self.ended = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    async def _wait(self, idle_seconds: float | None) -> bool:
        """Wait for a push; False after ``idle_seconds`` without one."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiter = waiter
        timer = None
        if idle_seconds is not None:
            timer = loop.call_later(idle_seconds, _expire, waiter)
        try:
            return await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def pending(self) -> int:
        """Buffered items (tests, metrics)."""
        return len(self._items)

    def close(self) -> None:
        """Stop receiving items."""
        self.closed = True
        self._broker._remove(self)


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


class ActivityBroker:
    """Fans live items out to the subscribers of their workspace, in publication order."""

    def __init__(self) -> None:
        self._subscribers: dict[str, set[Subscription]] = {}
        self._observers: list[Callable[[CommittedBatch], None]] = []
        self._ended = False

    def subscribe(self, workspace_id: str, *, max_items: int) -> Subscription:
        """Register a subscriber; it receives every item published after this call.

        After :meth:`end_all` the subscription is born ended.
        """
        subscription = Subscription(self, workspace_id, max_items)
        self._subscribers.setdefault(workspace_id, set()).add(subscription)
        if self._ended:
            subscription.end()
        return subscription

    def end_all(self) -> int:
        """End every subscription, now and later (the process drains); returns how many."""
        self._ended = True
        current = [sub for subs in self._subscribers.values() for sub in subs]
        for subscription in current:
            subscription.end()
        return len(current)

    def _remove(self, subscription: Subscription) -> None:
        subscribers = self._subscribers.get(subscription.workspace_id)
        if subscribers is not None:
            subscribers.discard(subscription)
            if not subscribers:
                del self._subscribers[subscription.workspace_id]

    def add_observer(self, observer: Callable[[CommittedBatch], None]) -> None:
        """Call ``observer`` with every committed batch (in-process consumers: the delta lane)."""
        self._observers.append(observer)

    def publish_delta(self, delta: LiveDelta) -> None:
        """Hand a live delta to the workspace's subscribers."""
        # No copy of the set: ``push`` never subscribes or unsubscribes (the hot path).
        for subscription in self._subscribers.get(delta.delta.workspace_id, ()):
            subscription.push(delta)

    def publish_batch(self, batch: CommittedBatch) -> None:
        """Hand a committed batch to observers and the workspace's subscribers.

        An observer's failure is logged and skipped: publication is a wake hint and never
        affects the commit it announces (HOST-OBS-1).
        """
        for observer in self._observers:
            try:
                observer(batch)
            except Exception:  # noqa: BLE001 - a wake hint never fails the commit path
                _log.exception("activity observer failed")
        for subscription in tuple(self._subscribers.get(batch.workspace_id, ())):
            subscription.push(batch)

    def subscriber_count(self, workspace_id: str | None = None) -> int:
        """Registered subscribers (all, or of one workspace)."""
        if workspace_id is not None:
            return len(self._subscribers.get(workspace_id, ()))
        return sum(len(subs) for subs in self._subscribers.values())
