"""Runtime delta -> ``WatchActivity`` consumer, beside a bare gRPC server-stream of the same data.

Run: ``.venv/bin/python -m bench.activity_bench [--rate 1000] [--seconds 3] [--burst 20000]
[--rounds 3]``

Starts Host in this process (its own event loop and port, a migrated SQLite database), registers
a target, creates a Session, connects a runtime over ``RuntimeLink`` and starts a Turn. Then, in
one run:

* ``latency``: the runtime sends one text delta per frame at ``--rate`` deltas/s; each delta
  carries its send time; the ``WatchActivity`` consumer records report-to-watch latency
  (p50/p99);
* ``throughput``: the runtime sends ``--burst`` deltas as fast as it can; the consumer's
  receive rate is the sustained delta throughput;
* ``bare``: the same two measurements over a bare ``grpc.aio`` server-stream that yields the
  same ``WatchActivityResponse`` payloads (the transport limit between the same processes).

Target: sustained throughput >= 0.5 x the bare stream's message rate. Results go to
``bench/results/activity_bench.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import statistics
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path
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
from bench.stats import ratio_line, summarize, write_results
from grpcserver.app import RunningServer, start_server
from grpcserver.auth import TokenRegistry, token_digest
from services.host.app import build
from services.host.settings import Settings
from store.migrate import upgrade

WS = "ws-bench"
ADMIN, SERVICE = "bench-admin", "bench-service"  # throwaway tokens of an in-process registry
ADMIN_MD = (("authorization", f"Bearer {ADMIN}"),)
SERVICE_MD = (("authorization", f"Bearer {SERVICE}"),)
_END = object()


def _registry() -> TokenRegistry:
    return TokenRegistry.from_entries(
        [
            {"subject": "a", "role": "admin", "workspaces": ["*"], "sha256": token_digest(ADMIN)},
            {
                "subject": "s",
                "role": "service",
                "workspaces": ["*"],
                "sha256": token_digest(SERVICE),
            },
        ]
    )


class _Loop(threading.Thread):
    """An event loop in a thread, running one server."""

    def __init__(self, start: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._start = start
        self.started: Future[Any] = Future()
        self.loop = asyncio.new_event_loop()

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.started.set_result(self.loop.run_until_complete(self._start()))
        self.loop.run_forever()


def _payload(index: int) -> str:
    return f"{time.perf_counter_ns()}|{index}|" + "x" * 48


def _delta(turn_id: str, index: int) -> canonical_pb2.MessageDelta:
    return canonical_pb2.MessageDelta(
        workspace_id=WS,
        session_id="s1",
        turn_id=turn_id,
        message_id="m1",
        target=canonical_pb2.DELTA_TARGET_TEXT,
        operation=canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
        text=_payload(index),
    )


def _consume(
    responses: Iterator[host_pb2.WatchActivityResponse], count: int, latencies: list[float]
) -> float:
    """Read ``count`` deltas; return the seconds between the first and the last."""
    first = last = 0.0
    seen = 0
    for response in responses:
        if response.WhichOneof("item") != "event":
            continue
        if response.event.WhichOneof("event") != "message_delta":
            continue
        now = time.perf_counter_ns()
        sent = int(response.event.message_delta.delta.text.split("|", 1)[0])
        latencies.append((now - sent) / 1e6)
        seen += 1
        first = first or now / 1e9
        last = now / 1e9
        if seen >= count:
            break
    return max(last - first, 1e-9)


def _paced(count: int, rate: float) -> Iterator[int]:
    start = time.perf_counter()
    for index in range(count):
        delay = start + index / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield index


def _measure_host(address: str, rate: float, seconds: float, burst: int) -> dict[str, Any]:
    channel = grpc.insecure_channel(address)
    host = host_pb2_grpc.HostServiceStub(channel)
    host.RegisterAgentTarget(
        host_pb2.RegisterAgentTargetRequest(
            target=host_pb2.AgentTarget(
                agent_target_id="bench",
                provider="bench",
                display_name="bench",
                enabled=True,
                launch_ref=host_pb2.AgentLaunchRef(runtime_target_ref="bench:default"),
            )
        ),
        metadata=ADMIN_MD,
    )
    host.CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id=WS, agent_target_id="bench", session_id="s1", cwd="/"
        ),
        metadata=ADMIN_MD,
    )
    requests: queue.Queue[Any] = queue.Queue()
    requests.put(
        runtime_pb2.RuntimeLinkRequest(
            hello=runtime_pb2.RuntimeHello(
                runtime_id="rt", runtime_instance_id="i1", protocol_revision=1, providers=["bench"]
            )
        )
    )

    def iterate() -> Iterator[runtime_pb2.RuntimeLinkRequest]:
        while (item := requests.get()) is not _END:
            yield item

    link = runtime_pb2_grpc.RuntimeLinkServiceStub(channel).RuntimeLink(
        iterate(), metadata=SERVICE_MD
    )
    commands: queue.Queue[runtime_pb2.RuntimeCommand] = queue.Queue()

    def read_link() -> None:
        try:
            for frame in link:
                if frame.WhichOneof("frame") == "command":
                    commands.put(frame.command)
        except grpc.RpcError:
            pass

    threading.Thread(target=read_link, daemon=True).start()
    turn_id = host.SendInput(
        host_pb2.SendInputRequest(
            workspace_id=WS,
            session_id="s1",
            client_submit_id="c1",
            delivery=canonical_pb2.DELIVERY_MODE_NEW_TURN,
            mode=canonical_pb2.COMPOSER_MODE_AGENT,
            content="go",
        ),
        metadata=ADMIN_MD,
    ).turn.turn_id
    command = commands.get(timeout=10)
    requests.put(
        runtime_pb2.RuntimeLinkRequest(
            command_ack=runtime_pb2.CommandAck(
                command_id=command.command_id, status=runtime_pb2.COMMAND_ACK_STATUS_ACCEPTED
            )
        )
    )

    def send(index: int) -> None:
        requests.put(
            runtime_pb2.RuntimeLinkRequest(
                deltas=runtime_pb2.MessageDeltaBatch(deltas=[_delta(turn_id, index)])
            )
        )

    results = _run_phases(
        lambda: host.WatchActivity(
            host_pb2.WatchActivityRequest(workspace_id=WS), metadata=SERVICE_MD
        ),
        send,
        rate,
        seconds,
        burst,
    )
    requests.put(_END)
    link.cancel()
    channel.close()
    return results


def _run_phases(
    open_stream: Callable[[], Any],
    send: Callable[[int], None],
    rate: float,
    seconds: float,
    burst: int,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for phase, count, pace in (
        ("latency", int(rate * seconds), rate),
        ("throughput", burst, None),
    ):
        stream = open_stream()
        first = next(iter(stream))
        assert first.WhichOneof("item") == "ready"
        latencies: list[float] = []
        elapsed: list[float] = []

        def consume(
            stream: Any = stream,
            count: int = count,
            into: list[float] = elapsed,
            latencies: list[float] = latencies,
        ) -> None:
            into.append(_consume(stream, count, latencies))

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        indexes = _paced(count, pace) if pace else iter(range(count))
        for index in indexes:
            send(index)
        reader.join(timeout=120)
        stream.cancel()
        out[phase] = summarize(phase, latencies, elapsed[0] if elapsed else None)
    return out


class _BareStream:
    """A bare grpc.aio server-stream of the same payloads (the transport limit)."""

    def __init__(self) -> None:
        self.pending: asyncio.Queue[int | None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def stream(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        self.loop = asyncio.get_running_loop()
        self.pending = asyncio.Queue()
        yield host_pb2.WatchActivityResponse(
            ready=activity_pb2.ActivityStreamReady(workspace_id=WS)
        ).SerializeToString()
        while (index := await self.pending.get()) is not None:
            event = activity_pb2.ActivityEvent(event_id=1, workspace_id=WS)
            event.message_delta.delta.CopyFrom(_delta("t", index))
            yield host_pb2.WatchActivityResponse(event=event).SerializeToString()


def _measure_bare(rate: float, seconds: float, burst: int) -> dict[str, Any]:
    bare = _BareStream()

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            "bench.Bare",
            {"Stream": grpc.unary_stream_rpc_method_handler(bare.stream)},
        )
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    runner = _Loop(start)
    runner.start()
    server, port = runner.started.result(timeout=30)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_stream(
        "/bench.Bare/Stream",
        request_serializer=lambda value: value,
        response_deserializer=host_pb2.WatchActivityResponse.FromString,
    )

    def send(index: int) -> None:
        while bare.pending is None or bare.loop is None:
            time.sleep(0.001)
        bare.loop.call_soon_threadsafe(bare.pending.put_nowait, index)

    def open_stream() -> Any:
        bare.pending = None
        return call(b"")

    results = _run_phases(open_stream, send, rate, seconds, burst)
    channel.close()
    asyncio.run_coroutine_threadsafe(server.stop(0), runner.loop).result(timeout=10)
    runner.loop.call_soon_threadsafe(runner.loop.stop)
    return results


def _one_round(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """One interleaved round: our path on a fresh Host, then the bare stream."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade(url)
        settings = Settings(
            listen_address="127.0.0.1:0",
            data_dir=Path(tmp),
            database_url=url,
            log_format="text",
            log_level="WARNING",
            watch_queue_max_items=max(100_000, args.burst * 2),
        )

        async def start_host() -> RunningServer:
            return await start_server(build(settings), settings, tokens=_registry())

        runner = _Loop(start_host)
        runner.start()
        running: RunningServer = runner.started.result(timeout=30)
        ours = _measure_host(f"127.0.0.1:{running.port}", args.rate, args.seconds, args.burst)
        asyncio.run_coroutine_threadsafe(running.stop(0), runner.loop).result(timeout=30)
        runner.loop.call_soon_threadsafe(runner.loop.stop)
    bare = _measure_bare(args.rate, args.seconds, args.burst)
    return ours, bare


def main() -> None:
    """Run ``--rounds`` interleaved rounds and write ``bench/results/activity_bench.json``.

    The machines are noisy, so the verdict uses the median of the per-round throughput
    ratios; every round's numbers are kept in the result file.
    """
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--burst", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds = []
    for number in range(1, args.rounds + 1):
        ours, bare = _one_round(args)
        ours_tp = ours["throughput"].throughput_per_s or 0.0
        bare_tp = bare["throughput"].throughput_per_s or 1.0
        ratio = ours_tp / bare_tp
        print(f"round {number}: " + ratio_line(ours["latency"], bare["latency"]))
        print(f"round {number}: sustained {ours_tp:,.0f}/s vs bare {bare_tp:,.0f}/s: {ratio:.2f}x")
        rounds.append(
            {
                "watch_latency": ours["latency"],
                "watch_throughput": ours["throughput"],
                "bare_latency": bare["latency"],
                "bare_throughput": bare["throughput"],
                "throughput_ratio": ratio,
            }
        )
    median_ratio = statistics.median(r["throughput_ratio"] for r in rounds)
    median_p50 = statistics.median(r["watch_latency"].p50_ms for r in rounds)
    median_p99 = statistics.median(r["watch_latency"].p99_ms for r in rounds)
    print(
        f"median over {len(rounds)} rounds: throughput ratio {median_ratio:.2f}x, "
        f"report-to-watch p50 {median_p50:.3f} ms p99 {median_p99:.3f} ms"
    )
    path = write_results(
        "activity_bench",
        {
            "rate_per_s": args.rate,
            "burst": args.burst,
            "rounds": [
                {
                    key: (asdict(value) if hasattr(value, "p50_ms") else value)
                    for key, value in entry.items()
                }
                for entry in rounds
            ],
            "median_throughput_ratio": median_ratio,
            "median_watch_p50_ms": median_p50,
            "median_watch_p99_ms": median_p99,
            "target_throughput_ratio": 0.5,
            "meets_target": median_ratio >= 0.5,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
