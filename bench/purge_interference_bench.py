"""SendInput latency while a retention purge runs, beside the same load idle (issue #15).

Run: ``.venv/bin/python -m bench.purge_interference_bench [--backends sqlite,postgres]
[--rate 10] [--idle-submits 200] [--rounds 3] [--trees 2000]``

On each backend (a temporary SQLite file; a scratch Postgres database, dropped after) the
database is seeded with ``deletion_bench``'s purge set — 2,000 restorable tombstone trees of
5 Sessions holding 200,000 messages, all past retention — and a real host process
(``tutti serve host``) is started with a bench runtime on the runtime link that acknowledges
every command. Foreground traffic is **open-loop**: one ``SendInput new_turn`` (a fresh idle
Session each) every ``1/--rate`` seconds (default 10/s, well below saturation), whatever the
previous ones are doing, as devices submit. The phases:

1. **idle** — ``--idle-submits`` submits with nothing else running;
2. **purge** — the same traffic while one task purges over gRPC exactly as the maintenance
   worker does: ``PurgeDeletedSessions`` with its bounds (100 trees, 10,000 rows per call),
   repeated until nothing remains; every submit *started* during the purge is counted;
3. **idle again** — as 1, so machine drift shows.

A purge of this set takes only seconds, so one run holds few submits in its purge phase:
``--rounds`` repeats the whole sequence on a fresh database and host process, and the
figures are over the pooled latencies of every round (each round's own are in the JSON).

It reports p50/p99 of each phase, the ratio of the purge phase's p99 to the idle phases'
(target at most 2x), and the purge's rows per second. ``bench/results/purge_interference.json``
records the command line and every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from bench.deletion_bench import PURGE_TREES, seed_purge_trees
from bench.host_bench import (
    BenchRuntime,
    create_sessions,
    database,
    metadata,
    register_target,
    start_host,
    submit_request,
)
from bench.stats import percentile, write_results

MAINTENANCE_TREES = 100
MAINTENANCE_ROWS = 10_000
TARGET_P99_RATIO = 2.0


async def _open_loop(
    stub: host_pb2_grpc.HostServiceAsyncStub,
    sessions: list[str],
    rate: float,
    *,
    count: int | None = None,
    until: asyncio.Future[Any] | None = None,
) -> list[float]:
    """Submit to ``sessions`` in order, one every ``1/rate`` s; latencies in ms.

    Stops after ``count`` submits, or when ``until`` is done (submits started before it
    finished are awaited and counted).
    """
    latencies: list[float] = []
    errors: dict[str, int] = {}
    pending: list[asyncio.Task[None]] = []

    async def one(session_id: str) -> None:
        started = time.perf_counter()
        try:
            await stub.SendInput(
                submit_request(session_id), metadata=metadata("device"), timeout=60
            )
        except grpc.aio.AioRpcError as error:
            errors[error.code().name] = errors.get(error.code().name, 0) + 1
            return
        latencies.append((time.perf_counter() - started) * 1000)

    interval = 1.0 / rate
    next_at = time.perf_counter()
    for index, session_id in enumerate(sessions):
        if count is not None and index >= count:
            break
        if until is not None and until.done():
            break
        pending.append(asyncio.create_task(one(session_id)))
        next_at += interval
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
    else:
        if until is not None and not until.done():
            raise RuntimeError("the submit pool ran out before the purge finished: raise it")
    await asyncio.gather(*pending)
    if errors:
        raise RuntimeError(f"submits failed: {errors}")
    return latencies


async def _purge_all(stub: host_pb2_grpc.HostServiceAsyncStub) -> dict[str, float]:
    """Purge every eligible tree with maintenance's bounds; rows and seconds."""
    started = time.perf_counter()
    rows = trees = calls = 0
    while True:
        response = await stub.PurgeDeletedSessions(
            host_pb2.PurgeDeletedSessionsRequest(
                cutoff_unix_ms=int(time.time() * 1000),
                max_trees=MAINTENANCE_TREES,
                max_rows=MAINTENANCE_ROWS,
            ),
            metadata=metadata("admin"),
            timeout=300,
        )
        calls += 1
        rows += response.purged_row_count
        trees += response.purged_tree_count
        if not response.more_remaining and response.purged_tree_count == 0:
            break
    seconds = time.perf_counter() - started
    return {"rows": rows, "trees": trees, "calls": calls, "seconds": seconds}


def _phase(latencies: list[float]) -> dict[str, float]:
    return {
        "submits": len(latencies),
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(percentile(latencies, 0.99), 3),
    }


async def run_backend(
    url: str, tmp: Path, rate: float, idle_submits: int, trees: int = PURGE_TREES
) -> dict[str, Any]:
    """The three phases on one backend, once; the raw latencies under ``"raw"``."""
    seeded = seed_purge_trees(url, trees)
    host = start_host(tmp, url)
    try:
        async with grpc.aio.insecure_channel(host.address) as channel:
            stub = host_pb2_grpc.HostServiceStub(channel)
            runtime = BenchRuntime(channel)
            await register_target(stub)
            await runtime.hello()
            # Enough fresh Sessions for both idle phases and a purge of up to 100 s.
            pool = [f"fg-{index}" for index in range(2 * idle_submits + int(rate * 100))]
            await create_sessions(stub, pool)
            first = await _open_loop(stub, pool[:idle_submits], rate, count=idle_submits)
            purge = asyncio.ensure_future(_purge_all(stub))
            rest = pool[idle_submits:-idle_submits]
            during = await _open_loop(stub, rest, rate, until=purge)
            purged = await purge
            last = await _open_loop(stub, pool[-idle_submits:], rate, count=idle_submits)
            await runtime.close()
    finally:
        host.stop()
    if purged["rows"] < seeded - 1:
        raise RuntimeError(f"the purge removed {purged['rows']} of {seeded} rows")
    idle_p99 = statistics.median([percentile(first, 0.99), percentile(last, 0.99)])
    purge_p99 = percentile(during, 0.99)
    return {
        "raw": {"idle_before": first, "during_purge": during, "idle_after": last},
        "idle_before": _phase(first),
        "during_purge": _phase(during),
        "idle_after": _phase(last),
        "p99_ratio_purge_to_idle": round(purge_p99 / idle_p99, 2),
        "target_p99_ratio": TARGET_P99_RATIO,
        "met": purge_p99 / idle_p99 <= TARGET_P99_RATIO,
        "purge": {
            **purged,
            "seconds": round(purged["seconds"], 2),
            "rows_per_s": round(purged["rows"] / purged["seconds"]),
        },
    }


def _pooled(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Every round's latencies pooled per phase; the rounds' own figures kept beside them."""
    pooled = {
        phase: [value for outcome in rounds for value in outcome["raw"][phase]]
        for phase in ("idle_before", "during_purge", "idle_after")
    }
    idle_p99 = statistics.median(
        [percentile(pooled["idle_before"], 0.99), percentile(pooled["idle_after"], 0.99)]
    )
    purge_p99 = percentile(pooled["during_purge"], 0.99)
    rows = sum(outcome["purge"]["rows"] for outcome in rounds)
    seconds = sum(outcome["purge"]["seconds"] for outcome in rounds)
    for outcome in rounds:
        del outcome["raw"]
    return {
        **{phase: _phase(values) for phase, values in pooled.items()},
        "p99_ratio_purge_to_idle": round(purge_p99 / idle_p99, 2),
        "target_p99_ratio": TARGET_P99_RATIO,
        "met": purge_p99 / idle_p99 <= TARGET_P99_RATIO,
        "purge": {
            "rows": rows,
            "seconds": round(seconds, 2),
            "rows_per_s": round(rows / seconds),
            "calls": sum(outcome["purge"]["calls"] for outcome in rounds),
        },
        "rounds": rounds,
    }


def main() -> None:
    """Run every backend; print the phases and the ratio; write the JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--rate", type=float, default=10.0, help="submits per second")
    parser.add_argument("--idle-submits", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="fresh database per round")
    parser.add_argument(
        "--trees", type=int, default=PURGE_TREES, help="purge set size (trees of 105 rows)"
    )
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        rounds = []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp, database(backend, Path(tmp)) as url:
                rounds.append(
                    asyncio.run(
                        run_backend(url, Path(tmp), args.rate, args.idle_submits, args.trees)
                    )
                )
        outcome = _pooled(rounds)
        results[backend] = outcome
        print(
            f"[{backend}] SendInput at {args.rate:g}/s: idle p50/p99 "
            f"{outcome['idle_before']['p50_ms']:.1f}/{outcome['idle_before']['p99_ms']:.1f} ms, "
            f"during purge {outcome['during_purge']['p50_ms']:.1f}/"
            f"{outcome['during_purge']['p99_ms']:.1f} ms ({outcome['during_purge']['submits']} "
            f"submits), idle again {outcome['idle_after']['p50_ms']:.1f}/"
            f"{outcome['idle_after']['p99_ms']:.1f} ms; p99 ratio "
            f"{outcome['p99_ratio_purge_to_idle']:.2f}x (target <= {TARGET_P99_RATIO:g}x, "
            f"{'met' if outcome['met'] else 'NOT met'}); purge {outcome['purge']['rows']} rows "
            f"in {outcome['purge']['seconds']:.1f} s ({outcome['purge']['rows_per_s']} rows/s, "
            f"{outcome['purge']['calls']} calls)"
        )
    path = write_results(
        "purge_interference",
        {
            "rate_per_s": args.rate,
            "idle_submits": args.idle_submits,
            "rounds": args.rounds,
            "trees": args.trees,
            "baseline": "the same open-loop SendInput traffic with no purge running (idle phases)",
            "backends": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
