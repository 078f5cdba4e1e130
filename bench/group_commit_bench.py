"""SQLite group commit: concurrent ``SendInput`` with shared commits vs. each committing alone.

Run: ``.venv/bin/python -m bench.group_commit_bench [--requests 600] [--concurrency 32]``

Four real host processes (``tutti serve host``), each on its own migrated SQLite file,
identical but for ``TUTTI_SQLITE_GROUP_COMMIT`` (``on``: ``store.write_queue`` shares commits;
``off``: every write transaction takes the writer alone and commits alone, as before) and
``TUTTI_SQLITE_SYNCHRONOUS`` (``NORMAL``: no ``fsync`` per commit in WAL mode; ``FULL``: one per
commit, so every acknowledged write survives a power loss). The baseline is ``normal-off``,
the behaviour before group commit. Each host has a bench runtime on its link acknowledging
every command. The same workload runs
against both, in interleaved rounds: ``SendInput`` ``new_turn`` to a fresh idle Session per
call (the submit path's write transaction, its command outbox row and the acknowledgement's
transaction) at the given concurrency over one ``grpc.aio`` channel per side.

A second part isolates the store: for each of the same four settings a fresh process runs
``--store-writers`` concurrent writers, each committing ``--store-writes`` small one-row
transactions through ``store.transactions.TransactionRunner`` on its own SQLite file (nothing
else on the path), so the commit itself is a visible share of each transaction; rounds
alternate the sides.

It prints throughput, p50/p99 latency and host CPU per call of every side and its ratios to
the baseline, and writes ``bench/results/group_commit_bench.json``. Postgres has no single
writer and no group commit: this benchmark is SQLite's only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from agentactivity.host.v1 import host_pb2_grpc
from bench.host_bench import (
    BenchRuntime,
    Series,
    ServerProcess,
    create_sessions,
    database,
    drive,
    metadata,
    register_target,
    start_host,
    submit_request,
)
from bench.stats import Summary, summarize, write_results
from store.engine import create_async_engine_for, sqlite_write_queue
from store.transactions import TransactionRunner

SIDES = {
    "normal-off": {"TUTTI_SQLITE_GROUP_COMMIT": "false", "TUTTI_SQLITE_SYNCHRONOUS": "NORMAL"},
    "normal-on": {"TUTTI_SQLITE_GROUP_COMMIT": "true", "TUTTI_SQLITE_SYNCHRONOUS": "NORMAL"},
    "full-off": {"TUTTI_SQLITE_GROUP_COMMIT": "false", "TUTTI_SQLITE_SYNCHRONOUS": "FULL"},
    "full-on": {"TUTTI_SQLITE_GROUP_COMMIT": "true", "TUTTI_SQLITE_SYNCHRONOUS": "FULL"},
}
BASELINE = "normal-off"


class Side:
    """One host process and its client: the sessions it will submit to, and its totals."""

    def __init__(self, name: str, host: ServerProcess) -> None:
        self.name = name
        self.host = host
        self.total = Series([], 0.0, {}, 0.0)

    async def setup(self, channel: grpc.aio.Channel, sessions: int) -> BenchRuntime:
        """Register the target, open the runtime link and create ``sessions`` idle Sessions."""
        stub = host_pb2_grpc.HostServiceStub(channel)
        await register_target(stub)
        runtime = BenchRuntime(channel)
        await runtime.hello()
        await create_sessions(stub, [f"gc-{index}" for index in range(sessions)])
        self.stub = stub
        return runtime

    async def submit(self, index: int) -> None:
        """One ``new_turn`` submission to the idle Session ``gc-<index>``."""
        await self.stub.SendInput(submit_request(f"gc-{index}"), metadata=metadata("device"))

    async def round(self, first: int, count: int, concurrency: int) -> None:
        """Submit to Sessions ``first .. first+count-1``; add to the totals."""
        before = self.host.cpu()
        series = await drive(self.submit, count, concurrency, first=first)
        assert self.total.server_cpu_s is not None
        self.total.server_cpu_s += self.host.cpu() - before
        self.total.latencies_ms += series.latencies_ms
        self.total.elapsed_s += series.elapsed_s
        for code, failed in series.errors.items():
            self.total.errors[code] = self.total.errors.get(code, 0) + failed

    def summary(self) -> dict[str, Any]:
        """Throughput, latency, errors and host CPU per call over every round."""
        summary: Summary = self.total.summary(self.name)
        cpu = self.total.server_cpu_s or 0.0
        return {
            "summary": summary.__dict__,
            "errors": self.total.errors,
            "host_cpu_ms_per_call": round(cpu * 1000 / max(1, summary.samples), 2),
        }


async def measure(
    hosts: dict[str, ServerProcess], requests: int, warmup: int, rounds: int, concurrency: int
) -> dict[str, dict[str, Any]]:
    """Set every side up, warm it, then run the interleaved rounds."""
    sides = {name: Side(name, host) for name, host in hosts.items()}
    channels = {name: grpc.aio.insecure_channel(host.address) for name, host in hosts.items()}
    runtimes = []
    try:
        for name, side in sides.items():
            runtimes.append(await side.setup(channels[name], warmup + requests))
        for side in sides.values():  # warm-up, not counted
            await drive(side.submit, warmup, concurrency)
        chunk = -(-requests // rounds)
        for index in range(rounds):
            first = warmup + index * chunk
            size = min(chunk, requests - index * chunk)
            # Rotate which side goes first, so drift over a round hits every side alike.
            ordered = list(sides.values())
            shift = index % len(ordered)
            order = ordered[shift:] + ordered[:shift]
            for side in order:
                await side.round(first, size, concurrency)
    finally:
        for runtime in runtimes:
            await runtime.close()
        for channel in channels.values():
            await channel.close()
    return {name: side.summary() for name, side in sides.items()}


async def store_side(path: Path, switches: dict[str, str], writers: int, writes: int) -> None:
    """One store-part side (run in its own process): print its commits/s and latency as JSON."""
    engine = create_async_engine_for(
        f"sqlite:///{path}",
        sqlite_group_commit=switches["TUTTI_SQLITE_GROUP_COMMIT"] == "true",
        sqlite_synchronous=switches["TUTTI_SQLITE_SYNCHRONOUS"],
    )
    async with engine.begin() as connection:
        await connection.exec_driver_sql(
            "CREATE TABLE IF NOT EXISTS bench_rows (id INTEGER PRIMARY KEY, body TEXT NOT NULL)"
        )
    runner = TransactionRunner(engine, scope=lambda session, _uow: session)
    body = "x" * 400
    latencies: list[float] = []

    async def write(session: AsyncSession) -> None:
        await session.execute(text("INSERT INTO bench_rows (body) VALUES (:body)"), {"body": body})

    async def writer() -> None:
        for _ in range(writes):
            started = time.perf_counter()
            await runner.run(write)
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    elapsed = time.perf_counter() - started
    queue = sqlite_write_queue(engine)
    await engine.dispose()
    summary = summarize("store", latencies, elapsed)
    print(
        json.dumps(
            {
                "commits_per_s": summary.throughput_per_s,
                "p50_ms": summary.p50_ms,
                "p99_ms": summary.p99_ms,
                "groups": queue.groups_committed if queue else 0,
                "members": queue.members_committed if queue else 0,
            }
        )
    )


def measure_store(tmp: Path, writers: int, writes: int, rounds: int) -> dict[str, dict[str, Any]]:
    """Run every store-part side ``rounds`` times, each in a fresh process; medians per side."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SIDES}
    for index in range(rounds):
        names = list(SIDES)
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            path = tmp / f"store-{name}-{index}.db"
            output = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.group_commit_bench",
                    "--store-side",
                    name,
                    "--store-path",
                    str(path),
                    "--store-writers",
                    str(writers),
                    "--store-writes",
                    str(writes),
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            runs[name].append(json.loads(output.strip().splitlines()[-1]))
    return {
        name: {
            "commits_per_s": statistics.median(run["commits_per_s"] for run in side),
            "p50_ms": statistics.median(run["p50_ms"] for run in side),
            "p99_ms": statistics.median(run["p99_ms"] for run in side),
            "members_per_commit": statistics.median(
                run["members"] / run["groups"] if run["groups"] else 1.0 for run in side
            ),
            "rounds": side,
        }
        for name, side in runs.items()
    }


def main() -> None:
    """Run the benchmark from the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=600, help="measured calls per side")
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--store-writers", type=int, default=32)
    parser.add_argument("--store-writes", type=int, default=100, help="commits per writer")
    parser.add_argument("--store-rounds", type=int, default=3)
    parser.add_argument("--store-side", choices=sorted(SIDES), help=argparse.SUPPRESS)
    parser.add_argument("--store-path", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.store_side:  # one store-part side, in its own process
        asyncio.run(
            store_side(
                args.store_path, SIDES[args.store_side], args.store_writers, args.store_writes
            )
        )
        return
    with tempfile.TemporaryDirectory(prefix="group-commit-bench-") as scratch:
        tmp = Path(scratch)
        hosts: dict[str, ServerProcess] = {}
        with contextlib.ExitStack() as stack:
            for name, switches in SIDES.items():
                side_dir = tmp / name
                side_dir.mkdir()
                url = stack.enter_context(database("sqlite", side_dir))
                hosts[name] = start_host(side_dir, url, switches)
                stack.callback(hosts[name].stop)
            results = asyncio.run(
                measure(hosts, args.requests, args.warmup, args.rounds, args.concurrency)
            )
        store = measure_store(tmp, args.store_writers, args.store_writes, args.store_rounds)
    base = results[BASELINE]
    ratios: dict[str, dict[str, float | None]] = {}
    for name in SIDES:
        side = results[name]
        summary = side["summary"]
        ratios[name] = {
            "throughput": summary["throughput_per_s"] / base["summary"]["throughput_per_s"],
            "p50": summary["p50_ms"] / base["summary"]["p50_ms"],
            "p99": summary["p99_ms"] / base["summary"]["p99_ms"],
            # Process CPU comes in clock ticks (10 ms): a short series can measure none.
            "cpu": (
                side["host_cpu_ms_per_call"] / base["host_cpu_ms_per_call"]
                if base["host_cpu_ms_per_call"]
                else None
            ),
        }
        print(
            f"{name:>10}: {summary['throughput_per_s']:7.1f} req/s "
            f"p50 {summary['p50_ms']:7.1f} ms p99 {summary['p99_ms']:7.1f} ms "
            f"host CPU {side['host_cpu_ms_per_call']:5.2f} ms/call "
            f"errors {side['errors'] or 'none'} | x {BASELINE}: "
            + ", ".join(
                f"{key} {'n/a' if value is None else f'{value:.2f}'}"
                for key, value in ratios[name].items()
            )
        )
    store_base = store[BASELINE]["commits_per_s"]
    print(f"store part: {args.store_writers} writers x {args.store_writes} commits, medians")
    for name, side in store.items():
        print(
            f"{name:>10}: {side['commits_per_s']:8.0f} commits/s p50 {side['p50_ms']:6.2f} ms "
            f"p99 {side['p99_ms']:6.2f} ms members/commit {side['members_per_commit']:5.1f} "
            f"| x {BASELINE}: throughput {side['commits_per_s'] / store_base:.2f}"
        )
    path = write_results(
        "group_commit_bench",
        {
            "concurrency": args.concurrency,
            "requests_per_side": args.requests,
            "rounds": args.rounds,
            "sides": results,
            "baseline": f"{BASELINE}: {SIDES[BASELINE]}",
            "store_part": {
                "writers": args.store_writers,
                "writes_per_writer": args.store_writes,
                "sides": store,
            },
            "ratios_to_baseline": {
                name: {
                    key: None if value is None else round(value, 3) for key, value in side.items()
                }
                for name, side in ratios.items()
            },
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
