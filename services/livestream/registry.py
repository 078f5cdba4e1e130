"""The retained publishers of a livestream process and their workspace feeds (LIVE-PUB-1).

The registry creates a publisher on the first hello of its (principal, device, scope),
attaches it to one shared :class:`~services.livestream.feed.WorkspaceFeed` per workspace
and keeps it for the retention period after its call ends. It bounds their number per
principal and overall (ADR 0019: the longest-disconnected publisher makes room first;
only when all are connected is a hello refused ``PUBLISHER_LIMIT_EXCEEDED``), and it
discards a feed once no publisher needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from domainerrors import Aborted, DomainError, ResourceExhausted, Unavailable
from grpcserver.auth import Principal
from services.livestream.deliveries import DeliveryMapper
from services.livestream.feed import WorkspaceFeed
from services.livestream.publisher import BoundCall, Publisher, PublisherKey
from services.livestream.replay import ReplayMemory
from services.livestream.settings import Settings
from services.livestream.source import ActivitySource

__all__ = ["PublisherRegistry"]

log = logging.getLogger(__name__)


def slow_consumer() -> DomainError:
    """The typed close of a call that fell too far behind (LIVE-FLOW-1)."""
    return ResourceExhausted(
        "this link fell too far behind its publisher; reconnect and resume",
        reason="SLOW_CONSUMER",
        retry_after_seconds=1.0,
    )


def superseded() -> DomainError:
    """The typed close of a call replaced by a newer one of the same device."""
    return Aborted("a newer DeviceLink of this device took over", reason="LINK_SUPERSEDED")


def draining() -> DomainError:
    """The typed close of every call when the server stops (ARCH-4)."""
    return Unavailable(
        "livestream is shutting down; reconnect and resume",
        reason="DRAINING",
        retry_after_seconds=1.0,
    )


class PublisherRegistry:
    """See the module docstring."""

    def __init__(
        self,
        settings: Settings,
        source: ActivitySource,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.source = source
        self.memory = ReplayMemory(settings.live_replay_memory_bytes)
        self.publishers: dict[PublisherKey, Publisher] = {}
        self.feeds: dict[str, WorkspaceFeed] = {}
        self._clock = clock
        self._janitor: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._per_principal: Counter[str] = Counter()
        self._orphan_reads: set[asyncio.Future[Any]] = set()

    # ---- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        """Start discarding publishers past their retention."""
        self._janitor = asyncio.create_task(self._expire_loop(), name="publisher-expiry")

    async def drain(self) -> None:
        """End every call with ``UNAVAILABLE`` ``DRAINING`` (the server refuses new ones)."""
        for publisher in self.publishers.values():
            if publisher.call is not None:
                publisher.call.close(draining())

    async def stop(self) -> None:
        """Stop feeds and discard every publisher."""
        if self._janitor is not None:
            self._janitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._janitor
        feeds = list(self.feeds.values())
        self.feeds.clear()
        for key in list(self.publishers):
            self._discard(key)
        # Baseline reads still in flight end with the server, not after it.
        reads = list(self._orphan_reads)
        for read in reads:
            read.cancel()
        await asyncio.gather(*reads, return_exceptions=True)
        for feed in feeds:
            await feed.stop()
        for task in list(self._background):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.source.close()

    # ---- publishers ----------------------------------------------------------------

    def publisher_for(
        self, principal: Principal, device_id: str, workspaces: Iterable[str]
    ) -> Publisher:
        """The publisher of (principal, device, scope), created (and subscribed) if needed.

        Raises:
            ResourceExhausted: ``PUBLISHER_LIMIT_EXCEEDED``.
        """
        key = PublisherKey(principal.subject, device_id, tuple(sorted(set(workspaces))))
        existing = self.publishers.get(key)
        if existing is not None:
            return existing
        self._make_room(principal.subject)
        publisher = Publisher(
            key,
            principal,
            replay_budget_bytes=self.settings.live_replay_budget_bytes,
            memory=self.memory,
            link_queue_bytes=self.settings.live_link_queue_bytes,
            slow_consumer=slow_consumer,
            clock=self._clock,
        )
        publisher.retained_until = self._clock() + self.settings.live_publisher_retention_seconds
        self.publishers[key] = publisher
        self._per_principal[key.principal] += 1
        for workspace_id in key.workspace_ids:
            self._feed(workspace_id).listeners.add(publisher)
        return publisher

    def feeds_of(self, publisher: Publisher) -> list[WorkspaceFeed]:
        """The feeds a publisher receives from."""
        return [self.feeds[w] for w in publisher.key.workspace_ids if w in self.feeds]

    def release(self, publisher: Publisher, call: BoundCall) -> None:
        """A call ended: keep the publisher for the retention period."""
        publisher.unbind(call, self.settings.live_publisher_retention_seconds)

    def _feed(self, workspace_id: str) -> WorkspaceFeed:
        feed = self.feeds.get(workspace_id)
        if feed is None:
            mapper = DeliveryMapper(
                workspace_id,
                safe_bytes=self.settings.live_safe_delivery_bytes,
                fence_size=self.settings.live_settled_turn_fence,
            )
            feed = WorkspaceFeed(
                workspace_id,
                self.source,
                mapper,
                retry_seconds=self.settings.live_upstream_retry_seconds,
            )
            self.feeds[workspace_id] = feed
            feed.start()
        return feed

    def _make_room(self, principal: str) -> None:
        # Counted, so a new device costs no scan until a bound is actually reached.
        if self._per_principal[principal] >= self.settings.live_max_publishers_per_principal:
            own = [p for p in self.publishers.values() if p.key.principal == principal]
            self._evict(own, "per-principal")
        if len(self.publishers) >= self.settings.live_max_publishers:
            self._evict(list(self.publishers.values()), "global")

    def _evict(self, candidates: list[Publisher], bound: str) -> None:
        idle = [p for p in candidates if p.call is None]
        if not idle:
            raise ResourceExhausted(
                f"the {bound} bound on retained publishers is reached and every one is connected",
                reason="PUBLISHER_LIMIT_EXCEEDED",
                retry_after_seconds=30.0,
            )
        oldest = min(idle, key=lambda p: p.retained_until or 0.0)
        log.info("discarding publisher %s to make room (%s bound)", oldest.key, bound)
        self._discard(oldest.key)

    def _discard(self, key: PublisherKey) -> None:
        publisher = self.publishers.pop(key)
        for read in publisher.reads:
            self._orphan_reads.add(read)
            read.add_done_callback(self._orphan_reads.discard)
        self._per_principal[key.principal] -= 1
        if not self._per_principal[key.principal]:
            del self._per_principal[key.principal]
        publisher.close()
        for workspace_id in key.workspace_ids:
            feed = self.feeds.get(workspace_id)
            if feed is None:
                continue
            feed.listeners.discard(publisher)
            if not feed.listeners:
                del self.feeds[workspace_id]
                task = asyncio.get_running_loop().create_task(feed.stop())
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    def expire(self) -> int:
        """Discard disconnected publishers past their retention; returns how many."""
        now = self._clock()
        expired = [
            key
            for key, p in self.publishers.items()
            if p.call is None and p.retained_until is not None and p.retained_until <= now
        ]
        for key in expired:
            self._discard(key)
        return len(expired)

    async def _expire_loop(self) -> None:
        period = max(0.05, min(5.0, self.settings.live_publisher_retention_seconds / 4))
        while True:
            await asyncio.sleep(period)
            try:
                self.expire()
            except Exception:
                log.exception("publisher expiry failed")
