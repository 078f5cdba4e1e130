"""The activity feed of one Host process: log, live lane, delta lane, pruning, ``WatchActivity``.

``WatchActivity(workspace, after_event_id)`` (HOST-OBS-2) works in three steps:

1. **Subscribe first.** The live subscription is registered before anything is read, then the
   log bounds are read and the ready marker is emitted. Any event that commits after the
   registration reaches the subscription, so nothing falls between catch-up and live.
2. **Catch up** from the durable log: events with ``after_event_id < id <= head``, where
   ``head`` is the workspace's last committed id seen right after registering.
3. **Live**: items in publication order. A delta is emitted as it comes; a committed batch is
   emitted directly when it follows the last emitted id (``previous_event_id``), skipped when
   already emitted, and otherwise the gap is read from the log up to the batch's last id (a
   batch published out of order, or a writer that did not publish). When the buffer is idle the
   log is checked once more, so even a lost wake hint costs only latency.

Causal order: the runtime link publishes a delta before it reads the runtime's next report,
and a report's events are published only after its commit, so in every subscriber's FIFO a
delta precedes the events of every later report. Catch-up never reads past ``head`` and a gap
read never past the batch being handled, so durable events are never pulled ahead of a delta
that was received before them.

Bounds: each subscriber buffers at most ``queue_max_items`` live items; overflow ends its stream
with ``RESOURCE_EXHAUSTED`` (``WATCH_CONSUMER_TOO_SLOW``) and the consumer resumes from its
cursor. Retention is per workspace (ADR 0015 §10): every ``prune_interval_seconds`` each
workspace keeps its newest ``max_rows`` events younger than ``retention_seconds``, and always
its newest event. A cursor below the highest id pruned from its workspace (the ready marker's
``oldest_retained_event_id`` minus one), or ahead of the log head, fails ``OUT_OF_RANGE``
(``EVENT_CURSOR_EXPIRED``); other workspaces' pruning never expires it.

Drain: when the process stops, every stream ends with ``UNAVAILABLE`` (``DRAINING``, the last
emitted id in ``after_event_id``) so its consumer resumes on another replica at once (OPS-3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass

from domainerrors import OutOfRange, ResourceExhausted, Unavailable
from services.host.activity.broker import (
    ActivityBroker,
    CommittedBatch,
    LiveDelta,
    LiveItem,
    SubscriberOverflow,
    Subscription,
    SubscriptionEnded,
)
from services.host.activity.delta_lane import DeltaLane
from services.host.activity.event_log import ActivityLog
from services.host.activity.events import EventCodec, MessageDelta
from services.host.repository import unit_of_work
from services.host.repository.activity_events import LogBounds, StoredEvent
from services.host.repository.unit_of_work import HostTransaction
from store.database import Database

__all__ = [
    "ActivityFeed",
    "FeedSettings",
    "WatchDelta",
    "WatchItem",
    "WatchReady",
    "watch_activity",
]

_log = logging.getLogger(__name__)

_TRACKED_TEXTS = 1024


@dataclass(frozen=True)
class FeedSettings:
    """Bounds of the feed (``services.host.settings.Settings`` fields of the same names).

    ``retention_seconds`` and ``max_rows`` bound each workspace's events on their own
    (``activity_event_retention_seconds``, ``activity_event_max_rows``).
    """

    queue_max_items: int = 10_000
    idle_check_seconds: float = 1.0
    page_size: int = 500
    retention_seconds: float = 7 * 24 * 3600.0
    max_rows: int = 1_000_000
    prune_interval_seconds: float = 300.0


class ActivityFeed:
    """Owns the broker, the delta lane, the log and the pruner of one Host process.

    Args:
        clock: Unix-millisecond clock.
        codec: Event serializer (wire layer); without one no events are recorded (unit tests
            that build a bare ``HostContext``).
        settings: Bounds.
    """

    def __init__(
        self,
        clock: Callable[[], int],
        codec: EventCodec | None = None,
        settings: FeedSettings | None = None,
    ) -> None:
        self.clock = clock
        self.settings = settings or FeedSettings()
        self.broker = ActivityBroker()
        self.log = None if codec is None else ActivityLog(codec, self.broker, clock)
        self.deltas = DeltaLane(self.broker, clock, outbox=self.log)
        self._pruner: asyncio.Task[None] | None = None

    async def start(self, database: Database) -> None:
        """Start the pruner (a server start hook)."""
        if self.log is None:
            return
        self._pruner = asyncio.create_task(self._prune_forever(database))

    async def end_watches(self) -> None:
        """End every ``WatchActivity`` stream, now and later (a server drain hook)."""
        ended = self.broker.end_all()
        if ended:
            _log.info("ended %d activity watches for the drain", ended)

    async def stop(self, database: Database) -> None:
        """Stop the pruner (a server stop hook)."""
        if self._pruner is not None:
            self._pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pruner
            self._pruner = None

    async def prune(self, database: Database) -> int:
        """Apply the retention bounds to every workspace once; returns the deleted rows."""
        cutoff = self.clock() - int(self.settings.retention_seconds * 1000)

        async def prune(tx: HostTransaction) -> int:
            return await tx.events.prune(
                older_than_unix_ms=cutoff, keep_newest=self.settings.max_rows
            )

        return await unit_of_work.run(database, prune)

    async def _prune_forever(self, database: Database) -> None:
        while True:
            try:
                deleted = await self.prune(database)
                if deleted:
                    _log.info("pruned %d activity events", deleted)
            except Exception:  # noqa: BLE001 - retry at the next interval
                _log.exception("pruning the activity log failed")
            await asyncio.sleep(self.settings.prune_interval_seconds)


@dataclass(frozen=True)
class WatchReady:
    """The ready marker: the subscription is registered and the cursor is valid."""

    workspace_id: str
    head_event_id: int
    oldest_retained_event_id: int


@dataclass(frozen=True)
class WatchDelta:
    """A live delta, following durable event ``after_event_id`` in this stream."""

    delta: MessageDelta
    after_event_id: int
    received_at_unix_ms: int


WatchItem = WatchReady | StoredEvent | WatchDelta


async def _read(
    database: Database, workspace_id: str, after_id: int, up_to: int | None, limit: int
) -> list[StoredEvent]:
    """Events after ``after_id``; ``OUT_OF_RANGE`` when a prune may have removed some of them.

    The retention bound is read after the page: a prune that deleted events this read needed
    committed its bound with the delete, so it is seen here (a prune after the page read is
    seen too and costs only a resubscription). Without it a prune racing the catch-up would
    drop events silently.
    """

    async def read(tx: HostTransaction) -> tuple[list[StoredEvent], int]:
        page = await tx.events.after(workspace_id, after_id, up_to=up_to, limit=limit)
        return page, await tx.events.pruned_through(workspace_id)

    page, pruned = await unit_of_work.run(database, read, write=False)
    if pruned > after_id:
        raise OutOfRange(
            f"events after {after_id} were pruned while this stream read them; "
            "reconcile and resubscribe without a cursor",
            reason="EVENT_CURSOR_EXPIRED",
            metadata={
                "after_event_id": str(after_id),
                "oldest_retained_event_id": str(pruned + 1),
            },
        )
    return page


async def _bounds(database: Database, workspace_id: str) -> LogBounds:
    async def bounds(tx: HostTransaction) -> LogBounds:
        return await tx.events.bounds(workspace_id)

    return await unit_of_work.run(database, bounds, write=False)


def _check_cursor(after_event_id: int, bounds: LogBounds) -> None:
    expired = bounds.oldest_retained is not None and after_event_id < bounds.oldest_retained - 1
    if after_event_id < 0 or after_event_id > bounds.global_head or expired:
        raise OutOfRange(
            f"event cursor {after_event_id} is outside the retained feed "
            f"(oldest {bounds.oldest_retained or 0}, head {bounds.global_head}); "
            "reconcile and resubscribe without a cursor",
            reason="EVENT_CURSOR_EXPIRED",
            metadata={
                "after_event_id": str(after_event_id),
                "oldest_retained_event_id": str(bounds.oldest_retained or 0),
                "head_event_id": str(bounds.global_head),
            },
        )


class _LiveTexts:
    """Text this subscriber streamed per message, to skip redundant snapshots (HOST-RT-2)."""

    def __init__(self) -> None:
        self._texts: OrderedDict[tuple[str, str], str] = OrderedDict()

    def apply(self, delta: MessageDelta) -> None:
        if delta.target not in ("text", "reasoning"):
            return
        key = (delta.session_id, delta.message_id)
        if delta.operation == "set":
            self._texts[key] = delta.text
        elif key in self._texts:
            self._texts[key] += delta.text
        else:
            return
        self._texts.move_to_end(key)
        while len(self._texts) > _TRACKED_TEXTS:
            self._texts.popitem(last=False)

    def represents(self, session_id: str | None, texts: dict[str, str] | None) -> bool:
        if not texts or session_id is None:
            return False
        return all(self._texts.get((session_id, mid)) == text for mid, text in texts.items())


async def watch_activity(
    feed: ActivityFeed, database: Database, workspace_id: str, after_event_id: int | None
) -> AsyncGenerator[WatchItem, None]:
    """The ``WatchActivity`` stream of one consumer (see the module docstring).

    Raises:
        OutOfRange: ``EVENT_CURSOR_EXPIRED``.
        ResourceExhausted: ``WATCH_CONSUMER_TOO_SLOW`` (the buffer overflowed).
    """
    settings = feed.settings
    subscription = feed.broker.subscribe(workspace_id, max_items=settings.queue_max_items)
    try:
        bounds = await _bounds(database, workspace_id)
        if after_event_id is not None:
            _check_cursor(after_event_id, bounds)
        yield WatchReady(workspace_id, bounds.workspace_head, bounds.oldest_retained or 0)
        start = bounds.workspace_head if after_event_id is None else after_event_id
        cursor = _Cursor(database, workspace_id, settings.page_size, start)
        async with contextlib.aclosing(cursor.read_until(bounds.workspace_head)) as backlog:
            async for stored in backlog:
                yield stored
        texts = _LiveTexts()
        while True:
            item = await _next_live(subscription, settings.idle_check_seconds, cursor.last)
            if item is None:
                # Idle: nothing is buffered, so reading the log cannot overtake a delta.
                async with contextlib.aclosing(cursor.read_page()) as page:
                    async for stored in page:
                        yield stored
            elif isinstance(item, LiveDelta):
                texts.apply(item.delta)
                yield WatchDelta(item.delta, cursor.last, item.received_at_unix_ms)
            elif item.last_event_id <= cursor.last:
                continue
            elif item.previous_event_id <= cursor.last:
                for stored in cursor.follow(item, texts):
                    yield stored
            else:
                async with contextlib.aclosing(cursor.read_until(item.last_event_id)) as gap:
                    async for stored in gap:
                        yield stored
    finally:
        subscription.close()


async def _next_live(subscription: Subscription, idle_seconds: float, last: int) -> LiveItem | None:
    """The subscription's next item (None when idle), its end mapped to the stream's error."""
    try:
        return await subscription.next(idle_seconds)
    except SubscriberOverflow:
        raise ResourceExhausted(
            "the activity consumer fell too far behind; resume from its cursor",
            reason="WATCH_CONSUMER_TOO_SLOW",
            metadata={"after_event_id": str(last)},
        ) from None
    except SubscriptionEnded:
        raise Unavailable(
            "Host is shutting down; resume from your cursor on another replica",
            reason="DRAINING",
            metadata={"after_event_id": str(last)},
            retry_after_seconds=1.0,
        ) from None


class _Cursor:
    """The last event id a stream emitted or passed over, and the reads that advance it."""

    def __init__(self, database: Database, workspace_id: str, page_size: int, last: int) -> None:
        self._database = database
        self._workspace_id = workspace_id
        self._page_size = page_size
        self.last = last

    async def read_until(self, up_to: int) -> AsyncGenerator[StoredEvent, None]:
        """The log's events after ``last`` through ``up_to``, page by page."""
        while self.last < up_to:
            page = await _read(
                self._database, self._workspace_id, self.last, up_to, self._page_size
            )
            if not page:
                break
            for stored in page:
                yield stored
                self.last = stored.event_id

    async def read_page(self) -> AsyncGenerator[StoredEvent, None]:
        """One page of the log's events after ``last``, unbounded above."""
        for stored in await _read(
            self._database, self._workspace_id, self.last, None, self._page_size
        ):
            yield stored
            self.last = stored.event_id

    def follow(self, batch: CommittedBatch, texts: _LiveTexts) -> Iterator[StoredEvent]:
        """A batch's events after ``last``, minus snapshots the deltas already carried."""
        for stored in batch.events:
            if stored.event_id <= self.last:
                continue
            self.last = stored.event_id
            if texts.represents(
                stored.session_id,
                dict(batch.redundant_texts.get(stored.event_id, {})) or None,
            ):
                continue  # a non-terminal snapshot the deltas already carried
            yield stored
