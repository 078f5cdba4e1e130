"""The Subscriber's pure continuity machine, driven by hand-built frames (LIVE-SUB-1)."""

from __future__ import annotations

from typing import Any

import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.livestream.v1 import livestream_pb2 as pb
from services.livestream.subscriber import (
    PROTOCOL_REVISION,
    AttachmentCaughtUp,
    AttachmentDetached,
    AttachmentRejected,
    AttachmentStarted,
    ContinuityEvent,
    ContinuityMachine,
    Cursor,
    Delivered,
    DeviceState,
    MemoryStateStore,
    Ready,
    Reconcile,
    ReconcileKey,
    ReconcileReason,
    ResumeRejected,
)

WORKSPACES = ("ws-a", "ws-b")


def raw(number: int) -> Any:
    """An enum number as it arrives off the wire (possibly one the descriptor lacks)."""
    return number


WIDE = (ReconcileKey("ws-a"), ReconcileKey("ws-b"))
SESSION = (ReconcileKey("ws-a", "s-1"),)


# -- frame builders -------------------------------------------------------------------


def batch(epoch: str, *deliveries: pb.Delivery) -> pb.DeviceLinkResponse:
    return pb.DeviceLinkResponse(deliveries=pb.DeliveryBatch(epoch=epoch, deliveries=deliveries))


def delta(sequence: int, text: str = "hi") -> pb.Delivery:
    return pb.Delivery(
        sequence=sequence,
        message_delta=canonical_pb2.MessageDelta(
            workspace_id="ws-a", session_id="s-1", turn_id="t-1", message_id="m-1", text=text
        ),
    )


def turn(sequence: int, turn_id: str = "t-1") -> pb.Delivery:
    return pb.Delivery(
        sequence=sequence,
        turn_update=pb.TurnUpdate(
            turn=canonical_pb2.Turn(workspace_id="ws-a", session_id="s-1", turn_id=turn_id)
        ),
    )


def ready(
    epoch: str, latest: int, *, resumed: bool, heartbeat_ms: int = 5000
) -> pb.DeviceLinkResponse:
    return pb.DeviceLinkResponse(
        stream_ready=pb.StreamReady(
            protocol_revision=PROTOCOL_REVISION,
            epoch=epoch,
            resumed=resumed,
            latest_sequence=latest,
            limits=pb.LinkLimits(heartbeat_interval_ms=heartbeat_ms),
        )
    )


def heartbeat(epoch: str, latest: int) -> pb.DeviceLinkResponse:
    return pb.DeviceLinkResponse(heartbeat=pb.ServerHeartbeat(epoch=epoch, latest_sequence=latest))


def resume_rejected(
    reason: Any = pb.RESUME_REJECTED_REASON_EPOCH_UNKNOWN, cursor: Cursor | None = None
) -> pb.Delivery:
    rejected = pb.ResumeRejected(reason=reason)
    if cursor is not None:
        rejected.rejected_cursor.epoch = cursor.epoch
        rejected.rejected_cursor.last_sequence = cursor.last_sequence
    return pb.Delivery(sequence=1, resume_rejected=rejected)


def changed(
    sequence: int,
    revision: int = 1,
    session_id: str | None = "s-1",
    binding: str = "b",
    caller: str | None = None,
) -> pb.Delivery:
    return pb.Delivery(
        sequence=sequence,
        attachment_changed=pb.AttachmentChanged(
            binding_id=binding,
            revision=revision,
            workspace_id="ws-a",
            session_id=session_id,
            caller_turn_id=caller,
        ),
    )


def snapshot(
    sequence: int,
    revision: int = 1,
    root: str | None = "t-1",
    session_id: str = "s-1",
    interactions: int = 0,
) -> pb.Delivery:
    return pb.Delivery(
        sequence=sequence,
        interaction_snapshot=pb.InteractionSnapshot(
            binding_id="b",
            revision=revision,
            workspace_id="ws-a",
            session_id=session_id,
            root_turn_id=root,
            interactions=[
                canonical_pb2.Interaction(request_id=f"r-{i}") for i in range(interactions)
            ],
        ),
    )


def caught_up(
    sequence: int,
    revision: int = 1,
    root: str | None = "t-1",
    session_id: str = "s-1",
    workspace_id: str = "ws-a",
    caller: str | None = None,
    turns: tuple[str, ...] = ("t-1", "t-0"),
) -> pb.Delivery:
    return pb.Delivery(
        sequence=sequence,
        attachment_caught_up=pb.AttachmentCaughtUp(
            binding_id="b",
            revision=revision,
            workspace_id=workspace_id,
            session_id=session_id,
            canonical_turn_ids=turns,
            current_interaction_root_turn_id=root,
            caller_turn_id=caller,
        ),
    )


def fresh(*, generation: int = 1) -> ContinuityMachine:
    machine = ContinuityMachine(DeviceState(device_id="d", workspace_ids=WORKSPACES), generation)
    machine.begin_call(cursor_sent=False)
    return machine


def resumed_at(epoch: str, last: int) -> ContinuityMachine:
    state = DeviceState(device_id="d", workspace_ids=WORKSPACES, cursor=Cursor(epoch, last))
    machine = ContinuityMachine(state)
    machine.begin_call(cursor_sent=True)
    return machine


def reconciles(events: list[ContinuityEvent]) -> list[Reconcile]:
    return [e for e in events if isinstance(e, Reconcile)]


def assert_lost(machine: ContinuityMachine, events: list[ContinuityEvent], reason: str) -> None:
    last = events[-1]
    assert isinstance(last, Reconcile)
    assert (last.reason, last.keys, last.cursor_dropped) == (reason, WIDE, True)
    assert machine.broken
    assert machine.cursor is None
    assert machine.state.cursor is None
    assert machine.state.attachments == {}


# -- sequence continuity --------------------------------------------------------------


@pytest.mark.spec("LIVE-SUB-1")
def test_contiguous_deliveries_are_delivered_in_order_and_advance_the_cursor() -> None:
    machine = fresh()
    events = machine.feed(batch("e1", delta(1, "a"), delta(2, "b")))
    events += machine.feed(batch("e1", turn(3)))
    assert [(type(e), getattr(e, "sequence", None)) for e in events] == [
        (Delivered, 1),
        (Delivered, 2),
        (Delivered, 3),
    ]
    assert [e.kind for e in events if isinstance(e, Delivered)] == [
        "message_delta",
        "message_delta",
        "turn_update",
    ]
    assert machine.cursor == Cursor("e1", 3)
    assert not machine.broken


@pytest.mark.spec("LIVE-SUB-1")
def test_a_gap_reconciles_every_workspace_and_drops_the_cursor() -> None:
    machine = fresh()
    machine.feed(batch("e1", delta(1)))
    events = machine.feed(batch("e1", delta(3)))
    assert not [e for e in events if isinstance(e, Delivered)]
    assert_lost(machine, events, ReconcileReason.GAP)
    # The rest of the call is ignored: nothing after a gap can be trusted.
    assert machine.feed(batch("e1", delta(4))) == []


@pytest.mark.spec("LIVE-SUB-1")
def test_a_duplicate_is_never_delivered_and_reconciles() -> None:
    machine = fresh()
    machine.feed(batch("e1", delta(1), delta(2)))
    events = machine.feed(batch("e1", delta(3, "new"), delta(2, "again")))
    delivered = [e for e in events if isinstance(e, Delivered)]
    assert [e.sequence for e in delivered] == [3]
    assert_lost(machine, events, ReconcileReason.DUPLICATE)


@pytest.mark.spec("LIVE-SUB-1")
def test_a_repeated_last_delivery_is_a_duplicate() -> None:
    machine = resumed_at("e1", 5)
    events = machine.feed(batch("e1", delta(5)))
    assert not [e for e in events if isinstance(e, Delivered)]
    assert_lost(machine, events, ReconcileReason.DUPLICATE)


@pytest.mark.spec("LIVE-SUB-1")
def test_a_gap_inside_one_batch_keeps_the_accepted_prefix() -> None:
    machine = fresh()
    events = machine.feed(batch("e1", delta(1), delta(2), delta(4)))
    assert [e.sequence for e in events if isinstance(e, Delivered)] == [1, 2]
    assert_lost(machine, events, ReconcileReason.GAP)


@pytest.mark.spec("LIVE-SUB-1")
def test_a_fresh_epoch_must_start_at_sequence_one() -> None:
    machine = fresh()
    events = machine.feed(batch("e1", delta(2)))
    assert_lost(machine, events, ReconcileReason.GAP)


@pytest.mark.spec("LIVE-RESUME-1")
def test_another_epoch_without_resume_rejected_is_a_gap() -> None:
    machine = resumed_at("e1", 7)
    events = machine.feed(batch("e2", delta(1)))
    assert_lost(machine, events, ReconcileReason.GAP)


@pytest.mark.spec("LIVE-SUB-1")
def test_a_sequence_beyond_the_integer_bound_is_refused() -> None:
    machine = resumed_at("e1", 2**53 - 1)
    events = machine.feed(batch("e1", delta(2**53)))
    assert_lost(machine, events, ReconcileReason.GAP)


# -- resume ---------------------------------------------------------------------------


@pytest.mark.spec("LIVE-RESUME-1")
def test_a_resumed_call_continues_the_epoch_and_ready_says_resumed() -> None:
    machine = resumed_at("e1", 5)
    events = machine.feed(batch("e1", delta(6), delta(7)))
    events += machine.feed(ready("e1", 7, resumed=True))
    assert [type(e) for e in events] == [Delivered, Delivered, Ready]
    ready_event = events[-1]
    assert isinstance(ready_event, Ready)
    assert (ready_event.epoch, ready_event.resumed, ready_event.latest_sequence) == ("e1", True, 7)
    assert ready_event.limits.heartbeat_interval_ms == 5000
    assert machine.ready
    assert machine.cursor == Cursor("e1", 7)


@pytest.mark.spec("LIVE-RESUME-1")
def test_resume_rejected_starts_the_fresh_epoch_and_drops_the_projection() -> None:
    machine = resumed_at("e1", 5)
    machine.state.revisions["b"] = 4
    machine.feed(batch("e1", changed(6, revision=4)))
    assert "b" in machine.state.attachments
    events = machine.feed(
        batch(
            "e2",
            resume_rejected(pb.RESUME_REJECTED_REASON_CURSOR_OUTSIDE_WINDOW, Cursor("e1", 6)),
            delta(2),
        )
    )
    events += machine.feed(ready("e2", 2, resumed=False))
    rejected, reconcile, delivered, ready_event = events
    assert isinstance(rejected, ResumeRejected)
    assert (rejected.epoch, rejected.reason, rejected.rejected_cursor) == (
        "e2",
        "CURSOR_OUTSIDE_WINDOW",
        Cursor("e1", 6),
    )
    assert isinstance(reconcile, Reconcile)
    assert (reconcile.reason, reconcile.keys, reconcile.cursor_dropped) == (
        ReconcileReason.RESUME_REJECTED,
        WIDE,
        False,
    )
    assert isinstance(delivered, Delivered)
    assert delivered.sequence == 2
    assert isinstance(ready_event, Ready)
    assert not ready_event.resumed
    assert machine.state.attachments == {}
    assert machine.state.revisions == {"b": 4}  # revisions only grow
    assert machine.cursor == Cursor("e2", 2)
    assert not machine.broken


@pytest.mark.spec("LIVE-RESUME-1")
def test_an_epoch_ending_mid_call_is_accepted_through_resume_rejected() -> None:
    machine = fresh()
    machine.feed(ready("e1", 0, resumed=False))
    machine.feed(batch("e1", delta(1), delta(2)))
    events = machine.feed(
        batch("e2", resume_rejected(pb.RESUME_REJECTED_REASON_EPOCH_ENDED, Cursor("e1", 2)))
    )
    assert [type(e) for e in events] == [ResumeRejected, Reconcile]
    assert machine.cursor == Cursor("e2", 1)
    assert machine.feed(batch("e2", delta(2)))[0] == Delivered(
        generation=1, epoch="e2", sequence=2, kind="message_delta", delivery=delta(2)
    )


@pytest.mark.spec("LIVE-RESUME-1")
@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (
            batch("e1", pb.Delivery(sequence=6, resume_rejected=pb.ResumeRejected(reason=raw(1)))),
            ReconcileReason.PROTOCOL_ERROR,
        ),
        (
            batch("e2", pb.Delivery(sequence=2, resume_rejected=pb.ResumeRejected(reason=raw(1)))),
            ReconcileReason.GAP,
        ),
        (batch("e2", resume_rejected(reason=0)), ReconcileReason.PROTOCOL_ERROR),
        (batch("e2", resume_rejected(reason=42)), ReconcileReason.PROTOCOL_ERROR),
    ],
    ids=["same-epoch", "not-first", "unspecified-reason", "unknown-reason"],
)
def test_a_misplaced_or_unknown_resume_rejected_reconciles(
    frame: pb.DeviceLinkResponse, reason: str
) -> None:
    machine = resumed_at("e1", 5)
    events = machine.feed(frame)
    assert not [e for e in events if isinstance(e, ResumeRejected)]
    assert_lost(machine, events, reason)


# -- stream_ready and heartbeats ------------------------------------------------------


@pytest.mark.spec("LIVE-CTL-1")
def test_a_fresh_empty_epoch_is_learned_from_stream_ready() -> None:
    machine = fresh()
    events = machine.feed(ready("e1", 0, resumed=False))
    assert [type(e) for e in events] == [Ready]
    assert machine.epoch == "e1"
    # A position to resume from even before the first delivery (a cut here loses nothing).
    assert machine.cursor == Cursor("e1", 0)
    assert [type(e) for e in machine.feed(batch("e1", delta(1)))] == [Delivered]
    assert machine.cursor == Cursor("e1", 1)


@pytest.mark.spec("LIVE-CTL-1")
def test_replayed_controls_before_stream_ready_are_accepted() -> None:
    machine = resumed_at("e1", 3)
    events = machine.feed(batch("e1", changed(4), turn(5), snapshot(6), caught_up(7)))
    events += machine.feed(ready("e1", 7, resumed=True))
    assert [type(e) for e in events] == [
        AttachmentStarted,
        Delivered,
        Delivered,
        AttachmentCaughtUp,
        Ready,
    ]


@pytest.mark.spec("LIVE-CTL-1")
@pytest.mark.parametrize(
    ("cursor_sent", "frame"),
    [
        (True, ready("e1", 4, resumed=True)),  # latest_sequence behind what arrived
        (True, ready("e1", 6, resumed=True)),  # latest_sequence ahead: a lost tail
        (True, ready("e1", 5, resumed=False)),  # same epoch, yet "not resumed"
        (True, ready("e9", 5, resumed=True)),  # another epoch without resume_rejected
        (False, ready("e1", 0, resumed=True)),  # resumed without a cursor
        (False, ready("e1", 3, resumed=False)),  # fresh epoch, deliveries never sent
    ],
)
def test_a_stream_ready_that_contradicts_what_arrived_reconciles(
    cursor_sent: bool, frame: pb.DeviceLinkResponse
) -> None:
    machine = resumed_at("e1", 5) if cursor_sent else fresh()
    events = machine.feed(frame)
    assert_lost(machine, events, ReconcileReason.READY_MISMATCH)
    assert not machine.ready


@pytest.mark.spec("LIVE-CTL-1", "LIVE-REV-1")
@pytest.mark.parametrize(
    "frame",
    [
        pb.DeviceLinkResponse(
            stream_ready=pb.StreamReady(epoch="e1", latest_sequence=5, resumed=True)
        ),
        pb.DeviceLinkResponse(
            stream_ready=pb.StreamReady(
                protocol_revision=raw(7), epoch="e1", latest_sequence=5, resumed=True
            )
        ),
        pb.DeviceLinkResponse(
            stream_ready=pb.StreamReady(
                protocol_revision=pb.LIVE_PROTOCOL_REVISION_1,
                epoch="e1",
                latest_sequence=5,
                resumed=True,
            )
        ),
    ],
    ids=["unspecified-revision", "unknown-revision", "released-older-revision"],
)
def test_a_stream_ready_of_another_protocol_revision_is_a_protocol_error(
    frame: pb.DeviceLinkResponse,
) -> None:
    machine = resumed_at("e1", 5)
    assert_lost(machine, machine.feed(frame), ReconcileReason.PROTOCOL_ERROR)


@pytest.mark.spec("LIVE-CTL-1")
def test_a_second_stream_ready_on_one_call_is_a_protocol_error() -> None:
    machine = resumed_at("e1", 5)
    machine.feed(ready("e1", 5, resumed=True))
    assert_lost(machine, machine.feed(ready("e1", 5, resumed=True)), "protocol_error")


@pytest.mark.spec("LIVE-CTL-1")
def test_every_call_gets_its_own_stream_ready() -> None:
    machine = resumed_at("e1", 5)
    assert [type(e) for e in machine.feed(ready("e1", 5, resumed=True))] == [Ready]
    machine.begin_call(cursor_sent=True)
    assert not machine.ready
    assert [type(e) for e in machine.feed(ready("e1", 5, resumed=True))] == [Ready]


@pytest.mark.spec("LIVE-SUB-1")
def test_a_heartbeat_ahead_of_the_last_delivery_is_a_lost_tail() -> None:
    machine = resumed_at("e1", 5)
    machine.feed(ready("e1", 5, resumed=True))
    assert machine.feed(heartbeat("e1", 5)) == []
    assert machine.heartbeats == 1
    assert_lost(machine, machine.feed(heartbeat("e1", 6)), ReconcileReason.GAP)


@pytest.mark.spec("LIVE-SUB-1")
def test_a_heartbeat_of_another_epoch_means_a_lost_resume_rejected() -> None:
    machine = resumed_at("e1", 5)
    machine.feed(ready("e1", 5, resumed=True))
    assert_lost(machine, machine.feed(heartbeat("e2", 0)), ReconcileReason.GAP)


# -- delivery kinds -------------------------------------------------------------------


@pytest.mark.spec("LIVE-SUB-1", "LIVE-VAR-1")
def test_a_discontinuity_is_delivered_and_reconciles_its_keys() -> None:
    machine = fresh()
    gap = pb.Delivery(
        sequence=1,
        discontinuity=pb.Discontinuity(
            reason=pb.DISCONTINUITY_REASON_MESSAGE_UPDATE,
            keys=pb.ReconcileKeys(workspace_id="ws-a", session_id="s-1", message_id="m-1"),
        ),
    )
    delivered, reconcile = machine.feed(batch("e1", gap))
    assert isinstance(delivered, Delivered)
    assert delivered.kind == "discontinuity"
    assert isinstance(reconcile, Reconcile)
    key = ReconcileKey("ws-a", "s-1", None, "m-1")
    assert (reconcile.reason, reconcile.keys, reconcile.cursor_dropped) == (
        "MESSAGE_UPDATE",
        (key,),
        False,
    )
    assert key.scope == "message"
    assert machine.cursor == Cursor("e1", 1)


@pytest.mark.spec("LIVE-SUB-1", "LIVE-REV-1")
@pytest.mark.parametrize(
    "discontinuity",
    [
        pb.Discontinuity(reason=raw(0), keys=pb.ReconcileKeys(workspace_id="ws-a")),
        pb.Discontinuity(reason=raw(99), keys=pb.ReconcileKeys(workspace_id="ws-a")),
        pb.Discontinuity(reason=pb.DISCONTINUITY_REASON_QUEUE_OVERFLOW),
        pb.Discontinuity(
            reason=pb.DISCONTINUITY_REASON_LATE_DELTA_FOR_SETTLED_TURN,
            keys=pb.ReconcileKeys(workspace_id="ws-a", turn_id="t-1"),
        ),
    ],
    ids=["unspecified-reason", "unknown-reason", "no-keys", "turn-without-session"],
)
def test_a_malformed_discontinuity_is_a_protocol_error(discontinuity: pb.Discontinuity) -> None:
    machine = fresh()
    events = machine.feed(batch("e1", pb.Delivery(sequence=1, discontinuity=discontinuity)))
    assert not [e for e in events if isinstance(e, Delivered)]
    assert_lost(machine, events, ReconcileReason.PROTOCOL_ERROR)


@pytest.mark.spec("LIVE-SUB-1", "LIVE-REV-1")
@pytest.mark.parametrize(
    "frame",
    [
        pb.DeviceLinkResponse(),
        batch("e1", pb.Delivery(sequence=1)),
        pb.DeviceLinkResponse(deliveries=pb.DeliveryBatch(epoch="e1")),
        # An unknown oneof member (field 99) decodes as an unset kind.
        batch("e1", pb.Delivery.FromString(b"\x08\x01" + b"\x9a\x06\x00")),
    ],
    ids=["frame-kind-unset", "delivery-kind-unset", "empty-batch", "unknown-kind"],
)
def test_an_unset_or_unknown_oneof_is_a_protocol_error(frame: pb.DeviceLinkResponse) -> None:
    machine = fresh()
    assert_lost(machine, machine.feed(frame), ReconcileReason.PROTOCOL_ERROR)


@pytest.mark.spec("LIVE-PROJ-1")
def test_a_filtered_delivery_advances_the_cursor_silently() -> None:
    machine = fresh()
    events = machine.feed(
        batch("e1", delta(1), pb.Delivery(sequence=2, filtered=pb.FilteredDelivery()), delta(3))
    )
    assert [e.sequence for e in events if isinstance(e, Delivered)] == [1, 3]
    assert len(events) == 2
    assert machine.filtered == 1
    assert machine.cursor == Cursor("e1", 3)


@pytest.mark.spec("LIVE-SUB-1")
def test_every_event_carries_the_generation_it_was_produced_in() -> None:
    machine = fresh(generation=4)
    first = machine.feed(batch("e1", delta(1)))
    machine.generation = 5
    second = machine.feed(batch("e1", delta(2), delta(4)))
    assert [e.generation for e in first] == [4]
    assert [e.generation for e in second] == [5, 5]


# -- attachments ----------------------------------------------------------------------


@pytest.mark.spec("LIVE-ATT-1", "LIVE-SUB-1")
def test_a_complete_baseline_catches_the_binding_up() -> None:
    machine = fresh()
    events = machine.feed(batch("e1", changed(1, caller="t-1"), turn(2, "t-0"), turn(3)))
    assert not machine.state.attachments["b"].caught_up
    events += machine.feed(
        batch("e1", snapshot(4, interactions=2), caught_up(5, caller="t-1"), delta(6))
    )
    kinds = [type(e).__name__ for e in events]
    assert kinds == [
        "AttachmentStarted",
        "Delivered",
        "Delivered",
        "Delivered",
        "AttachmentCaughtUp",
        "Delivered",
    ]
    barrier = events[4]
    assert isinstance(barrier, AttachmentCaughtUp)
    assert barrier.canonical_turn_ids == frozenset({"t-0", "t-1"})
    assert (barrier.binding_id, barrier.revision, barrier.caller_turn_id) == ("b", 1, "t-1")
    assert barrier.current_root_turn_id == "t-1"
    attachment = machine.state.attachments["b"]
    assert attachment.caught_up
    assert attachment.current_root_turn_id == "t-1"
    assert attachment.canonical_turn_ids == frozenset({"t-0", "t-1"})
    assert not reconciles(events)


@pytest.mark.spec("LIVE-ATT-1")
def test_a_session_without_a_current_root_has_an_unset_root_on_both_controls() -> None:
    machine = fresh()
    events = machine.feed(batch("e1", changed(1), snapshot(2, root=None), caught_up(3, root=None)))
    assert isinstance(events[-1], AttachmentCaughtUp)
    assert events[-1].current_root_turn_id is None
    assert machine.state.attachments["b"].caught_up


@pytest.mark.spec("LIVE-SUB-1", "LIVE-ATT-1")
@pytest.mark.parametrize(
    ("barrier", "reason"),
    [
        (caught_up(3, revision=2), ReconcileReason.BARRIER_MISMATCH),
        (caught_up(3, workspace_id="ws-b"), ReconcileReason.BARRIER_MISMATCH),
        (caught_up(3, session_id="s-2"), ReconcileReason.BARRIER_MISMATCH),
        (caught_up(3, caller="t-9"), ReconcileReason.BARRIER_MISMATCH),
        (caught_up(3, root="t-2"), ReconcileReason.SNAPSHOT_MISMATCH),
        (caught_up(3, root=None), ReconcileReason.SNAPSHOT_MISMATCH),
    ],
    ids=["revision", "workspace", "session", "caller", "other-root", "root-unset"],
)
def test_a_mismatched_barrier_reconciles_the_session_and_stays_not_caught_up(
    barrier: pb.Delivery, reason: str
) -> None:
    machine = fresh()
    machine.feed(batch("e1", changed(1), snapshot(2)))
    events = machine.feed(batch("e1", barrier))
    (reconcile,) = events
    assert isinstance(reconcile, Reconcile)
    assert reconcile.reason == reason
    assert ReconcileKey("ws-a", "s-1") in reconcile.keys
    assert all(key.session_id is not None for key in reconcile.keys)
    assert not reconcile.cursor_dropped
    assert not machine.broken
    assert not machine.state.attachments["b"].caught_up


@pytest.mark.spec("LIVE-SUB-1")
def test_a_barrier_without_a_snapshot_reconciles_the_session() -> None:
    machine = fresh()
    events = machine.feed(batch("e1", changed(1), turn(2), caught_up(3)))
    assert [type(e) for e in events] == [AttachmentStarted, Delivered, Reconcile]
    assert events[-1] == Reconcile(
        generation=1,
        reason=ReconcileReason.MISSING_SNAPSHOT,
        keys=SESSION,
        detail="delivery 3: barrier before any snapshot",
    )
    assert not machine.state.attachments["b"].caught_up


@pytest.mark.spec("LIVE-SUB-1")
def test_a_barrier_for_an_unknown_binding_reconciles_its_session() -> None:
    machine = fresh()
    (reconcile,) = machine.feed(batch("e1", caught_up(1)))
    assert isinstance(reconcile, Reconcile)
    assert (reconcile.reason, reconcile.keys) == (ReconcileReason.BARRIER_MISMATCH, SESSION)


@pytest.mark.spec("LIVE-SUB-1", "LIVE-ATT-1")
@pytest.mark.parametrize(
    "bad",
    [
        snapshot(2, root=None, interactions=1),
        snapshot(2, root=""),
        snapshot(2, revision=7),
        snapshot(2, session_id="s-2"),
    ],
    ids=["interactions-without-root", "empty-root", "other-revision", "other-session"],
)
def test_a_snapshot_that_is_not_the_controlled_one_is_rejected(bad: pb.Delivery) -> None:
    machine = fresh()
    machine.feed(batch("e1", changed(1)))
    events = machine.feed(batch("e1", bad, caught_up(3)))
    assert not [e for e in events if isinstance(e, Delivered)]  # never applied
    assert next(e.reason for e in reconciles(events)) == ReconcileReason.SNAPSHOT_MISMATCH
    assert all(key.session_id is not None for e in reconciles(events) for key in e.keys)
    assert not machine.state.attachments["b"].caught_up


@pytest.mark.spec("LIVE-SUB-1")
def test_a_second_snapshot_for_one_revision_spoils_its_barrier() -> None:
    machine = fresh()
    events = machine.feed(batch("e1", changed(1), snapshot(2), snapshot(3), caught_up(4)))
    assert [e.reason for e in reconciles(events)] == [
        ReconcileReason.SNAPSHOT_MISMATCH,
        ReconcileReason.MISSING_SNAPSHOT,
    ]
    assert not machine.state.attachments["b"].caught_up


@pytest.mark.spec("LIVE-ATT-1")
def test_a_newer_revision_restarts_the_baseline() -> None:
    machine = fresh()
    machine.feed(batch("e1", changed(1), snapshot(2), caught_up(3)))
    assert machine.state.attachments["b"].caught_up
    events = machine.feed(batch("e1", changed(4, revision=2, session_id="s-2")))
    assert isinstance(events[0], AttachmentStarted)
    assert events[0].session_id == "s-2"
    attachment = machine.state.attachments["b"]
    assert (attachment.revision, attachment.caught_up, attachment.snapshot_seen) == (
        2,
        False,
        False,
    )
    # The old revision's barrier can no longer close the new baseline.
    assert reconciles(machine.feed(batch("e1", caught_up(5))))


@pytest.mark.spec("LIVE-ATT-1")
@pytest.mark.parametrize("revision", [3, 2])
def test_an_attachment_revision_that_does_not_grow_is_a_protocol_error(revision: int) -> None:
    machine = fresh()
    machine.feed(batch("e1", changed(1, revision=3)))
    assert_lost(machine, machine.feed(batch("e1", changed(2, revision))), "protocol_error")


@pytest.mark.spec("LIVE-ATT-1")
def test_a_detach_removes_the_binding() -> None:
    machine = fresh()
    machine.feed(batch("e1", changed(1), snapshot(2), caught_up(3)))
    (detached,) = machine.feed(batch("e1", changed(4, revision=2, session_id=None)))
    assert isinstance(detached, AttachmentDetached)
    assert (detached.binding_id, detached.revision, detached.workspace_id) == ("b", 2, "ws-a")
    assert machine.state.attachments == {}


@pytest.mark.spec("LIVE-ATT-1")
def test_an_attachment_rejected_leaves_the_binding_not_caught_up() -> None:
    machine = fresh()
    rejected = pb.Delivery(
        sequence=2,
        attachment_rejected=pb.AttachmentRejected(
            binding_id="b",
            revision=1,
            workspace_id="ws-a",
            session_id="s-1",
            reason=pb.ATTACHMENT_REJECTED_REASON_SESSION_NOT_FOUND,
        ),
    )
    events = machine.feed(batch("e1", changed(1), rejected))
    assert isinstance(events[-1], AttachmentRejected)
    assert events[-1].reason == "SESSION_NOT_FOUND"
    attachment = machine.state.attachments["b"]
    assert (attachment.caught_up, attachment.rejected_reason) == (False, "SESSION_NOT_FOUND")
    assert reconciles(machine.feed(batch("e1", snapshot(3), caught_up(4))))
    assert not machine.state.attachments["b"].caught_up


@pytest.mark.spec("LIVE-ATT-1", "LIVE-REV-1")
def test_an_attachment_rejected_with_an_unknown_reason_is_a_protocol_error() -> None:
    machine = fresh()
    rejected = pb.Delivery(
        sequence=1,
        attachment_rejected=pb.AttachmentRejected(binding_id="b", revision=1, reason=raw(3)),
    )
    assert_lost(machine, machine.feed(batch("e1", rejected)), ReconcileReason.PROTOCOL_ERROR)


@pytest.mark.spec("LIVE-SUB-1", "LIVE-RESUME-1")
def test_not_caught_up_survives_a_resume_until_the_replayed_barrier() -> None:
    store = MemoryStateStore()
    machine = fresh()
    machine.feed(batch("e1", changed(1), turn(2), snapshot(3)))
    store.save(machine.state)  # what the Subscriber persists after the frame

    # The app restarts: a new machine from the saved document, a resumed call.
    restored = store.load()
    assert restored is not None
    assert restored.cursor == Cursor("e1", 3)
    assert not restored.attachments["b"].caught_up
    again = ContinuityMachine(restored)
    again.begin_call(cursor_sent=True)
    events = again.feed(batch("e1", caught_up(4)))
    events += again.feed(ready("e1", 4, resumed=True))
    assert [type(e) for e in events] == [AttachmentCaughtUp, Ready]
    assert again.state.attachments["b"].caught_up


@pytest.mark.spec("LIVE-SUB-1")
def test_a_connect_without_cursor_forgets_the_projection_but_not_the_revisions() -> None:
    machine = resumed_at("e1", 3)
    machine.state.revisions["b"] = 9
    machine.feed(batch("e1", changed(4, revision=9)))
    machine.begin_call(cursor_sent=False)
    assert (machine.cursor, machine.epoch, machine.last_sequence) == (None, None, 0)
    assert machine.state.attachments == {}
    assert machine.state.revisions == {"b": 9}


def test_begin_call_with_a_cursor_needs_one() -> None:
    machine = ContinuityMachine(DeviceState(workspace_ids=WORKSPACES))
    with pytest.raises(ValueError, match="no cursor"):
        machine.begin_call(cursor_sent=True)


@pytest.mark.spec("LIVE-SUB-1")
def test_a_broken_call_recovers_on_the_next_fresh_call() -> None:
    machine = fresh()
    machine.feed(batch("e1", delta(2)))
    was_broken = machine.broken
    machine.begin_call(cursor_sent=False)
    assert (was_broken, machine.broken) == (True, False)
    assert [type(e) for e in machine.feed(batch("e5", delta(1)))] == [Delivered]
    assert machine.cursor == Cursor("e5", 1)
