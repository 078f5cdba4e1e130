"""Device-side clients of ``bench.live_bench``: one worker process holds many links.

A :class:`DeviceWorker` runs in its own process (:class:`bench.live_bench_procs.Worker`) and
holds *groups* of receiving links, each link with its own channel or connection (its own
TCP connection, as separate devices would have):

* ``live``: a ``DeviceLink`` call per device, authenticated as that device's principal.
  Frames go through the device-side continuity machine of
  ``services.livestream.subscriber`` (sequence continuity, epochs, ``stream_ready``), and
  every ``message_delta`` text is counted op by op (:class:`bench.live_bench_common.Tally`);
* ``bare``: a server-stream of the bare fan-out server, one delivery per frame;
* ``nats``: a NATS core subscription on its own connection, one delivery per message.

Besides arming, waiting and closing, the worker reconnects links (``resume``: the same
channel, the saved cursor; ``storm``: every link of a group dropped at one instant and
reconnected at once) and replays a JetStream stream from a sequence (``js_replay``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
import nats
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from nats.aio.msg import Msg
from nats.js import api as js_api

from agentactivity.livestream.v1 import livestream_pb2, livestream_pb2_grpc
from bench.live_bench_common import WORKSPACE, Tally
from services.livestream.subscriber.continuity import PROTOCOL_REVISION

__all__ = ["CHANNEL_OPTIONS", "DeviceWorker", "LibraryContinuity", "RawContinuity"]

CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]
"""One TCP connection per channel (gRPC would otherwise share one per target)."""

Event = tuple[str, Any]
"""What a continuity check makes of a frame: ``("delta", text)``, ``("ready", resumed)``,
``("delivery", encoded delivery)`` (any sequenced delivery, for capture), ``("other", kind)``
or ``("problem", description)``."""


def error_name(error: BaseException) -> str:
    """``CODE`` or ``CODE/REASON`` of a failed call."""
    if not isinstance(error, grpc.aio.AioRpcError):
        return type(error).__name__
    code = error.code().name
    with contextlib.suppress(Exception):
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
        for detail in status.details if status is not None else ():
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                return f"{code}/{info.reason}"
    return str(code)


# ---- continuity ---------------------------------------------------------------------------


class Continuity(Protocol):
    """Checks one device's frames (LIVE-SUB-1) and keeps its resume cursor."""

    def begin_call(self, with_cursor: bool) -> None:
        """A call starts (with or without the saved cursor)."""

    def feed(self, frame: livestream_pb2.DeviceLinkResponse, capture: bool) -> list[Event]:
        """What the frame means for the application."""
        ...

    def cursor(self) -> tuple[str, int] | None:
        """The resume cursor, or ``None`` when the device must connect fresh."""
        ...


class LibraryContinuity:
    """The device library's :class:`ContinuityMachine` (services/livestream/subscriber)."""

    def __init__(self, device_id: str, workspace: str = WORKSPACE) -> None:
        from services.livestream.subscriber import continuity
        from services.livestream.subscriber.state import DeviceState

        self._lib = continuity
        self._machine = continuity.ContinuityMachine(
            DeviceState(device_id=device_id, workspace_ids=(workspace,))
        )

    def begin_call(self, with_cursor: bool) -> None:
        """A call starts (with or without the saved cursor).

        Args:
            with_cursor: Whether the call resumes from the saved cursor.
        """
        self._machine.begin_call(with_cursor)

    def feed(self, frame: livestream_pb2.DeviceLinkResponse, capture: bool) -> list[Event]:
        """What the frame means for the application, as the device library sees it.

        Args:
            frame: One frame received on the call.
            capture: Whether every sequenced delivery is also returned, encoded.

        Returns:
            The events the frame yields, in order.
        """
        lib = self._lib
        out: list[Event] = []
        for event in self._machine.feed(frame):
            if isinstance(event, lib.Delivered):
                if capture:
                    out.append(("delivery", event.delivery.SerializeToString()))
                if event.kind == "message_delta":
                    out.append(("delta", event.delivery.message_delta.text))
                else:
                    out.append(("other", event.kind))
            elif isinstance(event, lib.Ready):
                out.append(("ready", event.resumed))
            elif isinstance(event, lib.Reconcile):
                out.append(("problem", f"reconcile {event.reason}: {event.detail}"))
            else:
                out.append(("other", type(event).__name__))
        return out

    def cursor(self) -> tuple[str, int] | None:
        """The resume cursor, or ``None`` when the device must connect fresh.

        Returns:
            ``(epoch, last_sequence)``, or ``None``.
        """
        cursor = self._machine.cursor
        return None if cursor is None else (cursor.epoch, cursor.last_sequence)


class RawContinuity:
    """Sequence continuity checked directly on the generated messages.

    The fallback when the device library is not importable.
    """

    def __init__(self, device_id: str, workspace: str = WORKSPACE) -> None:
        self._epoch: str | None = None
        self._last = 0
        self._broken = False

    def begin_call(self, with_cursor: bool) -> None:
        """A call starts; without the cursor the device starts over.

        Args:
            with_cursor: Whether the call resumes from the saved cursor.
        """
        if not with_cursor:
            self._epoch, self._last = None, 0
        self._broken = False

    def feed(self, frame: livestream_pb2.DeviceLinkResponse, capture: bool) -> list[Event]:
        """What the frame means for the application; nothing more once continuity broke.

        Args:
            frame: One frame received on the call.
            capture: Whether every sequenced delivery is also returned, encoded.

        Returns:
            The events the frame yields, in order, ending with a ``problem`` when it breaks
            continuity.
        """
        if self._broken:
            return []
        kind = frame.WhichOneof("kind")
        out: list[Event] = []
        if kind == "stream_ready":
            return self._feed_ready(frame.stream_ready, out)
        if kind == "deliveries":
            return self._feed_deliveries(frame.deliveries, capture, out)
        if kind == "heartbeat":
            if frame.heartbeat.latest_sequence > self._last:
                return self._break(out, "lost tail")
            return out
        return self._break(out, "frame kind unset")

    def _feed_ready(self, ready: livestream_pb2.StreamReady, out: list[Event]) -> list[Event]:
        if self._epoch is None:
            self._epoch = ready.epoch
        if (ready.epoch, ready.latest_sequence) != (self._epoch, self._last):
            return self._break(out, f"stream_ready {ready.epoch}/{ready.latest_sequence}")
        out.append(("ready", ready.resumed))
        return out

    def _feed_deliveries(
        self, batch: livestream_pb2.DeliveryBatch, capture: bool, out: list[Event]
    ) -> list[Event]:
        if batch.epoch != self._epoch:
            if batch.deliveries[0].sequence != 1:
                return self._break(out, f"epoch {batch.epoch} not at sequence 1")
            self._epoch, self._last = batch.epoch, 0
        for delivery in batch.deliveries:
            if delivery.sequence != self._last + 1:
                return self._break(out, f"sequence {delivery.sequence} after {self._last}")
            self._last = delivery.sequence
            if capture:
                out.append(("delivery", delivery.SerializeToString()))
            which = delivery.WhichOneof("kind")
            if which == "message_delta":
                out.append(("delta", delivery.message_delta.text))
            else:
                out.append(("other", which))
        return out

    def _break(self, out: list[Event], why: str) -> list[Event]:
        self._broken = True
        self._epoch, self._last = None, 0
        out.append(("problem", why))
        return out

    def cursor(self) -> tuple[str, int] | None:
        """The resume cursor, or ``None`` when the device must connect fresh.

        Returns:
            ``(epoch, last_sequence)``, or ``None``.
        """
        return None if self._epoch is None else (self._epoch, self._last)


def make_continuity(
    device_id: str, check: str = "library", workspace: str = WORKSPACE
) -> Continuity:
    """The device library's machine, else :class:`RawContinuity`.

    The library's machine is used for ``check="library"`` when it is importable.
    """
    if check == "library":
        try:
            return LibraryContinuity(device_id, workspace)
        except ImportError:
            pass
    return RawContinuity(device_id, workspace)


# ---- links ----------------------------------------------------------------------------------


@dataclass
class Link:
    """One receiving link of any kind; ``tally`` counts what it received."""

    name: str
    tally: Tally
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    ready_at_ns: int | None = None
    resumed: bool | None = None
    error: str | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    on_done: Callable[[], None] | None = None
    detail: str = ""

    def done_now(self) -> None:
        """The armed target arrived."""
        if self.on_done is not None:
            self.on_done()


class LiveLink(Link):
    """A ``DeviceLink`` call of one device (its own channel, principal and cursor)."""

    def __init__(
        self,
        name: str,
        tally: Tally,
        token: str,
        check: str = "library",
        workspace: str = WORKSPACE,
    ) -> None:
        super().__init__(name, tally)
        self.metadata = (("authorization", f"Bearer {token}"),)
        self.workspace = workspace
        self.continuity = make_continuity(name, check, workspace)
        self.channel: grpc.aio.Channel | None = None
        self.call: Any = None
        self.reader: asyncio.Task[None] | None = None
        self.closing = False
        self.capture: list[bytes] | None = None
        self.captured: list[bytes] = []
        self.started_at_ns = 0
        self.attempts = 0

    def open_channel(self, address: str) -> None:
        """A new channel (a new TCP connection) to ``address``."""
        self.channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)

    async def start(self, with_cursor: bool, capture: bool = False) -> None:
        """Start a call: hello (with the cursor when asked) and the reader."""
        assert self.channel is not None
        cursor = self.continuity.cursor() if with_cursor else None
        self.continuity.begin_call(cursor is not None)
        hello = livestream_pb2.ClientHello(
            protocol_revision=PROTOCOL_REVISION, device_id=self.name, workspace_ids=[self.workspace]
        )
        if cursor is not None:
            hello.resume_cursor.epoch, hello.resume_cursor.last_sequence = cursor
        self.ready = asyncio.Event()
        self.ended = asyncio.Event()
        self.ready_at_ns = None
        self.resumed = None
        self.error = None
        self.closing = False
        self.capture = [] if capture else None
        self.attempts += 1
        self.started_at_ns = time.perf_counter_ns()
        stub: Any = livestream_pb2_grpc.DeviceLinkServiceStub(self.channel)
        self.call = stub.DeviceLink(metadata=self.metadata)
        await self.call.write(livestream_pb2.DeviceLinkRequest(hello=hello))
        self.reader = asyncio.create_task(self._read(self.call))

    async def _read(self, call: Any) -> None:
        tally = self.tally
        try:
            while True:
                frame = await call.read()
                if frame is grpc.aio.EOF:
                    if not self.closing:
                        self.error = "EOF"
                    return
                now = time.perf_counter_ns()
                tally.frames += 1
                for kind, value in self.continuity.feed(frame, self.capture is not None):
                    self._on_event(kind, value, now)
        except asyncio.CancelledError:
            if not self.closing:
                self.error = "task cancelled"
        except grpc.aio.AioRpcError as error:
            if not (self.closing and error.code() == grpc.StatusCode.CANCELLED):
                self.error = error_name(error)
                self.detail = str(error.details())
        finally:
            self.ready.set()
            self.ended.set()

    def _on_event(self, kind: str, value: Any, now: int) -> None:
        tally = self.tally
        if kind == "delta":
            if tally.account(value, now):
                self.done_now()
        elif kind == "ready":
            self.ready_at_ns = now
            self.resumed = bool(value)
            if self.capture is not None:
                self.captured, self.capture = self.capture, None
            self.ready.set()
        elif kind == "delivery":
            if self.capture is not None:
                self.capture.append(value)
        elif kind == "problem":
            tally.problem(str(value))
        else:
            tally.other_deliveries += 1

    async def drop(self, close_channel: bool) -> None:
        """End the call from the device side (and close the channel when asked)."""
        self.closing = True
        if self.call is not None:
            self.call.cancel()
        if self.reader is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.reader
        if close_channel and self.channel is not None:
            await self.channel.close()
            self.channel = None


class BareLink(Link):
    """A server-stream of the bare fan-out server (one delivery per frame)."""

    def __init__(self, name: str, tally: Tally) -> None:
        super().__init__(name, tally)
        self.channel: grpc.aio.Channel | None = None
        self.call: Any = None
        self.reader: asyncio.Task[None] | None = None
        self.last_sequence: int | None = None
        self.closing = False
        self.method_name = "Stream"

    async def start(self, address: str, method_name: str = "Stream") -> None:
        """Open a channel and the stream (``BatchedStream``: the batched variant)."""
        self.method_name = method_name
        self.channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.ready = asyncio.Event()
        self.ended = asyncio.Event()
        self.ready_at_ns = None
        self.error = None
        self.closing = False
        self.last_sequence = None
        method = self.channel.unary_stream(
            f"/bench.Bare/{method_name}",
            request_serializer=lambda value: value,
            response_deserializer=livestream_pb2.DeviceLinkResponse.FromString,
        )
        self.call = method(b"")
        self.reader = asyncio.create_task(self._read(self.call))

    async def _read(self, call: Any) -> None:
        tally = self.tally
        try:
            async for frame in call:
                now = time.perf_counter_ns()
                tally.frames += 1
                if frame.WhichOneof("kind") == "stream_ready":
                    self.ready_at_ns = now
                    self.ready.set()
                    continue
                for delivery in frame.deliveries.deliveries:
                    last = self.last_sequence
                    if last is not None and delivery.sequence != last + 1:
                        tally.problem(f"sequence {delivery.sequence} after {last}")
                    self.last_sequence = delivery.sequence
                    if tally.account(delivery.message_delta.text, now):
                        self.done_now()
        except asyncio.CancelledError:
            pass
        except grpc.aio.AioRpcError as error:
            if not (self.closing and error.code() == grpc.StatusCode.CANCELLED):
                self.error = error_name(error)
                self.detail = str(error.details())
        finally:
            self.ready.set()
            self.ended.set()

    async def drop(self) -> None:
        """Cancel the stream and close the channel."""
        self.closing = True
        if self.call is not None:
            self.call.cancel()
        if self.reader is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.reader
        if self.channel is not None:
            await self.channel.close()
            self.channel = None


class NatsLink(Link):
    """A NATS core subscriber on its own connection (one delivery per message)."""

    def __init__(self, name: str, tally: Tally) -> None:
        super().__init__(name, tally)
        self.connection: Any = None
        self.last_sequence: int | None = None

    async def start(self, url: str, subject: str) -> None:
        """Connect, subscribe and make sure the server registered the subscription."""

        async def on_error(error: Exception) -> None:
            self.tally.problem(f"nats error: {error!r}")

        self.connection = await nats.connect(
            url, name=self.name, allow_reconnect=False, error_cb=on_error
        )
        await self.connection.subscribe(subject, cb=self._on_message)
        await self.connection.flush()
        self.ready_at_ns = time.perf_counter_ns()
        self.ready.set()

    async def _on_message(self, message: Msg) -> None:
        now = time.perf_counter_ns()
        tally = self.tally
        tally.frames += 1
        delivery = livestream_pb2.Delivery.FromString(message.data)
        last = self.last_sequence
        if last is not None and delivery.sequence != last + 1:
            tally.problem(f"sequence {delivery.sequence} after {last}")
        self.last_sequence = delivery.sequence
        if tally.account(delivery.message_delta.text, now):
            self.done_now()

    async def drop(self) -> None:
        """Close the connection."""
        if self.connection is not None:
            with contextlib.suppress(Exception):
                await self.connection.close()
            self.connection = None


# ---- the worker -------------------------------------------------------------------------------


@dataclass
class Group:
    """Links of one kind that are armed and awaited together."""

    links: list[Any]
    remaining: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def link_done(self) -> None:
        self.remaining -= 1
        if self.remaining <= 0:
            self.done.set()


async def _bounded(jobs: Iterable[Callable[[], Awaitable[Any]]], limit: int) -> list[Any]:
    gate = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await job()

    return await asyncio.gather(*(one(job) for job in jobs), return_exceptions=True)


def _errors(values: Iterable[str | None]) -> dict[str, int]:
    seen: dict[str, int] = {}
    for value in values:
        if value:
            seen[value] = seen.get(value, 0) + 1
    return seen


class DeviceWorker:
    """Command handler of one device worker process (see the module docstring)."""

    def __init__(self, check: str = "library") -> None:
        self.groups: dict[str, Group] = {}
        self.check = check
        """How live links check continuity: ``library`` (the device library's
        ContinuityMachine) or ``raw`` (:class:`RawContinuity`)."""

    def _group(self, name: str, links: list[Any], append: bool = False) -> Group:
        group = self.groups.get(name) if append else None
        if group is None:
            group = self.groups[name] = Group([])
        group.links += links
        for link in links:
            link.on_done = group.link_done
        return group

    async def cmd_connect_live(
        self,
        group: str,
        address: str,
        devices: list[tuple[str, str]],
        first_index: int,
        width: int,
        concurrency: int = 64,
        ready_seconds: float = 120.0,
        append: bool = False,
        workspace: str = WORKSPACE,
    ) -> dict[str, Any]:
        """Connect one ``DeviceLink`` per ``(device_id, token)``; wait for ``stream_ready``.

        With ``append`` the links join the group's existing ones; ``workspace`` is the one
        workspace the links watch (the bench workspace unless told).
        """
        links = [
            LiveLink(device, Tally(width, first_index), token, self.check, workspace)
            for device, token in devices
        ]
        self._group(group, links, append)
        started = time.perf_counter_ns()

        async def connect(link: LiveLink) -> None:
            link.open_channel(address)
            await link.start(with_cursor=False)
            await asyncio.wait_for(link.ready.wait(), ready_seconds)

        results = await _bounded([functools.partial(connect, link) for link in links], concurrency)
        return {
            "links": len(links),
            "ready": sum(1 for link in links if link.ready_at_ns is not None and not link.error),
            "errors": _errors(
                [link.error for link in links]
                + [type(r).__name__ for r in results if isinstance(r, BaseException)]
            ),
            "seconds": (time.perf_counter_ns() - started) / 1e9,
        }

    async def cmd_connect_bare(
        self,
        group: str,
        address: str,
        count: int,
        first_index: int,
        width: int,
        append: bool = False,
        method_name: str = "Stream",
    ) -> dict[str, Any]:
        """Open ``count`` bare server-streams; wait for their first frame."""
        links = [BareLink(f"bare-{k}", Tally(width, first_index)) for k in range(count)]
        self._group(group, links, append)
        for link in links:
            await link.start(address, method_name)
        await asyncio.wait_for(asyncio.gather(*(link.ready.wait() for link in links)), 60)
        return {"links": len(links), "errors": _errors(link.error for link in links)}

    async def cmd_connect_nats(
        self, group: str, url: str, subject: str, count: int, first_index: int, width: int
    ) -> dict[str, Any]:
        """Open ``count`` NATS connections, each subscribed to ``subject``."""
        links = [NatsLink(f"nats-{k}", Tally(width, first_index)) for k in range(count)]
        self._group(group, links)
        await asyncio.gather(*(link.start(url, subject) for link in links))
        return {"links": len(links)}

    async def cmd_arm(self, group: str, target_index: int, latencies: bool = False) -> int:
        """Count afresh; the group is done once every link received op ``target_index``.

        A group this worker does not hold has no links.
        """
        entry = self.groups.setdefault(group, Group([]))
        entry.done = asyncio.Event()
        entry.remaining = 0
        for link in entry.links:
            link.tally.arm(target_index, latencies)
            if not link.tally.done:
                entry.remaining += 1
        if entry.remaining == 0:
            entry.done.set()
        return len(entry.links)

    async def cmd_wait(self, group: str, seconds: float) -> dict[str, Any]:
        """Wait until the armed group is done (or ``seconds`` passed).

        Returns what every link counted.
        """
        entry = self.groups.setdefault(group, Group([]))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(entry.done.wait(), seconds)
        latencies: list[float] = []
        for link in entry.links:
            latencies += link.tally.latencies_ms or []
        return {
            "links": [
                {**link.tally.report(), "name": link.name, "error": link.error}
                for link in entry.links
            ],
            "latencies_ms": latencies,
        }

    async def cmd_close(self, group: str) -> None:
        """Close every link of ``group``."""
        entry = self.groups.pop(group, None)
        if entry is None:
            return
        for link in entry.links:
            if isinstance(link, LiveLink):
                await link.drop(close_channel=True)
            else:
                await link.drop()

    # ---- resume -------------------------------------------------------------------------------

    async def cmd_disconnect(self, group: str) -> list[tuple[str, int] | None]:
        """End every live call of ``group`` from the device side; keep channels and cursors."""
        links: list[LiveLink] = self.groups[group].links
        for link in links:
            await link.drop(close_channel=False)
        return [link.continuity.cursor() for link in links]

    async def cmd_resume(self, group: str, ready_seconds: float = 60.0) -> list[dict[str, Any]]:
        """Reconnect each link of ``group`` on its open channel with its cursor, in turn.

        Times each from the hello to ``stream_ready`` (after the replay).
        """
        out: list[dict[str, Any]] = []
        for link in self.groups[group].links:
            assert link.channel is not None
            await asyncio.wait_for(link.channel.channel_ready(), 30)
            before = link.tally.ops, link.tally.deliveries, link.tally.text_bytes
            await link.start(with_cursor=True, capture=True)
            await asyncio.wait_for(link.ready.wait(), ready_seconds)
            captured = link.captured
            out.append(
                {
                    "name": link.name,
                    "seconds": ((link.ready_at_ns or 0) - link.started_at_ns) / 1e9,
                    "resumed": link.resumed,
                    "error": link.error,
                    "replayed_ops": link.tally.ops - before[0],
                    "replayed_deltas": link.tally.deliveries - before[1],
                    "replayed_text_bytes": link.tally.text_bytes - before[2],
                    "replayed_deliveries": len(captured),
                    "replayed_bytes": sum(len(d) for d in captured),
                    "deliveries": captured,
                    "problems": list(link.tally.problems),
                }
            )
            link.captured = []
        return out

    # ---- reconnect storm -------------------------------------------------------------------------

    async def cmd_storm(
        self,
        group: str,
        address: str,
        at_ns: int,
        deadline_seconds: float = 120.0,
        backoff_seconds: float = 0.25,
    ) -> dict[str, Any]:
        """At ``at_ns`` drop every link of ``group`` at once, then reconnect them all at once.

        Dropping cancels the calls and closes the channels (new TCP connections); the
        reconnects carry their cursors.

        A refused reconnect is retried after a jittered backoff (what a device does) until
        the deadline; every error code seen is counted.
        """
        links: list[LiveLink] = self.groups[group].links
        await asyncio.sleep(max(0.0, (at_ns - time.perf_counter_ns()) / 1e9))
        dropped_at = time.perf_counter_ns()
        await asyncio.gather(*(link.drop(close_channel=True) for link in links))
        reconnect_at = time.perf_counter_ns()
        seen: dict[str, int] = {}
        samples: list[str] = []
        cursors = sum(1 for link in links if link.continuity.cursor() is not None)
        end = time.monotonic() + deadline_seconds

        async def resume(link: LiveLink) -> None:
            attempt = 0
            while True:
                attempt += 1
                link.open_channel(address)
                try:
                    await link.start(with_cursor=True)
                    await asyncio.wait_for(link.ready.wait(), max(0.1, end - time.monotonic()))
                except (TimeoutError, grpc.aio.AioRpcError) as error:
                    link.error = link.error or error_name(error)
                    if isinstance(error, grpc.aio.AioRpcError):
                        link.detail = str(error.details())
                if link.error is None and link.ready_at_ns is not None:
                    return
                seen[link.error or "no ready"] = seen.get(link.error or "no ready", 0) + 1
                if len(samples) < 10:
                    samples.append(f"{link.error}: {link.detail}")
                await link.drop(close_channel=True)
                if time.monotonic() > end:
                    return
                await asyncio.sleep(backoff_seconds * attempt * random.uniform(0.5, 1.5))

        for link in links:
            link.attempts = 0
        await asyncio.gather(*(resume(link) for link in links))
        ready = [link.ready_at_ns for link in links if link.error is None and link.ready_at_ns]
        return {
            "links": len(links),
            "with_cursor": cursors,
            "resumed": sum(1 for link in links if link.error is None and link.resumed),
            "ready": len(ready),
            "attempts": sum(link.attempts for link in links),
            "errors": seen,
            "error_samples": samples,
            "dropped_at_ns": dropped_at,
            "reconnect_at_ns": reconnect_at,
            "drop_seconds": (reconnect_at - dropped_at) / 1e9,
            "ready_at_ns": ready,
            "problems": [p for link in links for p in link.tally.problems][:20],
        }

    async def cmd_bare_storm(
        self,
        group: str,
        address: str,
        at_ns: int,
        deadline_seconds: float = 120.0,
        backoff_seconds: float = 0.25,
    ) -> dict[str, Any]:
        """The bare baseline of :meth:`cmd_storm`: close every stream at once, reopen all.

        A refused one is retried after the same jittered backoff.
        """
        links: list[BareLink] = self.groups[group].links
        await asyncio.sleep(max(0.0, (at_ns - time.perf_counter_ns()) / 1e9))
        dropped_at = time.perf_counter_ns()
        await asyncio.gather(*(link.drop() for link in links))
        reconnect_at = time.perf_counter_ns()
        seen: dict[str, int] = {}
        samples: list[str] = []
        end = time.monotonic() + deadline_seconds
        attempts = 0

        async def reopen(link: BareLink) -> None:
            nonlocal attempts
            attempt = 0
            while True:
                attempt += 1
                attempts += 1
                await link.start(address, link.method_name)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(link.ready.wait(), max(0.1, end - time.monotonic()))
                if link.error is None and link.ready_at_ns is not None:
                    return
                code = link.error or "no ready"
                seen[code] = seen.get(code, 0) + 1
                if len(samples) < 10:
                    samples.append(f"{code}: {link.detail}")
                await link.drop()
                if time.monotonic() > end:
                    return
                await asyncio.sleep(backoff_seconds * attempt * random.uniform(0.5, 1.5))

        await asyncio.gather(*(reopen(link) for link in links))
        ready = [link.ready_at_ns for link in links if link.error is None and link.ready_at_ns]
        return {
            "links": len(links),
            "ready": len(ready),
            "attempts": attempts,
            "errors": seen,
            "error_samples": samples,
            "dropped_at_ns": dropped_at,
            "reconnect_at_ns": reconnect_at,
            "ready_at_ns": ready,
        }

    # ---- JetStream ---------------------------------------------------------------------------

    async def cmd_js_replay(
        self, url: str, subject: str, start_sequence: int, count: int, width: int
    ) -> dict[str, Any]:
        """Replay ``count`` messages of a JetStream stream from ``start_sequence``.

        An ordered push consumer on an open connection; times from subscribe to the last one.

        Each message is decoded as a ``Delivery`` and its ops counted, as a device would.
        """
        connection = await nats.connect(url, allow_reconnect=False)
        js = connection.jetstream()
        tally = Tally(width)
        received = 0
        received_bytes = 0
        done = asyncio.Event()
        last_at = 0

        async def on_message(message: Msg) -> None:
            nonlocal received, received_bytes, last_at
            delivery = livestream_pb2.Delivery.FromString(message.data)
            now = time.perf_counter_ns()
            tally.account(delivery.message_delta.text, now)
            received += 1
            received_bytes += len(message.data)
            if received >= count:
                last_at = now
                done.set()

        try:
            started = time.perf_counter_ns()
            subscription = await js.subscribe(
                subject,
                cb=on_message,
                ordered_consumer=True,
                config=js_api.ConsumerConfig(
                    deliver_policy=js_api.DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=start_sequence,
                ),
            )
            await asyncio.wait_for(done.wait(), 120)
            await subscription.unsubscribe()
        finally:
            await connection.close()
        return {
            "seconds": (last_at - started) / 1e9,
            "messages": received,
            "bytes": received_bytes,
            "ops": tally.ops,
            "problems": list(tally.problems),
        }

    async def close(self) -> None:
        """Close every group (the worker exits)."""
        for name in list(self.groups):
            with contextlib.suppress(Exception):
                await self.cmd_close(name)
