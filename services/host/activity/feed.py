"""The activity feed of one Host process: log, live lane, delta lane, pruning, ``WatchActivity``.

``WatchActivity(workspace, after_event_id)`` (HOST-OBS-2, SCALE-1) works in three steps:

1. **Subscribe first.** The live subscription is registered before anything is read, then the
   log bounds are read and the ready marker is emitted. Any event that commits after the
   registration reaches the subscription — from this process's commit observer, or from the
   :class:`~services.host.activity.log_follower.LogFollower` when another process committed
   it — so nothing falls between catch-up and live.
2. **Catch up** from the durable log: events with ``after_event_id < id <= head``, where
   ``head`` is the workspace's last committed id seen right after registering. Within a
   workspace ids commit in order (``services.host.repository.activity_events``), so this is
   exactly the workspace's events up to its head sequence.
3. **Live**: items in publication order, ordered by the workspace's gap-free sequence
   ``workspace_seq``. A delta is emitted as it comes; a committed batch is emitted directly
   when it follows the last emitted sequence (``previous_seq``), skipped when already emitted,
   and otherwise the gap is read from the log up to the batch's last sequence (a batch
   published out of order, or a writer that did not publish: the follower's next read brings
   it). With the shared lane the gap may hold another replica's events whose deltas are
   still on their way, so the batch is parked instead: the follower reads the gap behind its
   fence (ADR 0041 §6) and the parked batch follows once the stream reached it, or the gap is
   read here after the fence timeout. Reads are never needed to notice an event: the
   follower publishes whatever reached the log without reaching the broker.

Causal order: the runtime link publishes a delta before it reads the runtime's next report,
and a report's events are published only after its commit (by the observer or, later, by the
follower), so in every subscriber's FIFO a delta precedes the events of every later report.
Catch-up never reads past ``head`` and a gap read never past the batch being handled, so
durable events are never pulled ahead of a delta that was received before them.

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
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from dataclasses import dataclass

from domainerrors import OutOfRange, ResourceExhausted, Unavailable
from livelog.interface import LiveLog
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
from services.host.activity.hint_relay import HintRelay
from services.host.activity.log_follower import LogFollower, WakeHints
from services.host.activity.shared_lane import LaneItem, SharedLane
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

_LIVE_LOG_READY_SECONDS = 5.0
"""How long a stream waits for its live-log subscription before it reports ready anyway
(the bus is down: other replicas' deltas are then missing, and their publishers say so)."""


@dataclass(frozen=True)
class FeedSettings:
    """Bounds of the feed (``services.host.settings.Settings`` fields of the same names).

    ``retention_seconds`` and ``max_rows`` bound each workspace's events on their own
    (``activity_event_retention_seconds``, ``activity_event_max_rows``).
    """

    queue_max_items: int = 10_000
    idle_check_seconds: float = 1.0
    """How often the log follower reads the heads of the watched workspaces (SCALE-1)."""
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
        wake_hints: Cross-process wake-ups for the log follower (a bus); none: it polls.
        live_log: Opens the live log shared with other replicas (``TUTTI_BUS=nats``); at
            start the deltas, the commit hints and the follower's wake-ups go through it
            (ADR 0041). None: the in-process lane alone (the single-node default).
    """

    def __init__(
        self,
        clock: Callable[[], int],
        codec: EventCodec | None = None,
        settings: FeedSettings | None = None,
        wake_hints: WakeHints | None = None,
        live_log: Callable[[], Awaitable[LiveLog[LaneItem]]] | None = None,
    ) -> None:
        self.clock = clock
        self.settings = settings or FeedSettings()
        self.broker = ActivityBroker()
        self.log = None if codec is None else ActivityLog(codec, self.broker, clock)
        self.deltas = DeltaLane(self.broker, clock, outbox=self.log)
        self.follower = LogFollower(
            self.broker,
            poll_seconds=self.settings.idle_check_seconds,
            page_size=self.settings.page_size,
            hints=wake_hints,
        )
        self._open_live_log = live_log
        self.shared: SharedLane | None = None
        self.relay: HintRelay | None = None
        self._pruner: asyncio.Task[None] | None = None

    async def start(self, database: Database) -> None:
        """Start the shared lane, the pruner and the log follower (a server start hook).

        Raises:
            LiveLogUnavailable: the shared live log cannot be reached.
        """
        if self.log is None:
            return
        if self._open_live_log is not None:
            shared = SharedLane(await self._open_live_log(), self.broker)
            self.shared = shared
            self.deltas.shared = shared
            self.follower.hints = shared
            self.follower.fence = shared.fence
            self.relay = HintRelay(shared.log, interval_seconds=self.settings.idle_check_seconds)
            shared.on_lost_hint = self.relay.owe
            self.relay.start(database)
        try:
            await self.follower.start(database)
        except BaseException:
            # No stop hook runs for a start that failed: the relay task would outlive it.
            if self.relay is not None:
                await self.relay.stop()
            raise
        self._pruner = asyncio.create_task(self._prune_forever(database))

    async def end_watches(self) -> None:
        """End every ``WatchActivity`` stream, now and later (a server drain hook)."""
        ended = self.broker.end_all()
        if ended:
            _log.info("ended %d activity watches for the drain", ended)

    async def stop(self, database: Database) -> None:
        """Stop the pruner, the hint relay and the log follower (a server stop hook)."""
        if self.relay is not None:
            await self.relay.stop()
        await self.follower.stop()
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
    head_workspace_seq: int = 0


@dataclass(frozen=True)
class WatchDelta:
    """A live delta, following durable event ``after_event_id`` in this stream."""

    delta: MessageDelta
    after_event_id: int
    received_at_unix_ms: int
    after_workspace_seq: int = 0


WatchItem = WatchReady | StoredEvent | WatchDelta


async def _read(
    database: Database,
    workspace_id: str,
    after: int,
    up_to: int | None,
    limit: int,
    *,
    by_seq: bool = False,
    resume_id: int | None = None,
) -> list[StoredEvent]:
    """Events after ``after`` (an id, or a ``workspace_seq`` with ``by_seq``).

    ``resume_id`` is the stream's resume cursor reported with a ``by_seq`` expiry.

    ``OUT_OF_RANGE`` when a prune may have removed some of them: the retention bound is read
    after the page; a prune that deleted events this read needed committed its bound with the
    delete, so it is seen here (a prune after the page read is seen too and costs only a
    resubscription). Without it a prune racing the catch-up would drop events silently.
    """

    async def read(tx: HostTransaction) -> tuple[list[StoredEvent], int, int]:
        if by_seq:
            page = await tx.events.after_seq(workspace_id, after, up_to=up_to, limit=limit)
            pruned_seq = await tx.events.pruned_through_seq(workspace_id)
            return page, pruned_seq, await tx.events.pruned_through(workspace_id)
        page = await tx.events.after(workspace_id, after, up_to=up_to, limit=limit)
        pruned_id = await tx.events.pruned_through(workspace_id)
        return page, pruned_id, pruned_id

    page, pruned, pruned_id = await unit_of_work.run(database, read, write=False)
    if pruned > after:
        # Both paths name the oldest retained id: the consumer's reconcile starts there.
        metadata = (
            {
                "after_event_id": str(resume_id),
                "after_workspace_seq": str(after),
                "oldest_retained_event_id": str(pruned_id + 1),
            }
            if by_seq
            else {"after_event_id": str(after), "oldest_retained_event_id": str(pruned_id + 1)}
        )
        raise OutOfRange(
            f"events after {after} were pruned while this stream read them; "
            "reconcile and resubscribe without a cursor",
            reason="EVENT_CURSOR_EXPIRED",
            metadata=metadata,
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
    watching = False
    try:
        bounds = await _bounds(database, workspace_id)
        if after_event_id is not None:
            _check_cursor(after_event_id, bounds)
        feed.follower.watch(workspace_id, bounds.workspace_head_seq)
        watching = True
        if feed.shared is not None:
            # Other replicas' deltas come through the live log: subscribed before ready.
            await feed.shared.ready(workspace_id, _LIVE_LOG_READY_SECONDS)
        yield WatchReady(
            workspace_id,
            bounds.workspace_head,
            bounds.oldest_retained or 0,
            bounds.workspace_head_seq,
        )
        start = bounds.workspace_head if after_event_id is None else after_event_id
        cursor = _Cursor(database, workspace_id, settings.page_size, start)
        async with contextlib.aclosing(cursor.read_until(bounds.workspace_head)) as backlog:
            async for stored in backlog:
                yield stored
        # Caught up through the head: from here on the stream follows the workspace sequence.
        cursor.last_seq = bounds.workspace_head_seq
        texts = _LiveTexts()
        parked = _ParkedBatches()
        while True:
            item = await _next_live(subscription, cursor.last, parked)
            if isinstance(item, LiveDelta):
                texts.apply(item.delta)
                yield WatchDelta(item.delta, cursor.last, item.received_at_unix_ms, cursor.last_seq)
                continue
            async with contextlib.aclosing(_committed(feed, cursor, texts, parked, item)) as new:
                async for stored in new:
                    yield stored
    finally:
        subscription.close()
        if watching:
            feed.follower.unwatch(workspace_id)


async def _committed(
    feed: ActivityFeed,
    cursor: _Cursor,
    texts: _LiveTexts,
    parked: _ParkedBatches,
    batch: CommittedBatch | None,
) -> AsyncGenerator[StoredEvent, None]:
    """The events a committed batch brings the stream, in sequence (None: the park expired).

    A batch that follows the last emitted sequence is emitted, one already emitted skipped,
    and a gap is read from the log up to the batch — except with the shared lane, where the
    batch is parked until the follower has handed the gap on behind its fence.
    """
    if batch is None:
        # The follower did not bring the gap in time (the bus is down): read it here.
        async with contextlib.aclosing(cursor.read_gap(parked.release())) as gap:
            async for stored in gap:
                yield stored
        return
    if batch.last_seq <= cursor.last_seq:
        pass
    elif batch.previous_seq <= cursor.last_seq:
        for stored in cursor.follow(batch, texts):
            yield stored
    elif feed.shared is not None:
        # Another replica's events in the gap go out only after its earlier deltas
        # (ADR 0041 §6): the follower reads them behind a fence, so they arrive after.
        parked.park(batch, feed.shared.fence_timeout_seconds + feed.settings.idle_check_seconds)
        feed.follower.wake(cursor.workspace_id)
    else:
        async with contextlib.aclosing(cursor.read_gap(batch.last_seq)) as gap:
            async for stored in gap:
                yield stored
    for ready in parked.take_ready(cursor.last_seq):
        for stored in cursor.follow(ready, texts):
            yield stored


async def _next_live(
    subscription: Subscription, last: int, parked: _ParkedBatches
) -> LiveItem | None:
    """The subscription's next item; None once a parked batch's deadline passed.

    The subscription's end is mapped to the stream's error.
    """
    wait_seconds = parked.wait_seconds()
    if wait_seconds == 0.0:
        return None  # checked before reading: a flood of deltas must not hold it forever
    try:
        while True:
            item = await subscription.next(wait_seconds)
            if item is not None or wait_seconds is not None:
                return item
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


class _ParkedBatches:
    """This process's batches that arrived past a gap, waiting for the follower to fill it.

    With the shared lane the gap may hold another replica's events whose deltas are still on
    their way; the follower hands those on behind a fence, so the deltas arrive first. A
    batch waits until the stream reached its ``previous_seq``, or until the deadline; then
    the stream reads the gap itself, as without the shared lane.
    """

    def __init__(self) -> None:
        self._batches: list[CommittedBatch] = []
        self._deadline: float | None = None

    def park(self, batch: CommittedBatch, wait_seconds: float) -> None:
        """Hold ``batch``; the first parked batch sets the deadline."""
        self._batches.append(batch)
        if self._deadline is None:
            self._deadline = asyncio.get_running_loop().time() + wait_seconds

    def wait_seconds(self) -> float | None:
        """How long the stream may wait for its next item (None: no batch waits)."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    def take_ready(self, last_seq: int) -> list[CommittedBatch]:
        """The parked batches that now follow ``last_seq``, in order; drops covered ones."""
        ready: list[CommittedBatch] = []
        while self._batches:
            waiting = [batch for batch in self._batches if batch.last_seq > last_seq]
            follows = [batch for batch in waiting if batch.previous_seq <= last_seq]
            if not follows:
                self._batches = waiting
                break
            batch = min(follows, key=lambda candidate: candidate.previous_seq)
            ready.append(batch)
            waiting.remove(batch)
            self._batches = waiting
            last_seq = batch.last_seq
        if not self._batches:
            self._deadline = None
        return ready

    def release(self) -> int:
        """Give up waiting: the highest sequence the parked batches reach (the gap's end)."""
        through = max(batch.last_seq for batch in self._batches)
        self._batches = []
        self._deadline = None
        return through


class _Cursor:
    """Where a stream stands and the reads that advance it.

    ``last`` is the id of the last durable event the stream emitted or passed over (the
    consumer's resume cursor); ``last_seq`` its ``workspace_seq``, which orders the live phase.
    """

    def __init__(self, database: Database, workspace_id: str, page_size: int, last: int) -> None:
        self._database = database
        self.workspace_id = workspace_id
        self._page_size = page_size
        self.last = last
        self.last_seq = 0

    def _advance(self, stored: StoredEvent) -> None:
        self.last = stored.event_id
        self.last_seq = stored.workspace_seq

    async def read_until(self, up_to: int) -> AsyncGenerator[StoredEvent, None]:
        """The log's events after id ``last`` through id ``up_to``, page by page (catch-up)."""
        while self.last < up_to:
            page = await _read(self._database, self.workspace_id, self.last, up_to, self._page_size)
            if not page:
                break
            for stored in page:
                yield stored
                self._advance(stored)

    async def read_gap(self, up_to_seq: int) -> AsyncGenerator[StoredEvent, None]:
        """The log's events after ``last_seq`` through ``up_to_seq``, page by page."""
        while self.last_seq < up_to_seq:
            page = await _read(
                self._database,
                self.workspace_id,
                self.last_seq,
                up_to_seq,
                self._page_size,
                by_seq=True,
                resume_id=self.last,
            )
            if not page:
                break
            for stored in page:
                yield stored
                self._advance(stored)

    def follow(self, batch: CommittedBatch, texts: _LiveTexts) -> Iterator[StoredEvent]:
        """A batch's events after ``last_seq``, minus snapshots the deltas already carried."""
        for stored in batch.events:
            if stored.workspace_seq <= self.last_seq:
                continue
            self._advance(stored)
            if texts.represents(
                stored.session_id,
                dict(batch.redundant_texts.get(stored.event_id, {})) or None,
            ):
                continue  # a non-terminal snapshot the deltas already carried
            yield stored
