"""The application side of the livestream torture test: a device app on a real
:class:`~services.livestream.subscriber.Subscriber`, with seeded chaos.

A :class:`TortureApp` does what the Subscriber's documentation asks of an application: it
applies every :class:`Delivered`, rereads Host for the keys of every :class:`Reconcile`
(the whole workspace once its first call is ready: a fresh app starts from Host), and keeps
a projection (Turn id -> latest version and phase, message id -> text). Its seeded chaos cuts
the link after a random number of deliveries, right after ``stream_ready``, right after an
``attachment_changed`` (mid-baseline), while a resumed call is still replaying, and at
random moments; it also restarts the Subscriber from its persisted state (a graceful close,
the queued events drained first), re-attaches bindings with new revisions or to another
Session, and pauses (a slow application: backpressure, then the server's slow-consumer
close).

Every application-visible event is appended to :attr:`TortureApp.log`, with the rereads
between them, for :mod:`tests.integration.livestream.torture_check`.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from services.livestream.subscriber import (
    AttachmentStarted,
    Backoff,
    Connecting,
    Delivered,
    DeviceState,
    MemoryStateStore,
    Ready,
    Reconcile,
    ReconcileKey,
    Reconnecting,
    ResumeRejected,
    Subscriber,
    Terminated,
)
from tests.integration.livestream.torture_worlds import SETTLED, SessionView, World
from tests.support.servers import token_for

__all__ = ["AppConfig", "Entry", "Reread", "SlowStore", "TortureApp"]

WS = "ws-1"
SET = 1  # DELTA_OPERATION_SET
CLOSE_SECONDS = 2.0
"""A Subscriber.close() that takes longer is stuck (a violation)."""


@dataclass(frozen=True)
class AppConfig:
    """One app's seeded behaviour."""

    start_delay: float = 0.0
    queue_limit: int = 10_000
    backoff: Backoff = field(default_factory=lambda: Backoff(initial_s=0.01, max_s=0.1))
    max_gap: int = 40
    """Deliveries between two chaos actions are drawn from ``1..max_gap``."""
    weights: tuple[tuple[str, float], ...] = (
        ("drop", 6.0),
        ("restart", 1.0),
        ("reattach", 1.0),
        ("switch", 0.5),
        ("pause", 1.0),
    )
    p_drop_on_ready: float = 0.3
    p_drop_on_attach: float = 0.3
    p_drop_in_replay: float = 0.3
    timer_mean_seconds: float = 0.25
    max_pause_seconds: float = 0.25
    save_seconds: float = 0.0
    """How long each save of the device state takes (a phone's flash storage)."""

    @staticmethod
    def random(rng: random.Random, start_delay: float) -> AppConfig:
        return AppConfig(
            start_delay=start_delay,
            queue_limit=rng.choice([8, 64, 10_000]),
            backoff=rng.choice(
                [
                    Backoff(initial_s=0.005, max_s=0.02),
                    Backoff(initial_s=0.02, max_s=0.1),
                    Backoff(initial_s=0.15, max_s=0.3),
                    Backoff(initial_s=0.4, max_s=0.8),
                ]
            ),
            max_gap=rng.choice([3, 15, 60]),
            p_drop_on_ready=rng.choice([0.0, 0.3, 0.8]),
            p_drop_on_attach=rng.choice([0.0, 0.3, 0.8]),
            p_drop_in_replay=rng.choice([0.0, 0.3, 0.8]),
            timer_mean_seconds=rng.choice([0.05, 0.25, 1.0]),
            save_seconds=rng.choice([0.0, 0.0, 0.002]),
        )


class SlowStore(MemoryStateStore):
    """A :class:`MemoryStateStore` whose saves take ``seconds`` (they run in a thread)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def save(self, state: DeviceState) -> None:
        if self.seconds:
            time.sleep(self.seconds)
        super().save(state)


@dataclass(frozen=True)
class Reread:
    """The app read Host because of a Reconcile (or at start, ``reason="initial"``)."""

    reason: str
    keys: tuple[ReconcileKey, ...]
    turns_read: frozenset[str]
    """Sessions whose Turns were read (message-scoped keys read only messages)."""
    views: dict[str, SessionView]


@dataclass(frozen=True)
class Restarted:
    """The app closed its Subscriber and starts a new one on the same store."""

    run: int


@dataclass(frozen=True)
class Entry:
    """One application-visible event, in the order the application saw it."""

    index: int
    at: float
    run: int
    token: int
    """Epoch token: grows at every fresh connect and every ``resume_rejected``."""
    event: Any


@dataclass
class TortureApp:
    name: str
    device_id: str
    world: World
    sessions: tuple[str, ...]
    """Every Session of the iteration (a workspace-wide reread reads them all)."""
    sentinel_session: str
    bindings: dict[str, str]
    """Binding id -> the Session the application wants it attached to (now)."""
    attachable: tuple[str, ...]
    """Sessions a binding may switch to."""
    rng: random.Random
    config: AppConfig
    chaos: threading.Event
    stop: threading.Event
    store: SlowStore = field(default_factory=lambda: SlowStore(0.0))
    log: list[Entry] = field(default_factory=list)
    turns: dict[str, tuple[int, int]] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    canonical: set[str] = field(default_factory=set)
    """Messages whose text came from Host (deltas no longer apply to them)."""
    first_ready_at: float | None = None
    actions: dict[str, int] = field(default_factory=dict)
    final_state: DeviceState | None = None
    failure: BaseException | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _sentinels: set[str] = field(default_factory=set)
    _caught_up: bool = False
    _connected: bool = False
    _run: int = 0
    _token: int = 0
    _countdown: int = 0
    _before_ready: bool = False
    _closing: bool = False
    _restart: bool = False
    _closes: dict[int, asyncio.Future[None]] = field(default_factory=dict)

    # ---- what the test thread reads ------------------------------------------------------

    def saw_sentinel(self, turn_id: str) -> bool:
        with self._lock:
            return turn_id in self._sentinels

    @property
    def connected(self) -> bool:
        """The app's current call is ready (as of the last event it read)."""
        with self._lock:
            return self._connected

    @property
    def caught_up(self) -> bool:
        """Every desired binding is caught up at its latest revision (as of the last event)."""
        with self._lock:
            return self._caught_up

    # ---- the app --------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._main()
        except BaseException as error:  # noqa: BLE001 - reported by the test thread
            self.failure = error

    async def _main(self) -> None:
        self.store.seconds = self.config.save_seconds
        await asyncio.sleep(self.config.start_delay)
        self._countdown = self.rng.randint(1, self.config.max_gap)
        while True:
            self._run += 1
            subscriber = Subscriber(
                target=self.world.target,
                token=token_for("ws1-device"),
                device_id=self.device_id,
                workspace_ids=[WS],
                store=self.store,
                backoff=self.config.backoff,
                rng=random.Random(self.rng.random()),
                queue_limit=self.config.queue_limit,
            )
            await subscriber.start()
            if self._run == 1:
                for binding_id, session_id in self.bindings.items():
                    await subscriber.attach(binding_id, WS, session_id)
            stopped = await self._consume(subscriber)
            with self._lock:
                self._connected = False
            self.final_state = subscriber.state
            if stopped:
                return
            await asyncio.sleep(self.rng.uniform(0, 0.05))
            self._append(Restarted(self._run + 1))

    async def _consume(self, subscriber: Subscriber) -> bool:
        """Read events until the Subscriber is closed; True when the test asked to stop."""
        self._closing = self._restart = False
        closer = asyncio.create_task(self._close_on_stop(subscriber))
        timer = asyncio.create_task(self._timer_chaos(subscriber))
        try:
            async for event in subscriber.events():
                if isinstance(event, ResumeRejected) or (
                    isinstance(event, Connecting) and event.cursor is None
                ):
                    self._token += 1  # a fresh epoch begins with this event
                self._append(event)
                if isinstance(event, Ready | Connecting | Reconnecting | Terminated):
                    with self._lock:
                        self._connected = isinstance(event, Ready)
                await self._react(subscriber, event)
                self._update_caught_up(subscriber)
                if isinstance(event, Terminated):
                    return True
                if self._restart and not self._closing:
                    self._closing = True
                    await self._close(subscriber)  # the queued events are still read
        finally:
            closer.cancel()
            timer.cancel()
            await asyncio.gather(closer, timer, return_exceptions=True)
            await self._close(subscriber)
        return self.stop.is_set() or not self._restart

    async def _close_on_stop(self, subscriber: Subscriber) -> None:
        while not self.stop.is_set():  # noqa: ASYNC110 - a threading.Event of the test thread
            await asyncio.sleep(0.01)
        self._closing = True
        self.final_state = subscriber.state
        await self._close(subscriber)

    async def _timer_chaos(self, subscriber: Subscriber) -> None:
        while True:
            await asyncio.sleep(self.rng.expovariate(1 / self.config.timer_mean_seconds))
            if self.chaos.is_set() and not self._closing:
                self._count("timer-drop")
                await subscriber.drop_link()

    async def _close(self, subscriber: Subscriber) -> None:
        closing = self._closes.get(id(subscriber))
        if closing is None:
            closing = self._closes[id(subscriber)] = asyncio.ensure_future(subscriber.close())
        await asyncio.wait({closing}, timeout=CLOSE_SECONDS)
        while not closing.done():
            # close() must always return (bug 5, fixed in 01a3e19: a close during a call's
            # teardown lost its cancellation and waited for good). Report it, then cancel
            # the Subscriber's task again so the iteration can finish and be checked.
            if self.failure is None:
                self.failure = AssertionError(f"Subscriber.close() hung > {CLOSE_SECONDS} s")
            task = getattr(subscriber, "_task", None)
            if task is not None:
                task.cancel()
            await asyncio.wait({closing}, timeout=CLOSE_SECONDS)

    def _append(self, event: object) -> None:
        self.log.append(Entry(len(self.log), time.monotonic(), self._run, self._token, event))

    def _count(self, action: str) -> None:
        self.actions[action] = self.actions.get(action, 0) + 1

    def _update_caught_up(self, subscriber: Subscriber) -> None:
        state = subscriber.state
        done = all(
            (a := state.attachments.get(b)) is not None
            and a.caught_up
            and a.revision == state.revisions.get(b)
            and a.session_id == s
            for b, s in self.bindings.items()
        )
        with self._lock:
            self._caught_up = done

    # ---- reactions --------------------------------------------------------------------------

    async def _react(self, subscriber: Subscriber, event: object) -> None:
        chaos = self.chaos.is_set() and not self._closing
        if isinstance(event, Connecting):
            self._before_ready = event.cursor is not None
        elif isinstance(event, Ready):
            self._before_ready = False
            if self.first_ready_at is None:
                self.first_ready_at = time.monotonic()
                await self._reread("initial", (ReconcileKey(WS),))
            if chaos and self.rng.random() < self.config.p_drop_on_ready:
                self._count("drop-on-ready")
                await subscriber.drop_link()
        elif isinstance(event, Reconcile):
            await self._reread(event.reason, event.keys)
        elif isinstance(event, AttachmentStarted):
            if chaos and self.rng.random() < self.config.p_drop_on_attach:
                self._count("drop-mid-baseline")
                await subscriber.drop_link()
        elif isinstance(event, Delivered):
            self._apply(event)
            if chaos and self._before_ready and self.rng.random() < self.config.p_drop_in_replay:
                self._count("drop-in-replay")
                await subscriber.drop_link()
            if chaos:
                self._countdown -= 1
                if self._countdown <= 0:
                    self._countdown = self.rng.randint(1, self.config.max_gap)
                    await self._action(subscriber)

    async def _action(self, subscriber: Subscriber) -> None:
        names = [n for n, _ in self.config.weights]
        weights = [w for _, w in self.config.weights]
        action = self.rng.choices(names, weights)[0]
        self._count(action)
        if action == "drop":
            await subscriber.drop_link()
        elif action == "restart":
            self._restart = True
        elif action == "reattach" and self.bindings:
            binding_id = self.rng.choice(sorted(self.bindings))
            await subscriber.attach(binding_id, WS, self.bindings[binding_id])
        elif action == "switch" and self.bindings:
            # The screen shows another Session: the binding's baseline is replaced.
            binding_id = self.rng.choice(sorted(self.bindings))
            self.bindings[binding_id] = self.rng.choice(self.attachable)
            await subscriber.attach(binding_id, WS, self.bindings[binding_id])
        elif action == "pause":
            await asyncio.sleep(self.rng.uniform(0, self.config.max_pause_seconds))

    def _apply(self, event: Delivered) -> None:
        delivery = event.delivery
        if event.kind == "message_delta":
            delta = delivery.message_delta
            if delta.message_id in self.canonical:
                return
            if delta.operation == SET:
                self.texts[delta.message_id] = delta.text
            else:
                self.texts[delta.message_id] = self.texts.get(delta.message_id, "") + delta.text
        elif event.kind == "turn_update":
            turn = delivery.turn_update.turn
            self._learn_turn(turn.session_id, turn.turn_id, turn.version, int(turn.phase))
            if turn.session_id == self.sentinel_session and turn.phase == SETTLED:
                # Delivered, not read from Host: everything sent before it was consumed.
                with self._lock:
                    self._sentinels.add(turn.turn_id)

    def _learn_turn(self, session_id: str, turn_id: str, version: int, phase: int) -> None:
        known = self.turns.get(turn_id)
        if known is None or version > known[0]:
            self.turns[turn_id] = (version, phase)

    async def _reread(self, reason: str, keys: tuple[ReconcileKey, ...]) -> None:
        with_turns: set[str] = set()
        messages_only: set[str] = set()
        for key in keys:
            if key.workspace_id != WS:
                continue
            if key.session_id is None:
                with_turns.update(self.sessions)
            elif key.session_id in self.sessions:
                (messages_only if key.message_id is not None else with_turns).add(key.session_id)
        messages_only -= with_turns
        views: dict[str, SessionView] = {}
        for session_id in sorted(with_turns | messages_only):
            views[session_id] = await asyncio.to_thread(
                self.world.read_session, session_id, turns=session_id in with_turns
            )
        for session_id, view in views.items():
            for turn_id, (version, phase) in view.turns.items():
                self._learn_turn(session_id, turn_id, version, phase)
            for message_id, text in view.messages.items():
                self.texts[message_id] = text
                self.canonical.add(message_id)
        self._append(Reread(reason, keys, frozenset(with_turns), views))
