"""The golden live-protocol fixtures against real servers (CON-3, LIVE-FRAME-1, LIVE-REV-1).

Host and livestream run over real sockets on SQLite and Postgres:

- a recorded device session (attach, a Turn with deltas, an Interaction, a second attach
  with a root, settlement, an oversized delta, detach, a rejected attach, delete and restore,
  an idle heartbeat, then resume, unknown epoch, cursor ahead and ended epoch) is
  compared, with generated ids, epochs and clocks normalised, to ``session.json``;
  every frame the server wrote is the canonical encoding of what it decodes to, breaks
  no closed-protocol rule, and carries only fields the golden frames of its kind carry;
- the golden requests of ``requests.json``, sent as bytes, are accepted and answered
  with exactly the golden ``attachment_changed`` deliveries;
- every typed refusal of ``refusals.json`` is replayed as bytes: the call ends with its
  code, ``ErrorInfo`` reason and metadata and ``BadRequest`` fields, and a refused hello
  leaves no publisher behind.

A scripted Host source (no store) shows the bodies real Host cannot be made to produce on
demand (upstream resubscribed, the ended epoch, Host unavailable) byte for byte.

``TUTTI_LIVE_RECORD_SESSION=1`` rewrites ``session.json`` from a run instead of checking
it (review the diff: it is the contract).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, runtime_pb2
from agentactivity.livestream.v1 import livestream_pb2, livestream_pb2_grpc
from services.livestream.encoding import body_of, delivery_bytes
from services.livestream.link import CURRENT_REVISION
from services.livestream.source import Baseline, SourceUnavailable
from tests.contract.live_fixtures import (
    REVISION_DIR,
    Names,
    Refusal,
    closed_protocol_violations,
    load_frames,
    load_refusals,
    load_requests,
    normalised,
    readable_of,
    shape,
)
from tests.contract.live_link import RawFrame, RawLink
from tests.integration.host_activity import DEVICE, WS, HostUnderTest, start_host
from tests.integration.livestream.link_client import start_livestream
from tests.integration.livestream.scripted_source import ScriptedSource, delta_event, turn_event
from tests.support.rpc_errors import error_details
from tests.support.runtime_client import ScriptedRuntime, interaction, text_message, turn_patch
from tests.support.servers import LiveServer, auth_metadata

SESSION_FILE = REVISION_DIR / "session.json"
RECORD = os.environ.get("TUTTI_LIVE_RECORD_SESSION") == "1"
FRAMES = {frame.name: frame for frame in load_frames()}
REQUESTS = {request.name: request for request in load_requests()}
REFUSALS = load_refusals()
Delivery = livestream_pb2.Delivery
RUNNING = canonical_pb2.TURN_PHASE_RUNNING
SETTLED = canonical_pb2.TURN_PHASE_SETTLED
HEARTBEAT_SECONDS = 0.3
SAFE_BYTES = 4096
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def _hello(device: str, cursor: tuple[str, int] | None = None) -> bytes:
    hello = livestream_pb2.ClientHello(
        protocol_revision=CURRENT_REVISION,
        device_id=device,
        workspace_ids=[WS],
    )
    if cursor is not None:
        hello.resume_cursor.epoch, hello.resume_cursor.last_sequence = cursor
    return livestream_pb2.DeviceLinkRequest(hello=hello).SerializeToString()


def _attach(binding: str, revision: int, session: str, caller: str | None = None) -> bytes:
    attach = livestream_pb2.ClientAttach(
        binding_id=binding, revision=revision, workspace_id=WS, session_id=session
    )
    if caller is not None:
        attach.caller_turn_id = caller
    return livestream_pb2.DeviceLinkRequest(attach=attach).SerializeToString()


def _detach(binding: str, revision: int) -> bytes:
    return livestream_pb2.DeviceLinkRequest(
        detach=livestream_pb2.ClientDetach(binding_id=binding, revision=revision)
    ).SerializeToString()


def _body(delivery: Delivery) -> bytes:
    copy = Delivery()
    copy.CopyFrom(delivery)
    copy.ClearField("sequence")
    return body_of(copy)


def _golden_deliveries(name: str) -> list[Delivery]:
    frame = livestream_pb2.DeviceLinkResponse.FromString(FRAMES[name].data)
    return list(frame.deliveries.deliveries)


def _golden_shapes() -> dict[str, set[str]]:
    """Field paths the golden frames carry, per delivery kind and per frame kind."""
    shapes: dict[str, set[str]] = {}
    for golden in FRAMES.values():
        frame = livestream_pb2.DeviceLinkResponse.FromString(golden.data)
        kind = frame.WhichOneof("kind") or ""
        if kind == "deliveries":
            for delivery in frame.deliveries.deliveries:
                name = delivery.WhichOneof("kind") or ""
                shapes.setdefault(name, set()).update(shape(readable_of(delivery)))
        else:
            shapes.setdefault(kind, set()).update(shape(readable_of(frame)))
    return shapes


def _check_frame(raw: RawFrame, shapes: dict[str, set[str]]) -> list[str]:
    """What is wrong with one frame the server wrote (nothing, normally)."""
    problems = []
    if raw.frame.SerializeToString(deterministic=True) != raw.data:
        problems.append(f"not the canonical encoding of what it decodes to: {raw.data[:60]!r}")
    violations = closed_protocol_violations(raw.frame)
    if violations:
        problems.append(f"breaks the closed protocol: {violations}")
    parts: list[tuple[str, dict[str, Any]]]
    if raw.kind == "deliveries":
        parts = [
            (d.WhichOneof("kind") or "", readable_of(d)) for d in raw.frame.deliveries.deliveries
        ]
    else:
        parts = [(raw.kind, readable_of(raw.frame))]
    for kind, readable in parts:
        extra = set(shape(readable)) - shapes.get(kind, set())
        if extra:
            problems.append(f"{kind} carries fields no golden {kind} has: {sorted(extra)}")
    return problems


def _contiguous(frames: list[RawFrame]) -> list[str]:
    """Sequences within each epoch start at 1 and grow by exactly 1."""
    problems = []
    last: dict[str, int] = {}
    for raw in frames:
        if raw.kind != "deliveries":
            continue
        epoch = raw.frame.deliveries.epoch
        for delivery in raw.frame.deliveries.deliveries:
            expected = last.get(epoch, delivery.sequence - 1) + 1
            if delivery.sequence != expected:
                problems.append(f"epoch {epoch}: sequence {delivery.sequence} after {expected - 1}")
            last[epoch] = delivery.sequence
    return problems


# ------------------------------------------------------------------ recorded session


@dataclass
class Recorder:
    """Runs the session's steps, turning frames into normalised transcript items."""

    live: LiveServer
    expected: list[dict[str, Any]] | None
    names: Names = field(default_factory=lambda: Names({"turn": rf"turn-{UUID}"}))
    steps: list[dict[str, Any]] = field(default_factory=list)
    links: list[RawLink] = field(default_factory=list)
    link: RawLink | None = None
    _consumed: int = 0

    def open(self, hello: bytes) -> RawLink:
        self.link = RawLink(self.live.channel, auth_metadata("ws1-device"), [hello])
        self.links.append(self.link)
        self._consumed = 0
        return self.link

    def _item(self, raw: RawFrame) -> list[dict[str, Any]]:
        if raw.kind == "deliveries":
            epoch = raw.frame.deliveries.epoch
            return [
                {
                    "epoch": self.names(epoch, "epoch"),
                    "delivery": normalised(readable_of(d), self.names),
                }
                for d in raw.frame.deliveries.deliveries
            ]
        return [normalised(readable_of(raw.frame), self.names)]

    def step(
        self,
        name: str,
        action: Callable[[], object] = lambda: None,
        *,
        heartbeat: bool = False,
        publishers: Callable[[], Any] | None = None,
    ) -> None:
        link = self.link
        assert link is not None
        action()
        want = None
        if self.expected is not None:
            assert len(self.expected) > len(self.steps), f"unexpected step {name}"
            assert self.expected[len(self.steps)]["step"] == name
            want = [i for i in self.expected[len(self.steps)]["frames"] if "heartbeat" not in i]

        def items(frames: list[RawFrame]) -> int:
            return sum(
                len(self._item(f)) for f in frames[self._consumed :] if f.kind != "heartbeat"
            )

        if want is not None:
            reached = link.wait(lambda frames: items(frames) >= len(want))
            assert reached, (name, link.error)
        else:
            link.wait_quiet(1.0)
        if heartbeat:
            start = len(link.frames)
            link.wait(lambda frames: any(f.kind == "heartbeat" for f in frames[start:]))
        new = link.frames[self._consumed :]
        self._consumed = len(link.frames)
        recorded: list[dict[str, Any]] = []
        for raw in new:
            if raw.kind == "heartbeat":
                if heartbeat and not any("heartbeat" in i for i in recorded):
                    recorded.extend(self._item(raw))
                continue
            recorded.extend(self._item(raw))
        entry: dict[str, Any] = {"step": name, "frames": recorded}
        if publishers is not None:
            entry["publishers"] = normalised(readable_of(publishers()), self.names)
        self.steps.append(entry)


@dataclass
class Session:
    """The Host side of the recorded session."""

    host: HostUnderTest
    runtime: ScriptedRuntime
    turn_id: str = ""

    def submit(self) -> None:
        self.turn_id = self.host.send("hello", "c1").turn.turn_id

    def run(self) -> None:
        self.runtime.ack(self.runtime.next_command().command_id)
        report = turn_patch(self.turn_id, RUNNING, occurred_at_unix_ms=1)
        self.runtime.report(WS, "s1", "r-run", report)

    def delta(self, text: str, message_id: str = "msg-1") -> None:
        delta = canonical_pb2.MessageDelta(
            workspace_id=WS,
            session_id="s1",
            turn_id=self.turn_id,
            message_id=message_id,
            target=canonical_pb2.DELTA_TARGET_TEXT,
            operation=canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
            text=text,
        )
        self.runtime.send(
            runtime_pb2.RuntimeLinkRequest(deltas=runtime_pb2.MessageDeltaBatch(deltas=[delta]))
        )

    def ask(self) -> None:
        self.runtime.report(WS, "s1", "r-ask", interaction(self.turn_id, "req-1"))

    def answer_text(self) -> None:
        self.runtime.report(WS, "s1", "r-text", text_message("msg-1", self.turn_id, "Hello"))

    def settle(self) -> None:
        report = turn_patch(
            self.turn_id,
            SETTLED,
            outcome=canonical_pb2.TURN_OUTCOME_COMPLETED,
            occurred_at_unix_ms=2,
        )
        self.runtime.report(WS, "s1", "r-settle", report)

    def delete(self) -> None:
        self.host.stub.DeleteSessions(
            host_pb2.DeleteSessionsRequest(workspace_id=WS, session_ids=["s1"]), metadata=DEVICE
        )

    def restore(self) -> None:
        self.host.stub.RestoreDeletedSession(
            host_pb2.RestoreDeletedSessionRequest(workspace_id=WS, session_id="s1"),
            metadata=DEVICE,
        )


@pytest.fixture
def raw_links() -> Iterator[list[RawLink]]:
    opened: list[RawLink] = []
    yield opened
    for link in opened:
        link.cancel()


def _record(recorder: Recorder, session: Session, live: LiveServer) -> None:
    publishers = livestream_pb2_grpc.DeviceLinkServiceStub(live.channel)

    def list_mine() -> livestream_pb2.ListPublishersResponse:
        """The recorder's publisher, once the acknowledgement sent before was applied."""
        request = livestream_pb2.ListPublishersRequest(device_id="recorder")
        deadline = time.monotonic() + 10
        while True:
            response: livestream_pb2.ListPublishersResponse = publishers.ListPublishers(
                request, metadata=auth_metadata("admin"), timeout=10
            )
            (publisher,) = response.publishers
            if publisher.acked_sequence == acked and publisher.connected:
                return response
            assert time.monotonic() < deadline, response
            time.sleep(0.02)

    link = recorder.open(_hello("recorder"))
    recorder.step("hello")
    first_epoch = link.wait_kind("stream_ready").frame.stream_ready.epoch
    recorder.step("attach an idle Session", lambda: link.send(_attach("screen-1", 1, "s1")))
    recorder.step("submit a Turn", session.submit)
    recorder.step("the runtime starts it", session.run)
    recorder.step("a text delta", lambda: session.delta("Hel"))
    recorder.step("a delta over the safe delivery size", lambda: session.delta("x" * 5000))
    recorder.step("the runtime asks for permission", session.ask)
    recorder.step(
        "attach again following the Turn",
        lambda: link.send(_attach("screen-2", 1, "s1", caller=session.turn_id)),
    )
    recorder.step("the runtime writes its answer", session.answer_text)
    recorder.step("the Turn settles", session.settle)
    recorder.step("detach", lambda: link.send(_detach("screen-2", 2)))
    recorder.step(
        "attach a Session that does not exist", lambda: link.send(_attach("screen-3", 1, "s-404"))
    )
    recorder.step("the Session is deleted", session.delete)
    recorder.step("the Session is restored", session.restore)
    recorder.step("idle", heartbeat=True)
    last = link.deliveries[-1].sequence
    acked = last - 1
    ack = livestream_pb2.ClientHeartbeat(epoch=first_epoch, last_sequence=acked)
    recorder.step(
        "the device acknowledges",
        lambda: link.send(livestream_pb2.DeviceLinkRequest(heartbeat=ack).SerializeToString()),
        publishers=list_mine,
    )
    link.cancel()
    recorder.open(_hello("recorder", (first_epoch, last - 2)))
    recorder.step("resume two deliveries back", publishers=list_mine)
    assert recorder.link is not None
    recorder.link.cancel()
    recorder.open(_hello("recorder", ("0" * 32, 5)))
    recorder.step("resume from an epoch the publisher never had")
    assert recorder.link is not None
    fresh = recorder.link.wait_kind("stream_ready").frame.stream_ready.epoch
    recorder.link.cancel()
    recorder.open(_hello("recorder", (fresh, 99)))
    recorder.step("resume ahead of the publisher")
    assert recorder.link is not None
    recorder.link.cancel()
    recorder.open(_hello("recorder", (first_epoch, last)))
    recorder.step("resume into the first, ended epoch")


@pytest.mark.spec("CON-3", "LIVE-FRAME-1", "LIVE-VAR-1", "LIVE-CTL-1", "LIVE-ATT-1")
@pytest.mark.spec("LIVE-RESUME-1", "LIVE-FENCE-1", "LIVE-FLOW-1", "LIVE-REV-1")
@pytest.mark.timeout(180)
def test_a_real_session_is_the_recorded_transcript_in_the_golden_shapes(
    live_server: Callable[..., LiveServer], migrated_db_url: str
) -> None:
    host = start_host(live_server, migrated_db_url)
    live = start_livestream(
        live_server,
        host.server,
        live_heartbeat_interval_seconds=HEARTBEAT_SECONDS,
        live_safe_delivery_bytes=SAFE_BYTES,
    )
    expected = None if RECORD else json.loads(SESSION_FILE.read_text(encoding="utf-8"))["steps"]
    recorder = Recorder(live, expected)
    try:
        _record(recorder, Session(host, host.runtime()), live)
    finally:
        for link in recorder.links:
            link.cancel()
    if RECORD:
        document = {
            "description": (
                "A device session against real Host and livestream, recorded by "
                "tests/integration/livestream/test_live_contract.py: per step, every frame "
                "after it (heartbeats only in the idle step) as proto3 JSON, with epochs, "
                "generated Turn ids and clocks (*UnixMs) replaced by placeholders. The server "
                "runs with a 300 ms heartbeat and a 4096-byte safe delivery size."
            ),
            "protocolRevision": livestream_pb2.LiveProtocolRevision.Name(CURRENT_REVISION),
            "steps": recorder.steps,
        }
        SESSION_FILE.write_text(
            json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        pytest.skip(f"recorded {SESSION_FILE}")
    assert expected is not None
    for got, want in zip(recorder.steps, expected, strict=True):
        assert got == want, f"step {want['step']!r}"
    shapes = _golden_shapes()
    frames = [raw for link in recorder.links for raw in link.frames]
    problems = [p for raw in frames for p in _check_frame(raw, shapes)]
    for link in recorder.links:
        problems += _contiguous(link.frames)
    assert not problems, problems
    seen: set[str] = {
        d.WhichOneof("kind") or "" for link in recorder.links for d in link.deliveries
    }
    seen |= {raw.kind for raw in frames}
    assert seen >= {
        "deliveries",
        "stream_ready",
        "heartbeat",
        "message_delta",
        "turn_update",
        "interaction_update",
        "discontinuity",
        "attachment_changed",
        "interaction_snapshot",
        "attachment_caught_up",
        "attachment_rejected",
        "resume_rejected",
    }, seen


# ------------------------------------------------------------------- golden requests


@pytest.mark.spec("CON-3", "LIVE-LINK-1", "LIVE-ATT-1", "LIVE-FLOW-1")
def test_the_golden_requests_drive_a_real_server_to_the_golden_deliveries(
    live_server: Callable[..., LiveServer], migrated_db_url: str, raw_links: list[RawLink]
) -> None:
    host = start_host(live_server, migrated_db_url)
    live = start_livestream(live_server, host.server)
    link = RawLink(live.channel, auth_metadata("ws1-device"), [REQUESTS["hello_minimal"].data])
    raw_links.append(link)
    ready = link.wait_kind("stream_ready").frame.stream_ready
    assert not ready.resumed
    assert ready.latest_sequence == 0
    golden = _golden_deliveries("attachment_changed")
    for request, expected in (
        (REQUESTS["attach_with_caller_turn"], golden[0]),
        (REQUESTS["attach"], golden[1]),
        (REQUESTS["detach"], golden[2]),
    ):
        before = len(link.deliveries)
        link.send(request.data)
        link.wait(lambda frames, n=before: len(link.deliveries) > n)  # type: ignore[misc]
        changed = next(
            d for d in link.deliveries[before:] if d.WhichOneof("kind") == "attachment_changed"
        )
        # Exactly the golden delivery, at the sequence this publisher gave it.
        assert changed.SerializeToString() == delivery_bytes(changed.sequence, _body(expected))
    # Heartbeats acknowledge (one of another epoch is ignored, LIVE-FLOW-1).
    for name in ("heartbeat", "heartbeat_before_any_delivery"):
        link.send(REQUESTS[name].data)
    epoch = ready.epoch
    mine = livestream_pb2.ClientHeartbeat(epoch=epoch, last_sequence=2)
    link.send(livestream_pb2.DeviceLinkRequest(heartbeat=mine).SerializeToString())
    stub = livestream_pb2_grpc.DeviceLinkServiceStub(live.channel)

    def acked() -> int:
        response = stub.ListPublishers(
            livestream_pb2.ListPublishersRequest(device_id="phone-1"),
            metadata=auth_metadata("ws1-device"),
            timeout=10,
        )
        return int(response.publishers[0].acked_sequence)

    link.wait(lambda frames: acked() == 2, timeout=10)
    assert link.error is None
    # The resume hellos are accepted too: an unknown epoch starts a fresh one.
    link.cancel()
    for name in ("hello_resume", "hello_two_workspaces_cursor_at_zero"):
        principal = "admin" if "two" in name else "ws1-device"
        again = RawLink(live.channel, auth_metadata(principal), [REQUESTS[name].data])
        raw_links.append(again)
        again.wait_kind("stream_ready")
        first = again.deliveries[0]
        assert first.sequence == 1
        assert first.HasField("resume_rejected")
        assert first.resume_rejected.rejected_cursor == (
            livestream_pb2.DeviceLinkRequest.FromString(REQUESTS[name].data).hello.resume_cursor
        )


# ------------------------------------------------------------------------- refusals


def _status(error: grpc.RpcError) -> tuple[str, str, dict[str, str], set[str]]:
    code, reason, fields = error_details(error)
    metadata: dict[str, str] = {}
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            metadata = dict(info.metadata)
    return code.name, reason, metadata, fields


def _replay(live: LiveServer, refusal: Refusal) -> list[str]:
    """Replay one refusal; what differed from the fixture (nothing, normally)."""
    metadata = () if refusal.principal == "none" else auth_metadata(refusal.principal)
    admin = livestream_pb2_grpc.DeviceLinkServiceStub(live.channel)

    def publishers() -> list[str]:
        response = admin.ListPublishers(
            livestream_pb2.ListPublishersRequest(), metadata=auth_metadata("admin"), timeout=10
        )
        return [json_format.MessageToJson(p) for p in response.publishers]

    before = publishers()
    link = RawLink(live.channel, metadata, refusal.send, timeout=15)
    try:
        error = link.wait_error(timeout=15)
    finally:
        link.cancel()
    code, reason, info, fields = _status(error)
    problems = []
    if code != refusal.code:
        problems.append(f"code {code}, expected {refusal.code}: {error.details()}")
    if refusal.reason is not None and reason != refusal.reason:
        problems.append(f"reason {reason!r}, expected {refusal.reason!r}")
    if refusal.metadata is not None and info != refusal.metadata:
        problems.append(f"ErrorInfo metadata {info}, expected {refusal.metadata}")
    if fields != set(refusal.fields):
        problems.append(f"field violations {sorted(fields)}, expected {sorted(refusal.fields)}")
    if len(refusal.send) == 1 and publishers() != before:
        problems.append("a refused hello changed the publishers")
    if any(f.kind == "deliveries" for f in link.frames) and len(refusal.send) == 1:
        problems.append("a refused hello was sent deliveries")
    return [f"{refusal.name}: {p}" for p in problems]


@pytest.fixture
def refusal_host(live_server: Callable[..., LiveServer], migrated_db_url: str) -> HostUnderTest:
    return start_host(live_server, migrated_db_url)


@pytest.mark.spec("CON-3", "CON-5", "LIVE-REV-1", "LIVE-LINK-1", "LIVE-ATT-1", "SEC-1", "SEC-4")
@pytest.mark.timeout(300)
def test_every_typed_refusal_replays_as_the_fixture_says(
    live_server: Callable[..., LiveServer], refusal_host: HostUnderTest
) -> None:
    problems: list[str] = []
    replayed = 0
    for refusal in REFUSALS:
        # A fresh livestream per case: binding revisions and publishers start empty.
        live = start_livestream(live_server, refusal_host.server)
        problems += _replay(live, refusal)
        replayed += 1
        live.channel.close()
        live.stop()
    assert replayed >= 30
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------ scripted Host source


class WithOutages(ScriptedSource):
    """A scripted Host whose baselines of the Sessions in ``unavailable`` cannot be read."""

    def __init__(self) -> None:
        super().__init__()
        self.unavailable: set[str] = set()

    async def read_baseline(self, workspace_id: str, session_id: str) -> Baseline:
        if session_id in self.unavailable:
            raise SourceUnavailable("scripted outage")
        return await super().read_baseline(workspace_id, session_id)


def _bodies(deliveries: list[Delivery]) -> list[bytes]:
    return [_body(d) for d in deliveries]


@pytest.mark.spec("CON-3", "LIVE-FRAME-1", "LIVE-UP-1", "LIVE-ATT-1", "LIVE-RESUME-1")
def test_a_server_fed_by_a_scripted_host_writes_the_golden_bodies_byte_for_byte(
    live_server: Callable[..., LiveServer], raw_links: list[RawLink]
) -> None:
    source = WithOutages()
    live = live_server(
        "livestream",
        build=source.build,
        live_safe_delivery_bytes=SAFE_BYTES,
        live_upstream_retry_seconds=0.05,
    )
    link = RawLink(live.channel, auth_metadata("ws1-device"), [_hello("scripted")])
    raw_links.append(link)
    link.wait_kind("stream_ready")
    shapes = _golden_shapes()

    def deliveries_after(action: Callable[[], object], count: int) -> list[Delivery]:
        before = len(link.deliveries)
        action()
        assert link.wait(lambda frames: len(link.deliveries) >= before + count)
        return link.deliveries[before:]

    # The live variants, one event at a time (no coalescing across them).
    for name in ("message_delta", "turn_update", "interaction_update"):
        golden = _golden_deliveries(name)
        got: list[Delivery] = []
        for delivery in golden:
            event = _event_for(delivery)
            got += deliveries_after(lambda e=event: source.push(e), 1)  # type: ignore[misc]
        assert _bodies(got) == _bodies(golden), name
    # An upstream drop: the workspace-wide discontinuity of the golden frame.
    golden_reasons = {d.discontinuity.reason: d for d in _golden_deliveries("discontinuity")}
    resubscribed = golden_reasons[livestream_pb2.DISCONTINUITY_REASON_UPSTREAM_RESUBSCRIBED]
    (got_resubscribed,) = deliveries_after(source.drop, 1)
    assert _body(got_resubscribed) == _body(resubscribed)
    source.wait_watches(2)
    # Attachments with a baseline: changed, one turn_update per Turn, snapshot, barrier.
    snapshot = _golden_deliveries("interaction_snapshot")[0].interaction_snapshot
    caught_up = _golden_deliveries("attachment_caught_up")[0].attachment_caught_up
    turns = [
        d.turn_update.turn
        for d in _golden_deliveries("turn_update")
        if d.turn_update.turn.turn_id in caught_up.canonical_turn_ids
    ]
    source.baselines[("ws-1", "s1")] = Baseline(
        session=canonical_pb2.Session(
            workspace_id="ws-1", session_id="s1", active_turn_id="turn-1"
        ),
        turns=turns,
        root_turn_id=snapshot.root_turn_id,
        interactions=list(snapshot.interactions),
    )
    attach = _attach("screen-1", 1, "s1", caller="turn-1")
    got = deliveries_after(lambda: link.send(attach), 2 + len(turns) + 1)
    changed = _golden_deliveries("attachment_changed")[0]
    assert _body(got[0]) == _body(changed)
    assert [d.WhichOneof("kind") for d in got] == [
        "attachment_changed",
        *["turn_update"] * len(turns),
        "interaction_snapshot",
        "attachment_caught_up",
    ]
    assert _body(got[-2]) == _body(_golden_deliveries("interaction_snapshot")[0])
    assert _body(got[-1]) == _body(_golden_deliveries("attachment_caught_up")[0])
    # Attach revisions ended without a baseline, for each reason.
    rejected = {d.attachment_rejected.reason: d for d in _golden_deliveries("attachment_rejected")}
    got = deliveries_after(lambda: link.send(_attach("screen-4", 1, "no-such-session")), 2)
    assert _body(got[1]) == _body(
        rejected[livestream_pb2.ATTACHMENT_REJECTED_REASON_SESSION_NOT_FOUND]
    )
    source.unavailable.add("s1")
    got = deliveries_after(lambda: link.send(_attach("screen-1", 3, "s1")), 2)
    assert _body(got[1]) == _body(
        rejected[livestream_pb2.ATTACHMENT_REJECTED_REASON_HOST_UNAVAILABLE]
    )
    # An expired Host cursor ends the epoch in band: resume_rejected EPOCH_ENDED first.
    old_epoch = link.frames[-1].frame.deliveries.epoch
    old_last = link.deliveries[-1].sequence
    source.expire()
    ended = link.wait(
        lambda frames: any(d.HasField("resume_rejected") for d in link.deliveries[old_last:])
    )
    assert ended
    new = next(d for d in link.deliveries if d.HasField("resume_rejected"))
    assert new.sequence == 1
    assert new.resume_rejected == livestream_pb2.ResumeRejected(
        reason=livestream_pb2.RESUME_REJECTED_REASON_EPOCH_ENDED,
        rejected_cursor=livestream_pb2.ResumeCursor(epoch=old_epoch, last_sequence=old_last),
    )
    problems = [p for raw in link.frames for p in _check_frame(raw, shapes)]
    assert not problems, problems


def _event_for(delivery: Delivery) -> Any:
    kind = delivery.WhichOneof("kind")
    if kind == "message_delta":
        d = delivery.message_delta
        return delta_event(
            d.text,
            turn_id=d.turn_id,
            message_id=d.message_id,
            target=d.target,
            operation=d.operation,
            offset=d.offset_bytes if d.HasField("offset_bytes") else None,
        )
    if kind == "turn_update":
        event = turn_event(1, delivery.turn_update.turn.turn_id)
        event.turn_update.turn.CopyFrom(delivery.turn_update.turn)
        event.turn_update.ClearField("active_turn_id")
        if delivery.turn_update.HasField("active_turn_id"):
            event.turn_update.active_turn_id = delivery.turn_update.active_turn_id
        return event
    from agentactivity.host.v1 import activity_pb2

    return activity_pb2.ActivityEvent(
        event_id=1,
        workspace_id="ws-1",
        interaction_update=activity_pb2.InteractionUpdateEvent(
            interaction=delivery.interaction_update
        ),
    )
