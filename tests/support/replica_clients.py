"""The clients of the replica torture: resuming ``WatchActivity`` watchers, livestream devices
on the real :class:`~services.livestream.subscriber.Subscriber`, and Host reads.

A :class:`ResumingWatcher` keeps one ``WatchActivity`` going across replica deaths: after a
broken stream it resubscribes from its last event id (on whichever Host replica the balanced
channel picks), after a typed ``EVENT_CURSOR_EXPIRED`` from the head. A :class:`Device` does
what the Subscriber's documentation asks of an application: applies every delivery, rereads
Host for every ``Reconcile`` (and the whole workspace at its first ready). Both record what
they saw for :mod:`tests.support.live_gap_check`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import activity_pb2, host_pb2, host_pb2_grpc
from services.livestream.subscriber import (
    CHANNEL_OPTIONS,
    AttachmentCaughtUp,
    AttachmentRejected,
    Backoff,
    Delivered,
    Ready,
    Reconcile,
    Subscriber,
)
from tests.support.live_gap_check import (
    CommittedEvent,
    Reread,
    WatchDelta,
    WatchEnded,
    WatchEvent,
    WatchLog,
    WatchSubscribed,
)
from tests.support.servers import auth_metadata, token_for

__all__ = [
    "Device",
    "ResumingWatcher",
    "committed",
    "read_feed",
    "read_sessions",
    "running_devices",
]

T = TypeVar("T")

WS = "ws-1"
DEVICE = auth_metadata("ws1-device")
SETTLED = canonical_pb2.TURN_PHASE_SETTLED
READ_SECONDS = 60.0
"""How long a Host read keeps retrying while replicas die and come back."""


def _reason(error: grpc.RpcError) -> str:
    """The ErrorInfo reason of a failed call ("" when it carries none)."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    if status is None:
        return ""
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return str(info.reason)
    return ""


def _retrying(call: Callable[[], T]) -> T:
    """``call()``, again while the replica it reached is dying (reads are idempotent)."""
    deadline = time.monotonic() + READ_SECONDS
    while True:
        try:
            return call()
        except grpc.RpcError as error:
            retriable = error.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )
            if not retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def read_sessions(
    stub: host_pb2_grpc.HostServiceStub, session_ids: list[str]
) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """Host's Turns ``{id: (version, phase)}`` and message texts of these Sessions."""
    turns: dict[str, tuple[int, int]] = {}
    messages: dict[str, str] = {}
    for session_id in session_ids:
        cursor = ""
        while True:
            turns_request = host_pb2.ListSessionTurnsRequest(
                workspace_id=WS, session_id=session_id, cursor=cursor, limit=1000
            )
            page: host_pb2.ListSessionTurnsResponse = _retrying(
                functools.partial(stub.ListSessionTurns, turns_request, metadata=DEVICE, timeout=10)
            )
            for turn in page.turns:
                turns[turn.turn_id] = (turn.version, int(turn.phase))
            cursor = page.next_cursor
            if not cursor:
                break
        after = 0
        while True:
            messages_request = host_pb2.ListSessionMessagesRequest(
                workspace_id=WS, session_id=session_id, after_version=after, limit=1000
            )
            listing: host_pb2.ListSessionMessagesResponse = _retrying(
                functools.partial(
                    stub.ListSessionMessages, messages_request, metadata=DEVICE, timeout=10
                )
            )
            for message in listing.messages:
                messages[message.message_id] = str(json.loads(message.payload_json)["text"])
                after = max(after, message.version)
            if not listing.has_more:
                break
    return turns, messages


def committed(event: activity_pb2.ActivityEvent) -> CommittedEvent:
    """The checker's view of a durable event."""
    kind = str(event.WhichOneof("event"))
    if kind == "turn_update":
        turn = event.turn_update.turn
        return CommittedEvent(
            event.workspace_sequence,
            event.event_id,
            kind,
            turn.session_id,
            turn.turn_id,
            version=turn.version,
        )
    if kind == "message_update":
        update = event.message_update
        return CommittedEvent(
            event.workspace_sequence,
            event.event_id,
            kind,
            update.session_id,
            message_ids=tuple(m.message_id for m in update.messages),
        )
    session_id = str(getattr(getattr(event, kind), "session_id", ""))
    return CommittedEvent(event.workspace_sequence, event.event_id, kind, session_id)


def read_feed(
    channel: grpc.Channel, after_event_id: int = 0
) -> tuple[dict[int, CommittedEvent], int]:
    """Host's durable feed after ``after_event_id`` up to its head: ``{sequence: event}``, head."""
    stub = host_pb2_grpc.HostServiceStub(channel)
    call = stub.WatchActivity(
        host_pb2.WatchActivityRequest(workspace_id=WS, after_event_id=after_event_id),
        metadata=auth_metadata("service"),
        timeout=READ_SECONDS,
    )
    feed: dict[int, CommittedEvent] = {}
    head: int | None = None
    try:
        for response in call:
            if response.WhichOneof("item") == "ready":
                head = response.ready.head_workspace_sequence
            elif response.event.WhichOneof("event") != "message_delta":
                event = committed(response.event)
                feed[event.sequence] = event
            if head is not None and (head == 0 or head in feed):
                break
    finally:
        call.cancel()
    assert head is not None
    return feed, head


class ResumingWatcher:
    """A ``WatchActivity`` consumer in a thread that survives the death of its replica: it
    resumes from its cursor on the next replica of its list (SCALE-1: any replica serves it)."""

    def __init__(self, name: str, channels: list[grpc.Channel]) -> None:
        """Watch through ``channels[0]``; after each broken call, through the next one."""
        self.log = WatchLog(name)
        self._stubs = [host_pb2_grpc.HostServiceStub(c) for c in channels]
        self._calls = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._call: grpc.Future | None = None  # type: ignore[type-arg]
        self._lock = threading.Lock()
        self.last_event_id: int | None = None
        self.position = 0
        """The last ``workspace_sequence`` received (or the first head)."""
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float = 30) -> None:
        """Block until the first subscription is live."""
        assert self._ready.wait(timeout), f"{self.log.name}: no ready marker"

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._one_call()
                if not self._stop.is_set():
                    time.sleep(0.05)
        except BaseException as error:  # noqa: BLE001 - reported by the test thread
            self.failure = error

    def _one_call(self) -> None:
        request = host_pb2.WatchActivityRequest(workspace_id=WS)
        if self.last_event_id is not None:
            request.after_event_id = self.last_event_id
        stub = self._stubs[self._calls % len(self._stubs)]
        self._calls += 1
        call = stub.WatchActivity(request, metadata=auth_metadata("service"))
        with self._lock:
            self._call = call  # type: ignore[assignment]
        if self._stop.is_set():
            call.cancel()
        try:
            for response in call:
                if response.WhichOneof("item") == "ready":
                    after = self.last_event_id
                    self.log.entries.append(
                        WatchSubscribed(response.ready.head_workspace_sequence, after)
                    )
                    if after is None:
                        self.position = response.ready.head_workspace_sequence
                    self._ready.set()
                    continue
                event = response.event
                if event.WhichOneof("event") == "message_delta":
                    delta = event.message_delta.delta
                    self.log.entries.append(
                        WatchDelta(delta.session_id, delta.message_id, delta.text)
                    )
                    continue
                seen = committed(event)
                self.log.entries.append(
                    WatchEvent(
                        seen.sequence, seen.event_id, seen.kind, seen.session_id, seen.message_ids
                    )
                )
                self.last_event_id = event.event_id
                self.position = max(self.position, event.workspace_sequence)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.CANCELLED and self._stop.is_set():
                return
            reason = _reason(error)
            self.log.entries.append(WatchEnded(error.code().name, reason))
            if reason == "EVENT_CURSOR_EXPIRED":
                self.last_event_id = None  # typed: reconcile and start from the head

    def wait_position(self, sequence: int, timeout: float) -> bool:
        """Wait until the watcher received ``sequence``; whether it did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.position >= sequence:
                return True
            time.sleep(0.02)
        return self.position >= sequence

    def stop(self) -> None:
        """Stop watching (the log is final afterwards)."""
        self._stop.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        self._thread.join(15)
        assert not self._thread.is_alive(), f"{self.log.name} did not stop"


@dataclass
class Device:
    """A device app on a Subscriber dialing ``target`` (one livestream replica, or an
    ``ipv4:`` list it tries in order)."""

    name: str
    target: str
    sessions: list[str]
    host: host_pb2_grpc.HostServiceStub
    """Where the app rereads (a balanced channel: any Host replica)."""
    log: list[object] = field(default_factory=list)
    failure: BaseException | None = None
    settled: set[str] = field(default_factory=set)
    """Turns whose settling update was *delivered* (not read)."""
    _ready_once: bool = False

    async def run(self, stop: threading.Event) -> None:
        """Subscribe, attach every Session, and record until ``stop`` is set."""
        try:
            await self._main(stop)
        except BaseException as error:  # noqa: BLE001 - reported by the test thread
            self.failure = error

    async def _main(self, stop: threading.Event) -> None:
        target = self.target
        subscriber = Subscriber(
            # pick_first over the listed replicas: a device stays on one livestream replica
            # (as the deployment keeps it) and fails over in list order. A subchannel of its
            # own: one shared with an earlier device may still be backing off from a kill.
            channel_factory=lambda: grpc.aio.insecure_channel(
                target, options=[*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
            ),
            token=token_for("ws1-device"),
            device_id=f"replica-torture-{self.name}",
            workspace_ids=[WS],
            backoff=Backoff(initial_s=0.05, max_s=0.5),
        )
        await subscriber.start()
        for k, session_id in enumerate(self.sessions):
            await subscriber.attach(f"b{k}", WS, session_id)
        reader = asyncio.create_task(self._read(subscriber))
        while not stop.is_set():  # noqa: ASYNC110 - a threading.Event of the test thread
            await asyncio.sleep(0.02)
        await subscriber.close()
        await asyncio.wait({reader}, timeout=5)
        reader.cancel()

    async def _read(self, subscriber: Subscriber) -> None:
        async for event in subscriber.events():
            self.log.append(event)
            if isinstance(event, Ready) and not self._ready_once:
                self._ready_once = True
                await self._reread("initial", self.sessions)
            elif isinstance(event, Reconcile):
                named = {k.session_id for k in event.keys}
                chosen = self.sessions if None in named else sorted(s for s in named if s)
                await self._reread(event.reason, [s for s in chosen if s in self.sessions])
            elif isinstance(event, AttachmentRejected) and event.reason == "HOST_UNAVAILABLE":
                # The replica's Host was down: attach again (a higher revision), as an app would.
                await asyncio.sleep(0.2)
                await subscriber.attach(event.binding_id, WS, event.session_id)
            elif isinstance(event, Delivered) and event.kind == "turn_update":
                turn = event.delivery.turn_update.turn
                if turn.phase == SETTLED:
                    self.settled.add(turn.turn_id)

    async def _reread(self, reason: str, sessions: list[str]) -> None:
        turns, messages = await asyncio.to_thread(read_sessions, self.host, sessions)
        self.log.append(Reread(reason, turns, messages))

    @property
    def caught_up(self) -> bool:
        """Every Session's attachment baseline has completed at least once."""
        done = {e.binding_id for e in self.log if isinstance(e, AttachmentCaughtUp)}
        return len(done) == len(self.sessions)

    @property
    def ready(self) -> bool:
        """The first call reached ``stream_ready`` (and the initial reread is done)."""
        return any(isinstance(e, Reread) for e in self.log)


@contextmanager
def running_devices(devices: list[Device]) -> Iterator[None]:
    """Run ``devices`` on an event loop of their own thread until the block ends."""
    stop = threading.Event()

    async def main() -> None:
        await asyncio.gather(*(device.run(stop) for device in devices))

    thread = threading.Thread(target=asyncio.run, args=(main(),), name="devices", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive(), "the devices did not stop"
