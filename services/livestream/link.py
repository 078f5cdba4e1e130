"""One DeviceLink call (LIVE-LINK-1, LIVE-CTL-1, LIVE-FLOW-1).

The call reads its hello, binds the publisher of (principal, device, scope), answers the
resume cursor (LIVE-RESUME-1) and then runs two loops until it ends:

- the sender writes what the publisher has after the call's position, as frames of
  consecutive deliveries within the frame ceiling (LIVE-FRAME-1), then ``stream_ready``
  once every workspace feed is subscribed to Host (LIVE-CTL-1; replayed deliveries come
  first), and a ``ServerHeartbeat`` whenever nothing was sent for the heartbeat interval;
- the reader applies the client's attaches, detaches and heartbeats; a client half-close
  does not end the call, only the device cancelling it does.

A call that falls too far behind is closed ``RESOURCE_EXHAUSTED`` ``SLOW_CONSUMER`` by its
publisher (ADR 0019); its memory is the one frame being written. Every refusal is a typed
:class:`~domainerrors.DomainError` the interceptor turns into ``google.rpc.Status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from agentactivity.livestream.v1 import livestream_pb2
from domainerrors import (
    DomainError,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    PermissionDenied,
)
from grpcserver.auth import Principal
from grpcserver.errors import internal_error
from services.livestream import attachments
from services.livestream.encoding import (
    FRAME_OVERHEAD_BYTES,
    batch_frame,
    batch_header_size,
    delivery_entry_size,
    frame_bytes,
)
from services.livestream.projection import hidden_workspaces, project
from services.livestream.publisher import BoundCall, Publisher
from services.livestream.registry import PublisherRegistry, slow_consumer, superseded

__all__ = ["CURRENT_REVISION", "DeviceLinkCall", "protocol_violation"]

CURRENT_REVISION = livestream_pb2.LIVE_PROTOCOL_REVISION_2
"""The one live protocol revision this server speaks (LIVE-REV-1, ADR 0030); a hello
naming any other is refused, never converted."""
log = logging.getLogger(__name__)

MAX_ID_CHARS = 256
MAX_SCOPE_WORKSPACES = 64
MAX_BINDINGS = 256
MAX_SEQUENCE = 2**53 - 1
FRAME_ENTRIES = 4096
"""Deliveries considered per frame (a frame of small deltas stays far below the ceiling)."""


def protocol_violation(field: str, description: str) -> InvalidArgument:
    """``INVALID_ARGUMENT`` ``PROTOCOL_VIOLATION`` naming the offending field."""
    return InvalidArgument(
        f"{field}: {description}",
        reason="PROTOCOL_VIOLATION",
        field_violations=[FieldViolation(field, description)],
    )


def _check_id(value: str, field: str) -> None:
    if not value:
        raise protocol_violation(field, "must not be empty")
    if len(value) > MAX_ID_CHARS:
        raise protocol_violation(field, f"must be at most {MAX_ID_CHARS} characters")


def check_hello(request: livestream_pb2.DeviceLinkRequest) -> livestream_pb2.ClientHello:
    """The call's hello, validated (LIVE-LINK-1, LIVE-REV-1).

    Raises:
        InvalidArgument: ``PROTOCOL_VIOLATION``.
        FailedPrecondition: ``PROTOCOL_REVISION_MISMATCH``.
    """
    if request.WhichOneof("kind") != "hello":
        raise protocol_violation("hello", "the first request of a DeviceLink must be a hello")
    hello = request.hello
    if hello.protocol_revision != CURRENT_REVISION:
        raise FailedPrecondition(
            f"live protocol revision {hello.protocol_revision} is not this server's "
            f"({CURRENT_REVISION}); reconcile through Host and update the client",
            reason="PROTOCOL_REVISION_MISMATCH",
            metadata={
                "client_revision": str(int(hello.protocol_revision)),
                "server_revision": str(int(CURRENT_REVISION)),
            },
        )
    _check_id(hello.device_id, "hello.device_id")
    if len(set(hello.workspace_ids)) > MAX_SCOPE_WORKSPACES:
        raise protocol_violation(
            "hello.workspace_ids", f"at most {MAX_SCOPE_WORKSPACES} workspaces"
        )
    for workspace_id in hello.workspace_ids:
        _check_id(workspace_id, "hello.workspace_ids")
    if hello.HasField("client_build") and len(hello.client_build) > MAX_ID_CHARS:
        raise protocol_violation("hello.client_build", f"must be at most {MAX_ID_CHARS} characters")
    if hello.HasField("resume_cursor"):
        cursor = hello.resume_cursor
        _check_id(cursor.epoch, "hello.resume_cursor.epoch")
        if not 0 <= cursor.last_sequence <= MAX_SEQUENCE:
            raise protocol_violation(
                "hello.resume_cursor.last_sequence", "must be between 0 and 2^53-1"
            )
    return hello


def _pack(epoch: str, entries: list[bytes], max_frame_bytes: int) -> tuple[bytes, int]:
    """The frame of the longest prefix of ``entries`` within the ceiling (at least one)."""
    budget = max_frame_bytes - FRAME_OVERHEAD_BYTES - batch_header_size(epoch)
    used = 0
    count = 0
    for encoded in entries:
        size = delivery_entry_size(len(encoded))
        if count and used + size > budget:
            break
        used += size
        count += 1
    return batch_frame(epoch, entries[:count]), count


async def _wait(event: asyncio.Event, seconds: float) -> None:
    """Wait for ``event`` (cleared first) or ``seconds``.

    Cheaper than ``asyncio.wait_for``, which wraps every wait in a task (this runs once per
    frame per call).
    """
    event.clear()
    handle = asyncio.get_running_loop().call_later(seconds, event.set)
    try:
        await event.wait()
    finally:
        handle.cancel()


class DeviceLinkCall:
    """Serves one DeviceLink call; see the module docstring."""

    def __init__(self, registry: PublisherRegistry, principal: Principal) -> None:
        self._registry = registry
        self._settings = registry.settings
        self._principal = principal

    async def run(
        self, requests: AsyncIterator[livestream_pb2.DeviceLinkRequest]
    ) -> AsyncIterator[bytes]:
        """The call's frames, as encoded ``DeviceLinkResponse`` bytes."""
        first = await anext(aiter(requests), None)
        if first is None:
            return
        hello = check_hello(first)
        cursor = hello.resume_cursor if hello.HasField("resume_cursor") else None
        foreign: int | None = None
        if cursor is not None:
            # SCALE-4: an epoch another replica holds is handed over first (with a bus).
            foreign = await self._registry.take_over(
                self._principal, hello.device_id, hello.workspace_ids, cursor
            )
        publisher = self._registry.publisher_for(
            self._principal, hello.device_id, hello.workspace_ids
        )
        decision = publisher.resume(cursor, foreign)
        call = BoundCall(self._principal, decision.start_after)
        call.bound_at = publisher.latest_sequence
        publisher.bind(call, superseded)
        reader = asyncio.create_task(self._read(requests, publisher, call), name="devicelink-read")
        try:
            async for frame in self._send(publisher, call, resumed=decision.resumed):
                yield frame
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self._registry.release(publisher, call)

    def _feeds_ready(self, publisher: Publisher) -> bool:
        feeds = self._registry.feeds_of(publisher)
        return len(feeds) == len(publisher.key.workspace_ids) and all(f.ready for f in feeds)

    async def _send(
        self, publisher: Publisher, call: BoundCall, *, resumed: bool
    ) -> AsyncIterator[bytes]:
        settings = self._settings
        interval = settings.live_heartbeat_interval_seconds
        linger = settings.live_batch_linger_seconds
        flush_bytes = settings.live_max_frame_bytes // 2
        hidden = hidden_workspaces(publisher.key.workspace_ids, call.principal)
        ready_sent = False
        last_write = last_batch = time.monotonic()
        while True:
            if call.close_error is not None:
                raise call.close_error
            buffer = publisher.buffer
            if call.sent < buffer.latest_sequence:
                if not buffer.holds_after(call.sent):
                    raise slow_consumer()
                # LIVE-FRAME-1 batching: under sustained traffic a live call sends at most
                # one frame per linger interval, so deliveries share frames; an idle call
                # (or a replay, or half a frame pending) sends at once.
                since = time.monotonic() - last_batch
                if ready_sent and since < linger and buffer.bytes_after(call.sent) < flush_bytes:
                    await asyncio.sleep(linger - since)
                    continue
                entries = buffer.after(call.sent, FRAME_ENTRIES)
                if hidden:
                    entries = [project(e, hidden) for e in entries]
                frame, count = _pack(publisher.epoch, entries, settings.live_max_frame_bytes)
                call.sent += count
                last_write = last_batch = time.monotonic()
                yield frame
                continue
            if not ready_sent and self._feeds_ready(publisher):
                ready_sent = True
                last_write = time.monotonic()
                yield self._stream_ready(publisher, call, resumed=resumed)
                continue
            # A feed becoming ready wakes the call too (``Publisher.wake``).
            timeout = interval - (time.monotonic() - last_write)
            if timeout > 0:
                await _wait(call.wakeup, timeout)
                continue
            last_write = time.monotonic()
            yield frame_bytes(
                livestream_pb2.DeviceLinkResponse(
                    heartbeat=livestream_pb2.ServerHeartbeat(
                        epoch=publisher.epoch,
                        latest_sequence=call.sent,
                        server_time_unix_ms=int(time.time() * 1000),
                    )
                )
            )

    def _stream_ready(self, publisher: Publisher, call: BoundCall, *, resumed: bool) -> bytes:
        settings = self._settings
        return frame_bytes(
            livestream_pb2.DeviceLinkResponse(
                stream_ready=livestream_pb2.StreamReady(
                    protocol_revision=CURRENT_REVISION,
                    epoch=publisher.epoch,
                    resumed=resumed and not call.epoch_changed,
                    latest_sequence=call.sent,
                    limits=livestream_pb2.LinkLimits(
                        safe_delivery_bytes=settings.live_safe_delivery_bytes,
                        max_frame_bytes=settings.live_max_frame_bytes,
                        replay_budget_bytes=settings.live_replay_budget_bytes,
                        heartbeat_interval_ms=int(settings.live_heartbeat_interval_seconds * 1000),
                        publisher_retention_ms=int(
                            settings.live_publisher_retention_seconds * 1000
                        ),
                    ),
                    server_time_unix_ms=int(time.time() * 1000),
                )
            )
        )

    async def _read(
        self,
        requests: AsyncIterator[livestream_pb2.DeviceLinkRequest],
        publisher: Publisher,
        call: BoundCall,
    ) -> None:
        try:
            async for request in requests:
                if call.close_error is not None:
                    return
                self._apply(request, publisher, call)
        except DomainError as error:
            call.close(error)
            return
        except Exception:
            log.exception("DeviceLink request handling failed")
            call.close(internal_error())
            return
        # A half-close only means the device has nothing more to say; deliveries go on
        # until it cancels the call (a read error is the call going away: the sender ends).

    def _apply(
        self, request: livestream_pb2.DeviceLinkRequest, publisher: Publisher, call: BoundCall
    ) -> None:
        kind = request.WhichOneof("kind")
        if kind == "heartbeat":
            publisher.acknowledge(request.heartbeat.epoch, request.heartbeat.last_sequence)
        elif kind == "attach":
            attach = request.attach
            self._check_revision("attach", attach.binding_id, attach.revision, publisher)
            _check_id(attach.session_id, "attach.session_id")
            if attach.HasField("caller_turn_id"):
                _check_id(attach.caller_turn_id, "attach.caller_turn_id")
            if (
                attach.workspace_id not in publisher.key.workspace_ids
                or not call.principal.may_access(attach.workspace_id)
            ):
                raise PermissionDenied(
                    f"workspace {attach.workspace_id!r} is outside this link's scope",
                    reason="WORKSPACE_SCOPE_MISMATCH",
                    metadata={"workspace_id": attach.workspace_id},
                )
            attachments.attach(
                publisher,
                attach,
                self._registry.source,
                safe_bytes=self._settings.live_safe_delivery_bytes,
            )
        elif kind == "detach":
            detach = request.detach
            self._check_revision("detach", detach.binding_id, detach.revision, publisher)
            attachments.detach(publisher, detach)
        elif kind == "hello":
            raise protocol_violation("hello", "a DeviceLink sends exactly one hello")
        else:
            raise protocol_violation("kind", "a request must set exactly one known kind")

    def _check_revision(
        self, what: str, binding_id: str, revision: int, publisher: Publisher
    ) -> None:
        _check_id(binding_id, f"{what}.binding_id")
        binding = publisher.bindings.get(binding_id)
        if binding is None and len(publisher.bindings) >= MAX_BINDINGS:
            raise protocol_violation(
                f"{what}.binding_id", f"a publisher holds at most {MAX_BINDINGS} bindings"
            )
        last = binding.revision if binding is not None else 0
        if not last < revision <= MAX_SEQUENCE:
            raise protocol_violation(
                f"{what}.revision", f"must be positive and greater than the binding's last ({last})"
            )
