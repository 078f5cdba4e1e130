"""The replica torture's checker must be able to fail: synthetic silent gaps and duplicates.

Each case builds what a watcher or a device would have recorded and asks
:mod:`tests.support.live_gap_check` for its verdict: a correct log (including a typed
``resume_rejected`` followed by a reread) passes; a silent gap or a duplicate is named.
"""

from __future__ import annotations

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.livestream.v1 import livestream_pb2
from services.livestream.subscriber import (
    Connecting,
    Cursor,
    Delivered,
    Reconcile,
    ReconcileKey,
    ResumeRejected,
)
from tests.support.live_gap_check import (
    Canonical,
    CommittedEvent,
    Reread,
    WatchDelta,
    WatchEnded,
    WatchEvent,
    WatchLog,
    WatchSubscribed,
    check_device,
    check_watcher,
    delta_text,
)

WS = "ws-1"
SETTLED = canonical_pb2.TURN_PHASE_SETTLED
RUNNING = canonical_pb2.TURN_PHASE_RUNNING
FEED = [
    CommittedEvent(11, 101, "turn_update", "s1", "t1", version=1),
    CommittedEvent(12, 102, "turn_update", "s1", "t1", version=2),
    CommittedEvent(13, 103, "message_update", "s1", message_ids=("m1",)),
    CommittedEvent(14, 104, "turn_update", "s1", "t1", version=3),
]


def _canonical() -> Canonical:
    return Canonical(
        feed={e.sequence: e for e in FEED},
        head=14,
        turns={"t1": (3, SETTLED)},
        messages={"m1": "final"},
        deltas_sent={"m1": 3},
    )


# ---- watchers -------------------------------------------------------------------------------


def _event(sequence: int) -> WatchEvent:
    event = next(e for e in FEED if e.sequence == sequence)
    return WatchEvent(sequence, event.event_id, event.kind, "s1", event.message_ids)


def _delta(index: int) -> WatchDelta:
    return WatchDelta("s1", "m1", delta_text("m1", index))


def _clean_watch() -> list[object]:
    return [
        WatchSubscribed(head=10, after_event_id=None),
        _event(11),
        _event(12),
        _delta(1),
        _delta(2),
        _delta(3),
        _event(13),
        WatchEnded("UNAVAILABLE", ""),  # the replica died: resumed from the cursor
        WatchSubscribed(head=13, after_event_id=103),
        _event(14),
    ]


def _watch(entries: list[object]) -> list[str]:
    return check_watcher(WatchLog("w", entries), _canonical())  # type: ignore[arg-type]


def test_a_watcher_that_saw_everything_once_in_order_passes() -> None:
    assert _watch(_clean_watch()) == []


def test_a_watcher_with_a_silent_gap_fails() -> None:
    entries = [e for e in _clean_watch() if e != _event(12)]
    (violation,) = _watch(entries)
    assert "silent gap: sequences 12..12" in violation


def test_a_watcher_with_a_duplicate_fails() -> None:
    entries = _clean_watch()
    entries.insert(3, _event(12))  # redelivered after a resume that went back too far
    (violation,) = _watch(entries)
    assert "duplicate: sequence 12 after 12" in violation


def test_a_fresh_subscription_is_allowed_only_after_a_typed_cursor_expiry() -> None:
    silent = [
        *_clean_watch()[:7],
        WatchEnded("UNAVAILABLE", ""),
        WatchSubscribed(head=14, after_event_id=None),  # skips nothing here, but could
    ]
    assert any("without a typed EVENT_CURSOR_EXPIRED" in v for v in _watch(silent))
    typed = [
        *_clean_watch()[:7],
        WatchEnded("OUT_OF_RANGE", "EVENT_CURSOR_EXPIRED"),
        WatchSubscribed(head=14, after_event_id=None),
    ]
    assert _watch(typed) == []


def test_a_watcher_that_stops_short_of_hosts_head_fails() -> None:
    (violation,) = _watch(_clean_watch()[:-1])
    assert "silent tail gap" in violation


def test_a_confirmation_that_overtakes_its_deltas_fails() -> None:
    entries = [e for e in _clean_watch() if e != _delta(3)]
    (violation,) = _watch(entries)
    assert "message_update before its deltas 3..3" in violation


def test_a_delta_gap_is_silent_unless_a_reconcile_notice_came_first() -> None:
    gap = [e for e in _clean_watch() if e != _delta(2)]
    assert any("silent gap: m1 deltas 2..2" in v for v in _watch(gap))
    notice = WatchEvent(12, 102, "session_reconcile_required", "s1")
    feed = {**_canonical().feed, 12: CommittedEvent(12, 102, "session_reconcile_required", "s1")}
    canonical = _canonical()
    canonical.feed = feed
    excused = [
        WatchSubscribed(head=10, after_event_id=None),
        _event(11),
        _delta(1),
        notice,
        _delta(3),
        _event(13),
        _event(14),
    ]
    assert check_watcher(WatchLog("w", excused), canonical) == []  # type: ignore[arg-type]


# ---- devices --------------------------------------------------------------------------------


class _Device:
    """Builds a device log: deliveries numbered per epoch."""

    def __init__(self) -> None:
        self.log: list[object] = []
        self.epoch = "e1"
        self.sequence = 0

    def connect(self, cursor: Cursor | None = None) -> _Device:
        self.log.append(Connecting(generation=1, attempt=0, cursor=cursor))
        return self

    def deliver(self, delivery: livestream_pb2.Delivery, kind: str) -> _Device:
        self.sequence += 1
        delivery.sequence = self.sequence
        self.log.append(
            Delivered(
                generation=1,
                epoch=self.epoch,
                sequence=self.sequence,
                kind=kind,
                delivery=delivery,
            )
        )
        return self

    def turn(self, version: int, phase: int = RUNNING) -> _Device:
        turn = canonical_pb2.Turn(
            workspace_id=WS,
            session_id="s1",
            turn_id="t1",
            version=version,
            phase=phase,  # type: ignore[arg-type]
        )
        return self.deliver(
            livestream_pb2.Delivery(turn_update=livestream_pb2.TurnUpdate(turn=turn)),
            "turn_update",
        )

    def delta(self, index: int) -> _Device:
        delta = canonical_pb2.MessageDelta(
            workspace_id=WS,
            session_id="s1",
            turn_id="t1",
            message_id="m1",
            operation=canonical_pb2.DELTA_OPERATION_SET
            if index == 1
            else canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
            text=delta_text("m1", index),
        )
        return self.deliver(livestream_pb2.Delivery(message_delta=delta), "message_delta")

    def message_update(self) -> _Device:
        keys = livestream_pb2.ReconcileKeys(workspace_id=WS, session_id="s1", message_id="m1")
        discontinuity = livestream_pb2.Discontinuity(
            reason=livestream_pb2.DISCONTINUITY_REASON_MESSAGE_UPDATE, keys=keys
        )
        self.deliver(livestream_pb2.Delivery(discontinuity=discontinuity), "discontinuity")
        key = ReconcileKey(WS, "s1", "t1", "m1")
        self.log.append(Reconcile(generation=1, reason="MESSAGE_UPDATE", keys=(key,)))
        return self.reread(messages={"m1": "final"})

    def reread(
        self,
        turns: dict[str, tuple[int, int]] | None = None,
        messages: dict[str, str] | None = None,
    ) -> _Device:
        self.log.append(Reread("reconcile", turns or {}, messages or {}))
        return self

    def resume_rejected(self, epoch: str) -> _Device:
        cursor = Cursor(self.epoch, self.sequence)
        self.connect(cursor)
        self.epoch, self.sequence = epoch, 1
        self.log.append(
            ResumeRejected(
                generation=1, epoch=epoch, reason="EPOCH_UNKNOWN", rejected_cursor=cursor
            )
        )
        self.log.append(Reconcile(generation=1, reason="RESUME_REJECTED", keys=(ReconcileKey(WS),)))
        return self


def _device(device: _Device) -> list[str]:
    return check_device("d", device.log, _canonical())


def test_a_device_that_saw_everything_once_in_order_passes() -> None:
    device = _Device().connect().turn(1).turn(2).delta(1).delta(2).delta(3)
    assert _device(device.message_update().turn(3, SETTLED)) == []


def test_resume_rejected_then_a_reread_that_converges_passes() -> None:
    device = _Device().connect().turn(1).delta(1)
    device.resume_rejected("e2")  # the replica died: typed, never silent
    device.reread(turns={"t1": (2, RUNNING)}, messages={})
    device.delta(3).message_update().turn(3, SETTLED)  # deltas 2 lost, but announced
    assert _device(device) == []


def test_a_device_with_a_duplicate_delivery_sequence_fails() -> None:
    device = _Device().connect().turn(1).turn(2).delta(1).delta(2).delta(3)
    device.message_update().turn(3, SETTLED)
    repeated = device.log[2]
    device.log.insert(3, repeated)  # the same epoch and sequence a second time
    violations = _device(device)
    assert any("duplicate: delivery sequence 2 after 2" in v for v in violations), violations


def test_a_device_that_silently_skips_a_committed_turn_version_fails() -> None:
    device = _Device().connect().turn(1).delta(1).delta(2).delta(3)
    device.message_update().turn(3, SETTLED)  # version 2 never came, nothing announced
    violations = _device(device)
    assert any("silent gap: Turn t1 versions [2]" in v for v in violations), violations


def test_a_device_that_silently_loses_deltas_fails() -> None:
    device = _Device().connect().turn(1).turn(2).delta(1).delta(3)
    violations = _device(device.message_update().turn(3, SETTLED))
    assert any("silent gap: m1 deltas 2..2" in v for v in violations), violations


def test_a_device_that_silently_loses_the_tail_does_not_converge() -> None:
    device = _Device().connect().turn(1).turn(2).delta(1).delta(2).delta(3)
    violations = _device(device.message_update())  # the settling update never came
    assert any("not converged: Turn t1 is (2, 2) on the device" in v for v in violations), (
        violations
    )


def test_resume_rejected_without_a_reread_does_not_converge() -> None:
    device = _Device().connect().turn(1).turn(2).delta(1).delta(2).delta(3)
    device.resume_rejected("e2")  # announced, but the application ignored it
    violations = _device(device)
    assert any("not converged: message m1 is 'm1#1;m1#2;m1#3;'" in v for v in violations), (
        violations
    )
