"""A publisher: one device's sequenced, replayable delivery stream (LIVE-PUB-1, LIVE-RESUME-1).

A publisher belongs to one (principal, device id, workspace scope). It holds its epoch,
the sequence of its deliveries and their replay buffer, the attachments of its bindings
(LIVE-ATT-1) and at most one bound DeviceLink call. It outlives the call: the registry
keeps it, attached to its workspace feeds, for the retention period after the call ended.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentactivity.livestream.v1 import livestream_pb2
from domainerrors import DomainError
from grpcserver.auth import Principal
from services.livestream.deliveries import Body
from services.livestream.encoding import body_of, delivery_bytes
from services.livestream.handover.state import HandedBinding, PublisherState
from services.livestream.replay import ReplayBuffer, ReplayMemory

__all__ = ["Binding", "BoundCall", "Publisher", "PublisherKey", "ResumeDecision"]

ENDED_EPOCHS_REMEMBERED = 8
"""Ended epochs a publisher still recognises, to answer ``EPOCH_ENDED`` precisely."""

Rejected = livestream_pb2.ResumeRejectedReason


@dataclass(frozen=True, slots=True, order=True)
class PublisherKey:
    """Who a publisher belongs to; a different workspace set is a different publisher."""

    principal: str
    device_id: str
    workspace_ids: tuple[str, ...]


@dataclass
class Binding:
    """The publisher's knowledge of one attachment slot (LIVE-ATT-1).

    ``revision`` only grows, across calls and epochs; ``session_id`` is ``None`` after a
    detach or when the epoch that held the attachment ended.
    """

    binding_id: str
    revision: int
    workspace_id: str = ""
    session_id: str | None = None
    caller_turn_id: str | None = None
    caught_up: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class ResumeDecision:
    """How a hello's cursor was answered."""

    resumed: bool
    start_after: int
    rejected: int | None = None  # ResumeRejectedReason when a cursor was refused


class BoundCall:
    """The publisher's side of one DeviceLink call: where it is and how to end it."""

    def __init__(self, principal: Principal, start_after: int) -> None:
        self.principal = principal
        self.sent = start_after
        self.bound_at = start_after
        self.wakeup = asyncio.Event()
        self.close_error: DomainError | None = None
        self.epoch_changed = False

    def close(self, error: DomainError) -> None:
        """End the call with ``error`` (the first reason wins)."""
        if self.close_error is None:
            self.close_error = error
        self.wakeup.set()


class Publisher:
    """See the module docstring."""

    def __init__(
        self,
        key: PublisherKey,
        principal: Principal,
        *,
        replay_budget_bytes: int,
        memory: ReplayMemory,
        link_queue_bytes: int,
        slow_consumer: Callable[[], DomainError],
        clock: Callable[[], float] = time.time,
        on_epoch: Callable[[Publisher, str, str], None] | None = None,
    ) -> None:
        self.key = key
        self.principal = principal
        self.bindings: dict[str, Binding] = {}
        self.reads: set[asyncio.Future[Any]] = set()
        """Baseline reads in flight (shielded from their baseline's cancellation)."""
        self.acked_sequence = 0
        self.call: BoundCall | None = None
        self.retained_until: float | None = None
        self._clock = clock
        self._memory = memory
        self._budget = replay_budget_bytes
        self._link_queue_bytes = link_queue_bytes
        self._slow_consumer = slow_consumer
        self._ended: deque[str] = deque(maxlen=ENDED_EPOCHS_REMEMBERED)
        self._on_epoch = on_epoch
        """Told (publisher, old epoch, new epoch) when the epoch changes: the hand-over responder
        answers for the current epoch only (SCALE-4)."""
        self.epoch = ""
        self.epoch_started_at = 0.0
        self.buffer = ReplayBuffer(replay_budget_bytes, memory)
        self._begin_epoch()

    # ---- epochs and sequence -------------------------------------------------------

    def _begin_epoch(self) -> None:
        old = self.epoch
        if self.epoch:
            self._ended.append(self.epoch)
        self.epoch = uuid.uuid4().hex
        self.epoch_started_at = self._clock()
        if self._on_epoch is not None:
            self._on_epoch(self, old, self.epoch)
        self.buffer.clear()
        self.buffer.latest_sequence = 0
        self.acked_sequence = 0
        # The server forgets attachments with their epoch; revisions keep growing.
        for binding in self.bindings.values():
            if binding.task is not None:
                binding.task.cancel()
                binding.task = None
            binding.session_id = None

    @property
    def latest_sequence(self) -> int:
        """The last sequence of the epoch (0 when none)."""
        return self.buffer.latest_sequence

    def publish(self, delivery: livestream_pb2.Delivery) -> int:
        """Sequence ``delivery`` (built without a sequence) and keep it for replay."""
        return self._append(body_of(delivery))

    def deliver(self, bodies: list[Body]) -> None:
        """Sequence bodies from a workspace feed (``FeedListener``)."""
        for body in bodies:
            self._append(body.body)

    def _append(self, body: bytes) -> int:
        sequence = self.buffer.append(delivery_bytes(self.buffer.latest_sequence + 1, body))
        call = self.call
        if call is not None:
            call.wakeup.set()
            # LIVE-FLOW-1: the call's queue is what it has not sent since it was bound;
            # past the bound, or when what it needs next was evicted, it is closed.
            lag = self.buffer.bytes_after(max(call.sent, call.bound_at))
            if lag > self._link_queue_bytes or not self.buffer.holds_after(call.sent):
                call.close(self._slow_consumer())
        return sequence

    def wake(self) -> None:
        """Wake the bound call (a feed became ready)."""
        if self.call is not None:
            self.call.wakeup.set()

    def end_epoch(self) -> None:
        """The Host cursor expired (LIVE-UP-1): start a fresh epoch in band.

        The new epoch's first delivery is ``resume_rejected`` ``EPOCH_ENDED`` with the old
        cursor.
        """
        old = livestream_pb2.ResumeCursor(epoch=self.epoch, last_sequence=self.latest_sequence)
        self._begin_epoch()
        call = self.call
        if call is not None:
            call.sent = 0
            call.bound_at = 0
            call.epoch_changed = True
        self.publish(
            livestream_pb2.Delivery(
                resume_rejected=livestream_pb2.ResumeRejected(
                    reason=Rejected.RESUME_REJECTED_REASON_EPOCH_ENDED, rejected_cursor=old
                )
            )
        )

    def resume(
        self, cursor: livestream_pb2.ResumeCursor | None, foreign_reason: int | None = None
    ) -> ResumeDecision:
        """Answer a hello's cursor (LIVE-RESUME-1): replay after it, or a fresh epoch.

        ``foreign_reason`` is why another replica's owner refused to hand the cursor's
        epoch over (SCALE-4), used instead of ``EPOCH_UNKNOWN`` when this publisher does
        not know the epoch.
        """
        if cursor is None:
            self._begin_epoch()
            return ResumeDecision(resumed=False, start_after=0)
        reason: int | None = None
        if cursor.epoch != self.epoch:
            reason = (
                Rejected.RESUME_REJECTED_REASON_EPOCH_ENDED
                if cursor.epoch in self._ended
                else foreign_reason or Rejected.RESUME_REJECTED_REASON_EPOCH_UNKNOWN
            )
        elif cursor.last_sequence > self.latest_sequence:
            reason = Rejected.RESUME_REJECTED_REASON_CURSOR_AHEAD
        elif not self.buffer.holds_after(cursor.last_sequence):
            reason = Rejected.RESUME_REJECTED_REASON_CURSOR_OUTSIDE_WINDOW
        if reason is None:
            return ResumeDecision(resumed=True, start_after=cursor.last_sequence)
        self._begin_epoch()
        self.publish(
            livestream_pb2.Delivery(
                resume_rejected=livestream_pb2.ResumeRejected(
                    reason=reason,  # type: ignore[arg-type]
                    rejected_cursor=cursor,
                )
            )
        )
        return ResumeDecision(resumed=False, start_after=0, rejected=reason)

    # ---- hand-over (SCALE-4) -------------------------------------------------------

    def export(self, after: int, positions: dict[str, int | None]) -> PublisherState:
        """The state to hand over for a device whose cursor is ``after`` in this epoch.

        The caller froze the publisher (no call, no feed) and checked the cursor.
        """
        return PublisherState(
            principal=self.key.principal,
            device_id=self.key.device_id,
            workspace_ids=self.key.workspace_ids,
            epoch=self.epoch,
            epoch_started_at=self.epoch_started_at,
            latest_sequence=self.latest_sequence,
            acked_sequence=self.acked_sequence,
            first_sequence=after + 1,
            entries=tuple(self.buffer.after(after)),
            positions=dict(positions),
            bindings=tuple(
                HandedBinding(
                    binding_id=b.binding_id,
                    revision=b.revision,
                    workspace_id=b.workspace_id,
                    session_id=b.session_id,
                    caller_turn_id=b.caller_turn_id,
                    caught_up=b.caught_up,
                )
                for b in self.bindings.values()
            ),
            ended_epochs=tuple(self._ended),
        )

    def restore(self, state: PublisherState) -> None:
        """Continue ``state``'s epoch here: its sequence, replay tail and bindings.

        Raises:
            ValueError: the replay tail does not fit the budget or the process cap.
        """
        old = self.epoch
        self.buffer.clear()
        self.buffer.latest_sequence = 0
        self.buffer.restore(state.first_sequence, state.entries)
        self._ended.clear()
        self._ended.extend(e for e in state.ended_epochs if e != state.epoch)
        if old:
            self._ended.append(old)
        self.epoch = state.epoch
        self.epoch_started_at = state.epoch_started_at
        self.acked_sequence = state.acked_sequence
        for binding in self.bindings.values():
            if binding.task is not None:
                binding.task.cancel()
        self.bindings = {
            b.binding_id: Binding(
                b.binding_id,
                b.revision,
                workspace_id=b.workspace_id,
                session_id=b.session_id,
                caller_turn_id=b.caller_turn_id,
                caught_up=b.caught_up,
            )
            for b in state.bindings
        }
        if self._on_epoch is not None:
            self._on_epoch(self, old, self.epoch)

    def freeze(self, error: DomainError) -> None:
        """Stop the publisher for a hand-over: end its call and its baselines."""
        if self.call is not None:
            self.call.close(error)
            self.call = None
        for binding in self.bindings.values():
            if binding.task is not None:
                binding.task.cancel()
                binding.task = None

    # ---- calls ---------------------------------------------------------------------

    def bind(self, call: BoundCall, superseded: Callable[[], DomainError]) -> None:
        """Make ``call`` the publisher's one call; an older one is closed (LIVE-LINK-1)."""
        if self.call is not None and self.call is not call:
            self.call.close(superseded())
        self.call = call
        self.principal = call.principal
        self.retained_until = None

    def unbind(self, call: BoundCall, retention_seconds: float) -> None:
        """``call`` ended; the publisher is retained for ``retention_seconds``."""
        if self.call is call:
            self.call = None
            self.retained_until = self._clock() + retention_seconds

    def acknowledge(self, epoch: str, last_sequence: int) -> None:
        """Record a client heartbeat's acknowledgement (never shrinks the window)."""
        if epoch == self.epoch:
            self.acked_sequence = max(self.acked_sequence, min(last_sequence, self.latest_sequence))

    def close(self) -> None:
        """Discard the publisher: stop its baselines and release its replay bytes.

        Baseline reads in flight are left to finish (bounded by their deadline; cancelling
        Host's query mid-flight only makes noise there): the registry holds them and
        cancels what is left when the server stops.
        """
        for binding in self.bindings.values():
            if binding.task is not None:
                binding.task.cancel()
        self._memory.release(self.buffer)

    def info(self) -> livestream_pb2.PublisherInfo:
        """The operator view of the publisher (ListPublishers)."""
        info = livestream_pb2.PublisherInfo(
            device_id=self.key.device_id,
            workspace_ids=list(self.key.workspace_ids),
            principal_id=self.key.principal,
            epoch=self.epoch,
            latest_sequence=self.latest_sequence,
            replay_bytes=self.buffer.bytes,
            connected=self.call is not None,
            epoch_started_at_unix_ms=int(self.epoch_started_at * 1000),
            acked_sequence=self.acked_sequence,
        )
        oldest = self.buffer.oldest_sequence
        if oldest is not None:
            info.oldest_replayable_sequence = oldest
        for binding_id in sorted(self.bindings):
            binding = self.bindings[binding_id]
            if binding.session_id is not None:
                info.bindings.add(
                    binding_id=binding_id,
                    revision=binding.revision,
                    workspace_id=binding.workspace_id,
                    session_id=binding.session_id,
                    caught_up=binding.caught_up,
                )
        if self.retained_until is not None:
            info.retained_until_unix_ms = int(self.retained_until * 1000)
        return info
