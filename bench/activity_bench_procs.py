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
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import (
    activity_pb2,
    host_pb2,
    host_pb2_grpc,
    runtime_pb2,
    runtime_pb2_grpc,
)

__all__ = ["BareRelay", "Consumer", "Producer"]

WORKSPACE = "ws-bench"
SESSION = "s-bench"
TARGET = "bench-target"
MESSAGE = "m-bench"
PADDING = "x" * 48
BARE_INGEST = "/bench.Bare/Ingest"
BARE_STREAM = "/bench.Bare/Stream"


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _frame(turn_id: str, index: int) -> runtime_pb2.RuntimeLinkRequest:
    """One runtime frame carrying one text delta stamped with its send time."""
    return runtime_pb2.RuntimeLinkRequest(
        deltas=runtime_pb2.MessageDeltaBatch(
            deltas=[
                canonical_pb2.MessageDelta(
                    workspace_id=WORKSPACE,
                    session_id=SESSION,
                    turn_id=turn_id,
                    message_id=MESSAGE,
                    target=canonical_pb2.DELTA_TARGET_TEXT,
                    operation=canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
                    text=f"{time.perf_counter_ns()}|{index}|{PADDING}",
                )
            ]
        )
    )


class Producer:
    """Command handler of the producer process (see the module docstring)."""

    def __init__(self) -> None:
        self.turn_id = "t-bench"
        self._channels: list[grpc.aio.Channel] = []
        self._links: dict[str, Any] = {}
        self._commands: asyncio.Queue[runtime_pb2.RuntimeCommand] = asyncio.Queue()
        self._results: asyncio.Queue[runtime_pb2.ReportResult] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    async def cmd_setup_host(self, address: str, admin_token: str, service_token: str) -> str:
        """Target, Session, runtime link and a running Turn on Host; returns the Turn id."""
        admin = _bearer(admin_token)
        channel = grpc.aio.insecure_channel(address)
        self._channels.append(channel)
        host: Any = host_pb2_grpc.HostServiceStub(channel)
        await host.RegisterAgentTarget(
            host_pb2.RegisterAgentTargetRequest(
                target=host_pb2.AgentTarget(
                    agent_target_id=TARGET,
                    provider="bench",
                    display_name=TARGET,
                    enabled=True,
                    launch_ref=host_pb2.AgentLaunchRef(runtime_target_ref="bench:default"),
                )
            ),
            metadata=admin,
        )
        await host.CreateSession(
            host_pb2.CreateSessionRequest(
                workspace_id=WORKSPACE, agent_target_id=TARGET, session_id=SESSION, cwd="/"
            ),
            metadata=admin,
        )
        link = runtime_pb2_grpc.RuntimeLinkServiceStub(channel).RuntimeLink(
            metadata=_bearer(service_token)
        )
        self._links["host"] = link
        await link.write(
            runtime_pb2.RuntimeLinkRequest(
                hello=runtime_pb2.RuntimeHello(
                    runtime_id="bench-runtime",
                    runtime_instance_id="i1",
                    protocol_revision=1,
                    providers=["bench"],
                )
            )
        )
        self._tasks.append(asyncio.create_task(self._read_link(link)))
        sent = await host.SendInput(
            host_pb2.SendInputRequest(
                workspace_id=WORKSPACE,
                session_id=SESSION,
                client_submit_id="c1",
                delivery=canonical_pb2.DELIVERY_MODE_NEW_TURN,
                mode=canonical_pb2.COMPOSER_MODE_AGENT,
                content="go",
            ),
            metadata=admin,
        )
        self.turn_id = sent.turn.turn_id
        command = await asyncio.wait_for(self._commands.get(), 30)
        await link.write(
            runtime_pb2.RuntimeLinkRequest(
                command_ack=runtime_pb2.CommandAck(
                    command_id=command.command_id, status=runtime_pb2.COMMAND_ACK_STATUS_ACCEPTED
                )
            )
        )
        await link.write(
            runtime_pb2.RuntimeLinkRequest(
                report=runtime_pb2.RuntimeReport(
                    workspace_id=WORKSPACE,
                    session_id=SESSION,
                    report_id="r1",
                    items=[
                        runtime_pb2.ReportItem(
                            turn_patch=runtime_pb2.TurnPatch(
                                turn_id=self.turn_id,
                                phase=canonical_pb2.TURN_PHASE_RUNNING,
                                occurred_at_unix_ms=int(time.time() * 1000),
                            )
                        )
                    ],
                )
            )
        )
        result = await asyncio.wait_for(self._results.get(), 30)
        if result.outcome != runtime_pb2.REPORT_OUTCOME_APPLIED:
            raise RuntimeError(f"the running-Turn report was not applied: {result}")
        return self.turn_id

    async def _read_link(self, link: Any) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for frame in link:
                kind = frame.WhichOneof("frame")
                if kind == "command":
                    self._commands.put_nowait(frame.command)
                elif kind == "report_result":
                    self._results.put_nowait(frame.report_result)

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
