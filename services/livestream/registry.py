"""The retained publishers of a livestream process and their workspace feeds (LIVE-PUB-1).

The registry creates a publisher on the first hello of its (principal, device, scope),
attaches it to one shared :class:`~services.livestream.feed.WorkspaceFeed` per workspace
and keeps it for the retention period after its call ends. It bounds their number per
principal and overall (ADR 0019: the longest-disconnected publisher makes room first;
only when all are connected is a hello refused ``PUBLISHER_LIMIT_EXCEEDED``), and it
discards a feed once no publisher needs it.

With a hand-over transport (``TUTTI_BUS=nats``, SCALE-4, ADR 0043) it answers for the epoch
of every publisher it holds: :meth:`PublisherRegistry.hand_over` freezes the publisher and
gives up its state; :meth:`PublisherRegistry.take_over` asks the owner of a cursor's epoch
for it and adopts it within the replay-memory cap, continuing each workspace from the Host
position the publisher had consumed (a feed already exactly there, or one started there).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from agentactivity.livestream.v1 import livestream_pb2
from domainerrors import Aborted, DomainError, ResourceExhausted, Unavailable
from grpcserver.auth import Principal
from services.livestream import attachments
from services.livestream.deliveries import DeliveryMapper, discontinuity, reconcile_keys
from services.livestream.feed import WorkspaceFeed
from services.livestream.handover.port import HandoverTransport, OwnerLost
from services.livestream.handover.state import (
    FORMAT_VERSION,
    HandoverRefused,
    HandoverRequest,
    PublisherState,
    is_epoch_token,
)
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


def handed_over() -> DomainError:
    """The typed close of a call whose publisher another replica took over (SCALE-4)."""
    return Aborted("this device resumed on another livestream replica", reason="LINK_SUPERSEDED")


HANDOVER_JOIN_SECONDS = 60.0
"""How long a feed started for a hand-over stays joinable at its origin by publishers handed
over later from the same position (a drain's reconnects arrive within its grace)."""

Rejected = livestream_pb2.ResumeRejectedReason


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
        handover: HandoverTransport | None = None,
    ) -> None:
        self.settings = settings
        self.source = source
        self.handover = handover
        self.memory = ReplayMemory(settings.live_replay_memory_bytes)
        self.publishers: dict[PublisherKey, Publisher] = {}
        self.feeds: dict[str, WorkspaceFeed] = {}
        """The head feed of each workspace (shared by the publishers that began here)."""
        self.handover_feeds: dict[WorkspaceFeed, float] = {}
        """Feeds started at a handed-over position, and when (monotonic)."""
        self.by_epoch: dict[str, Publisher] = {}
        self._subscribed: dict[PublisherKey, list[WorkspaceFeed]] = {}
        self._taking_over: dict[PublisherKey, asyncio.Lock] = {}
        self._taking_over_count: Counter[PublisherKey] = Counter()
        self._emptied = asyncio.Event()
        """Set when the last publisher is discarded (a drain waits for it)."""
        self._clock = clock
        self._janitor: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._per_principal: Counter[str] = Counter()
        self._orphan_reads: set[asyncio.Future[Any]] = set()

    # ---- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        """Start discarding publishers past their retention."""
        self._janitor = asyncio.create_task(self._expire_loop(), name="publisher-expiry")

    async def drain(self, handover_seconds: float = 0.0) -> None:
        """End every call with ``UNAVAILABLE`` ``DRAINING`` (the server refuses new ones).

        With a hand-over transport, keep answering hand-over requests for up to
        ``handover_seconds`` (the rest of the grace) or until no publisher is left here,
        so the devices told to reconnect resume exactly on another replica (ADR 0043).
        """
        for publisher in self.publishers.values():
            if publisher.call is not None:
                publisher.call.close(draining())
        if self.handover is None or handover_seconds <= 0:
            return
        log.info(
            "draining: answering hand-overs of %d publishers for up to %.1f s",
            len(self.publishers),
            handover_seconds,
        )
        self._emptied.clear()
        if self.publishers:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(handover_seconds):
                    await self._emptied.wait()
        log.info("draining: %d publishers were not handed over", len(self.publishers))

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
        feeds += list(self.handover_feeds)
        self.handover_feeds.clear()
        for feed in feeds:
            await feed.stop()
        for task in list(self._background):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.handover is not None:
            await self.handover.close()
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
        publisher = self._new_publisher(key, principal)
        feeds = self._subscribed[key] = []
        for workspace_id in key.workspace_ids:
            feed = self._feed(workspace_id)
            feed.listeners.add(publisher)
            feeds.append(feed)
        return publisher

    def _new_publisher(self, key: PublisherKey, principal: Principal) -> Publisher:
        self._make_room(principal.subject)
        publisher = Publisher(
            key,
            principal,
            replay_budget_bytes=self.settings.live_replay_budget_bytes,
            memory=self.memory,
            link_queue_bytes=self.settings.live_link_queue_bytes,
            slow_consumer=slow_consumer,
            clock=self._clock,
            on_epoch=self._epoch_changed,
        )
        publisher.retained_until = self._clock() + self.settings.live_publisher_retention_seconds
        self.publishers[key] = publisher
        self._per_principal[key.principal] += 1
        return publisher

    def _epoch_changed(self, publisher: Publisher, old: str, new: str) -> None:
        if old and self.by_epoch.get(old) is publisher:
            del self.by_epoch[old]
            if self.handover is not None:
                self.handover.withdraw(old)
        self.by_epoch[new] = publisher
        if self.handover is not None:
            self.handover.announce(new)

    def feeds_of(self, publisher: Publisher) -> list[WorkspaceFeed]:
        """The feeds a publisher receives from."""
        return list(self._subscribed.get(publisher.key, ()))

    # ---- hand-over (SCALE-4) -------------------------------------------------------

    async def take_over(
        self,
        principal: Principal,
        device_id: str,
        workspaces: Iterable[str],
        cursor: livestream_pb2.ResumeCursor,
    ) -> int | None:
        """Take the publisher of a hello's cursor over from the replica that holds it.

        Does nothing without a transport, when the cursor's epoch is held here, or when it
        cannot name an epoch of this service. Returns the ``ResumeRejectedReason`` to use
        when the epoch could not be taken over and the owner said precisely why (else
        ``None``: the resume then answers ``EPOCH_UNKNOWN`` as after a crash).
        """
        key = PublisherKey(principal.subject, device_id, tuple(sorted(set(workspaces))))
        if self.handover is None or not is_epoch_token(cursor.epoch):
            return None
        # Two hellos of one device at once ask once: the second finds the epoch adopted.
        lock = self._taking_over.setdefault(key, asyncio.Lock())
        self._taking_over_count[key] += 1
        try:
            async with lock:
                local = self.publishers.get(key)
                if local is not None and local.epoch == cursor.epoch:
                    return None
                request = HandoverRequest(
                    v=FORMAT_VERSION,
                    principal=key.principal,
                    device_id=key.device_id,
                    workspace_ids=key.workspace_ids,
                    epoch=cursor.epoch,
                    last_sequence=cursor.last_sequence,
                )
                try:
                    state = await self.handover.request(request, self._adoptable_bytes())
                except OwnerLost as error:
                    log.info(
                        "no owner of epoch %s answered (%s); resume rejected", cursor.epoch, error
                    )
                    return None
                except HandoverRefused as error:
                    log.warning("hand-over of epoch %s refused: %s", cursor.epoch, error)
                    return error.resume_rejected
                try:
                    self.adopt(principal, state)
                except HandoverRefused as error:
                    log.warning("could not adopt epoch %s: %s", cursor.epoch, error)
                    return error.resume_rejected
                return None
        finally:
            self._taking_over_count[key] -= 1
            if not self._taking_over_count[key]:
                del self._taking_over_count[key]
                del self._taking_over[key]

    def _adoptable_bytes(self) -> int:
        return min(self.settings.live_replay_budget_bytes, self.memory.cap_bytes)

    def adopt(self, principal: Principal, state: PublisherState) -> Publisher:
        """Continue a handed-over publisher here (see the module docstring).

        The replay tail must fit the per-publisher budget and the process cap (room is made
        under the cap as for any append). The first new delivery is an
        ``upstream_resubscribed`` discontinuity per workspace: deltas Host streamed between
        the old owner's freeze and this replica's subscription cannot be replayed.

        Raises:
            HandoverRefused: ``TOO_LARGE`` (``CURSOR_OUTSIDE_WINDOW``) or ``KEY_MISMATCH``.
        """
        key = PublisherKey(state.principal, state.device_id, tuple(sorted(state.workspace_ids)))
        if key.principal != principal.subject or key.workspace_ids != state.workspace_ids:
            raise HandoverRefused("KEY_MISMATCH", "the state is not this device's publisher")
        if state.replay_bytes > self._adoptable_bytes():
            raise HandoverRefused(
                "TOO_LARGE",
                f"{state.replay_bytes} replay bytes exceed what a publisher may hold here",
                Rejected.RESUME_REJECTED_REASON_CURSOR_OUTSIDE_WINDOW,
            )
        local = self.publishers.get(key)
        if local is not None:
            # This device's older publisher here (another epoch) gives way, call and all.
            if local.call is not None:
                local.call.close(superseded())
            self._discard(key)
        publisher = self._new_publisher(key, principal)
        try:
            publisher.restore(state)
        except ValueError as error:
            self._discard(key)
            raise HandoverRefused(
                "TOO_LARGE", str(error), Rejected.RESUME_REJECTED_REASON_CURSOR_OUTSIDE_WINDOW
            ) from None
        # The junction: what Host streamed between the old owner's freeze and this
        # replica's subscription (ephemeral deltas) is not replayable (ADR 0043).
        for workspace_id in key.workspace_ids:
            publisher.publish(
                discontinuity(
                    livestream_pb2.DISCONTINUITY_REASON_UPSTREAM_RESUBSCRIBED,
                    reconcile_keys(workspace_id),
                )
            )
        feeds = self._subscribed[key] = []
        for workspace_id in key.workspace_ids:
            feeds.append(self._continue(publisher, workspace_id, state.positions[workspace_id]))
        for binding in publisher.bindings.values():
            if binding.session_id is not None and not binding.caught_up:
                # A baseline cut by the hand-over is read again from Host (LIVE-ATT-1).
                attachments.rebaseline(
                    publisher,
                    binding,
                    self.source,
                    safe_bytes=self.settings.live_safe_delivery_bytes,
                )
        log.info(
            "adopted publisher %s epoch %s at sequence %d (%d replay bytes)",
            key,
            state.epoch,
            state.latest_sequence,
            state.replay_bytes,
        )
        return publisher

    def _continue(
        self, publisher: Publisher, workspace_id: str, position: int | None
    ) -> WorkspaceFeed:
        """Attach ``publisher`` to a feed of ``workspace_id`` continuing right after ``position``.

        An existing feed exactly there, or one started there.
        """
        if position is None:
            feed = self._feed(workspace_id)
            feed.listeners.add(publisher)
            return feed
        now = time.monotonic()
        head = self.feeds.get(workspace_id)
        candidates = ([head] if head is not None else []) + [
            f for f in self.handover_feeds if f.workspace_id == workspace_id
        ]
        for feed in candidates:
            if feed.join(publisher, position):
                return feed
        feed = WorkspaceFeed(
            workspace_id,
            self.source,
            self._mapper(workspace_id),
            retry_seconds=self.settings.live_upstream_retry_seconds,
            origin=position,
        )
        self.handover_feeds[feed] = now
        feed.listeners.add(publisher)
        feed.start()
        return feed

    def hand_over(self, request: HandoverRequest) -> PublisherState:
        """Freeze the publisher holding ``request.epoch`` and give up its state.

        The publisher's call ends ``ABORTED`` ``LINK_SUPERSEDED``, its baselines stop, and
        it is discarded here: from now on its owner is the replica that asked.

        Raises:
            HandoverRefused: no such publisher (``UNKNOWN_EPOCH``), another device's
                (``KEY_MISMATCH``), or a cursor it cannot resume (``CURSOR_AHEAD``,
                ``CURSOR_OUTSIDE_WINDOW``, with the resume reason).
        """
        publisher = self.by_epoch.get(request.epoch)
        if publisher is None or publisher.epoch != request.epoch:
            raise HandoverRefused("UNKNOWN_EPOCH", "this replica no longer holds the epoch")
        key = publisher.key
        if (key.principal, key.device_id, key.workspace_ids) != (
            request.principal,
            request.device_id,
            tuple(sorted(request.workspace_ids)),
        ):
            raise HandoverRefused("KEY_MISMATCH", "the epoch belongs to another device or scope")
        if request.last_sequence > publisher.latest_sequence:
            raise HandoverRefused("CURSOR_AHEAD", "", Rejected.RESUME_REJECTED_REASON_CURSOR_AHEAD)
        if not publisher.buffer.holds_after(request.last_sequence):
            raise HandoverRefused(
                "CURSOR_OUTSIDE_WINDOW", "", Rejected.RESUME_REJECTED_REASON_CURSOR_OUTSIDE_WINDOW
            )
        publisher.freeze(handed_over())
        positions = {feed.workspace_id: feed.delivered_through for feed in self.feeds_of(publisher)}
        for workspace_id in key.workspace_ids:
            positions.setdefault(workspace_id, None)
        state = publisher.export(request.last_sequence, positions)
        self._discard(key)
        log.info(
            "handed publisher %s epoch %s over at sequence %d",
            key,
            publisher.epoch,
            publisher.latest_sequence,
        )
        return state

    def release(self, publisher: Publisher, call: BoundCall) -> None:
        """A call ended: keep the publisher for the retention period."""
        publisher.unbind(call, self.settings.live_publisher_retention_seconds)

    def _mapper(self, workspace_id: str) -> DeliveryMapper:
        return DeliveryMapper(
            workspace_id,
            safe_bytes=self.settings.live_safe_delivery_bytes,
            fence_size=self.settings.live_settled_turn_fence,
        )

    def _feed(self, workspace_id: str) -> WorkspaceFeed:
        feed = self.feeds.get(workspace_id)
        if feed is None:
            feed = WorkspaceFeed(
                workspace_id,
                self.source,
                self._mapper(workspace_id),
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
        if not self.publishers:
            self._emptied.set()
        if self.by_epoch.get(publisher.epoch) is publisher:
            del self.by_epoch[publisher.epoch]
            if self.handover is not None:
                self.handover.withdraw(publisher.epoch)
        publisher.close()
        for feed in self._subscribed.pop(key, ()):
            feed.listeners.discard(publisher)
            if not feed.listeners:
                if self.feeds.get(feed.workspace_id) is feed:
                    del self.feeds[feed.workspace_id]
                self.handover_feeds.pop(feed, None)
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
        joinable_since = time.monotonic() - HANDOVER_JOIN_SECONDS
        for feed, started in self.handover_feeds.items():
            if started < joinable_since:
                feed.close_history()
        return len(expired)

    async def _expire_loop(self) -> None:
        period = max(0.05, min(5.0, self.settings.live_publisher_retention_seconds / 4))
        while True:
            await asyncio.sleep(period)
            try:
                self.expire()
            except Exception:
                log.exception("publisher expiry failed")
