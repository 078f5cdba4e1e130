"""Processes of ``bench.activity_bench``: the runtime/producer, the consumer, the bare relay.

Each runs in its own spawned process as a command handler of
:class:`bench.live_bench_procs.Worker` (the parent calls ``cmd_*`` coroutines over a pipe):

* :class:`Producer` is the runtime on Host's ``RuntimeLink`` (target, Session, a running Turn)
  and the producer of the baseline: the same ``RuntimeLinkRequest`` frames, one text delta
  each, go either to Host or to the bare relay's ``Ingest`` bidi stream.
* :class:`Consumer` reads ``WatchActivity`` from Host, or the bare relay's server-stream of
  the same ``WatchActivityResponse`` messages, and records each delta's latency.
* :class:`BareRelay` is the baseline: a bare ``grpc.aio`` server with Host's hops and nothing
  else. Each ingested frame is decoded, each of its deltas is wrapped in a
  ``WatchActivityResponse`` and encoded once, and the bytes are written to every open
  server-stream (an unbounded queue per stream: no checks, no broker, no bound).

Every delta's text is ``"<send perf_counter_ns>|<index>|"`` plus padding; ``perf_counter_ns``
is CLOCK_MONOTONIC, so it compares across the processes of one machine. Both sides use
generated protobuf (de)serializers and default channel and server options.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from agentactivity.host.v1 import (
    activity_pb2,
    host_pb2,
    host_pb2_grpc,
    runtime_pb2,
)
from bench.live_bench_common import SESSION, TARGET, WORKSPACE, text_delta
from bench.running_turn import open_running_turn

__all__ = ["BareRelay", "Consumer", "Producer"]

PADDING = "x" * 48
BARE_INGEST = "/bench.Bare/Ingest"
BARE_STREAM = "/bench.Bare/Stream"


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _frame(turn_id: str, index: int) -> runtime_pb2.RuntimeLinkRequest:
    """One runtime frame carrying one text delta stamped with its send time."""
    return runtime_pb2.RuntimeLinkRequest(
        deltas=runtime_pb2.MessageDeltaBatch(
            deltas=[text_delta(turn_id, f"{time.perf_counter_ns()}|{index}|{PADDING}")]
        )
    )


class Producer:
    """Command handler of the producer process (see the module docstring)."""

    def __init__(self) -> None:
        self.turn_id = "t-bench"
        self._channels: list[grpc.aio.Channel] = []
        self._links: dict[str, Any] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def cmd_setup_host(self, address: str, admin_token: str, service_token: str) -> str:
        """Target, Session, runtime link and a running Turn on Host; returns the Turn id."""
        channel = grpc.aio.insecure_channel(address)
        self._channels.append(channel)
        running = await open_running_turn(
            channel,
            admin_token,
            service_token,
            workspace=WORKSPACE,
            session=SESSION,
            target=TARGET,
        )
        self._links["host"] = running.link
        self._tasks.append(running.reader)
        self.turn_id = running.turn_id
        return self.turn_id

    async def cmd_connect_bare(self, address: str) -> None:
        """Open the bare relay's ingest stream (bidi, like ``RuntimeLink``)."""
        channel = grpc.aio.insecure_channel(address)
        self._channels.append(channel)
        self._links["bare"] = channel.stream_stream(
            BARE_INGEST,
            request_serializer=runtime_pb2.RuntimeLinkRequest.SerializeToString,
            response_deserializer=runtime_pb2.RuntimeLinkResponse.FromString,
        )()

    async def cmd_send(self, system: str, count: int, rate: float | None) -> dict[str, int]:
        """Send ``count`` one-delta frames to ``system`` (``host`` or ``bare``).

        Paced at ``rate`` frames/s, or as fast as the transport takes them when ``None``.
        """
        link = self._links[system]
        started = time.perf_counter_ns()
        for index in range(count):
            if rate is not None:
                delay = (started + int(index / rate * 1e9) - time.perf_counter_ns()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
            await link.write(_frame(self.turn_id, index))
        return {"start_ns": started, "end_ns": time.perf_counter_ns()}

    async def close(self) -> None:
        """Close every stream and channel."""
        for task in self._tasks:
            task.cancel()
        for link in self._links.values():
            link.cancel()
        for channel in self._channels:
            await channel.close()


class Consumer:
    """Command handler of the consumer process (see the module docstring)."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._tokens: dict[str, str] = {}
        self._reading: asyncio.Task[dict[str, Any]] | None = None
        self._call: Any = None

    async def cmd_connect(self, system: str, address: str, token: str = "") -> None:
        """Open a channel to ``system`` (``host`` or ``bare``)."""
        self._channels[system] = grpc.aio.insecure_channel(address)
        self._tokens[system] = token

    async def cmd_arm(self, system: str, count: int) -> None:
        """Open a stream, await its ready marker, then read ``count`` deltas in the background."""
        channel = self._channels[system]
        if system == "host":
            self._call = host_pb2_grpc.HostServiceStub(channel).WatchActivity(
                host_pb2.WatchActivityRequest(workspace_id=WORKSPACE),
                metadata=_bearer(self._tokens[system]),
            )
        else:
            self._call = channel.unary_stream(
                BARE_STREAM,
                request_serializer=host_pb2.WatchActivityRequest.SerializeToString,
                response_deserializer=host_pb2.WatchActivityResponse.FromString,
            )(host_pb2.WatchActivityRequest(workspace_id=WORKSPACE))
        first = await self._call.read()
        if first is grpc.aio.EOF or first.WhichOneof("item") != "ready":
            raise RuntimeError(f"{system}: the stream did not start with its ready marker")
        self._reading = asyncio.create_task(self._read(count))

    async def _read(self, count: int) -> dict[str, Any]:
        latencies: list[float] = []
        first_ns = last_ns = 0
        error = ""
        try:
            while len(latencies) < count:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    error = "the stream ended early"
                    break
                if response.WhichOneof("item") != "event":
                    continue
                if response.event.WhichOneof("event") != "message_delta":
                    continue
                now = time.perf_counter_ns()
                sent = int(response.event.message_delta.delta.text.split("|", 1)[0])
                latencies.append((now - sent) / 1e6)
                first_ns = first_ns or now
                last_ns = now
        except grpc.aio.AioRpcError as failure:
            error = f"{failure.code().name}: {failure.details()}"
        self._call.cancel()
        return {
            "latencies_ms": latencies,
            "first_ns": first_ns,
            "last_ns": last_ns,
            "error": error,
        }

    async def cmd_wait(self, seconds: float) -> dict[str, Any]:
        """The armed read's latencies and first/last receive times."""
        assert self._reading is not None
        try:
            return await asyncio.wait_for(self._reading, seconds)
        finally:
            self._reading = None

    async def close(self) -> None:
        """Close every channel."""
        for channel in self._channels.values():
            await channel.close()


class BareRelay:
    """Command handler of the bare relay process (see the module docstring)."""

    def __init__(self) -> None:
        self._server: grpc.aio.Server | None = None
        self._streams: set[asyncio.Queue[bytes]] = set()
        self._sequence = 0
        self._ready = host_pb2.WatchActivityResponse(
            ready=activity_pb2.ActivityStreamReady(workspace_id=WORKSPACE)
        ).SerializeToString()

    async def cmd_start(self) -> int:
        """Serve on 127.0.0.1 port 0 (default options); returns the port."""
        handler = grpc.method_handlers_generic_handler(
            "bench.Bare",
            {
                "Ingest": grpc.stream_stream_rpc_method_handler(
                    self._ingest,
                    request_deserializer=runtime_pb2.RuntimeLinkRequest.FromString,
                    response_serializer=runtime_pb2.RuntimeLinkResponse.SerializeToString,
                ),
                "Stream": grpc.unary_stream_rpc_method_handler(
                    self._stream,
                    request_deserializer=host_pb2.WatchActivityRequest.FromString,
                    response_serializer=bytes,
                ),
            },
        )
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers((handler,))
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        return port

    async def _stream(
        self, request: host_pb2.WatchActivityRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        pending: asyncio.Queue[bytes] = asyncio.Queue()
        self._streams.add(pending)
        try:
            yield self._ready
            while True:
                yield await pending.get()
        finally:
            self._streams.discard(pending)

    async def _ingest(
        self,
        requests: AsyncIterator[runtime_pb2.RuntimeLinkRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> None:
        # A coroutine handler (gRPC's reader/writer form): the relay answers nothing.
        async for frame in requests:
            for delta in frame.deltas.deltas:
                self._sequence += 1
                response = host_pb2.WatchActivityResponse()
                event = response.event
                event.event_id = self._sequence
                event.workspace_id = delta.workspace_id
                event.occurred_at_unix_ms = time.time_ns() // 1_000_000
                event.message_delta.delta.CopyFrom(delta)
                encoded = response.SerializeToString()
                for pending in self._streams:
                    pending.put_nowait(encoded)

    async def close(self) -> None:
        """Stop serving."""
        if self._server is not None:
            await self._server.stop(0)
