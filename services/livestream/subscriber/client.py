"""The async device ``Subscriber`` (LIVE-SUB-1): one resumable ``DeviceLink`` at a time.

The Subscriber runs calls one after another over one ``grpc.aio`` channel: it sends the
hello (with the persisted resume cursor when it has one), feeds every frame to the pure
:class:`~services.livestream.subscriber.continuity.ContinuityMachine`, persists the
device state after every frame, heartbeats at the interval ``stream_ready`` announces,
and reconnects with capped, jittered backoff when the call ends for a reason a retry can
cure. It stops with a :class:`Terminated` event when the server refused the device for
good (revision, scope, authentication, protocol violation, or another instance took the
link over).

Attachments are the application's *desired* state (persisted too): they are re-sent,
with fresh revisions, whenever a new epoch begins (the server forgets attachments with
its epoch) and whenever an attach or detach sent on an earlier call was never confirmed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from agentactivity.livestream.v1 import livestream_pb2, livestream_pb2_grpc
from services.livestream.subscriber.continuity import (
    PROTOCOL_REVISION,
    ContinuityEvent,
    ContinuityMachine,
    Ready,
    ResumeRejected,
)
from services.livestream.subscriber.state import (
    Cursor,
    DesiredAttachment,
    DeviceState,
    MemoryStateStore,
    StateStore,
)

__all__ = [
    "CHANNEL_OPTIONS",
    "DEFAULT_HEARTBEAT_INTERVAL_MS",
    "TERMINAL_CODES",
    "TERMINAL_REASONS",
    "Backoff",
    "Connecting",
    "LinkEnd",
    "Reconnecting",
    "Subscriber",
    "SubscriberEvent",
    "Terminated",
    "link_end",
]

CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    # Phones lose networks silently: ping every 30 s, give up on an unanswered ping after
    # 10 s, also while the stream is quiet (the server permits pings every 10 s).
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Twice the default encoded-frame ceiling (2 MiB, LIVE-FRAME-1).
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
)
"""Channel options of a channel the Subscriber builds itself."""

DEFAULT_HEARTBEAT_INTERVAL_MS = 15_000
"""Client heartbeat interval when ``stream_ready`` announces none."""

TERMINAL_REASONS = frozenset(
    {
        "PROTOCOL_REVISION_MISMATCH",
        "WORKSPACE_SCOPE_MISMATCH",
        "PROTOCOL_VIOLATION",
        "LINK_SUPERSEDED",
    }
)
"""``ErrorInfo`` reasons after which reconnecting cannot help."""

TERMINAL_CODES = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)
"""Status codes after which the same hello would be refused again."""


@dataclass(frozen=True, kw_only=True)
class Connecting:
    """A call is being opened; ``cursor`` is the resume cursor its hello carries."""

    generation: int
    attempt: int
    """Consecutive failed calls before this one (0 after a call that became ready)."""
    cursor: Cursor | None


@dataclass(frozen=True, kw_only=True)
class Reconnecting:
    """The call ended; the next one starts after ``delay_s``.

    ``code`` is the call's status (``None`` when the Subscriber ended the call itself);
    ``reason`` is the ``ErrorInfo`` reason, or for a local end ``"CONTINUITY_LOST"``,
    ``"HEARTBEAT_TIMEOUT"`` or ``"LINK_DROPPED"`` (:meth:`Subscriber.drop_link`).
    """

    generation: int
    code: grpc.StatusCode | None
    reason: str
    message: str
    delay_s: float
    attempt: int


@dataclass(frozen=True, kw_only=True)
class Terminated:
    """The Subscriber stopped for good; :meth:`Subscriber.events` ends after this event.

    Always delivered, whatever the generation (a terminal error must not be missed).
    """

    generation: int
    code: grpc.StatusCode
    reason: str
    message: str


SubscriberEvent = ContinuityEvent | Connecting | Reconnecting | Terminated
"""Everything :meth:`Subscriber.events` yields."""


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with jitter between consecutive failed calls."""

    initial_s: float = 0.25
    multiplier: float = 2.0
    max_s: float = 30.0
    jitter: float = 0.5
    """The delay is drawn from ``[d * (1 - jitter), d]`` so a fleet does not reconnect in step."""

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The pause before call number ``attempt`` + 1 of a failure streak."""
        ceiling = min(self.max_s, self.initial_s * self.multiplier ** min(attempt, 64))
        return ceiling * (1.0 - self.jitter * rng.random())


@dataclass(frozen=True)
class LinkEnd:
    """How a call ended, read from its status and ``google.rpc.Status`` details."""

    code: grpc.StatusCode | None
    reason: str
    message: str
    retry_after_s: float | None = None
    reached_ready: bool = False

    @property
    def terminal(self) -> bool:
        """Reconnecting would be refused the same way (or would fight another instance)."""
        return self.reason in TERMINAL_REASONS or self.code in TERMINAL_CODES


def link_end(error: grpc.aio.AioRpcError) -> LinkEnd:
    """Classify a failed call: code, ``ErrorInfo.reason`` and ``RetryInfo`` delay.

    The details are the ``grpc-status-details-bin`` trailer (a ``google.rpc.Status``).
    """
    reason, retry_after = "", None
    for key, value in error.trailing_metadata() or ():
        if key != "grpc-status-details-bin" or not isinstance(value, bytes):
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except DecodeError:
            continue  # a garbled trailer only loses the reason; the code still decides
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason = str(info.reason)
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                retry_after = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
    return LinkEnd(error.code(), reason, error.details() or "", retry_after)


_Call = grpc.aio.StreamStreamCall[
    livestream_pb2.DeviceLinkRequest, livestream_pb2.DeviceLinkResponse
]


class _Link:
    """One call: its writes are serialized (grpc.aio allows one write at a time)."""

    def __init__(self, call: _Call) -> None:
        self.call = call
        self.local_end: str | None = None
        """Why the Subscriber cancelled this call itself, if it did."""
        self.reading_since: float | None = None
        """When the pending read started (``None`` while frames are being processed, so
        an application slow to consume events is not mistaken for a silent server)."""
        self._lock = asyncio.Lock()

    async def write(self, request: livestream_pb2.DeviceLinkRequest) -> bool:
        """Send ``request``; False when the call already ended (the reader reports why)."""
        async with self._lock:
            if self.call.done():
                return False
            # A write on a call cancelled before its initial metadata arrived never
            # completes (grpc.aio waits for metadata that will not come), so the write
            # races the call's end.
            write = asyncio.ensure_future(self.call.write(request))
            ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def _ended(_: object) -> None:
                if not ended.done():
                    ended.set_result(None)

            self.call.add_done_callback(_ended)
            try:
                await asyncio.wait({write, ended}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                write.cancel()
                raise
            if not write.done():
                write.cancel()
                return False
            if write.cancelled():
                return False
            error = write.exception()
            if error is None:
                return True
            if isinstance(error, grpc.aio.AioRpcError | asyncio.InvalidStateError):
                return False
            raise error

    def cut(self, why: str) -> None:
        """Cancel the call; the reader sees it and reconnects."""
        if self.local_end is None:
            self.local_end = why
        self.call.cancel()


_END = object()


class Subscriber:
    """A device's live subscription: ``async with Subscriber(...) as sub:``.

    Args:
        device_id: the stable identity of this installation (names the publisher).
        workspace_ids: the workspace scope (non-empty).
        target: the livestream address (``host:port``), or use ``channel_factory``.
        credentials: TLS credentials for ``target``; plaintext without.
        token: bearer token sent as ``authorization: Bearer <token>`` on every call.
        channel_factory: builds the channel (called once, inside the event loop); the
            Subscriber closes it on :meth:`close`.
        store: where the device state is kept; default in memory.
        resume: start from the stored cursor (False: the first call connects fresh; the
            stored revisions and desired attachments are still used).
        client_build: diagnostics string of the hello.
        backoff: reconnect pacing; ``rng`` seeds its jitter (tests).
        metadata: further call metadata.
        silence_factor: a ready call with no frame for this many heartbeat intervals is
            considered dead and cut (the server heartbeats when idle).
        queue_limit: events buffered for :meth:`events` before frames stop being read
            (the server then sees a slow consumer instead of the device growing without
            bound).
    """

    def __init__(
        self,
        *,
        device_id: str,
        workspace_ids: Sequence[str],
        target: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        channel_factory: Callable[[], grpc.aio.Channel] | None = None,
        store: StateStore | None = None,
        resume: bool = True,
        client_build: str | None = "agentactivity-subscriber/1",
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        silence_factor: float = 3.0,
        queue_limit: int = 10_000,
    ) -> None:
        if (target is None) == (channel_factory is None):
            raise ValueError("pass exactly one of target and channel_factory")
        if not device_id or not workspace_ids:
            raise ValueError("a Subscriber needs a device_id and at least one workspace")
        self.device_id = device_id
        self.workspace_ids = tuple(sorted(set(workspace_ids)))
        self._target, self._credentials = target, credentials
        self._channel_factory = channel_factory
        self._store: StateStore = store if store is not None else MemoryStateStore()
        self._resume = resume
        self._client_build = client_build
        self._backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self._metadata = tuple(metadata) + (
            (("authorization", f"Bearer {token}"),) if token is not None else ()
        )
        self._silence_factor = silence_factor
        self._queue_limit = max(1, queue_limit)

        self._generation = 1
        self._machine: ContinuityMachine | None = None
        self._channel: grpc.aio.Channel | None = None
        self._task: asyncio.Task[None] | None = None
        self._link: _Link | None = None
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._space = asyncio.Event()
        self._ready = asyncio.Event()
        self._ended = asyncio.Event()
        self._control = asyncio.Lock()  # revision allocation + its write, in wire order
        self._saving = asyncio.Lock()  # saves land in the order their snapshots were taken
        self._resync = False
        self._closed = False
        self.terminated: Terminated | None = None
        """The terminal event, once the Subscriber stopped for good."""
        self.dropped_events = 0
        """Events discarded because their generation was closed when they were read."""
        self.calls = 0
        """How many calls were opened."""
        self.failure: Exception | None = None
        """An unexpected error that stopped the Subscriber (reported as SUBSCRIBER_FAILED)."""

    # -- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Subscriber:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Load the device state, open the channel and start connecting.

        Raises:
            StateCorruptError: the store holds a document it cannot read.
            RuntimeError: already started.
        """
        if self._task is not None or self._closed:
            raise RuntimeError("a Subscriber starts once")
        state = await asyncio.to_thread(self._store.load)
        self._machine = ContinuityMachine(self._adopt(state), generation=self._generation)
        if self._channel_factory is not None:
            self._channel = self._channel_factory()
        elif self._credentials is not None:
            assert self._target is not None
            self._channel = grpc.aio.secure_channel(
                self._target, self._credentials, options=CHANNEL_OPTIONS
            )
        else:
            assert self._target is not None
            self._channel = grpc.aio.insecure_channel(self._target, options=CHANNEL_OPTIONS)
        self._task = asyncio.create_task(self._run(), name=f"subscriber {self.device_id}")

    def _adopt(self, state: DeviceState | None) -> DeviceState:
        if state is None:
            return DeviceState(device_id=self.device_id, workspace_ids=self.workspace_ids)
        if (state.device_id, tuple(state.workspace_ids)) != (self.device_id, self.workspace_ids):
            # Another publisher's cursor and projection mean nothing here; revisions are
            # kept because they only ever grow.
            return DeviceState(
                device_id=self.device_id,
                workspace_ids=self.workspace_ids,
                revisions=dict(state.revisions),
            )
        if not self._resume:
            state.cursor = None
        return state

    async def close(self) -> None:
        """Stop: cancel the current call, persist the state, close an owned channel."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._machine is not None:
            await self._persist()
        if self._channel is not None:
            await self._channel.close()
        self._finish()

    def _finish(self) -> None:
        self._ended.set()
        self._queue.put_nowait(_END)
        self._space.set()

    # -- application API ----------------------------------------------------------------

    @property
    def generation(self) -> int:
        """The open local generation; events of older ones are dropped when read."""
        return self._generation

    def open_generation(self) -> int:
        """Close the current local generation and open the next one (e.g. app resumed).

        Events already queued under the closed generation are discarded by
        :meth:`events`; events produced from now on carry the new one.
        """
        self._generation += 1
        if self._machine is not None:
            self._machine.generation = self._generation
        return self._generation

    @property
    def state(self) -> DeviceState:
        """A copy of the device state as it is now (cursor, projection, revisions)."""
        return self._require_machine().state.copy()

    @property
    def machine(self) -> ContinuityMachine:
        """The continuity machine, for diagnostics; do not feed it.

        Read ``filtered``, ``heartbeats``, ``epoch`` and ``last_sequence`` from it.
        """
        return self._require_machine()

    @property
    def cursor(self) -> Cursor | None:
        """The current resume cursor."""
        return self._require_machine().cursor

    @property
    def ready(self) -> bool:
        """The current call is live (its ``stream_ready`` was accepted)."""
        return self._ready.is_set()

    async def events(self) -> AsyncIterator[SubscriberEvent]:
        """Events in order; ends after :class:`Terminated` or :meth:`close`."""
        while True:
            item = await self._queue.get()
            if self._queue.qsize() < self._queue_limit:
                self._space.set()
            if item is _END:
                self._queue.put_nowait(_END)  # every other reader ends too
                return
            event: SubscriberEvent = item  # type: ignore[assignment]
            if not isinstance(event, Terminated) and event.generation != self._generation:
                self.dropped_events += 1
                continue
            yield event

    async def wait_ready(self) -> None:
        """Wait until the current call is ready (bound it with ``asyncio.timeout``).

        Raises:
            RuntimeError: the Subscriber stopped first.
        """
        ready = asyncio.ensure_future(self._ready.wait())
        ended = asyncio.ensure_future(self._ended.wait())
        try:
            await asyncio.wait({ready, ended}, return_when="FIRST_COMPLETED")
        finally:
            ready.cancel()
            ended.cancel()
        if not self._ready.is_set():
            raise RuntimeError(f"the Subscriber stopped: {self.terminated}")

    async def attach(
        self,
        binding_id: str,
        workspace_id: str,
        session_id: str,
        caller_turn_id: str | None = None,
    ) -> int | None:
        """Attach ``binding_id`` to a Session (LIVE-ATT-1); returns the revision sent.

        The revision (persisted last + 1) is saved before it is sent. When no call is
        ready the attach is only recorded (``None``): the next ready call sends it.
        Attaching again, even to the same Session, reruns the baseline.
        """
        if workspace_id not in self.workspace_ids:
            raise ValueError(f"workspace {workspace_id!r} is outside this link's scope")
        want = DesiredAttachment(workspace_id, session_id, caller_turn_id)
        async with self._control:
            self._require_machine().state.desired[binding_id] = want
            return await self._send_locked(binding_id, want)

    async def detach(self, binding_id: str) -> int | None:
        """End the attachment of ``binding_id``; returns the revision sent.

        ``None``: not connected; the next ready call detaches it if the server still holds
        it.
        """
        async with self._control:
            self._require_machine().state.desired.pop(binding_id, None)
            return await self._send_locked(binding_id, None)

    async def drop_link(self) -> None:
        """Cut the current call as a lost network would; the Subscriber resumes."""
        if self._link is not None:
            self._link.cut("LINK_DROPPED")

    # -- internals ----------------------------------------------------------------------

    def _require_machine(self) -> ContinuityMachine:
        if self._machine is None:
            raise RuntimeError("the Subscriber is not started")
        return self._machine

    async def _send_locked(self, binding_id: str, want: DesiredAttachment | None) -> int | None:
        machine = self._require_machine()
        link = self._link
        if link is None or not machine.ready:
            await self._persist()  # the desired state; the next ready call's resync sends it
            return None
        revision = machine.state.revisions.get(binding_id, 0) + 1
        machine.state.revisions[binding_id] = revision
        await self._persist()  # the revision is durable before the server can see it
        if want is None:
            request = livestream_pb2.DeviceLinkRequest(
                detach=livestream_pb2.ClientDetach(binding_id=binding_id, revision=revision)
            )
        else:
            request = livestream_pb2.DeviceLinkRequest(
                attach=livestream_pb2.ClientAttach(
                    binding_id=binding_id,
                    revision=revision,
                    workspace_id=want.workspace_id,
                    session_id=want.session_id,
                    caller_turn_id=want.caller_turn_id,
                )
            )
        await link.write(request)
        return revision

    async def _resync_attachments(self) -> None:
        """Re-send what the server does not hold.

        That is desired attaches it never confirmed (or forgot with its epoch) and
        attachments it holds that are no longer wanted.
        """
        async with self._control:
            state = self._require_machine().state
            for binding_id in sorted(set(state.desired) | set(state.attachments)):
                want = state.desired.get(binding_id)
                have = state.attachments.get(binding_id)
                if want is not None:
                    # The server answered our latest revision for what is desired now (an
                    # attach recorded while disconnected changed `want`, not the revision).
                    # A rejection may come without attachment_changed, hence no caller.
                    confirmed = (
                        have is not None
                        and have.revision == state.revisions.get(binding_id, 0)
                        and (have.workspace_id, have.session_id)
                        == (want.workspace_id, want.session_id)
                        and (
                            have.rejected_reason is not None
                            or have.caller_turn_id == want.caller_turn_id
                        )
                    )
                    if not confirmed:
                        await self._send_locked(binding_id, want)
                elif have is not None:
                    await self._send_locked(binding_id, None)

    async def _persist(self) -> None:
        snapshot = self._require_machine().state.copy()
        async with self._saving:
            await asyncio.to_thread(self._store.save, snapshot)

    async def _emit(self, events: Sequence[SubscriberEvent]) -> None:
        for event in events:
            self._queue.put_nowait(event)
        # Backpressure: stop reading frames while the application is this far behind.
        while self._queue.qsize() >= self._queue_limit and not self._closed:
            self._space.clear()
            await self._space.wait()

    async def _run(self) -> None:
        try:
            await self._reconnect_loop()
        except Exception as error:  # noqa: BLE001 - surfaced as the terminal event, not lost
            self.failure = error
            self.terminated = Terminated(
                generation=self._generation,
                code=grpc.StatusCode.UNKNOWN,
                reason="SUBSCRIBER_FAILED",
                message=repr(error),
            )
            self._queue.put_nowait(self.terminated)
        finally:
            self._ended.set()
            if self.terminated is not None or not self._closed:
                self._queue.put_nowait(_END)

    async def _reconnect_loop(self) -> None:
        attempt = 0
        while True:
            end = await self._one_call(attempt)
            if end.reached_ready:
                attempt = 0
            if end.terminal and end.code is not None:
                self.terminated = Terminated(
                    generation=self._generation,
                    code=end.code,
                    reason=end.reason,
                    message=end.message,
                )
                await self._emit([self.terminated])
                return
            delay = self._backoff.delay(attempt, self._rng)
            if end.retry_after_s is not None:
                delay = max(delay, end.retry_after_s)  # honour RetryInfo
            attempt += 1
            await self._emit(
                [
                    Reconnecting(
                        generation=self._generation,
                        code=end.code,
                        reason=end.reason,
                        message=end.message,
                        delay_s=delay,
                        attempt=attempt,
                    )
                ]
            )
            await asyncio.sleep(delay)

    async def _one_call(self, attempt: int) -> LinkEnd:
        machine = self._require_machine()
        assert self._channel is not None
        cursor = machine.cursor
        machine.begin_call(cursor_sent=cursor is not None)
        await self._persist()  # a fresh connect cleared the projection
        await self._emit([Connecting(generation=self._generation, attempt=attempt, cursor=cursor)])
        stub = livestream_pb2_grpc.DeviceLinkServiceStub(self._channel)
        link = _Link(stub.DeviceLink(metadata=self._metadata))
        self.calls += 1
        self._link, self._resync = link, False
        self._ready.clear()
        heartbeat: asyncio.Task[None] | None = None
        reached_ready = False
        try:
            await link.write(self._hello(cursor))
            while True:
                link.reading_since = time.monotonic()
                frame = await link.call.read()
                link.reading_since = None
                if not isinstance(frame, livestream_pb2.DeviceLinkResponse):  # EOF
                    code = await link.call.code()
                    details = await link.call.details()
                    return LinkEnd(code, "", details or "call ended", reached_ready=reached_ready)
                events = machine.feed(frame)
                # Queue the frame's events before its cursor is saved: a close() (or a
                # crash) in between then loses nothing; a crash after queueing and before
                # saving resumes from the older cursor, so the application may see those
                # deliveries again (same epoch and sequence), never miss them.
                await self._emit(events)
                if frame.WhichOneof("kind") in ("deliveries", "stream_ready") or machine.broken:
                    await self._persist()  # only these change the cursor or projection
                started = self._note_events(link, events)
                if started is not None:
                    reached_ready = True
                    heartbeat = started
                if machine.broken:
                    link.cut("CONTINUITY_LOST")
                    return LinkEnd(
                        None, "CONTINUITY_LOST", "continuity lost", reached_ready=reached_ready
                    )
                if self._resync and machine.ready:
                    self._resync = False
                    await self._resync_attachments()
        except grpc.aio.AioRpcError as error:
            if link.local_end is not None:
                return LinkEnd(None, link.local_end, error.details() or "", None, reached_ready)
            end = link_end(error)
            return LinkEnd(end.code, end.reason, end.message, end.retry_after_s, reached_ready)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if link.local_end is None or (task is not None and task.cancelling()):
                raise
            return LinkEnd(None, link.local_end, "cut locally", reached_ready=reached_ready)
        finally:
            self._link = None
            self._ready.clear()
            if heartbeat is not None:
                heartbeat.cancel()
                # Wait for it without swallowing a cancellation of this task (close()):
                # asyncio.wait never raises the awaited task's CancelledError.
                await asyncio.wait({heartbeat})
            link.call.cancel()

    def _note_events(
        self, link: _Link, events: Sequence[ContinuityEvent]
    ) -> asyncio.Task[None] | None:
        """React to a frame's ``Ready`` and ``ResumeRejected`` events.

        Returns:
            The heartbeat task started for the call's ``Ready``; ``None`` without one.
        """
        heartbeat: asyncio.Task[None] | None = None
        for event in events:
            if isinstance(event, Ready):
                self._ready.set()
                heartbeat = asyncio.create_task(self._heartbeats(link, event))
                self._resync = True  # also on resume: unconfirmed sends are redone
            elif isinstance(event, ResumeRejected):
                self._resync = True
        return heartbeat

    def _hello(self, cursor: Cursor | None) -> livestream_pb2.DeviceLinkRequest:
        hello = livestream_pb2.ClientHello(
            protocol_revision=PROTOCOL_REVISION,
            device_id=self.device_id,
            workspace_ids=self.workspace_ids,
            client_build=self._client_build,
        )
        if cursor is not None:
            hello.resume_cursor.epoch = cursor.epoch
            hello.resume_cursor.last_sequence = cursor.last_sequence
        return livestream_pb2.DeviceLinkRequest(hello=hello)

    async def _heartbeats(self, link: _Link, ready: Ready) -> None:
        machine = self._require_machine()
        interval_ms = ready.limits.heartbeat_interval_ms or DEFAULT_HEARTBEAT_INTERVAL_MS
        interval = interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            waiting = link.reading_since
            if waiting is not None and time.monotonic() - waiting > interval * self._silence_factor:
                # The server heartbeats whenever it is idle, so silence means a dead path
                # that TCP and HTTP/2 keepalive have not noticed yet.
                link.cut("HEARTBEAT_TIMEOUT")
                return
            beat = livestream_pb2.ClientHeartbeat(
                epoch=machine.epoch or "",
                last_sequence=machine.last_sequence,
                client_time_unix_ms=int(time.time() * 1000),
            )
            if not await link.write(livestream_pb2.DeviceLinkRequest(heartbeat=beat)):
                return
