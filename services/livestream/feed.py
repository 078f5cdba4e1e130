"""One Host activity subscription per workspace, shared by its publishers (ADR 0019).

A :class:`WorkspaceFeed` watches one workspace through the :class:`ActivitySource`, maps
what it receives once (:class:`~services.livestream.deliveries.DeliveryMapper`) and hands
the bodies to every attached publisher. It owns LIVE-UP-1:

- after a drop it resubscribes from its last durable event id, and the first thing its
  publishers receive from the new subscription is a workspace-wide
  ``upstream_resubscribed`` discontinuity (the deltas of the outage are gone);
- when Host no longer holds that id (``EVENT_CURSOR_EXPIRED``) the feed subscribes again
  at the head and, once that subscription is registered, every publisher ends its epoch.

Reading and mapping run as two tasks, so what arrives while a batch is being mapped is
mapped together next: adjacent appends coalesce under load (LIVE-COAL-1).

A feed knows the last durable event whose bodies it handed to its publishers
(``delivered_through``): that is the Host position a publisher handed over to another
replica continues from (SCALE-4, ADR 0043). A feed started for such a hand-over begins at
that position (``origin``) and keeps what it published since, up to a bound, so the
publishers handed over later from the same position join it instead of opening one Host
subscription each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from agentactivity.host.v1 import activity_pb2
from agentactivity.livestream.v1 import livestream_pb2
from services.livestream.deliveries import Body, DeliveryMapper
from services.livestream.source import ActivitySource, CursorExpired, SourceUnavailable

__all__ = ["FeedListener", "WorkspaceFeed"]

log = logging.getLogger(__name__)

MAX_RETRY_SECONDS = 30.0

MAX_BATCH_TURNS = 64
"""Loop turns the mapper waits for more of what Host already sent before mapping."""

MAX_BATCH_EVENTS = 4096
"""Events mapped together at most."""

JOIN_HISTORY_BYTES = 1024 * 1024
"""What a hand-over feed keeps of what it published, for publishers joining it later at its
origin; past it the feed is no longer joinable at its origin (a joiner opens its own)."""


class FeedListener(Protocol):
    """What a feed calls on each attached publisher."""

    def deliver(self, bodies: list[Body]) -> None:
        """Publish bodies of the feed's workspace, in order."""

    def end_epoch(self) -> None:
        """The Host cursor expired: end the epoch (LIVE-UP-1)."""

    def wake(self) -> None:
        """The feed became ready."""


class WorkspaceFeed:
    """A workspace's Host subscription and its attached publishers."""

    def __init__(
        self,
        workspace_id: str,
        source: ActivitySource,
        mapper: DeliveryMapper,
        *,
        retry_seconds: float,
        origin: int | None = None,
    ) -> None:
        self.workspace_id = workspace_id
        self.listeners: set[FeedListener] = set()
        self.last_event_id: int | None = origin
        self.origin = origin
        """The Host event id a hand-over feed starts after (``None``: the head)."""
        self.delivered_through: int | None = origin
        """The last durable event id whose bodies reached the listeners (``None`` before
        the first subscription is registered)."""
        self.history: list[Body] | None = [] if origin is not None else None
        """What a hand-over feed published since its origin, while it stays joinable."""
        self._history_bytes = 0
        self.resubscriptions = 0
        self._source = source
        self._mapper = mapper
        self._retry_seconds = retry_seconds
        self._ready = asyncio.Event()
        self._pending: list[activity_pb2.ActivityEvent | Body] = []
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def ready(self) -> bool:
        """Whether the Host subscription is registered (events are being buffered)."""
        return self._ready.is_set()

    async def wait_ready(self) -> None:
        """Wait until the Host subscription is registered."""
        await self._ready.wait()

    def start(self) -> None:
        """Start watching Host."""
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._read(), name=f"feed-read-{self.workspace_id}"),
                asyncio.create_task(self._map(), name=f"feed-map-{self.workspace_id}"),
            ]

    async def stop(self) -> None:
        """Stop watching Host."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    async def _read(self) -> None:
        delay = self._retry_seconds
        dropped = expired = False
        while True:
            try:
                async for item in self._source.watch(self.workspace_id, self.last_event_id):
                    if isinstance(item, activity_pb2.ActivityStreamReady):
                        self._on_ready(item, expired=expired, dropped=dropped)
                        expired = dropped = False
                        delay = self._retry_seconds
                        continue
                    if item.WhichOneof("event") != "message_delta":
                        self.last_event_id = item.event_id
                    self._push(item)
            except CursorExpired as error:
                log.warning(
                    "activity cursor of %s expired (%s); epochs end", self.workspace_id, error
                )
                self._ready.clear()
                self.last_event_id = None
                expired = True
                continue
            except SourceUnavailable as error:
                self._log_unavailable(error)
            self._ready.clear()
            dropped = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_SECONDS)

    def _on_ready(
        self, item: activity_pb2.ActivityStreamReady, *, expired: bool, dropped: bool
    ) -> None:
        """The subscription is registered: end epochs or mark the resubscription, then wake."""
        if self.last_event_id is None:
            self.last_event_id = item.head_event_id
        if self.delivered_through is None:
            self.delivered_through = item.head_event_id
        if expired:
            # LIVE-UP-1: the epochs end only now that the subscription at
            # the head is registered, so a device reconciling on their
            # resume_rejected cannot miss a commit made in between.
            self._publish_pending()
            self.delivered_through = item.head_event_id
            self.history = None  # its origin is gone
            for listener in list(self.listeners):
                listener.end_epoch()
        elif dropped:
            # LIVE-UP-1: before any event of the new subscription.
            self.resubscriptions += 1
            self._push(
                self._mapper.workspace_discontinuity(
                    livestream_pb2.DISCONTINUITY_REASON_UPSTREAM_RESUBSCRIBED
                )
            )
        self._ready.set()
        for listener in list(self.listeners):
            listener.wake()

    def _log_unavailable(self, error: SourceUnavailable) -> None:
        """Log a lost subscription: a drop at info, a refusal (misconfiguration) as a warning."""
        if error.code in ("UNAVAILABLE", "CANCELLED", "RESOURCE_EXHAUSTED"):
            log.info("activity feed of %s dropped (%s); resubscribing", self.workspace_id, error)
        else:  # a refusal: the service token or Host address is wrong
            log.warning(
                "Host refused the activity feed of %s (%s); check TUTTI_SERVICE_TOKEN "
                "and TUTTI_HOST_ADDRESS; retrying",
                self.workspace_id,
                error,
            )

    def _push(self, item: activity_pb2.ActivityEvent | Body) -> None:
        self._pending.append(item)
        self._wake.set()

    def _publish_pending(self) -> None:
        """Map and publish everything read so far (what arrived together maps together)."""
        items, self._pending = self._pending, []
        bodies: list[Body] = []
        run: list[activity_pb2.ActivityEvent] = []
        through = self.delivered_through
        for item in items:
            if isinstance(item, Body):
                bodies += self._mapper.map(run)
                run = []
                bodies.append(item)
            else:
                run.append(item)
                if item.WhichOneof("event") != "message_delta":
                    through = item.event_id
        bodies += self._mapper.map(run)
        self.delivered_through = through
        if bodies:
            self._remember(bodies)
            for listener in list(self.listeners):
                listener.deliver(bodies)

    def _remember(self, bodies: list[Body]) -> None:
        """Keep what a hand-over feed published, while it stays within its bound."""
        if self.history is None:
            return
        self._history_bytes += sum(len(body.body) for body in bodies)
        if self._history_bytes > JOIN_HISTORY_BYTES:
            self.history = None
        else:
            self.history += bodies

    def join(self, listener: FeedListener, after_event_id: int | None) -> bool:
        """Attach ``listener``, which has everything through ``after_event_id``, if exact.

        The listener joins when what the feed publishes next is exactly what follows that
        position: the feed has delivered through it, or it is a hand-over feed from that
        origin that still holds everything it published since (handed to the listener
        first). Returns whether it joined.
        """
        if after_event_id is not None and self.delivered_through == after_event_id:
            self.listeners.add(listener)
            return True
        if (
            after_event_id is not None
            and self.origin == after_event_id
            and self.history is not None
        ):
            if self.history:
                listener.deliver(list(self.history))
            self.listeners.add(listener)
            return True
        return False

    def close_history(self) -> None:
        """Stop being joinable at the origin (and free what was kept for it)."""
        self.history = None

    async def _map(self) -> None:
        while True:
            await self._wake.wait()
            # Adaptive batching: while the reader keeps finding messages Host already sent,
            # let it read on; map once it comes up empty (or the batch is large). Under
            # load, batches grow and every device gets one multi-delivery frame per batch;
            # when traffic is sparse this costs one loop turn of latency, not a timer.
            for _ in range(MAX_BATCH_TURNS):
                seen = len(self._pending)
                await asyncio.sleep(0)
                if len(self._pending) == seen or len(self._pending) >= MAX_BATCH_EVENTS:
                    break
            self._wake.clear()
            try:
                self._publish_pending()
            except Exception:
                log.exception("mapping activity of %s failed", self.workspace_id)
