"""The checker of the replica torture (SCALE-1, SCALE-3, SCALE-4): no silent gap, no duplicate.

What each client recorded is checked against Host's canonical state read at the end:

* a ``WatchActivity`` watcher (:class:`WatchLog`) must see every committed event of its range
  exactly once, in ``workspace_sequence`` order, with Host's event id at each number; a break
  of its stream is fine when it resumed from its cursor; a fresh subscription is allowed only
  after a typed ``EVENT_CURSOR_EXPIRED``. Within one subscription the deltas of a message are
  contiguous, a jump needs a ``session_reconcile_required`` of the Session before it, and a
  committed ``message_update`` after some deltas of its message means all of them arrived
  (a confirmation never overtakes its deltas).
* a livestream device (a list of :mod:`services.livestream.subscriber` events with the
  application's :class:`Reread` between them) must never see a delivery sequence twice or
  backwards within an epoch, nor an epoch come back. Between two typed announcements that
  cover it (``resume_rejected`` or a fresh connect cover everything; a ``Reconcile`` covers its
  keys), a Turn's live versions rise without skipping a version Host committed and a
  message's deltas are contiguous and complete before its ``message_update``; across such an
  announcement anything may be lost or repeated, because the application was told to reread.
  At the end, what the application holds (deliveries applied, rereads on top) must equal
  Host's Turns and messages: a gap nobody announced cannot converge.

Every function returns the violations as sentences (empty: correct); the torture prints them
with the seed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.livestream.v1 import livestream_pb2
from services.livestream.subscriber import (
    AttachmentCaughtUp,
    AttachmentDetached,
    AttachmentRejected,
    AttachmentStarted,
    Connecting,
    Delivered,
    Reconcile,
    ReconcileKey,
    ResumeRejected,
    Terminated,
)

__all__ = [
    "Canonical",
    "CommittedEvent",
    "DeviceProjection",
    "Reread",
    "WatchDelta",
    "WatchEnded",
    "WatchEvent",
    "WatchLog",
    "WatchSubscribed",
    "check_device",
    "check_watcher",
    "delta_indices",
    "delta_text",
]

SET = canonical_pb2.DELTA_OPERATION_SET
MESSAGE_UPDATE = livestream_pb2.DISCONTINUITY_REASON_MESSAGE_UPDATE
_PIECE = re.compile(r"([^#;|]+)#(\d+);")
CURSOR_EXPIRED = "EVENT_CURSOR_EXPIRED"


def delta_text(message_id: str, index: int) -> str:
    """The recognisable text of delta ``index`` (1-based) of a message."""
    return f"{message_id}#{index};"


def delta_indices(message_id: str, text: str) -> list[int] | None:
    """The delta numbers a (possibly coalesced) delta text carries; None: not the producer's."""
    found = list(_PIECE.finditer(text))
    if not found or "".join(m.group(0) for m in found) != text:
        return None
    if any(m.group(1) != message_id for m in found):
        return None
    return [int(m.group(2)) for m in found]


# ---- Host's canonical state ---------------------------------------------------------------


@dataclass(frozen=True)
class CommittedEvent:
    """One durable event of Host's feed."""

    sequence: int
    event_id: int
    kind: str
    session_id: str = ""
    turn_id: str = ""
    version: int = 0
    """The Turn's version for a ``turn_update``."""
    message_ids: tuple[str, ...] = ()
    """The messages of a ``message_update``."""


@dataclass
class Canonical:
    """Host at the end of a run: its feed, and the Turns and messages of the run's Sessions."""

    feed: dict[int, CommittedEvent]
    """``workspace_sequence`` -> event, for the run's range."""
    head: int
    turns: dict[str, tuple[int, int]]
    """Turn id -> (version, phase)."""
    messages: dict[str, str]
    """Message id -> text."""
    deltas_sent: dict[str, int]
    """Message id -> how many deltas the producer sent (numbered from 1)."""

    def turn_versions(self, turn_id: str) -> list[int]:
        """Every version of the Turn that Host committed as a ``turn_update``, in order."""
        return sorted(
            e.version
            for e in self.feed.values()
            if e.kind == "turn_update" and e.turn_id == turn_id
        )


# ---- a WatchActivity watcher ----------------------------------------------------------------


@dataclass(frozen=True)
class WatchSubscribed:
    """A ``WatchActivity`` call reached its ready marker."""

    head: int
    after_event_id: int | None


@dataclass(frozen=True)
class WatchEvent:
    """A durable event received."""

    sequence: int
    event_id: int
    kind: str
    session_id: str = ""
    message_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class WatchDelta:
    """A ``message_delta`` received."""

    session_id: str
    message_id: str
    text: str


@dataclass(frozen=True)
class WatchEnded:
    """The call ended with an error (``reason``: its ErrorInfo reason, or "")."""

    code: str
    reason: str


@dataclass
class WatchLog:
    """What one watcher saw, in order."""

    name: str
    entries: list[WatchSubscribed | WatchEvent | WatchDelta | WatchEnded] = field(
        default_factory=list
    )


def check_watcher(log: WatchLog, canonical: Canonical) -> list[str]:
    """Violations in what a ``WatchActivity`` watcher saw (SCALE-1, SCALE-3)."""
    out: list[str] = []
    position: int | None = None
    typed_gap = False
    deltas: dict[str, list[int]] = {}  # per subscription: message -> indices seen
    session_of: dict[str, str] = {}  # message -> its Session
    for index, entry in enumerate(log.entries):
        where = f"[{index}]"
        if isinstance(entry, WatchSubscribed):
            deltas = {}
            if entry.after_event_id is None:
                if position is not None and not typed_gap:
                    out.append(
                        f"{where} a fresh subscription after sequence {position} without a typed "
                        "EVENT_CURSOR_EXPIRED: the events in between are skipped silently"
                    )
                position = entry.head
            typed_gap = False
        elif isinstance(entry, WatchEnded):
            typed_gap = entry.reason == CURSOR_EXPIRED
        elif isinstance(entry, WatchEvent):
            if position is None:
                out.append(f"{where} event {entry.sequence} before any ready marker")
                position = entry.sequence - 1
            if entry.sequence <= position:
                out.append(
                    f"{where} duplicate: sequence {entry.sequence} after {position} (committed "
                    "event delivered twice or out of order)"
                )
                continue
            if entry.sequence > position + 1:
                out.append(
                    f"{where} silent gap: sequences {position + 1}..{entry.sequence - 1} never "
                    "arrived and no typed signal announced their loss"
                )
            position = entry.sequence
            expected = canonical.feed.get(entry.sequence)
            if expected is not None and expected.event_id != entry.event_id:
                out.append(
                    f"{where} sequence {entry.sequence} is event {entry.event_id}, Host's is "
                    f"{expected.event_id}"
                )
            if entry.kind == "session_reconcile_required":
                # Typed: the Session's deltas before it may be incomplete; count afresh.
                for message_id, session_id in session_of.items():
                    if session_id == entry.session_id:
                        deltas.pop(message_id, None)
            if entry.kind == "message_update":
                for message_id in entry.message_ids:
                    _check_tail(
                        where, message_id, deltas.get(message_id), canonical, out, "watcher"
                    )
                    deltas.pop(message_id, None)
        elif isinstance(entry, WatchDelta):
            indices = delta_indices(entry.message_id, entry.text)
            if indices is None:
                out.append(f"{where} delta text {entry.text!r} is not the producer's")
                continue
            session_of[entry.message_id] = entry.session_id
            seen = deltas.setdefault(entry.message_id, [])
            _check_run(where, entry.message_id, seen, indices, out)
            seen.extend(indices)
    if position is None or position < canonical.head:
        out.append(
            f"silent tail gap: the watcher stopped at sequence {position}, Host's head is "
            f"{canonical.head}"
        )
    return [f"{log.name}: {line}" for line in out]


def _check_run(
    where: str,
    message_id: str,
    seen: list[int],
    indices: list[int],
    out: list[str],
) -> None:
    """A delivered run of delta numbers against the ones seen before it in the same scope."""
    if indices != list(range(indices[0], indices[0] + len(indices))):
        out.append(f"{where} {message_id}: one delivery of non-adjacent deltas {indices}")
    if not seen:
        return
    last = seen[-1]
    if indices[0] <= last:
        out.append(
            f"{where} duplicate: {message_id} deltas {indices} after delta {last} (delivered "
            "twice or out of order)"
        )
    elif indices[0] > last + 1:
        out.append(
            f"{where} silent gap: {message_id} deltas {last + 1}..{indices[0] - 1} never "
            "arrived and no typed signal announced their loss"
        )


def _check_tail(
    where: str,
    message_id: str,
    seen: list[int] | None,
    canonical: Canonical,
    out: list[str],
    who: str,
) -> None:
    """The message's confirmation arrived: every delta after the first seen must be in."""
    total = canonical.deltas_sent.get(message_id)
    if not seen or total is None:
        return
    missing = sorted(set(range(seen[0], total + 1)) - set(seen))
    if missing:
        out.append(
            f"{where} silent gap: the {who} got {message_id}'s message_update before its deltas "
            f"{missing[0]}..{missing[-1]} (of {total}); no typed signal between"
        )


# ---- a livestream device --------------------------------------------------------------------


@dataclass(frozen=True)
class Reread:
    """The application reread Sessions from Host (after a Reconcile, or at its first ready)."""

    reason: str
    turns: dict[str, tuple[int, int]]
    """Turn id -> (version, phase) read."""
    messages: dict[str, str]
    """Message id -> text read."""


@dataclass
class DeviceProjection:
    """What the application holds: Turns from deliveries and rereads, message texts."""

    turns: dict[str, tuple[int, int]] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    canonical: set[str] = field(default_factory=set)
    """Messages whose text came from Host (late deltas no longer apply to them)."""

    def learn_turn(self, turn_id: str, version: int, phase: int) -> None:
        """Keep the newest version of a Turn (a reread may be ahead of queued deliveries)."""
        known = self.turns.get(turn_id)
        if known is None or version > known[0]:
            self.turns[turn_id] = (version, phase)

    def apply(self, event: object) -> None:
        """Apply one logged event as the application does."""
        if isinstance(event, Reread):
            for turn_id, (version, phase) in event.turns.items():
                self.learn_turn(turn_id, version, phase)
            for message_id, text in event.messages.items():
                self.texts[message_id] = text
                self.canonical.add(message_id)
        elif isinstance(event, Delivered) and event.kind == "turn_update":
            turn = event.delivery.turn_update.turn
            self.learn_turn(turn.turn_id, turn.version, int(turn.phase))
        elif isinstance(event, Delivered) and event.kind == "message_delta":
            delta = event.delivery.message_delta
            if delta.message_id in self.canonical:
                return
            before = "" if delta.operation == SET else self.texts.get(delta.message_id, "")
            self.texts[delta.message_id] = before + delta.text


def _fresh_epoch(event: object) -> bool:
    """A typed announcement that everything before is void: the application rereads all."""
    if isinstance(event, ResumeRejected):
        return True
    return isinstance(event, Connecting) and event.cursor is None


def check_device(name: str, log: Sequence[object], canonical: Canonical) -> list[str]:
    """Violations in what a livestream device saw (SCALE-4, SCALE-3)."""
    out: list[str] = []
    _check_epochs(log, out)
    _check_segments(log, canonical, out)
    projection = DeviceProjection()
    for event in log:
        projection.apply(event)
    _check_convergence(projection, canonical, out)
    return [f"{name}: {line}" for line in out]


def _check_epochs(log: Sequence[object], out: list[str]) -> None:
    last: dict[str, int] = {}
    current: str | None = None
    left: set[str] = set()
    for index, event in enumerate(log):
        if isinstance(event, Terminated):
            out.append(f"[{index}] the Subscriber terminated: {event}")
        if not isinstance(event, Delivered):
            continue
        if event.epoch != current:
            if event.epoch in left:
                out.append(f"[{index}] epoch {event.epoch} came back after it was left")
            if current is not None:
                left.add(current)
            current = event.epoch
        previous = last.get(event.epoch, 0)
        if event.sequence <= previous:
            out.append(
                f"[{index}] duplicate: delivery sequence {event.sequence} after {previous} in "
                f"epoch {event.epoch}"
            )
        last[event.epoch] = max(previous, event.sequence)


@dataclass
class _Segment:
    """What the device saw since the last typed announcement covering each item."""

    live: dict[str, int] = field(default_factory=dict)
    """Turn id -> last live version delivered."""
    seen: dict[str, set[int]] = field(default_factory=dict)
    """Turn id -> versions delivered (live or baseline) since the last live one."""
    deltas: dict[str, list[int]] = field(default_factory=dict)
    """Message id -> delta numbers delivered."""
    session_of: dict[str, str] = field(default_factory=dict)
    """Turn or message id -> its Session."""
    baselines: dict[str, str] = field(default_factory=dict)
    """Binding id -> the Session whose attachment baseline is in progress."""

    def forget(self, keys: Sequence[ReconcileKey]) -> None:
        """A Reconcile: the items its keys cover start afresh (the application rereads them)."""
        for key in keys:
            if key.session_id is None:
                self.live.clear()
                self.seen.clear()
                self.deltas.clear()
                return
            if key.message_id is not None:
                self.deltas.pop(key.message_id, None)
                continue
            for item, session_id in self.session_of.items():
                if session_id == key.session_id:
                    self.live.pop(item, None)
                    self.seen.pop(item, None)
                    self.deltas.pop(item, None)


def _check_segments(log: Sequence[object], canonical: Canonical, out: list[str]) -> None:
    segment = _Segment()
    updated: set[tuple[str, str]] = set()  # (epoch, message id) of message_update deliveries
    for index, event in enumerate(log):
        where = f"[{index}]"
        if _fresh_epoch(event):
            segment = _Segment()  # the old epoch's attachments are gone too
            continue
        if isinstance(event, Reconcile):
            segment.forget(event.keys)
        elif isinstance(event, AttachmentStarted):
            segment.baselines[event.binding_id] = event.session_id
        elif isinstance(event, AttachmentCaughtUp | AttachmentDetached | AttachmentRejected):
            segment.baselines.pop(event.binding_id, None)
        if not isinstance(event, Delivered):
            continue
        delivery = event.delivery
        if event.kind == "turn_update":
            turn = delivery.turn_update.turn
            segment.session_of[turn.turn_id] = turn.session_id
            _check_turn(where, segment, turn.turn_id, turn.session_id, turn.version, canonical, out)
        elif event.kind == "message_delta":
            delta = delivery.message_delta
            segment.session_of[delta.message_id] = delta.session_id
            indices = delta_indices(delta.message_id, delta.text)
            if indices is None:
                out.append(f"{where} delta text {delta.text!r} is not the producer's")
                continue
            seen = segment.deltas.setdefault(delta.message_id, [])
            _check_run(where, delta.message_id, seen, indices, out)
            seen.extend(indices)
        elif event.kind == "discontinuity" and delivery.discontinuity.reason == MESSAGE_UPDATE:
            message_id = delivery.discontinuity.keys.message_id
            if (event.epoch, message_id) in updated:
                out.append(f"{where} duplicate: a second message_update of {message_id}")
            updated.add((event.epoch, message_id))
            _check_tail(where, message_id, segment.deltas.get(message_id), canonical, out, "device")


def _check_turn(
    where: str,
    segment: _Segment,
    turn_id: str,
    session_id: str,
    version: int,
    canonical: Canonical,
    out: list[str],
) -> None:
    seen = segment.seen.setdefault(turn_id, set())
    seen.add(version)
    if session_id in segment.baselines.values():
        return  # a baseline reads Host afresh: it may repeat or pass a live version
    last = segment.live.get(turn_id)
    segment.live[turn_id] = version if last is None else max(last, version)
    if last is None:
        return
    if version <= last:
        out.append(
            f"{where} duplicate: Turn {turn_id} live version {version} after {last} "
            "(delivered twice or out of order)"
        )
        return
    skipped = [v for v in canonical.turn_versions(turn_id) if last < v < version and v not in seen]
    if skipped:
        out.append(
            f"{where} silent gap: Turn {turn_id} versions {skipped} never arrived between "
            f"{last} and {version}, and no typed signal announced their loss"
        )
    segment.seen[turn_id] = {version}


def _check_convergence(projection: DeviceProjection, canonical: Canonical, out: list[str]) -> None:
    for turn_id, expected in sorted(canonical.turns.items()):
        mine = projection.turns.get(turn_id)
        if mine != expected:
            out.append(
                f"not converged: Turn {turn_id} is {mine} on the device, {expected} in Host "
                "(version, phase)"
            )
    for message_id, text in sorted(canonical.messages.items()):
        mine_text = projection.texts.get(message_id)
        if mine_text != text:
            out.append(
                f"not converged: message {message_id} is {_short(mine_text)} on the device, "
                f"{_short(text)} in Host"
            )


def _short(text: str | None) -> str:
    if text is None or len(text) < 60:
        return repr(text)
    return repr(text[:25] + "..." + text[-25:])
