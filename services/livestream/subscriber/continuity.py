"""The device-side continuity machine (LIVE-SUB-1): frames in, application events out.

Pure: no I/O, no clock, no asyncio. :class:`ContinuityMachine` owns a
:class:`~services.livestream.subscriber.state.DeviceState` and mutates it in place; the
caller persists that state after every :meth:`ContinuityMachine.feed` (the cursor and
the attachment projection change together, so they are saved together).

What it enforces:

* **sequence continuity** (LIVE-RESUME-1): in one epoch every delivery is exactly the
  previous sequence + 1. A duplicate is never passed on; a duplicate, a gap, a lost tail
  (a ``ServerHeartbeat`` ahead of what arrived), an inconsistent ``stream_ready`` or any
  protocol error (unset oneof, unknown enum value, LIVE-REV-1) yields a workspace-wide
  :class:`Reconcile` and **drops the cursor**: the machine is then :attr:`broken` and
  ignores the rest of the call; the next call must connect without a cursor.
* **epochs**: a batch of another epoch is accepted only at sequence 1, and only when no
  epoch is known (a connect without cursor) or its first delivery is ``resume_rejected``
  (which also drops the attachment projection, the server having forgotten it).
* **attachment barriers** (LIVE-ATT-1, LIVE-CTL-1): a binding is caught up only when an
  ``attachment_caught_up`` echoes exactly its ``attachment_changed`` and names the root of
  the accepted ``interaction_snapshot``; a missing snapshot, a snapshot or barrier that does
  not match yields a Session-scoped :class:`Reconcile` and the binding stays not caught up.
  The projection is part of the persisted state, so "not caught up" survives a resume
  until the replayed barrier arrives.

Every event carries the caller's local :attr:`ContinuityMachine.generation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from google.protobuf.descriptor import EnumDescriptor

from agentactivity.livestream.v1 import livestream_pb2
from services.livestream.subscriber.state import Attachment, Cursor, DeviceState

__all__ = [
    "MAX_SEQUENCE",
    "PROTOCOL_REVISION",
    "AttachmentCaughtUp",
    "AttachmentDetached",
    "AttachmentRejected",
    "AttachmentStarted",
    "ContinuityEvent",
    "ContinuityMachine",
    "Delivered",
    "Ready",
    "Reconcile",
    "ReconcileKey",
    "ReconcileReason",
    "ResumeRejected",
]

MAX_SEQUENCE = 2**53 - 1
"""Sequences never exceed this (CON-4); a larger one is a protocol error."""

PROTOCOL_REVISION = livestream_pb2.LIVE_PROTOCOL_REVISION_2
"""The live protocol revision this library speaks (LIVE-REV-1): its hello names it, and a
``stream_ready`` naming any other is a protocol error. It changes only with the contract."""

DATA_KINDS = frozenset(
    {"message_delta", "turn_update", "interaction_update", "discontinuity", "interaction_snapshot"}
)
"""Delivery kinds the application receives as :class:`Delivered`."""


class ReconcileReason(StrEnum):
    """Why the machine itself asks for reconciliation.

    A :class:`Reconcile` caused by a ``discontinuity`` delivery carries that delivery's
    reason instead: the ``DiscontinuityReason`` value name without its prefix
    (``"MESSAGE_UPDATE"``, ``"SESSION_DELETED"``, ``"QUEUE_OVERFLOW"`` ...).
    """

    GAP = "gap"
    """A sequence skipped, an epoch changed without ``resume_rejected``, or a lost tail."""
    DUPLICATE = "duplicate"
    """A sequence at or below the last accepted one."""
    READY_MISMATCH = "ready_mismatch"
    """``stream_ready`` disagrees with what arrived (epoch, latest_sequence, resumed)."""
    PROTOCOL_ERROR = "protocol_error"
    """An unset oneof, an unknown enum value or a malformed control (LIVE-REV-1)."""
    RESUME_REJECTED = "resume_rejected"
    """A fresh epoch replaced the cursor's (the projection is gone)."""
    SNAPSHOT_MISMATCH = "snapshot_mismatch"
    """A snapshot that is not the current attachment's, or whose root is wrong."""
    MISSING_SNAPSHOT = "missing_snapshot"
    """A barrier arrived before any snapshot of its revision."""
    BARRIER_MISMATCH = "barrier_mismatch"
    """A barrier that does not echo its ``attachment_changed`` exactly."""


@dataclass(frozen=True)
class ReconcileKey:
    """One scope to reread from Host: only ``workspace_id`` set means workspace-wide."""

    workspace_id: str
    session_id: str | None = None
    turn_id: str | None = None
    message_id: str | None = None

    @property
    def scope(self) -> str:
        """``"workspace"``, ``"session"``, ``"turn"`` or ``"message"`` (the narrowest key)."""
        if self.message_id is not None:
            return "message"
        if self.turn_id is not None:
            return "turn"
        return "workspace" if self.session_id is None else "session"


@dataclass(frozen=True, kw_only=True)
class Delivered:
    """A data delivery for the application: ``kind`` is one of :data:`DATA_KINDS`.

    ``delivery`` is the wire message (read ``delivery.message_delta`` ...). A
    ``discontinuity`` is also announced as a :class:`Reconcile` right after this event.
    """

    generation: int
    epoch: str
    sequence: int
    kind: str
    delivery: livestream_pb2.Delivery


@dataclass(frozen=True, kw_only=True)
class Reconcile:
    """Reread ``keys`` from Host: live data cannot be trusted to be complete there.

    ``cursor_dropped`` is true when continuity was lost: the call is abandoned and the
    next connect starts a fresh epoch without cursor (attachments are re-sent).
    """

    generation: int
    reason: str
    keys: tuple[ReconcileKey, ...]
    detail: str = ""
    cursor_dropped: bool = False


@dataclass(frozen=True, kw_only=True)
class ResumeRejected:
    """The server started the fresh ``epoch`` instead of continuing ``rejected_cursor``."""

    generation: int
    epoch: str
    reason: str
    """``ResumeRejectedReason`` name without prefix: ``"EPOCH_UNKNOWN"``, ``"EPOCH_ENDED"``,
    ``"CURSOR_OUTSIDE_WINDOW"`` or ``"CURSOR_AHEAD"``."""
    rejected_cursor: Cursor | None


@dataclass(frozen=True, kw_only=True)
class Ready:
    """``stream_ready``: this call is live (transport only, never canonical catch-up)."""

    generation: int
    epoch: str
    resumed: bool
    latest_sequence: int
    limits: livestream_pb2.LinkLimits


@dataclass(frozen=True, kw_only=True)
class AttachmentStarted:
    """``attachment_changed`` with a Session: the binding's baseline begins (not caught up)."""

    generation: int
    sequence: int
    binding_id: str
    revision: int
    workspace_id: str
    session_id: str
    caller_turn_id: str | None


@dataclass(frozen=True, kw_only=True)
class AttachmentDetached:
    """``attachment_changed`` without a Session: the binding is no longer attached."""

    generation: int
    sequence: int
    binding_id: str
    revision: int
    workspace_id: str


@dataclass(frozen=True, kw_only=True)
class AttachmentCaughtUp:
    """The barrier matched: the binding's baseline is complete."""

    generation: int
    sequence: int
    binding_id: str
    revision: int
    workspace_id: str
    session_id: str
    caller_turn_id: str | None
    canonical_turn_ids: frozenset[str]
    current_root_turn_id: str | None


@dataclass(frozen=True, kw_only=True)
class AttachmentRejected:
    """The server could not serve an attach; the binding stays not caught up."""

    generation: int
    sequence: int
    binding_id: str
    revision: int
    workspace_id: str
    session_id: str
    reason: str
    """``AttachmentRejectedReason`` name without prefix: ``"SESSION_NOT_FOUND"`` or
    ``"HOST_UNAVAILABLE"`` (then attaching again with a higher revision may work)."""


ContinuityEvent = (
    Delivered
    | Reconcile
    | ResumeRejected
    | Ready
    | AttachmentStarted
    | AttachmentDetached
    | AttachmentCaughtUp
    | AttachmentRejected
)
"""Everything :meth:`ContinuityMachine.feed` yields."""


class _Broken(Exception):
    """Continuity is lost: reconcile the whole scope and drop the cursor."""

    def __init__(self, reason: ReconcileReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _enum_name(enum: EnumDescriptor, value: int, prefix: str, where: str) -> str:
    # Closed vocabulary (LIVE-REV-1): UNSPECIFIED and numbers the descriptor does not know
    # (proto3 keeps them as plain ints) are protocol errors, never "something new".
    known = enum.values_by_number.get(value)
    if known is None or value == 0:
        raise _Broken(ReconcileReason.PROTOCOL_ERROR, f"{where}: unknown {enum.name} {value}")
    return known.name.removeprefix(prefix)


def _optional(message: object, name: str) -> str | None:
    return getattr(message, name) if message.HasField(name) else None  # type: ignore[attr-defined]


@dataclass
class _CallState:
    cursor_sent: bool = False
    ready: bool = False
    epoch_started: bool = False
    """A new epoch began on this call (fresh connect or resume_rejected)."""


@dataclass
class ContinuityMachine:
    """Validates one device's frames and turns them into :data:`ContinuityEvent` lists.

    Call :meth:`begin_call` when a call starts (before feeding its frames), then
    :meth:`feed` for every frame; persist :attr:`state` after each feed. When
    :attr:`broken` turns true, abandon the call and start the next one without cursor.
    """

    state: DeviceState
    generation: int = 1
    filtered: int = 0
    """How many ``filtered`` placeholders advanced the cursor (LIVE-PROJ-1)."""
    heartbeats: int = 0
    """How many consistent server heartbeats arrived."""
    _epoch: str | None = field(default=None, init=False)
    _last: int = field(default=0, init=False)
    _broken: bool = field(default=False, init=False)
    _call: _CallState = field(default_factory=_CallState, init=False)

    def __post_init__(self) -> None:
        if self.state.cursor is not None:
            self._epoch = self.state.cursor.epoch
            self._last = self.state.cursor.last_sequence

    @property
    def cursor(self) -> Cursor | None:
        """The resume cursor to send (``None``: connect fresh)."""
        return self.state.cursor

    @property
    def epoch(self) -> str | None:
        """The epoch deliveries are accepted from (known once a call started one)."""
        return self._epoch

    @property
    def last_sequence(self) -> int:
        """The last accepted sequence of :attr:`epoch` (0 before any)."""
        return self._last

    @property
    def ready(self) -> bool:
        """This call's ``stream_ready`` was accepted."""
        return self._call.ready

    @property
    def broken(self) -> bool:
        """Continuity was lost on this call: stop reading it and reconnect without cursor."""
        return self._broken

    def begin_call(self, cursor_sent: bool) -> None:
        """Start a new call; ``cursor_sent`` says whether its hello carries :attr:`cursor`.

        Without a cursor the server starts a fresh epoch and forgets every attachment, so
        the projection is cleared here (the per-binding revisions are kept: they only grow).

        Raises:
            ValueError: ``cursor_sent`` but there is no cursor.
        """
        if cursor_sent and self.state.cursor is None:
            raise ValueError("cursor_sent, but the machine holds no cursor")
        self._broken = False
        self._call = _CallState(cursor_sent=cursor_sent)
        if not cursor_sent:
            self._epoch, self._last = None, 0
            self.state.cursor = None
            self.state.attachments.clear()

    def feed(self, frame: livestream_pb2.DeviceLinkResponse) -> list[ContinuityEvent]:
        """Validate one frame and return what the application must learn from it.

        Deliveries accepted before a failure inside a batch are kept (their events come
        first); the failure's :class:`Reconcile` is last. After :attr:`broken` is set,
        every further frame of the call yields nothing.
        """
        if self._broken:
            return []
        events: list[ContinuityEvent] = []
        try:
            kind = frame.WhichOneof("kind")
            if kind == "deliveries":
                self._batch(frame.deliveries, events)
            elif kind == "stream_ready":
                self._stream_ready(frame.stream_ready, events)
            elif kind == "heartbeat":
                self._heartbeat(frame.heartbeat)
            else:
                raise _Broken(ReconcileReason.PROTOCOL_ERROR, "frame kind unset or unknown")
        except _Broken as lost:
            events.append(
                Reconcile(
                    generation=self.generation,
                    reason=lost.reason,
                    keys=self._workspace_keys(),
                    detail=lost.detail,
                    cursor_dropped=True,
                )
            )
            self._drop_cursor()
        return events

    # -- frames -----------------------------------------------------------------------

    def _batch(self, batch: livestream_pb2.DeliveryBatch, events: list[ContinuityEvent]) -> None:
        if not batch.epoch or not batch.deliveries:
            raise _Broken(ReconcileReason.PROTOCOL_ERROR, "a batch needs an epoch and deliveries")
        first = batch.deliveries[0]
        if batch.epoch != self._epoch:
            # A new epoch starts at 0: the loop below refuses a first sequence other than 1.
            if self._epoch is not None and first.WhichOneof("kind") != "resume_rejected":
                raise _Broken(
                    ReconcileReason.GAP,
                    f"epoch {self._epoch!r} became {batch.epoch!r} without resume_rejected",
                )
            self._epoch, self._last = batch.epoch, 0
            self._call.epoch_started = True
        for delivery in batch.deliveries:
            if delivery.sequence <= self._last:
                raise _Broken(
                    ReconcileReason.DUPLICATE,
                    f"sequence {delivery.sequence} after {self._last} in {self._epoch!r}",
                )
            if delivery.sequence != self._last + 1 or delivery.sequence > MAX_SEQUENCE:
                raise _Broken(
                    ReconcileReason.GAP,
                    f"sequence {delivery.sequence} after {self._last} in {self._epoch!r}",
                )
            self._delivery(batch.epoch, delivery, events)
            self._last = delivery.sequence
            self.state.cursor = Cursor(batch.epoch, self._last)

    def _stream_ready(
        self, ready: livestream_pb2.StreamReady, events: list[ContinuityEvent]
    ) -> None:
        if self._call.ready:
            raise _Broken(ReconcileReason.PROTOCOL_ERROR, "a second stream_ready on one call")
        _enum_name(
            livestream_pb2.LiveProtocolRevision.DESCRIPTOR,
            ready.protocol_revision,
            "LIVE_PROTOCOL_",
            "stream_ready.protocol_revision",
        )
        if ready.protocol_revision != PROTOCOL_REVISION:
            raise _Broken(ReconcileReason.PROTOCOL_ERROR, "stream_ready names another revision")
        if not ready.epoch:
            raise _Broken(ReconcileReason.PROTOCOL_ERROR, "stream_ready without epoch")
        if self._epoch is None:
            # A connect without cursor whose fresh epoch has delivered nothing yet: the
            # epoch is learned here (and must be empty, everything is sent before ready).
            self._epoch, self._last = ready.epoch, 0
            self._call.epoch_started = True
        resumed = self._call.cursor_sent and not self._call.epoch_started
        if (ready.epoch, ready.latest_sequence, ready.resumed) != (
            self._epoch,
            self._last,
            resumed,
        ):
            raise _Broken(
                ReconcileReason.READY_MISMATCH,
                f"stream_ready (epoch {ready.epoch!r}, latest {ready.latest_sequence}, resumed "
                f"{ready.resumed}) but accepted (epoch {self._epoch!r}, last {self._last}, "
                f"resumed {resumed})",
            )
        self._call.ready = True
        # A fresh epoch that has delivered nothing yet is still a position to resume from:
        # without it a cut before the first delivery would connect without a cursor, and
        # what the publisher sequenced meanwhile would be skipped with no reconcile.
        self.state.cursor = Cursor(self._epoch, self._last)
        events.append(
            Ready(
                generation=self.generation,
                epoch=ready.epoch,
                resumed=ready.resumed,
                latest_sequence=ready.latest_sequence,
                limits=ready.limits,
            )
        )

    def _heartbeat(self, beat: livestream_pb2.ServerHeartbeat) -> None:
        if self._epoch is None:
            return  # nothing accepted yet on a fresh connect: nothing to compare
        if beat.epoch != self._epoch:
            raise _Broken(
                ReconcileReason.GAP, f"heartbeat of epoch {beat.epoch!r} in {self._epoch!r}"
            )
        if beat.latest_sequence > self._last:
            raise _Broken(
                ReconcileReason.GAP,
                f"lost tail: heartbeat at {beat.latest_sequence}, accepted {self._last}",
            )
        self.heartbeats += 1

    # -- deliveries -------------------------------------------------------------------

    def _delivery(
        self, epoch: str, delivery: livestream_pb2.Delivery, events: list[ContinuityEvent]
    ) -> None:
        kind = delivery.WhichOneof("kind")
        sequence = delivery.sequence
        if kind in ("message_delta", "turn_update", "interaction_update"):
            events.append(self._delivered(epoch, delivery, kind))
        elif kind == "discontinuity":
            self._discontinuity(epoch, delivery, events)
        elif kind == "filtered":
            self.filtered += 1
        elif kind == "attachment_changed":
            self._attachment_changed(sequence, delivery.attachment_changed, events)
        elif kind == "interaction_snapshot":
            self._snapshot(epoch, delivery, events)
        elif kind == "attachment_caught_up":
            self._caught_up(sequence, delivery.attachment_caught_up, events)
        elif kind == "attachment_rejected":
            self._attachment_rejected(sequence, delivery.attachment_rejected, events)
        elif kind == "resume_rejected":
            self._resume_rejected(epoch, delivery, events)
        else:
            raise _Broken(ReconcileReason.PROTOCOL_ERROR, f"delivery {sequence}: kind unset")

    def _delivered(self, epoch: str, delivery: livestream_pb2.Delivery, kind: str) -> Delivered:
        return Delivered(
            generation=self.generation,
            epoch=epoch,
            sequence=delivery.sequence,
            kind=kind,
            delivery=delivery,
        )

    def _discontinuity(
        self, epoch: str, delivery: livestream_pb2.Delivery, events: list[ContinuityEvent]
    ) -> None:
        gap = delivery.discontinuity
        reason = _enum_name(
            livestream_pb2.DiscontinuityReason.DESCRIPTOR,
            gap.reason,
            "DISCONTINUITY_REASON_",
            f"delivery {delivery.sequence}",
        )
        keys = gap.keys
        key = ReconcileKey(
            workspace_id=keys.workspace_id,
            session_id=_optional(keys, "session_id"),
            turn_id=_optional(keys, "turn_id"),
            message_id=_optional(keys, "message_id"),
        )
        nested = key.session_id is not None or (key.turn_id is None and key.message_id is None)
        if not gap.HasField("keys") or not key.workspace_id or not nested:
            raise _Broken(
                ReconcileReason.PROTOCOL_ERROR,
                f"delivery {delivery.sequence}: discontinuity keys {key} do not nest",
            )
        events.append(self._delivered(epoch, delivery, "discontinuity"))
        events.append(Reconcile(generation=self.generation, reason=reason, keys=(key,)))

    def _resume_rejected(
        self, epoch: str, delivery: livestream_pb2.Delivery, events: list[ContinuityEvent]
    ) -> None:
        rejected = delivery.resume_rejected
        if delivery.sequence != 1 or not self._call.epoch_started:
            raise _Broken(
                ReconcileReason.PROTOCOL_ERROR,
                f"resume_rejected at sequence {delivery.sequence} is not a fresh epoch's first",
            )
        reason = _enum_name(
            livestream_pb2.ResumeRejectedReason.DESCRIPTOR,
            rejected.reason,
            "RESUME_REJECTED_REASON_",
            "resume_rejected",
        )
        cursor = None
        if rejected.HasField("rejected_cursor"):
            cursor = Cursor(rejected.rejected_cursor.epoch, rejected.rejected_cursor.last_sequence)
        # The server forgot the attachments with the old epoch; revisions only grow.
        self.state.attachments.clear()
        events.append(
            ResumeRejected(
                generation=self.generation, epoch=epoch, reason=reason, rejected_cursor=cursor
            )
        )
        events.append(
            Reconcile(
                generation=self.generation,
                reason=ReconcileReason.RESUME_REJECTED,
                keys=self._workspace_keys(),
                detail=f"resume rejected: {reason}",
            )
        )

    def _attachment_changed(
        self,
        sequence: int,
        changed: livestream_pb2.AttachmentChanged,
        events: list[ContinuityEvent],
    ) -> None:
        known = self.state.attachments.get(changed.binding_id)
        if not changed.binding_id or changed.revision < 1:
            raise _Broken(
                ReconcileReason.PROTOCOL_ERROR, f"delivery {sequence}: attachment_changed identity"
            )
        if known is not None and changed.revision <= known.revision:
            raise _Broken(
                ReconcileReason.PROTOCOL_ERROR,
                f"delivery {sequence}: binding {changed.binding_id!r} revision "
                f"{changed.revision} after {known.revision}",
            )
        if not changed.HasField("session_id"):
            self.state.attachments.pop(changed.binding_id, None)
            events.append(
                AttachmentDetached(
                    generation=self.generation,
                    sequence=sequence,
                    binding_id=changed.binding_id,
                    revision=changed.revision,
                    workspace_id=changed.workspace_id,
                )
            )
            return
        if not changed.workspace_id or not changed.session_id:
            raise _Broken(
                ReconcileReason.PROTOCOL_ERROR, f"delivery {sequence}: attachment without Session"
            )
        caller = _optional(changed, "caller_turn_id")
        self.state.attachments[changed.binding_id] = Attachment(
            revision=changed.revision,
            workspace_id=changed.workspace_id,
            session_id=changed.session_id,
            caller_turn_id=caller,
        )
        events.append(
            AttachmentStarted(
                generation=self.generation,
                sequence=sequence,
                binding_id=changed.binding_id,
                revision=changed.revision,
                workspace_id=changed.workspace_id,
                session_id=changed.session_id,
                caller_turn_id=caller,
            )
        )

    def _snapshot(
        self, epoch: str, delivery: livestream_pb2.Delivery, events: list[ContinuityEvent]
    ) -> None:
        snapshot = delivery.interaction_snapshot
        attachment = self.state.attachments.get(snapshot.binding_id)
        root = _optional(snapshot, "root_turn_id")
        problem = None
        if attachment is None or attachment.caught_up or attachment.rejected_reason:
            problem = f"binding {snapshot.binding_id!r} has no baseline in progress"
        elif (attachment.revision, attachment.workspace_id, attachment.session_id) != (
            snapshot.revision,
            snapshot.workspace_id,
            snapshot.session_id,
        ):
            problem = f"snapshot of revision {snapshot.revision} for {snapshot.session_id!r}"
        elif attachment.snapshot_seen:
            problem = f"a second snapshot for revision {snapshot.revision}"
        elif root == "" or (root is None and len(snapshot.interactions) > 0):
            problem = f"snapshot root {root!r} with {len(snapshot.interactions)} interactions"
        if problem is not None:
            if attachment is not None and attachment.revision == snapshot.revision:
                # This revision's baseline is unusable: its barrier must not succeed.
                attachment.snapshot_seen = False
                attachment.snapshot_root_turn_id = None
                attachment.caught_up = False
            self._session_reconcile(
                ReconcileReason.SNAPSHOT_MISMATCH,
                attachment,
                snapshot.workspace_id,
                snapshot.session_id,
                f"delivery {delivery.sequence}: {problem}",
                events,
            )
            return
        assert attachment is not None
        attachment.snapshot_seen = True
        attachment.snapshot_root_turn_id = root
        events.append(self._delivered(epoch, delivery, "interaction_snapshot"))

    def _caught_up(
        self,
        sequence: int,
        barrier: livestream_pb2.AttachmentCaughtUp,
        events: list[ContinuityEvent],
    ) -> None:
        attachment = self.state.attachments.get(barrier.binding_id)
        caller = _optional(barrier, "caller_turn_id")
        root = _optional(barrier, "current_interaction_root_turn_id")
        reason, problem = ReconcileReason.BARRIER_MISMATCH, None
        if attachment is None or attachment.caught_up or attachment.rejected_reason:
            problem = f"barrier for binding {barrier.binding_id!r} without a baseline in progress"
        elif (
            attachment.revision,
            attachment.workspace_id,
            attachment.session_id,
            attachment.caller_turn_id,
        ) != (barrier.revision, barrier.workspace_id, barrier.session_id, caller):
            problem = (
                f"barrier (revision {barrier.revision}, {barrier.workspace_id!r}, "
                f"{barrier.session_id!r}, caller {caller!r}) does not echo revision "
                f"{attachment.revision} of {attachment.session_id!r}"
            )
        elif not attachment.snapshot_seen:
            reason, problem = ReconcileReason.MISSING_SNAPSHOT, "barrier before any snapshot"
        elif root != attachment.snapshot_root_turn_id:
            reason = ReconcileReason.SNAPSHOT_MISMATCH
            problem = f"barrier root {root!r}, snapshot root {attachment.snapshot_root_turn_id!r}"
        if problem is not None:
            if attachment is not None and attachment.revision == barrier.revision:
                attachment.caught_up = False
                attachment.snapshot_seen = False  # a replacement barrier must not pass either
            self._session_reconcile(
                reason,
                attachment,
                barrier.workspace_id,
                barrier.session_id,
                f"delivery {sequence}: {problem}",
                events,
            )
            return
        assert attachment is not None
        attachment.caught_up = True
        attachment.canonical_turn_ids = frozenset(barrier.canonical_turn_ids)
        attachment.current_root_turn_id = root
        events.append(
            AttachmentCaughtUp(
                generation=self.generation,
                sequence=sequence,
                binding_id=barrier.binding_id,
                revision=barrier.revision,
                workspace_id=barrier.workspace_id,
                session_id=barrier.session_id,
                caller_turn_id=caller,
                canonical_turn_ids=attachment.canonical_turn_ids,
                current_root_turn_id=root,
            )
        )

    def _attachment_rejected(
        self,
        sequence: int,
        rejected: livestream_pb2.AttachmentRejected,
        events: list[ContinuityEvent],
    ) -> None:
        reason = _enum_name(
            livestream_pb2.AttachmentRejectedReason.DESCRIPTOR,
            rejected.reason,
            "ATTACHMENT_REJECTED_REASON_",
            f"delivery {sequence}",
        )
        if not rejected.binding_id or rejected.revision < 1:
            raise _Broken(
                ReconcileReason.PROTOCOL_ERROR, f"delivery {sequence}: attachment_rejected identity"
            )
        known = self.state.attachments.get(rejected.binding_id)
        if known is None or known.revision <= rejected.revision:
            # The rejection may come without an attachment_changed; either way this
            # revision is the binding's latest and it is not caught up.
            self.state.attachments[rejected.binding_id] = Attachment(
                revision=rejected.revision,
                workspace_id=rejected.workspace_id,
                session_id=rejected.session_id,
                caller_turn_id=known.caller_turn_id if known is not None else None,
                rejected_reason=reason,
            )
        events.append(
            AttachmentRejected(
                generation=self.generation,
                sequence=sequence,
                binding_id=rejected.binding_id,
                revision=rejected.revision,
                workspace_id=rejected.workspace_id,
                session_id=rejected.session_id,
                reason=reason,
            )
        )

    # -- helpers ----------------------------------------------------------------------

    def _session_reconcile(
        self,
        reason: ReconcileReason,
        attachment: Attachment | None,
        workspace_id: str,
        session_id: str,
        detail: str,
        events: list[ContinuityEvent],
    ) -> None:
        keys = []
        if workspace_id and session_id:
            keys.append(ReconcileKey(workspace_id=workspace_id, session_id=session_id))
        if attachment is not None:
            own = ReconcileKey(
                workspace_id=attachment.workspace_id, session_id=attachment.session_id
            )
            if own not in keys:
                keys.append(own)
        events.append(
            Reconcile(
                generation=self.generation,
                reason=reason,
                keys=tuple(keys) or self._workspace_keys(),
                detail=detail,
            )
        )

    def _workspace_keys(self) -> tuple[ReconcileKey, ...]:
        return tuple(ReconcileKey(workspace_id=w) for w in sorted(set(self.state.workspace_ids)))

    def _drop_cursor(self) -> None:
        # The next connect is fresh, so the server will have forgotten every attachment.
        self._broken = True
        self._epoch, self._last = None, 0
        self.state.cursor = None
        self.state.attachments.clear()
