"""The golden wire fixtures of the live protocol, offline (CON-3, LIVE-FRAME-1, LIVE-REV-1).

For every golden frame and request of the current revision's directory
(``tests/contract/fixtures/livestream/live-protocol-<n>``):

- its bytes decode to exactly its readable form, and the readable form's canonical
  encoding is exactly its bytes (so any protobuf implementation can check itself
  against the file);
- the server's own composition (``services.livestream.encoding``: bodies encoded once,
  the sequence written in front, frames concatenated from encoded deliveries; and
  ``services.livestream.deliveries`` mapping Host events to bodies) produces exactly
  those bytes;
- it breaks no rule of the closed protocol, while every frame of ``protocol_errors.json``
  breaks the rule it names;
- the schema of the revision (field numbers, kinds, enums) is still the one recorded in
  ``schema.json``: any change to it needs a new revision (LIVE-REV-1);
- the fixtures of released revisions are frozen, byte for byte, and the device library
  speaks the server's revision.

The live-server half (real frames from a running Host and livestream, and the typed
refusals) is ``tests/integration/livestream/test_live_contract.py``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from google.protobuf import json_format

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import activity_pb2
from agentactivity.livestream.v1 import livestream_pb2
from services.livestream.deliveries import DeliveryMapper
from services.livestream.encoding import (
    batch_frame,
    body_of,
    delivery_bytes,
    delivery_entry_size,
    frame_bytes,
)
from services.livestream.link import CURRENT_REVISION
from services.livestream.projection import project
from services.livestream.subscriber import PROTOCOL_REVISION
from tests.contract.live_fixtures import (
    FIXTURES,
    REVISION_DIR,
    GoldenMessage,
    closed_protocol_violations,
    load_frames,
    load_protocol_errors,
    load_refusals,
    load_requests,
    load_schema,
    readable_of,
    schema_of,
)

FRAMES = load_frames()
REQUESTS = load_requests()
BY_NAME = {frame.name: frame for frame in FRAMES}
Delivery = livestream_pb2.Delivery
Reason = livestream_pb2.DiscontinuityReason


def _params(entries: list[GoldenMessage], *spec: str) -> list[Any]:
    return [
        pytest.param(entry, id=entry.name, marks=pytest.mark.spec(*spec, *entry.spec))
        for entry in entries
    ]


def _frame(entry: GoldenMessage) -> livestream_pb2.DeviceLinkResponse:
    return livestream_pb2.DeviceLinkResponse.FromString(entry.data)


def _encoded_deliveries(frame: livestream_pb2.DeviceLinkResponse) -> list[bytes]:
    return [delivery.SerializeToString() for delivery in frame.deliveries.deliveries]


def _body(delivery: Delivery) -> bytes:
    copy = Delivery()
    copy.CopyFrom(delivery)
    copy.ClearField("sequence")
    return body_of(copy)


# ---------------------------------------------------------------- bytes <-> readable


@pytest.mark.parametrize("entry", _params(FRAMES, "CON-3", "LIVE-FRAME-1"))
def test_golden_frame_bytes_decode_to_the_readable_form(entry: GoldenMessage) -> None:
    frame = _frame(entry)
    assert readable_of(frame) == entry.readable
    assert closed_protocol_violations(frame) == []
    # The readable form encodes back to exactly the bytes (fields in number order).
    parsed = json_format.ParseDict(entry.readable, livestream_pb2.DeviceLinkResponse())
    assert parsed.SerializeToString(deterministic=True) == entry.data
    assert parsed == frame


@pytest.mark.parametrize("entry", _params(REQUESTS, "CON-3", "LIVE-LINK-1"))
def test_golden_request_bytes_decode_to_the_readable_form(entry: GoldenMessage) -> None:
    request = livestream_pb2.DeviceLinkRequest.FromString(entry.data)
    assert readable_of(request) == entry.readable
    assert request.WhichOneof("kind") is not None
    parsed = json_format.ParseDict(entry.readable, livestream_pb2.DeviceLinkRequest())
    assert parsed.SerializeToString(deterministic=True) == entry.data


@pytest.mark.spec("CON-3", "CON-5", "LIVE-REV-1")
def test_refusal_requests_are_the_bytes_their_readable_form_says() -> None:
    refusals = load_refusals()
    assert len(refusals) >= 30
    for refusal in refusals:
        assert refusal.send, refusal.name
        for data, readable in zip(refusal.send, refusal.readable, strict=True):
            if readable is None:
                continue  # bytes no valid request has: the note in the file says what
            request = livestream_pb2.DeviceLinkRequest.FromString(data)
            assert readable_of(request) == readable, refusal.name
            assert request.SerializeToString(deterministic=True) == data, refusal.name


@pytest.mark.spec("CON-3", "LIVE-FRAME-1")
def test_the_golden_frames_cover_every_kind_control_and_reason() -> None:
    response_kinds = {frame.WhichOneof("kind") for frame in map(_frame, FRAMES)}
    assert response_kinds == set(livestream_pb2.DeviceLinkResponse.DESCRIPTOR.fields_by_name)
    deliveries = [d for frame in map(_frame, FRAMES) for d in frame.deliveries.deliveries]
    kinds: set[str] = {d.WhichOneof("kind") or "" for d in deliveries}
    assert kinds == {f.name for f in Delivery.DESCRIPTOR.oneofs_by_name["kind"].fields}
    enums = {
        "discontinuity.reason": Reason,
        "resume_rejected.reason": livestream_pb2.ResumeRejectedReason,
        "attachment_rejected.reason": livestream_pb2.AttachmentRejectedReason,
    }
    for path, enum in enums.items():
        kind, field = path.split(".")
        seen = {
            getattr(getattr(d, kind), field) for d in deliveries if d.WhichOneof("kind") == kind
        }
        assert seen == {v for v in enum.values() if v != 0}, path
    snapshots = [d.interaction_snapshot for d in deliveries if d.HasField("interaction_snapshot")]
    assert {s.HasField("root_turn_id") for s in snapshots} == {True, False}
    # A frame per kind with several deliveries of it (resume_rejected, always delivery 1
    # of a fresh epoch, has a frame per reason instead).
    for kind in kinds - {"resume_rejected"}:
        batch = _frame(BY_NAME[kind]).deliveries
        assert sum(d.WhichOneof("kind") == kind for d in batch.deliveries) >= 2, kind
    prefixes = [
        delivery_entry_size(len(d)) - len(d) for f in FRAMES for d in _encoded_deliveries(_frame(f))
    ]
    assert {1 + 1, 1 + 2, 1 + 3} <= set(prefixes), "one-, two- and three-byte lengths"


# --------------------------------------------------------------- server composition


@pytest.mark.parametrize("entry", _params(FRAMES, "CON-3", "LIVE-FRAME-1"))
def test_the_server_composition_produces_exactly_the_golden_bytes(entry: GoldenMessage) -> None:
    frame = _frame(entry)
    if frame.WhichOneof("kind") != "deliveries":
        assert frame_bytes(frame) == entry.data
        return
    batch = frame.deliveries
    composed = [delivery_bytes(d.sequence, _body(d)) for d in batch.deliveries]
    assert composed == _encoded_deliveries(frame)
    assert batch_frame(batch.epoch, composed) == entry.data


@pytest.mark.spec("CON-3", "LIVE-PROJ-1")
def test_projection_replaces_a_hidden_workspace_by_the_golden_filtered_delivery() -> None:
    frame = _frame(BY_NAME["filtered"])
    golden = {d.sequence: d.SerializeToString() for d in frame.deliveries.deliveries}
    hidden_turn = Delivery(
        turn_update=livestream_pb2.TurnUpdate(
            turn=canonical_pb2.Turn(workspace_id="ws-2", session_id="s9", turn_id="t9")
        )
    )
    hidden_delta = Delivery(
        message_delta=canonical_pb2.MessageDelta(workspace_id="ws-2", session_id="s9", text="x")
    )
    for sequence, delivery in ((36, hidden_turn), (37, hidden_delta)):
        encoded = delivery_bytes(sequence, body_of(delivery))
        assert project(encoded, frozenset({"ws-2"})) == golden[sequence]
    for sequence in (35, 38):  # what the recipient may see passes byte for byte
        assert project(golden[sequence], frozenset({"ws-2"})) == golden[sequence]


def _event(**payload: Any) -> activity_pb2.ActivityEvent:
    return activity_pb2.ActivityEvent(event_id=1, workspace_id="ws-1", **payload)


def _golden_bodies(name: str) -> list[bytes]:
    return [_body(d) for d in _frame(BY_NAME[name]).deliveries.deliveries]


@pytest.mark.spec("CON-3", "LIVE-VAR-1", "LIVE-FRAME-1")
def test_host_events_map_to_exactly_the_golden_variant_bodies() -> None:
    mapper = DeliveryMapper("ws-1", safe_bytes=1024 * 1024, fence_size=16)
    for name, kind in (
        ("message_delta", "message_delta"),
        ("turn_update", "turn_update"),
        ("interaction_update", "interaction_update"),
    ):
        golden = _frame(BY_NAME[name]).deliveries.deliveries
        events = []
        for delivery in golden:
            if kind == "message_delta":
                event = _event(
                    message_delta=activity_pb2.MessageDeltaEvent(delta=delivery.message_delta)
                )
            elif kind == "turn_update":
                update = activity_pb2.TurnUpdateEvent(turn=delivery.turn_update.turn)
                if delivery.turn_update.HasField("active_turn_id"):
                    update.active_turn_id = delivery.turn_update.active_turn_id
                event = _event(turn_update=update)
            else:
                event = _event(
                    interaction_update=activity_pb2.InteractionUpdateEvent(
                        interaction=delivery.interaction_update
                    )
                )
            events.append(event)
        # One event at a time: what arrives together may be coalesced (LIVE-COAL-1).
        bodies = [body.body for event in events for body in mapper.map([event])]
        assert bodies == _golden_bodies(name), name


@pytest.mark.spec("CON-3", "LIVE-VAR-1", "LIVE-FENCE-1", "LIVE-UP-1", "LIVE-FRAME-1")
def test_host_events_map_to_exactly_the_golden_discontinuity_bodies() -> None:
    mapper = DeliveryMapper("ws-1", safe_bytes=4096, fence_size=16)
    message = canonical_pb2.Message(
        workspace_id="ws-1", session_id="s1", message_id="msg-1", turn_id="turn-1", version=3
    )
    settled = canonical_pb2.Turn(
        workspace_id="ws-1",
        session_id="s1",
        turn_id="turn-1",
        phase=canonical_pb2.TURN_PHASE_SETTLED,
        version=4,
    )

    def delta(text: str) -> activity_pb2.ActivityEvent:
        return _event(
            message_delta=activity_pb2.MessageDeltaEvent(
                delta=canonical_pb2.MessageDelta(
                    workspace_id="ws-1",
                    session_id="s1",
                    turn_id="turn-1",
                    message_id="msg-1",
                    target=canonical_pb2.DELTA_TARGET_TEXT,
                    operation=canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
                    text=text,
                )
            )
        )

    bodies = [
        *mapper.map(
            [
                _event(
                    message_update=activity_pb2.MessageUpdateEvent(
                        session_id="s1", messages=[message], message_count=1
                    )
                )
            ]
        ),
        *mapper.map(
            [
                _event(
                    session_reconcile_required=activity_pb2.SessionReconcileRequiredEvent(
                        session_id="s1"
                    )
                )
            ]
        ),
        *mapper.map(
            [
                _event(
                    session_deleted=activity_pb2.SessionDeletedEvent(
                        session_id="s1", generation="g1", deleted_at_unix_ms=1
                    )
                )
            ]
        ),
        *mapper.map(
            [
                _event(
                    session_restored=activity_pb2.SessionRestoredEvent(
                        session_id="s1", generation="g1"
                    )
                )
            ]
        ),
        # A text delta over the safe size cannot be re-expressed (only tool output can).
        *mapper.map([delta("x" * 5000)]),
        mapper.workspace_discontinuity(Reason.DISCONTINUITY_REASON_QUEUE_OVERFLOW),
        mapper.workspace_discontinuity(Reason.DISCONTINUITY_REASON_UPSTREAM_RESUBSCRIBED),
    ]
    turn_body = mapper.map([_event(turn_update=activity_pb2.TurnUpdateEvent(turn=settled))])
    assert [b.kind for b in turn_body] == ["turn_update"]
    bodies += mapper.map([delta("late")])  # the Turn is in the settled fence now
    bodies += mapper.map([_event(message_update=activity_pb2.MessageUpdateEvent(session_id="s1"))])
    assert [b.body for b in bodies] == _golden_bodies("discontinuity")


# ------------------------------------------------------------------- closed protocol


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param(e, id=e["name"], marks=pytest.mark.spec("CON-3", "CON-6", *e["spec"]))
        for e in load_protocol_errors()
    ],
)
def test_each_protocol_error_frame_breaks_the_rule_it_names(entry: dict[str, Any]) -> None:
    frame = livestream_pb2.DeviceLinkResponse.FromString(bytes.fromhex(entry["hex"]))
    assert (entry["violation"], entry["path"]) in closed_protocol_violations(frame)


# ---------------------------------------------------------------------------- revision


@pytest.mark.spec("LIVE-REV-1", "CON-7")
def test_the_schema_is_still_revision_2() -> None:
    """Field numbers, kinds, control shapes and reasons are the revision's (LIVE-REV-1).

    A failure here means the live protocol changed: add ``LIVE_PROTOCOL_REVISION_3``,
    make it current, and add ``live-protocol-3/`` with its fixtures; never edit the
    fixtures of a released revision (ADR 0030).
    """
    assert CURRENT_REVISION == livestream_pb2.LIVE_PROTOCOL_REVISION_2
    assert schema_of() == load_schema(), "the live protocol changed without a new revision"


RELEASED = {
    1: {
        "README.md": "4a02c82860822896e7437f5f4f6f6de92ae987b3f5c59bb2323c93f236f0461c",
        "frames.json": "2aed6ee179918a7086e707b71724d480b493d4def2e2d162eb023697d944cbcc",
        "protocol_errors.json": "9f16fcfd543830569bdf77cd3f7c172fba6ced2a44352028ec5d25303d0805d2",
        "refusals.json": "58b95cc5642ad4e913f2442deeb34d49c47552446e34ec2ffbb432ad0cbea488",
        "requests.json": "cda5419d0a6053e35b1d81c77962e022d78f064a03518408c328b2d9717912f8",
        "schema.json": "acf8a3eace6e56b5d76d93d0e302514989b6991f137694b956d213e16fafa351",
        "session.json": "2f42f1bf5ad39e3cd2319cd3a6ad07c946c1770ba1889828c0ead151fd1f23dd",
    },
}
"""SHA-256 of every fixture file of each released revision: they are the frozen record."""


@pytest.mark.spec("LIVE-REV-1", "CON-3")
@pytest.mark.parametrize("revision", sorted(RELEASED))
def test_a_released_revision_keeps_its_fixtures_and_its_own_schema(revision: int) -> None:
    """A released revision's fixtures are never edited; its schema differs from the current
    one (else it would not be another revision), and its frames and requests still decode
    to their readable form (revisions only add to the contract, which buf breaking checks)."""
    directory = FIXTURES / f"live-protocol-{revision}"
    assert revision < CURRENT_REVISION
    digests = {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
    }
    assert digests == RELEASED[revision], "a released revision's fixtures were edited"
    assert load_schema(directory) != load_schema()
    for entry in load_frames(directory):
        assert readable_of(_frame(entry)) == entry.readable, entry.name
    for entry in load_requests(directory):
        request = livestream_pb2.DeviceLinkRequest.FromString(entry.data)
        assert readable_of(request) == entry.readable, entry.name


@pytest.mark.spec("LIVE-REV-1")
def test_the_device_library_speaks_the_servers_revision() -> None:
    assert PROTOCOL_REVISION == CURRENT_REVISION
    for entry in REQUESTS:
        request = livestream_pb2.DeviceLinkRequest.FromString(entry.data)
        if request.HasField("hello"):
            assert request.hello.protocol_revision == CURRENT_REVISION, entry.name
    ready = [_frame(f).stream_ready for f in FRAMES if _frame(f).HasField("stream_ready")]
    assert ready
    assert {r.protocol_revision for r in ready} == {CURRENT_REVISION}


@pytest.mark.spec("LIVE-REV-1", "LIVE-VAR-1", "CON-3")
def test_a_golden_turn_delivery_carries_every_kind_of_file_change() -> None:
    """Revision 2 exists for ``Turn.file_changes``: a golden frame pins its encoding."""
    turns = [
        d.turn_update.turn
        for frame in map(_frame, FRAMES)
        for d in frame.deliveries.deliveries
        if d.HasField("turn_update")
    ]
    changes = [change for turn in turns for change in turn.file_changes]
    kinds = {change.change for change in changes}
    assert kinds == {v for v in canonical_pb2.FileChangeKind.values() if v != 0}
    renamed = [c for c in changes if c.change == canonical_pb2.FILE_CHANGE_KIND_RENAMED]
    assert renamed
    assert all(c.HasField("previous_path") for c in renamed)
    assert not any(c.HasField("previous_path") for c in changes if c not in renamed)


@pytest.mark.spec("LIVE-REV-1", "CON-3")
def test_every_revision_has_its_fixtures() -> None:
    revisions = [
        v.number for v in livestream_pb2.LiveProtocolRevision.DESCRIPTOR.values if v.number
    ]
    assert max(revisions) == CURRENT_REVISION
    for number in revisions:
        directory = FIXTURES / f"live-protocol-{number}"
        assert directory.is_dir(), directory
        for name in ("frames.json", "requests.json", "refusals.json", "schema.json"):
            assert (directory / name).is_file(), directory / name
    assert FIXTURES / f"live-protocol-{CURRENT_REVISION}" == REVISION_DIR
