"""A Host model behind livestream's ``ActivitySource``, for the torture test.

Unlike :class:`~tests.integration.livestream.scripted_source.ScriptedSource` (events pushed
one by one), this model *is* a small Host: it keeps canonical Sessions, Turns and Messages,
a durable event log replayed after a cursor, an ephemeral delta lane, and it lets the test
inject upstream drops and cursor expiries at any moment while a producer writes to it from
another thread. Its semantics follow HOST-OBS-2:

* ``watch(after_event_id)`` registers the subscription after a short, random latency (the
  RPC round trip to a real Host), then yields the ready marker carrying the head, then the
  durable events after the cursor, then live items in commit order;
* ``watch(None)`` starts at the head: what committed before the registration is not sent;
* a delta reaches only the subscriptions registered when it is published (it is never
  replayed), a durable event reaches them too and stays in the log;
* a cursor ahead of the head, or one the test declared expired, fails ``CursorExpired``.

Every mutation runs under one lock, so a Host read (a baseline, or the application's
reconcile read) is a consistent snapshot, and an event is either in a subscription's replay
or in its live queue, never both and never neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import activity_pb2
from services.livestream.source import (
    Baseline,
    CursorExpired,
    SessionNotFound,
    SourceUnavailable,
    WatchItem,
)

__all__ = ["ModelHost", "SessionView"]

WS = "ws-1"
_DROP = object()
_EXPIRE = object()
RUNNING = canonical_pb2.TURN_PHASE_RUNNING
QUEUED = canonical_pb2.TURN_PHASE_QUEUED
SETTLED = canonical_pb2.TURN_PHASE_SETTLED


@dataclass(frozen=True)
class SessionView:
    """What an application reads of one Session from Host (its reconcile read)."""

    session_id: str
    turns: dict[str, tuple[int, int]]
    """Turn id -> (version, phase), in creation order."""
    messages: dict[str, str]
    """Message id -> the text of its durable payload."""
    active_turn_id: str | None = None


@dataclass
class _Session:
    session_id: str
    turns: dict[str, canonical_pb2.Turn] = field(default_factory=dict)
    messages: dict[str, canonical_pb2.Message] = field(default_factory=dict)
    message_version: int = 0
    active_turn_id: str | None = None


@dataclass
class _Subscription:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any]

    def put(self, item: object) -> None:
        with contextlib.suppress(RuntimeError):  # the server's loop is closed (teardown)
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class ModelHost:
    """See the module docstring. Producer methods are called from any thread."""

    def __init__(
        self,
        rng: random.Random,
        *,
        subscribe_latency_seconds: float = 0.03,
        read_latency_seconds: float = 0.03,
    ) -> None:
        self._rng = rng
        self._rng_lock = threading.Lock()
        self._subscribe_latency = subscribe_latency_seconds
        self._read_latency = read_latency_seconds
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.RLock()
        self._log: list[activity_pb2.ActivityEvent] = []
        self._subs: list[_Subscription] = []
        self._sessions: dict[str, _Session] = {}
        self._expire_next_watch = False
        self.history: dict[str, list[int]] = {}
        """Turn id -> every version Host committed, in order."""
        self.watches: list[int | None] = []
        """The cursor of every registered or refused ``watch``."""
        self.drops = 0
        self.expiries = 0
        self.timeline: list[tuple[float, str]] = []
        """(``time.monotonic()``, what happened): registrations, faults, commits."""

    # ---- ActivitySource ----------------------------------------------------------------

    def _latency(self, bound: float) -> float:
        with self._rng_lock:
            return self._rng.uniform(0, bound)

    async def watch(
        self, workspace_id: str, after_event_id: int | None
    ) -> AsyncIterator[WatchItem]:
        if self._subscribe_latency:
            await asyncio.sleep(self._latency(self._subscribe_latency))  # the RPC round trip
        while not self._open.is_set():  # noqa: ASYNC110 - released from the test thread
            await asyncio.sleep(0.005)
        sub = _Subscription(asyncio.get_running_loop(), asyncio.Queue())
        with self._lock:
            head = len(self._log)
            self.watches.append(after_event_id)
            if after_event_id is not None and (self._expire_next_watch or after_event_id > head):
                self._expire_next_watch = False
                self.timeline.append((time.monotonic(), f"refused cursor {after_event_id}"))
                raise CursorExpired(f"cursor {after_event_id} expired (model)")
            replay = list(self._log[after_event_id:]) if after_event_id is not None else []
            self._subs.append(sub)
            self.timeline.append((time.monotonic(), f"registered after {after_event_id} at {head}"))
        try:
            yield activity_pb2.ActivityStreamReady(workspace_id=workspace_id, head_event_id=head)
            for event in replay:
                yield event
            while True:
                item = await sub.queue.get()
                if item is _DROP:
                    raise SourceUnavailable("model drop")
                if item is _EXPIRE:
                    raise CursorExpired("model expiry")
                for event in item:
                    yield event
        finally:
            with self._lock:
                if sub in self._subs:
                    self._subs.remove(sub)

    async def read_baseline(self, workspace_id: str, session_id: str) -> Baseline:
        if self._read_latency:
            await asyncio.sleep(self._latency(self._read_latency))  # GetSession + List*
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or workspace_id != WS:
                raise SessionNotFound(session_id)
            proto = canonical_pb2.Session(workspace_id=WS, session_id=session_id)
            if session.active_turn_id is not None:
                proto.active_turn_id = session.active_turn_id
            turns = [_copy(t) for t in session.turns.values()]
            return Baseline(proto, turns, session.active_turn_id, ())

    async def close(self) -> None:
        return None

    # ---- upstream faults ---------------------------------------------------------------

    def drop(self) -> None:
        """End every subscription as a transport loss (the feed resubscribes from its cursor)."""
        with self._lock:
            self.drops += 1
            self.timeline.append((time.monotonic(), f"drop of {len(self._subs)}"))
            for sub in self._subs:
                sub.put(_DROP)
            self._subs.clear()

    def expire(self) -> None:
        """End every subscription with an expired cursor (LIVE-UP-1: epochs end)."""
        with self._lock:
            self.expiries += 1
            self.timeline.append((time.monotonic(), f"expiry of {len(self._subs)}"))
            for sub in self._subs:
                sub.put(_EXPIRE)
            self._subs.clear()

    def drop_then_expire(self) -> None:
        """Drop, and refuse the resubscription's cursor as expired."""
        with self._lock:
            self._expire_next_watch = True
            self.drop()

    def hold_subscriptions(self) -> None:
        """New ``watch`` calls wait before registering until :meth:`release_subscriptions`
        (a slow Host)."""
        self._open.clear()

    def release_subscriptions(self) -> None:
        self._open.set()

    @property
    def subscriptions(self) -> int:
        """How many ``watch`` subscriptions are registered now."""
        with self._lock:
            return len(self._subs)

    # ---- canonical reads ---------------------------------------------------------------

    def read_session(self, session_id: str) -> SessionView:
        """A consistent read of one Session (what GetSession/List* would return)."""
        with self._lock:
            session = self._sessions[session_id]
            return SessionView(
                session_id,
                {t.turn_id: (t.version, int(t.phase)) for t in session.turns.values()},
                {
                    m.message_id: json.loads(m.payload_json)["text"]
                    for m in session.messages.values()
                },
                session.active_turn_id,
            )

    # ---- producer ----------------------------------------------------------------------

    def create_session(self, session_id: str) -> None:
        with self._lock:
            self._sessions[session_id] = _Session(session_id)

    def start_turn(self, session_id: str, turn_id: str) -> None:
        """A Turn is created (queued) and starts running: two commits."""
        with self._lock:
            session = self._sessions[session_id]
            turn = canonical_pb2.Turn(
                workspace_id=WS, session_id=session_id, turn_id=turn_id, phase=QUEUED, version=1
            )
            session.turns[turn_id] = turn
            session.active_turn_id = turn_id
            self._commit([self._turn_event(turn, turn_id)])
            turn.phase, turn.version = RUNNING, 2
            self._commit([self._turn_event(turn, turn_id)])

    def deltas(self, deltas: Sequence[canonical_pb2.MessageDelta]) -> None:
        """Publish deltas on the live lane, read together (they may coalesce)."""
        events = tuple(
            activity_pb2.ActivityEvent(
                workspace_id=WS, message_delta=activity_pb2.MessageDeltaEvent(delta=d)
            )
            for d in deltas
        )
        with self._lock:
            for sub in self._subs:
                sub.put(events)

    def snapshot_message(self, session_id: str, turn_id: str, message_id: str, text: str) -> None:
        """A durable message snapshot (``message_update``)."""
        with self._lock:
            session = self._sessions[session_id]
            session.message_version += 1
            message = canonical_pb2.Message(
                workspace_id=WS,
                session_id=session_id,
                message_id=message_id,
                sequence=len(session.messages) + 1,
                version=session.message_version,
                turn_id=turn_id,
                role=canonical_pb2.MESSAGE_ROLE_ASSISTANT,
                kind=canonical_pb2.MESSAGE_KIND_TEXT,
                payload_json=json.dumps({"text": text}),
            )
            session.messages[message_id] = message
            update = activity_pb2.MessageUpdateEvent(
                session_id=session_id,
                messages=[message],
                message_count=len(session.messages),
                latest_message_version=session.message_version,
            )
            self._commit([activity_pb2.ActivityEvent(workspace_id=WS, message_update=update)])

    def settle(self, session_id: str, turn_id: str) -> None:
        with self._lock:
            session = self._sessions[session_id]
            turn = session.turns[turn_id]
            turn.phase = SETTLED
            turn.outcome = canonical_pb2.TURN_OUTCOME_COMPLETED
            turn.version += 1
            session.active_turn_id = None
            self._commit([self._turn_event(turn, None)])

    # ---- internals ---------------------------------------------------------------------

    def _turn_event(
        self, turn: canonical_pb2.Turn, active_turn_id: str | None
    ) -> activity_pb2.ActivityEvent:
        self.history.setdefault(turn.turn_id, []).append(turn.version)
        update = activity_pb2.TurnUpdateEvent(turn=_copy(turn))
        if active_turn_id is not None:
            update.active_turn_id = active_turn_id
        return activity_pb2.ActivityEvent(workspace_id=WS, turn_update=update)

    def _commit(self, events: list[activity_pb2.ActivityEvent]) -> None:
        for event in events:
            event.event_id = len(self._log) + 1
            self._log.append(event)
        batch = tuple(events)
        self.timeline.append(
            (time.monotonic(), f"commit {events[-1].event_id} to {len(self._subs)}")
        )
        for sub in self._subs:
            sub.put(batch)


def _copy(turn: canonical_pb2.Turn) -> canonical_pb2.Turn:
    copy = canonical_pb2.Turn()
    copy.CopyFrom(turn)
    return copy
