"""The cross-replica live log on NATS JetStream (``TUTTI_BUS=nats``, SCALE-3, ADR 0036).

One stream (``TUTTI_LIVE_LOG_STREAM``) holds one subject per workspace
(``<prefix>.<workspace token>``), bounded by count, bytes and age with the oldest discarded
first. A publication is a JetStream publish with ``Nats-Msg-Id`` that returns only after the
stream's acknowledgement. A subscription is an ephemeral push consumer on the workspace's
subject that starts at a stream sequence; this module (not the client's ordered-consumer
mode, whose reset silently starts at the next retained message) re-establishes it from its
cursor whenever the consumer sequence skips, heartbeats stop or the connection comes back,
and checks the cursor first, so anything that may be missing becomes a typed
:class:`~livelog.interface.Discontinuity`.

A publication that fails marks its workspace: the next successful publication to it is
preceded by a gap record, which subscribers see as ``PUBLISH_FAILED`` — items a publisher
could not publish while the bus was unreachable are never silently absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Generator
from typing import Any, Generic, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from livelog.codec import Codec, ItemDecodeError
from livelog.cursor import start_after
from livelog.interface import (
    Discontinuity,
    DiscontinuityReason,
    LiveLogUnavailable,
    LogEntry,
    LogPosition,
    PublishAck,
)
from livelog.settings import LiveLogSettings
from livelog.subjects import workspace_subject

__all__ = ["JetStreamLiveLog"]

_log = logging.getLogger(__name__)

T = TypeVar("T")

MSG_ID = "Nats-Msg-Id"
GAP_HEADER = "Tutti-Gap"
"""Header of a gap record: a publisher failed to publish items of this subject before it."""

_STATUS = "Status"
_LAST_CONSUMER = "Nats-Last-Consumer"
_CONSUMER_STALLED = "Nats-Consumer-Stalled"
_LAST_STREAM = "Nats-Last-Stream"
# Errors the client raises when the server cannot be reached or does not answer in time.
_UNAVAILABLE = (
    TimeoutError,
    nats.errors.Error,
    nats.js.errors.Error,
    OSError,
)
_MAX_IN_FLIGHT = 4_000
"""Sent publications awaiting acknowledgement per connection (the client's own bound)."""
_PENDING_MSGS = 65_536
_PENDING_BYTES = 64 * 1024 * 1024


class JetStreamLiveLog(Generic[T]):
    """The live log on one NATS connection; create it with :meth:`connect`."""

    def __init__(self, settings: LiveLogSettings, codec: Codec[T], client: NatsClient) -> None:
        self._settings = settings
        self._codec = codec
        self._nc = client
        self._js: JetStreamContext = client.jetstream(
            timeout=settings.live_log_publish_timeout_seconds
        )
        self._stream = settings.live_log_stream
        self.epoch = ""
        self._lost: set[str] = set()
        self._subscriptions: set[_JetStreamSubscription[T]] = set()
        self._stream_checked = asyncio.Event()
        self._closed = False

    @classmethod
    async def connect(
        cls, settings: LiveLogSettings, codec: Codec[T], *, name: str = "tutti-livelog"
    ) -> JetStreamLiveLog[T]:
        """Connect to ``settings.nats_url`` and make sure the stream exists with its bounds.

        Raises:
            LiveLogUnavailable: the server cannot be reached within
                ``settings.nats_connect_timeout_seconds``.
        """
        holder: dict[str, JetStreamLiveLog[T]] = {}
        # The last error of the first connection's attempts, for the one line that says why.
        first_attempts: list[Exception] = []

        async def reconnected() -> None:
            log = holder.get("log")
            if log is not None:
                log._on_reconnected()

        async def disconnected() -> None:
            log = holder.get("log")
            if log is not None and not log._closed:
                _log.warning("live log: NATS connection lost; reconnecting")

        async def error(err: Exception) -> None:
            if "log" not in holder:
                # Attempts of the first connection: the bound below ends them with one line.
                first_attempts[:] = [err]
                _log.debug("live log: NATS connect attempt failed: %s", err)
                return
            _log.warning("live log: NATS error: %s", err)

        bound = settings.nats_connect_timeout_seconds
        # The client retries the first connection without end (allow_reconnect with
        # max_reconnect_attempts=-1, which later outages need), so the first connection and
        # the stream check are bounded here: past the bound the caller fails to start and
        # its orchestrator restarts it, instead of a process that is never ready.
        client = NatsClient()
        deadline = asyncio.timeout(bound)
        _log.info("live log: connecting to NATS at %s (up to %g s)", settings.nats_url, bound)
        try:
            async with deadline:
                await client.connect(
                    servers=[url.strip() for url in settings.nats_url.split(",") if url.strip()],
                    name=name,
                    # No reconnect buffer: a publication while the connection is down fails
                    # at once (typed) instead of being sent later, after items published since.
                    pending_size=0,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    # nats-py annotates this int but sleeps for it as seconds (a float).
                    reconnect_time_wait=0.25,  # type: ignore[arg-type]
                    connect_timeout=2,
                    reconnected_cb=reconnected,
                    disconnected_cb=disconnected,
                    error_cb=error,
                )
                log = cls(settings, codec, client)
                holder["log"] = log
                await log._ensure_stream()
        except TimeoutError as err:
            await _close_quietly(client)
            if not deadline.expired():  # the server answered a request too late, not the bound
                raise LiveLogUnavailable(f"NATS at {settings.nats_url}: {err!r}") from err
            last = f": {first_attempts[-1]}" if first_attempts else ""
            raise LiveLogUnavailable(
                f"NATS at {settings.nats_url} unreachable within {bound:g} s{last}"
            ) from err
        except _UNAVAILABLE as err:
            await _close_quietly(client)
            raise LiveLogUnavailable(f"NATS at {settings.nats_url} unreachable: {err}") from err
        except BaseException:
            # Cancelled (a stop signal during the wait) or a failure of the stream check.
            await _close_quietly(client)
            raise
        return log

    def _stream_config(self) -> api.StreamConfig:
        settings = self._settings
        return api.StreamConfig(
            name=self._stream,
            subjects=[f"{settings.live_log_subject_prefix}.>"],
            retention=api.RetentionPolicy.LIMITS,
            discard=api.DiscardPolicy.OLD,
            max_msgs=settings.live_log_max_msgs,
            max_bytes=settings.live_log_max_bytes,
            max_age=settings.live_log_max_age_seconds,
            duplicate_window=min(
                settings.live_log_duplicate_window_seconds, settings.live_log_max_age_seconds
            ),
            storage=(
                api.StorageType.FILE
                if settings.live_log_storage == "file"
                else api.StorageType.MEMORY
            ),
            num_replicas=settings.live_log_replicas,
            allow_direct=True,
        )

    async def _ensure_stream(self) -> None:
        """Create the stream, or bring an existing one to the configured bounds; read its epoch."""
        config = self._stream_config()
        try:
            try:
                info = await self._js.add_stream(config)
            except nats.js.errors.BadRequestError:
                # The stream exists with other bounds (err_code 10058): apply ours.
                info = await self._js.update_stream(config)
        except _UNAVAILABLE as err:
            raise LiveLogUnavailable(f"stream {self._stream} unavailable: {err}") from err
        self.epoch = _epoch_of(info)
        self._stream_checked.set()

    def _on_reconnected(self) -> None:
        # The server may have restarted without the stream (memory storage): check it again
        # before the next publication, which then carries the stream's current epoch.
        self._stream_checked.clear()
        for subscription in tuple(self._subscriptions):
            subscription.request_reset()

    async def _ready(self) -> None:
        if self._closed:
            raise LiveLogUnavailable("the live log is closed")
        if not self._stream_checked.is_set():
            await self._ensure_stream()

    async def stream_state(self) -> tuple[str, int, int]:
        """``(epoch, first_sequence, last_sequence)`` of the stream now.

        Raises:
            LiveLogUnavailable: the server cannot be reached.
        """
        try:
            try:
                info = await self._js.stream_info(self._stream)
            except nats.js.errors.NotFoundError:
                # Lost with a memory-storage restart: recreate it (a new epoch).
                await self._ensure_stream()
                info = await self._js.stream_info(self._stream)
        except _UNAVAILABLE as err:
            raise LiveLogUnavailable(f"stream {self._stream} unavailable: {err}") from err
        epoch = _epoch_of(info)
        self.epoch = epoch
        return epoch, info.state.first_seq, info.state.last_seq

    async def _mark_gap_if_lost(self, workspace_id: str, subject: str) -> None:
        """Before a workspace's next publication after a failed one, publish its gap record."""
        if workspace_id in self._lost:
            await self._js.publish(
                subject,
                b"",
                stream=self._stream,
                headers={MSG_ID: f"gap:{uuid.uuid4().hex}", GAP_HEADER: "publish_failed"},
            )
            self._lost.discard(workspace_id)

    async def publish(self, workspace_id: str, item: T, msg_id: str) -> PublishAck:
        """Publish and wait for JetStream's acknowledgement; see :class:`~livelog.LiveLog`."""
        subject = workspace_subject(self._settings.live_log_subject_prefix, workspace_id)
        data = self._codec.encode(item)
        try:
            await self._ready()
            await self._mark_gap_if_lost(workspace_id, subject)
            ack = await self._js.publish(
                subject, data, stream=self._stream, headers={MSG_ID: msg_id}
            )
        except LiveLogUnavailable:
            self._lost.add(workspace_id)
            raise
        except _UNAVAILABLE as err:
            self._lost.add(workspace_id)
            if isinstance(err, nats.js.errors.NoStreamResponseError):
                self._stream_checked.clear()
            raise LiveLogUnavailable(f"publish to {subject} failed: {err!r}") from err
        return PublishAck(LogPosition(self.epoch, ack.seq), duplicate=bool(ack.duplicate))

    async def send(self, workspace_id: str, item: T, msg_id: str) -> Awaitable[PublishAck]:
        """Write the publication now (in order on this connection); acknowledge later.

        A failed or late acknowledgement marks the workspace like a failed
        :meth:`publish`: its next publication is preceded by a gap record.
        """
        subject = workspace_subject(self._settings.live_log_subject_prefix, workspace_id)
        data = self._codec.encode(item)
        try:
            await self._ready()
            await self._mark_gap_if_lost(workspace_id, subject)
            if self._js.publish_async_pending() >= _MAX_IN_FLIGHT:
                # Refused rather than queued: the client's own wait for a free slot costs a
                # task per call (it measured 3-5x slower), and acknowledgements this far
                # behind mean the server is not keeping up.
                raise LiveLogUnavailable(f"{_MAX_IN_FLIGHT} publications await acknowledgement")
            pending = await self._js.publish_async(
                subject, data, stream=self._stream, headers={MSG_ID: msg_id}
            )
        except LiveLogUnavailable:
            self._lost.add(workspace_id)
            raise
        except _UNAVAILABLE as err:
            self._lost.add(workspace_id)
            raise LiveLogUnavailable(f"send to {subject} failed: {err!r}") from err
        # No task per send (it measured slower than the publication itself): the wait
        # happens when the caller awaits, and an acknowledgement already in costs nothing.
        return _PendingAck(self, workspace_id, subject, pending)

    async def subscribe(
        self, workspace_id: str, after: LogPosition | None
    ) -> _JetStreamSubscription[T]:
        """Subscribe from ``after`` (established on return); see :class:`~livelog.LiveLog`."""
        subject = workspace_subject(self._settings.live_log_subject_prefix, workspace_id)
        if self._closed:
            raise LiveLogUnavailable("the live log is closed")
        subscription = _JetStreamSubscription(self, workspace_id, subject, after)
        await subscription.start()
        self._subscriptions.add(subscription)
        return subscription

    async def close(self) -> None:
        """End every subscription and close the connection."""
        self._closed = True
        for subscription in tuple(self._subscriptions):
            await subscription.close()
        with contextlib.suppress(*_UNAVAILABLE):
            await self._nc.drain()

    @property
    def client(self) -> NatsClient:
        """The NATS connection (tests and benchmarks)."""
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        """The JetStream context (tests and benchmarks)."""
        return self._js


class _PendingAck:
    """The acknowledgement of one sent publication, converted when awaited."""

    def __init__(
        self,
        log: JetStreamLiveLog[Any],
        workspace_id: str,
        subject: str,
        pending: asyncio.Future[api.PubAck],
    ) -> None:
        self._log = log
        self._workspace_id = workspace_id
        self._subject = subject
        self._pending = pending

    def __await__(self) -> Generator[Any, None, PublishAck]:
        return self._wait().__await__()

    async def _wait(self) -> PublishAck:
        log = self._log
        try:
            if self._pending.done():
                ack = self._pending.result()
            else:
                ack = await asyncio.wait_for(
                    self._pending, log._settings.live_log_publish_timeout_seconds
                )
        except _UNAVAILABLE as err:
            # wait_for cancelled the client's future on a timeout, which frees its slot.
            log._lost.add(self._workspace_id)
            raise LiveLogUnavailable(f"no acknowledgement from {self._subject}: {err!r}") from err
        return PublishAck(LogPosition(log.epoch, ack.seq), duplicate=bool(ack.duplicate))


def _epoch_of(info: api.StreamInfo) -> str:
    created = info.created.isoformat() if info.created is not None else "unknown"
    return f"{info.config.name}@{created}"


class _JetStreamSubscription(Generic[T]):
    """One workspace's entries through an ephemeral push consumer it re-creates as needed."""

    def __init__(
        self,
        log: JetStreamLiveLog[T],
        workspace_id: str,
        subject: str,
        after: LogPosition | None,
    ) -> None:
        self.workspace_id = workspace_id
        self._log = log
        self._subject = subject
        self._after = after
        self._last = after
        """The last position the subscriber was given (reported with a discontinuity)."""
        self._resume: LogPosition | None = after
        """Where a re-establishment continues: the last entry, or further when a heartbeat
        said the consumer had looked past it (the workspace had nothing there)."""
        self._identity: tuple[int, str] | None = None
        """``(sequence, message id)`` of the last entry, checked when re-establishing."""
        self._pending: deque[Discontinuity] = deque()
        self._sub: Subscription | None = None
        self._consumer: str | None = None
        self._consumer_sequence = 0
        self._epoch = ""
        self._reset_requested = False
        self._closed = False

    async def start(self) -> None:
        """Check the cursor and create the consumer (raises ``LiveLogUnavailable``)."""
        await self._establish(self._after)

    def request_reset(self) -> None:
        """Re-establish from the cursor at the next read (the connection came back)."""
        self._reset_requested = True

    async def _establish(self, after: LogPosition | None) -> None:
        log = self._log
        epoch, first, last = await log.stream_state()
        reason, next_sequence = start_after(
            after, epoch=epoch, first_sequence=first, last_sequence=last
        )
        # The last entry must still be the one this subscriber saw: a server that lost
        # acknowledged items (no fsync before a crash) would reuse their sequences.
        identity = self._identity
        if (
            reason is None
            and identity is not None
            and identity[0] >= first
            and await self._message_id_at(identity[0]) != identity[1]
        ):
            reason, next_sequence = DiscontinuityReason.CURSOR_REWRITTEN, identity[0] + 1
        if reason is not None:
            self._pending.append(Discontinuity(self.workspace_id, reason, self._last))
            self._identity = None
        self._epoch = epoch
        # From here on a re-establishment continues exactly here, even before any entry
        # arrives (a new-only subscription must not skip what is published meanwhile).
        self._resume = LogPosition(epoch, next_sequence - 1)
        await self._teardown()
        inbox = log.client.new_inbox()
        try:
            self._sub = await log.client.subscribe(
                inbox, pending_msgs_limit=_PENDING_MSGS, pending_bytes_limit=_PENDING_BYTES
            )
        except _UNAVAILABLE as err:
            raise LiveLogUnavailable(f"subscription to {inbox} failed: {err!r}") from err
        heartbeat = log._settings.live_log_heartbeat_seconds
        config = api.ConsumerConfig(
            deliver_subject=inbox,
            filter_subject=self._subject,
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=max(1, next_sequence),
            ack_policy=api.AckPolicy.NONE,
            max_deliver=1,
            flow_control=True,
            idle_heartbeat=heartbeat,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=max(5.0, heartbeat * 10),
        )
        try:
            info = await log.js.add_consumer(log._stream, config=config)
        except _UNAVAILABLE as err:
            await self._teardown()
            raise LiveLogUnavailable(f"consumer on {self._subject} failed: {err!r}") from err
        self._consumer = info.name
        self._consumer_sequence = 0
        self._reset_requested = False

    async def _message_id_at(self, sequence: int) -> str | None:
        if sequence < 1:
            return None
        try:
            message = await self._log.js.get_msg(self._log._stream, sequence)
        except nats.js.errors.NotFoundError:
            return None
        except _UNAVAILABLE as err:
            raise LiveLogUnavailable(f"read of sequence {sequence} failed: {err!r}") from err
        headers = message.headers or {}
        return headers.get(MSG_ID)

    async def _teardown(self) -> None:
        sub, consumer = self._sub, self._consumer
        self._sub = None
        self._consumer = None
        if sub is not None:
            with contextlib.suppress(*_UNAVAILABLE):
                await sub.unsubscribe()
        if consumer is not None and self._log.client.is_connected:
            with contextlib.suppress(*_UNAVAILABLE):
                await self._log.js.delete_consumer(self._log._stream, consumer)

    async def _reset(self) -> None:
        """Re-establish from the cursor, retrying while the server is unreachable."""
        delay = 0.1
        while not self._closed:
            try:
                await self._establish(self._resume)
                return
            except LiveLogUnavailable as err:
                _log.info("live log: resubscribing %s: %s", self._subject, err)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def __aiter__(self) -> AsyncIterator[LogEntry[T] | Discontinuity]:
        return self

    async def __anext__(self) -> LogEntry[T] | Discontinuity:
        # Two missed heartbeats mean the consumer or the connection is gone.
        silence = self._log._settings.live_log_heartbeat_seconds * 2.5
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._pending:
                return self._pending.popleft()
            if self._reset_requested or self._sub is None:
                await self._reset()
                continue
            try:
                message = await self._sub.next_msg(timeout=silence)
            except _UNAVAILABLE:
                self._reset_requested = True
                continue
            event = await self._handle(message)
            if event is not None:
                return event

    async def _handle(self, message: Msg) -> LogEntry[T] | Discontinuity | None:
        headers = message.headers or {}
        if headers.get(_STATUS) == "100":
            # Flow control: the server waits for an answer to the request's reply subject, or
            # to the one a heartbeat names when the consumer stalled on a lost answer.
            answer_to = message.reply or headers.get(_CONSUMER_STALLED)
            if answer_to:
                with contextlib.suppress(*_UNAVAILABLE):
                    await self._log.client.publish(answer_to, b"")
            last_consumer = headers.get(_LAST_CONSUMER)
            if last_consumer is not None and int(last_consumer) != self._consumer_sequence:
                self._reset_requested = True  # the heartbeat says we missed deliveries
                return None
            self._advance_watermark(headers.get(_LAST_STREAM))
            return None
        if headers.get(_STATUS) or not message.reply:
            self._reset_requested = True  # e.g. the consumer was deleted
            return None
        metadata = message.metadata
        if metadata.sequence.consumer != self._consumer_sequence + 1:
            # A delivery was dropped (a slow subscriber over its pending limits): resume
            # from the cursor, which still names the last entry returned.
            self._reset_requested = True
            return None
        self._consumer_sequence = metadata.sequence.consumer
        position = LogPosition(self._epoch, metadata.sequence.stream)
        previous = self._last
        self._last = self._resume = position
        msg_id = headers.get(MSG_ID, "")
        self._identity = (position.sequence, msg_id)
        if headers.get(GAP_HEADER):
            return Discontinuity(
                self.workspace_id, DiscontinuityReason.PUBLISH_FAILED, previous, position
            )
        try:
            item = self._log._codec.decode(message.data)
        except ItemDecodeError as err:
            # Not an item of this log (another writer, a newer version): skip it and keep the
            # position, so the subscription goes on with the items after it.
            _log.warning(
                "live log: undecodable item %s at %s seq %d skipped: %s",
                msg_id or "(no id)",
                self._subject,
                position.sequence,
                err,
            )
            return None
        return LogEntry(self.workspace_id, position, msg_id, item)

    def _advance_watermark(self, last_stream: str | None) -> None:
        """Move the resume point to what the consumer has looked at (a heartbeat said so).

        A filtered consumer's heartbeat names the last stream sequence it considered; with
        every delivery received, the workspace has no item up to there. Resuming from it
        keeps a quiet workspace's subscriber from reporting an eviction of other
        workspaces' items after a reconnect.
        """
        if last_stream is None or self._resume is None:
            return
        considered = int(last_stream)
        if considered > self._resume.sequence:
            self._resume = LogPosition(self._epoch, considered)

    @property
    def resume_position(self) -> LogPosition | None:
        """Where a re-establishment would continue (tests, metrics)."""
        return self._resume

    async def close(self) -> None:
        """Stop the subscription and delete its consumer."""
        if self._closed:
            return
        self._closed = True
        self._log._subscriptions.discard(self)
        await self._teardown()


async def _close_quietly(client: NatsClient) -> None:
    """Close a client whose first connection did not complete (its tasks end with it)."""
    with contextlib.suppress(Exception):
        await client.close()
