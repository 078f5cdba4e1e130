"""The producer side of the livestream torture test: a real Host driven by a scripted
runtime, or the :class:`~tests.integration.livestream.torture_model.ModelHost`.

Both offer the same small surface (:class:`World`): create Sessions, start and settle Turns,
stream text deltas, snapshot messages, read a Session back as an application would, and
report every version Host committed for a Turn. :func:`produce` drives a world with a
seeded plan and records what was sent in a :class:`SentLog` (the torture test's oracle).
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, runtime_pb2
from tests.integration.host_activity import DEVICE, TARGET_ID, HostUnderTest
from tests.integration.livestream.torture_model import ModelHost, SessionView
from tests.support.activity_watch import Watcher
from tests.support.runtime_client import ScriptedRuntime, text_message, turn_patch

__all__ = [
    "HostWorld",
    "ModelWorld",
    "Plan",
    "SentLog",
    "SentMessage",
    "SessionView",
    "World",
    "delta_text",
    "produce",
]

WS = "ws-1"
SET = canonical_pb2.DELTA_OPERATION_SET
APPEND = canonical_pb2.DELTA_OPERATION_APPEND_TEXT
RUNNING = canonical_pb2.TURN_PHASE_RUNNING
SETTLED = canonical_pb2.TURN_PHASE_SETTLED
APPLIED = runtime_pb2.REPORT_OUTCOME_APPLIED


def delta_text(message_id: str, index: int) -> str:
    """The recognisable text of delta ``index`` (1-based) of a message."""
    return f"{message_id}#{index};"


class World(Protocol):
    """What the torture test needs of a Host (real or modelled)."""

    target: str
    """The livestream server's address."""

    def create_session(self, session_id: str) -> None: ...

    def start_turn(self, session_id: str) -> str:
        """Create a Turn and report it running; returns its id."""
        ...

    def send_deltas(self, deltas: list[canonical_pb2.MessageDelta]) -> None: ...

    def snapshot(self, session_id: str, turn_id: str, message_id: str, text: str) -> None: ...

    def settle(self, session_id: str, turn_id: str) -> None: ...

    def read_session(self, session_id: str, *, turns: bool = True) -> SessionView:
        """Host's canonical Session (``turns=False``: its messages only)."""
        ...

    def turn_history(self, turn_ids: set[str]) -> dict[str, list[int]]:
        """Every version Host committed for these Turns, in order."""
        ...

    def begin_iteration(self) -> None: ...

    def end_iteration(self) -> None: ...


# ---- the oracle ----------------------------------------------------------------------


@dataclass
class SentMessage:
    """One streamed message: its deltas in send order and its durable snapshot, if any."""

    session_id: str
    turn_id: str
    sent_at: list[float] = field(default_factory=list)
    """``time.monotonic()`` just before delta ``i + 1`` was sent."""
    snapshot: str | None = None


@dataclass
class SentLog:
    """What the producer did, for the checker."""

    messages: dict[str, SentMessage] = field(default_factory=dict)
    turns: dict[str, tuple[str, float]] = field(default_factory=dict)
    """Turn id -> (Session, ``time.monotonic()`` before its creation was requested)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def turn_started(self, session_id: str, turn_id: str, at: float) -> None:
        with self._lock:
            self.turns[turn_id] = (session_id, at)


@dataclass(frozen=True)
class Plan:
    """The shape of one iteration's production."""

    sessions: tuple[str, ...]
    turns_per_session: tuple[int, ...]
    max_messages: int = 3
    max_deltas: int = 40
    snapshot_probability: float = 0.7
    max_batch: int = 4
    max_pause_seconds: float = 0.004

    @staticmethod
    def random(rng: random.Random, prefix: str, *, sessions: int, turns: int) -> Plan:
        names = tuple(f"{prefix}-s{k}" for k in range(1, sessions + 1))
        return Plan(names, tuple(rng.randint(1, turns) for _ in names))


@dataclass
class _Stream:
    message_id: str
    total: int
    sent: int = 0


@dataclass
class _SessionWork:
    session_id: str
    turns_left: int
    turn_id: str | None = None
    streams: list[_Stream] = field(default_factory=list)
    finished: list[_Stream] = field(default_factory=list)
    turn_number: int = 0


def produce(
    world: World,
    plan: Plan,
    rng: random.Random,
    sent: SentLog,
    *,
    on_step: Callable[[], None] | None = None,
) -> None:
    """Run ``plan`` on ``world``: Sessions stream interleaved, each Turn streams several
    messages interleaved (first delta ``set``, then ``append_text``), most messages get a
    durable snapshot whose text differs from the streamed one (only a Host read yields it),
    and every Turn settles."""
    work = [_SessionWork(s, n) for s, n in zip(plan.sessions, plan.turns_per_session, strict=True)]
    while True:
        active = [w for w in work if w.turns_left > 0 or w.turn_id is not None]
        if not active:
            return
        item = rng.choice(active)
        _step(world, plan, rng, sent, item)
        if on_step is not None:
            on_step()
        if plan.max_pause_seconds:
            time.sleep(rng.uniform(0, plan.max_pause_seconds))


def _step(world: World, plan: Plan, rng: random.Random, sent: SentLog, w: _SessionWork) -> None:
    if w.turn_id is None:
        w.turn_number += 1
        w.turns_left -= 1
        at = time.monotonic()
        w.turn_id = world.start_turn(w.session_id)
        sent.turn_started(w.session_id, w.turn_id, at)
        prefix = f"{w.session_id}t{w.turn_number}"
        w.streams = [
            _Stream(f"{prefix}m{j}", rng.randint(1, plan.max_deltas))
            for j in range(1, rng.randint(1, plan.max_messages) + 1)
        ]
        for stream in w.streams:
            sent.messages[stream.message_id] = SentMessage(w.session_id, w.turn_id)
        return
    turn_id = w.turn_id
    if w.streams:
        stream = rng.choice(w.streams)
        record = sent.messages[stream.message_id]
        count = min(rng.randint(1, plan.max_batch), stream.total - stream.sent)
        deltas = []
        for _ in range(count):
            stream.sent += 1
            deltas.append(
                canonical_pb2.MessageDelta(
                    workspace_id=WS,
                    session_id=w.session_id,
                    turn_id=turn_id,
                    message_id=stream.message_id,
                    target=canonical_pb2.DELTA_TARGET_TEXT,
                    operation=SET if stream.sent == 1 else APPEND,
                    text=delta_text(stream.message_id, stream.sent),
                )
            )
            record.sent_at.append(time.monotonic())
        world.send_deltas(deltas)
        if stream.sent == stream.total:
            w.streams.remove(stream)
            if rng.random() < plan.snapshot_probability:
                streamed = (delta_text(stream.message_id, i) for i in range(1, stream.total + 1))
                text = "".join(streamed) + "|final"
                world.snapshot(w.session_id, turn_id, stream.message_id, text)
                record.snapshot = text
        return
    world.settle(w.session_id, turn_id)
    w.turn_id = None


# ---- a real Host ---------------------------------------------------------------------


class HostWorld:
    """A real Host (one scripted runtime serves every Session) and its livestream server."""

    def __init__(self, host: HostUnderTest, target: str) -> None:
        self.host = host
        self.target = target
        self.runtime: ScriptedRuntime = host.runtime()
        self._watcher: Watcher | None = None
        self._reports = 0

    def begin_iteration(self) -> None:
        # The reference: every Turn version Host commits during the iteration.
        self._watcher = Watcher(self.host.server.channel, WS)
        self._watcher.wait_ready()

    def end_iteration(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    def create_session(self, session_id: str) -> None:
        self.host.stub.CreateSession(
            host_pb2.CreateSessionRequest(
                workspace_id=WS,
                agent_target_id=TARGET_ID,
                session_id=session_id,
                title=f"torture {session_id}",
                cwd="/nonexistent/workspace",
            ),
            metadata=DEVICE,
        )

    def _report(self, session_id: str, *items: runtime_pb2.ReportItem) -> None:
        self._reports += 1
        result = self.runtime.report(WS, session_id, f"torture-{uuid.uuid4().hex}", *items)
        assert result.outcome == APPLIED, result

    def start_turn(self, session_id: str) -> str:
        response = self.host.send("torture", uuid.uuid4().hex, session_id=session_id)
        turn_id = response.turn.turn_id
        while True:
            command = self.runtime.next_command()
            self.runtime.ack(command.command_id)
            if command.WhichOneof("command") == "start_turn" and (
                command.start_turn.turn_id == turn_id
            ):
                break
        now = int(time.time() * 1000)
        self._report(session_id, turn_patch(turn_id, RUNNING, occurred_at_unix_ms=now))
        return turn_id

    def send_deltas(self, deltas: list[canonical_pb2.MessageDelta]) -> None:
        self.runtime.send(
            runtime_pb2.RuntimeLinkRequest(deltas=runtime_pb2.MessageDeltaBatch(deltas=deltas))
        )

    def snapshot(self, session_id: str, turn_id: str, message_id: str, text: str) -> None:
        self._report(session_id, text_message(message_id, turn_id, text))

    def settle(self, session_id: str, turn_id: str) -> None:
        self._report(
            session_id,
            turn_patch(
                turn_id,
                SETTLED,
                outcome=canonical_pb2.TURN_OUTCOME_COMPLETED,
                occurred_at_unix_ms=int(time.time() * 1000),
            ),
        )

    def read_session(self, session_id: str, *, turns: bool = True) -> SessionView:
        stub = self.host.stub
        ordered: dict[str, tuple[int, int]] = {}
        active: str | None = None
        if turns:
            detail = stub.GetSession(
                host_pb2.GetSessionRequest(workspace_id=WS, session_id=session_id),
                metadata=DEVICE,
            )
            if detail.session.HasField("active_turn_id"):
                active = detail.session.active_turn_id
            cursor = ""
            while True:
                page = stub.ListSessionTurns(
                    host_pb2.ListSessionTurnsRequest(
                        workspace_id=WS, session_id=session_id, cursor=cursor, limit=1000
                    ),
                    metadata=DEVICE,
                )
                for turn in page.turns:
                    ordered[turn.turn_id] = (turn.version, int(turn.phase))
                cursor = page.next_cursor
                if not cursor:
                    break
        messages: dict[str, str] = {}
        after = 0
        while True:
            listing = stub.ListSessionMessages(
                host_pb2.ListSessionMessagesRequest(
                    workspace_id=WS, session_id=session_id, after_version=after, limit=1000
                ),
                metadata=DEVICE,
            )
            for message in listing.messages:
                messages[message.message_id] = str(json.loads(message.payload_json)["text"])
                after = max(after, message.version)
            if not listing.has_more:
                break
        return SessionView(session_id, ordered, messages, active)

    def turn_history(self, turn_ids: set[str]) -> dict[str, list[int]]:
        assert self._watcher is not None

        def complete(events: list[object]) -> bool:
            seen = {
                e.turn_update.turn.turn_id  # type: ignore[attr-defined]
                for e in events
                if e.WhichOneof("event") == "turn_update"  # type: ignore[attr-defined]
                and e.turn_update.turn.phase == SETTLED  # type: ignore[attr-defined]
            }
            return turn_ids <= seen

        events = self._watcher.wait_for(complete)  # type: ignore[arg-type]
        history: dict[str, list[int]] = {}
        for event in events:
            if event.WhichOneof("event") == "turn_update":
                turn = event.turn_update.turn
                if turn.turn_id in turn_ids:
                    history.setdefault(turn.turn_id, []).append(turn.version)
        return history


# ---- the model -----------------------------------------------------------------------


class ModelWorld:
    """The :class:`ModelHost` (livestream reads it in-process) with injected upstream faults."""

    def __init__(self, model: ModelHost, target: str) -> None:
        self.model = model
        self.target = target
        self._turns = 0

    def begin_iteration(self) -> None:
        return None

    def end_iteration(self) -> None:
        return None

    def create_session(self, session_id: str) -> None:
        self.model.create_session(session_id)

    def start_turn(self, session_id: str) -> str:
        self._turns += 1
        turn_id = f"{session_id}-turn{self._turns}"
        self.model.start_turn(session_id, turn_id)
        return turn_id

    def send_deltas(self, deltas: list[canonical_pb2.MessageDelta]) -> None:
        self.model.deltas(deltas)

    def snapshot(self, session_id: str, turn_id: str, message_id: str, text: str) -> None:
        self.model.snapshot_message(session_id, turn_id, message_id, text)

    def settle(self, session_id: str, turn_id: str) -> None:
        self.model.settle(session_id, turn_id)

    def read_session(self, session_id: str, *, turns: bool = True) -> SessionView:
        view = self.model.read_session(session_id)
        if turns:
            return view
        return SessionView(session_id, {}, view.messages, None)

    def turn_history(self, turn_ids: set[str]) -> dict[str, list[int]]:
        return {t: list(self.model.history.get(t, [])) for t in turn_ids}
