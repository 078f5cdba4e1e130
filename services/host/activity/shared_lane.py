"""The live lane shared by Host replicas through the live log (SCALE-3, ADR 0041).

With ``TUTTI_BUS=nats`` every replica publishes the deltas it accepts, and a wake hint for
every commit, to the workspace's subject of the live log; every replica subscribes to the
subjects of the workspaces watched there. The in-process broker stays the fan-out inside a
process:

* a delta accepted here is handed to the broker at once (today's path) *and* sent to the
  log pipelined under its Session's key in an :class:`~livelog.barrier.AckBarrier`; the
  runtime link settles that key before the report that confirms the deltas is applied, so
  the commit never overtakes them in the log (HOST-RT-2 across replicas);
* a delta another replica published arrives through this process's subscription and is
  handed to the broker (this process's own are recognised by their message id and skipped);
* a committed batch is announced post-commit with a :class:`CommitHint` (message id
  ``ev:<workspace>:<sequence>``); a replica that receives it wakes its log follower, which
  reads the events from the durable log (the truth); a hint the log did not take is
  republished by :mod:`services.host.activity.hint_relay`;
* before the follower hands another replica's events to the broker, :meth:`SharedLane.fence`
  makes sure every delta the log stored before them went first: either a hint at least that
  far already came through the subscription, or a fence item is published and awaited.

A delta the log did not take (the bus is unreachable) is dropped and counted against its
Session; the next settle reports it and the link writes a durable
``session_reconcile_required`` for that Session — the typed, scoped signal every replica
serves from the durable log. A subscription's :class:`~livelog.Discontinuity` is logged and
wakes the follower (committed events come from the durable log).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from livelog.barrier import AckBarrier
from livelog.interface import (
    Discontinuity,
    LiveLog,
    LiveLogSubscription,
    LiveLogUnavailable,
    LogPosition,
)
from services.host.activity.broker import ActivityBroker, CommittedBatch, LiveDelta

__all__ = ["CommitHint", "FenceItem", "LaneItem", "SharedLane", "hint_msg_id"]

_log = logging.getLogger(__name__)

_RETRY_SECONDS = 0.5
"""The pause before a failed subscription is tried again."""


@dataclass(frozen=True)
class CommitHint:
    """Events of a workspace committed through ``last_seq`` (a wake hint, not the events)."""

    workspace_id: str
    last_event_id: int
    last_seq: int


@dataclass(frozen=True)
class FenceItem:
    """A marker a replica publishes to learn that its subscription delivered everything before."""

    workspace_id: str
    token: str


LaneItem = LiveDelta | CommitHint | FenceItem
"""What travels on a workspace's subject."""


def hint_msg_id(workspace_id: str, sequence: int) -> str:
    """The message id of the hint for events through ``sequence`` (every copy uses it)."""
    return f"ev:{workspace_id}:{sequence}"


class _Follow:
    """This process's subscription to one workspace and what it has delivered."""

    def __init__(self) -> None:
        self.watchers = 1
        self.ready = asyncio.Event()
        self.hinted_seq = 0
        self.fences: dict[str, asyncio.Future[None]] = {}
        self.task: asyncio.Task[None] | None = None
        self.subscription: LiveLogSubscription[LaneItem] | None = None


class SharedLane:
    """Deltas and commit hints of one Host process on the shared live log.

    Args:
        log: The live log (JetStream in production).
        broker: The process's broker (the fan-out to its ``WatchActivity`` streams).
        fence_timeout_seconds: How long the follower waits for the log before handing
            another replica's events on anyway (deltas then may be missing, never events).
    """

    def __init__(
        self,
        log: LiveLog[LaneItem],
        broker: ActivityBroker,
        *,
        fence_timeout_seconds: float = 2.0,
    ) -> None:
        self.log = log
        self._broker = broker
        self._barrier: AckBarrier[LaneItem] = AckBarrier(log)
        self._fence_timeout = fence_timeout_seconds
        self._origin = f"dl:{uuid.uuid4().hex[:12]}:"
        self._counter = itertools.count(1)
        self._dropped: dict[tuple[str, str], int] = {}
        self._follows: dict[str, _Follow] = {}
        self._wake: Callable[[str], None] = lambda _workspace: None
        self._hint_tasks: set[asyncio.Task[None]] = set()
        self._announced: dict[str, int] = {}
        self.on_lost_hint: Callable[[str, int], None] = lambda _workspace, _previous: None
        """Told ``(workspace, previous_seq)`` of a hint the log did not take (the relay)."""
        broker.add_observer(self._announce)

    @property
    def fence_timeout_seconds(self) -> float:
        """How long a fence waits for the log before it gives up."""
        return self._fence_timeout

    # -- publishing ---------------------------------------------------------------------

    async def send_delta(self, live: LiveDelta) -> bool:
        """Send an accepted delta to the log under its Session; False when it was dropped."""
        delta = live.delta
        key = (delta.workspace_id, delta.session_id)
        try:
            await self._barrier.send(
                key, delta.workspace_id, live, f"{self._origin}{next(self._counter)}"
            )
        except LiveLogUnavailable:
            self._dropped[key] = self._dropped.get(key, 0) + 1
            return False
        return True

    async def settle(self, workspace_id: str, session_id: str) -> int:
        """Wait for the Session's sent deltas; how many the log may not hold (0: all held).

        Called before the report that confirms them is applied: every delta acknowledged
        here is in the log before the report's commit and its hint.
        """
        key = (workspace_id, session_id)
        settled = await self._barrier.settle(key)
        return settled.failed + self._dropped.pop(key, 0)

    def _announce(self, batch: CommittedBatch) -> None:
        """Post-commit wake hint of a batch this process committed (a broker observer)."""
        if not batch.local or not batch.events:
            return
        hint = CommitHint(batch.workspace_id, batch.last_event_id, batch.last_seq)
        if batch.workspace_id in self._follows:
            # Remembered only while the workspace is watched here (its hints come back).
            announced = self._announced.get(batch.workspace_id, 0)
            self._announced[batch.workspace_id] = max(announced, batch.last_seq)
        task = asyncio.get_running_loop().create_task(self._publish_hint(hint, batch.previous_seq))
        self._hint_tasks.add(task)
        task.add_done_callback(self._hint_tasks.discard)

    async def _publish_hint(self, hint: CommitHint, previous_seq: int) -> None:
        try:
            await self.log.publish(
                hint.workspace_id, hint, hint_msg_id(hint.workspace_id, hint.last_seq)
            )
        except LiveLogUnavailable:
            # Only a hint: other replicas' followers find the events at their next poll,
            # and the relay republishes it once the log is back.
            _log.warning("commit hint for %s through %d lost", hint.workspace_id, hint.last_seq)
            self.on_lost_hint(hint.workspace_id, previous_seq)
        except Exception:  # noqa: BLE001 - a wake hint never fails the commit path
            _log.exception("commit hint for %s failed", hint.workspace_id)

    # -- the WakeHints port of the log follower ----------------------------------------

    async def start(self, wake: Callable[[str], None]) -> None:
        """Deliver commit hints (and discontinuities) to ``wake``."""
        self._wake = wake

    def watch(self, workspace_id: str) -> None:
        """Subscribe to the workspace's subject (its first watcher here)."""
        follow = self._follows.get(workspace_id)
        if follow is not None:
            follow.watchers += 1
            return
        follow = _Follow()
        self._follows[workspace_id] = follow
        follow.task = asyncio.get_running_loop().create_task(self._consume(workspace_id, follow))

    def unwatch(self, workspace_id: str) -> None:
        """Drop the subscription after the workspace's last watcher here."""
        follow = self._follows.get(workspace_id)
        if follow is None:
            return
        follow.watchers -= 1
        if follow.watchers <= 0:
            del self._follows[workspace_id]
            self._announced.pop(workspace_id, None)
            if follow.task is not None:
                follow.task.cancel()

    async def stop(self) -> None:
        """End every subscription and close the log."""
        follows = list(self._follows.values())
        self._follows.clear()
        for follow in follows:
            if follow.task is not None:
                follow.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await follow.task
        for task in list(self._hint_tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.log.close()

    async def ready(self, workspace_id: str, wait_seconds: float) -> bool:
        """Wait until the workspace's subscription is established (before a stream's ready)."""
        follow = self._follows.get(workspace_id)
        if follow is None:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(follow.ready.wait(), wait_seconds)
        return follow.ready.is_set()

    async def fence(self, workspace_id: str, through_seq: int) -> None:
        """Return once every item the log stored before now was delivered here.

        Called by the log follower before it hands events through ``through_seq`` on: a
        delta stored before them (it was acknowledged before their commit) is then already
        in the broker. A hint at least that far already proves it; otherwise a fence item
        goes through the log. On a bus failure it returns after the timeout anyway.
        """
        follow = self._follows.get(workspace_id)
        if follow is None or follow.hinted_seq >= through_seq:
            return
        token = uuid.uuid4().hex
        arrived: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        follow.fences[token] = arrived
        try:
            await asyncio.wait_for(
                self._fence_round_trip(workspace_id, token, arrived), self._fence_timeout
            )
        except (TimeoutError, LiveLogUnavailable):
            _log.warning("live log fence for %s not delivered; events go on", workspace_id)
        finally:
            follow.fences.pop(token, None)

    async def _fence_round_trip(
        self, workspace_id: str, token: str, arrived: asyncio.Future[None]
    ) -> None:
        await self.log.publish(workspace_id, FenceItem(workspace_id, token), f"fence:{token}")
        await arrived

    # -- the subscription ---------------------------------------------------------------

    async def _consume(self, workspace_id: str, follow: _Follow) -> None:
        # Where to resume if the subscription itself fails: the log then says what is missing.
        last: LogPosition | None = None
        while True:
            try:
                subscription = await self.log.subscribe(workspace_id, last)
            except LiveLogUnavailable:
                _log.warning("live log subscription for %s unavailable; retrying", workspace_id)
                await asyncio.sleep(_RETRY_SECONDS)
                continue
            except Exception:  # noqa: BLE001 - the workspace's lane must outlive one failure
                _log.exception("live log subscription for %s failed; retrying", workspace_id)
                await asyncio.sleep(_RETRY_SECONDS)
                continue
            follow.subscription = subscription
            follow.ready.set()
            try:
                async for entry in subscription:
                    if isinstance(entry, Discontinuity):
                        self._on_discontinuity(entry)
                        continue
                    # Set before delivering: an item whose delivery fails is not retried.
                    last = entry.position
                    self._deliver(workspace_id, follow, entry.msg_id, entry.item)
                return
            except LiveLogUnavailable:
                _log.warning("live log subscription for %s lost; re-subscribing", workspace_id)
            except Exception:  # noqa: BLE001 - see above; resume after the last item delivered
                _log.exception("live log subscription for %s broke; re-subscribing", workspace_id)
                await asyncio.sleep(_RETRY_SECONDS)
            finally:
                with contextlib.suppress(Exception):
                    await subscription.close()

    def _deliver(self, workspace_id: str, follow: _Follow, msg_id: str, item: LaneItem) -> None:
        claimed = item.delta.workspace_id if isinstance(item, LiveDelta) else item.workspace_id
        if claimed != workspace_id:
            # Whoever can reach the bus could otherwise put items into another workspace's
            # WatchActivity: an item counts only on its own workspace's subject.
            _log.warning(
                "live lane item %s for workspace %r on the subject of %r dropped",
                msg_id,
                claimed,
                workspace_id,
            )
            return
        if isinstance(item, LiveDelta):
            if not msg_id.startswith(self._origin):  # this process's own went out directly
                self._broker.publish_delta(item)
        elif isinstance(item, CommitHint):
            follow.hinted_seq = max(follow.hinted_seq, item.last_seq)
            # This process's own hints come back too; its broker already had those events
            # (an earlier gap is read by the subscriber that sees it), so no read for them.
            if item.last_seq > self._announced.get(workspace_id, 0):
                self._wake(workspace_id)
        else:
            arrived = follow.fences.get(item.token)
            if arrived is not None and not arrived.done():
                arrived.set_result(None)

    def _on_discontinuity(self, gap: Discontinuity) -> None:
        # Lost deltas were counted by their publisher, which writes the Session's durable
        # reconcile; committed events are read from the durable log, so read it now.
        _log.warning(
            "live log discontinuity for %s (%s): deltas may be missing",
            gap.workspace_id,
            gap.reason.value,
        )
        self._wake(gap.workspace_id)
