"""Sources of ``bench.live_bench``: the runtime/producer and the bare fan-out server.

* :class:`Producer` (its own process) is the runtime on Host's ``RuntimeLink`` (it sets up
  a target, a Session and a running Turn first), and the producer of both baselines: the
  same ``RuntimeLinkRequest`` delta batches go to the bare server's ingest stream, and the
  same deltas, one ``Delivery`` per message, are published to NATS (core or JetStream).
* :class:`BareServer` (its own process) is the bare ``grpc.aio`` baseline: every delta it
  ingests is encoded once as a one-delivery ``DeviceLinkResponse`` and written as its own
  message to every open server-stream (no batching, no coalescing, no replay). Its
  *batched* variant (``BatchedStream`` / ``IngestBatched``) writes each ingested frame's
  deltas as one multi-delivery message instead: what batching alone buys on this transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import nats
from nats.js import api as js_api

from agentactivity.host.v1 import runtime_pb2
from agentactivity.livestream.v1 import livestream_pb2
from bench.live_bench_common import SESSION, TARGET, WORKSPACE, op_text, text_delta
from bench.running_turn import open_running_turn

__all__ = ["BareServer", "Producer"]

_BYTES = {"request_serializer": bytes, "response_deserializer": bytes}


class Producer:
    """Command handler of the producer process (see the module docstring)."""

    def __init__(self) -> None:
        self.turn_id = "t-bench"
        self._host_channel: grpc.aio.Channel | None = None
        self._link: Any = None
        self._bare_channel: grpc.aio.Channel | None = None
        self._ingest: Any = None
        self._ingest_batched: Any = None
        self._nats: Any = None
        self._nats_sequence = 0
        self._tasks: list[asyncio.Task[None]] = []

    # ---- setup --------------------------------------------------------------------------------

    async def cmd_setup_host(self, address: str, admin_token: str, service_token: str) -> str:
        """Target, Session, runtime link and a running Turn on Host; returns the Turn id."""
        self._host_channel = grpc.aio.insecure_channel(address)
        running = await open_running_turn(
            self._host_channel,
            admin_token,
            service_token,
            workspace=WORKSPACE,
            session=SESSION,
            target=TARGET,
        )
        self._link = running.link
        self._tasks.append(running.reader)
        self.turn_id = running.turn_id
        return self.turn_id

    async def cmd_connect_bare(self, address: str) -> None:
        """Open the two ingest streams of the bare server."""
        self._bare_channel = grpc.aio.insecure_channel(address)
        self._ingest = self._bare_channel.stream_unary("/bench.Bare/Ingest", **_BYTES)()
        self._ingest_batched = self._bare_channel.stream_unary(
            "/bench.Bare/IngestBatched", **_BYTES
        )()

    async def cmd_connect_nats(self, url: str) -> None:
        """Connect to nats-server."""
        self._nats = await nats.connect(url, allow_reconnect=False)

    # ---- sending ------------------------------------------------------------------------------

    async def cmd_send(
        self,
        system: str,
        first_index: int,
        count: int,
        width: int,
        batch: int = 1,
        rate: float | None = None,
        subject: str = "live.ws-bench",
        at_ns: int | None = None,
    ) -> dict[str, int]:
        """Send ``count`` deltas (op indexes from ``first_index``), ``batch`` per frame.

        Paced at ``rate`` deltas/s (as fast as the transport takes them when ``None``).

        ``system`` is ``live`` (RuntimeLink to Host), ``bare`` (the bare server's ingest,
        the same frames), ``bare_batched`` (its batched ingest, the same frames) or
        ``nats`` (one ``Delivery`` message per delta on ``subject``).
        With ``at_ns`` the first one is sent at that ``perf_counter_ns`` instant.
        """
        if at_ns is not None:
            await asyncio.sleep(max(0.0, (at_ns - time.perf_counter_ns()) / 1e9))
        started = time.perf_counter_ns()
        sent = 0
        while sent < count:
            size = min(batch, count - sent)
            if rate is not None:
                due = started + int((sent / rate) * 1e9)
                delay = (due - time.perf_counter_ns()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
            deltas = [
                text_delta(self.turn_id, op_text(first_index + sent + k, width))
                for k in range(size)
            ]
            if system == "nats":
                for delta in deltas:
                    self._nats_sequence += 1
                    await self._nats.publish(
                        subject,
                        livestream_pb2.Delivery(
                            sequence=self._nats_sequence, message_delta=delta
                        ).SerializeToString(),
                    )
            else:
                frame = runtime_pb2.RuntimeLinkRequest(
                    deltas=runtime_pb2.MessageDeltaBatch(deltas=deltas)
                )
                if system == "live":
                    await self._link.write(frame)
                elif system == "bare_batched":
                    await self._ingest_batched.write(frame.SerializeToString())
                else:
                    await self._ingest.write(frame.SerializeToString())
            sent += size
        if system == "nats":
            await self._nats.flush()
        return {"start_ns": started, "end_ns": time.perf_counter_ns()}

    # ---- JetStream ------------------------------------------------------------------------------

    async def cmd_js_fill(self, stream: str, subject: str, payloads: list[bytes]) -> dict[str, int]:
        """Append ``payloads`` to a memory JetStream stream (created when missing).

        Returns the stream sequence of the first one.
        """
        js = self._nats.jetstream()
        with contextlib.suppress(Exception):
            await js.add_stream(
                name=stream, subjects=[f"{stream}.>"], storage=js_api.StorageType.MEMORY
            )
        first = 0
        for payload in payloads:
            ack = await js.publish(subject, payload)
            first = first or ack.seq
        return {"first_sequence": first, "messages": len(payloads)}

    async def close(self) -> None:
        """Close every connection."""
        for task in self._tasks:
            task.cancel()
        if self._link is not None:
            self._link.cancel()
        for ingest in (self._ingest, self._ingest_batched):
            if ingest is not None:
                ingest.cancel()
        for channel in (self._host_channel, self._bare_channel):
            if channel is not None:
                await channel.close()
        if self._nats is not None:
            with contextlib.suppress(Exception):
                await self._nats.close()


class BareServer:
    """Command handler of the bare fan-out server process (see the module docstring)."""

    def __init__(self) -> None:
        self._server: grpc.aio.Server | None = None
        self._queues: set[asyncio.Queue[bytes]] = set()
        self._batched_queues: set[asyncio.Queue[bytes]] = set()
        self._sequence = 0
        self._batched_sequence = 0
        self._ready = livestream_pb2.DeviceLinkResponse(
            stream_ready=livestream_pb2.StreamReady(epoch="bare")
        ).SerializeToString()

    async def cmd_start(self) -> int:
        """Start serving on 127.0.0.1 port 0; returns the port."""
        handler = grpc.method_handlers_generic_handler(
            "bench.Bare",
            {
                "Stream": grpc.unary_stream_rpc_method_handler(
                    self._stream, request_deserializer=bytes, response_serializer=bytes
                ),
                "Ingest": grpc.stream_unary_rpc_method_handler(
                    self._ingest, request_deserializer=bytes, response_serializer=bytes
                ),
                "BatchedStream": grpc.unary_stream_rpc_method_handler(
                    self._batched_stream, request_deserializer=bytes, response_serializer=bytes
                ),
                "IngestBatched": grpc.stream_unary_rpc_method_handler(
                    self._ingest_batched, request_deserializer=bytes, response_serializer=bytes
                ),
            },
        )
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers((handler,))
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return port

    async def cmd_streams(self) -> int:
        """How many server-streams are open."""
        return len(self._queues)

    async def _stream(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        async for frame in self._serve(self._queues):
            yield frame

    async def _batched_stream(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        async for frame in self._serve(self._batched_queues):
            yield frame

    async def _serve(self, queues: set[asyncio.Queue[bytes]]) -> AsyncIterator[bytes]:
        pending: asyncio.Queue[bytes] = asyncio.Queue()
        queues.add(pending)
        try:
            yield self._ready
            while True:
                yield await pending.get()
        finally:
            queues.discard(pending)

    async def _ingest(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        async for raw in requests:
            frame = runtime_pb2.RuntimeLinkRequest.FromString(raw)
            for delta in frame.deltas.deltas:
                self._sequence += 1
                encoded = livestream_pb2.DeviceLinkResponse(
                    deliveries=livestream_pb2.DeliveryBatch(
                        epoch="bare",
                        deliveries=[
                            livestream_pb2.Delivery(sequence=self._sequence, message_delta=delta)
                        ],
                    )
                ).SerializeToString()
                for pending in self._queues:
                    pending.put_nowait(encoded)
        return b""

    async def _ingest_batched(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        async for raw in requests:
            frame = runtime_pb2.RuntimeLinkRequest.FromString(raw)
            batch = livestream_pb2.DeliveryBatch(epoch="bare")
            for delta in frame.deltas.deltas:
                self._batched_sequence += 1
                batch.deliveries.add(sequence=self._batched_sequence).message_delta.CopyFrom(delta)
            encoded = livestream_pb2.DeviceLinkResponse(deliveries=batch).SerializeToString()
            for pending in self._batched_queues:
                pending.put_nowait(encoded)
        return b""

    async def close(self) -> None:
        """Stop serving."""
        if self._server is not None:
            await self._server.stop(0)
