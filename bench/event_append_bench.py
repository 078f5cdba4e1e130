"""Activity-event appends from two processes into two workspaces, on Postgres (SCALE-1).

Run: ``.venv/bin/python -m bench.event_append_bench [--appends 400] [--concurrency 4] [--rounds 5]``

Two worker processes (``--worker``) each append to their own workspace: ``--concurrency``
tasks, each running ``--appends / concurrency`` write transactions on the store's async engine,
each appending one event with ``EventLogRepository.append`` — the production append: the
workspace head row bump (``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``) and the event
``INSERT`` — then committing. Host's command work around an append is left out, so the
difference between the sides is the lock alone.

Sides, in interleaved rounds on one scratch database:

* ``global-lock`` (the baseline, what appends did before ADR 0037): the same transaction takes
  ``pg_advisory_xact_lock`` on one key shared by every appender of the log first, so all
  appends of the deployment commit one at a time;
* ``row-lock`` (ours): no shared key; only the appenders of one workspace wait for each other,
  on its head row.

A round starts both workers at once and measures total appends over the slower worker's
elapsed time, plus each transaction's latency. Prints medians over rounds, p50/p99 latency
and the ratio, and writes ``bench/results/event_append_bench.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from bench.host_bench import database
from bench.stats import percentile, write_results
from services.host.repository.activity_events import EventLogRepository, NewEventRow
from store.engine import create_async_engine_for

SHARED_KEY = 0x7475_7474_6965_7631
"""The advisory-lock key every append took before ADR 0037 (``EVENT_APPEND_LOCK``)."""

SIDES = ("global-lock", "row-lock")


async def _worker(url: str, side: str, workspace_id: str, appends: int, concurrency: int) -> None:
    engine = create_async_engine_for(url)
    latencies: list[float] = []
    rows = [NewEventRow(workspace_id, "s", "session_reconcile_required", b"x" * 64, 1)]

    async def task(count: int) -> None:
        for _ in range(count):
            began = time.perf_counter()
            async with AsyncSession(engine) as session, session.begin():
                if side == "global-lock":
                    await session.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": SHARED_KEY}
                    )
                await EventLogRepository(session).append(rows)
            latencies.append((time.perf_counter() - began) * 1000)

    per_task = appends // concurrency
    # Warm the pool and the statement cache outside the measurement.
    await asyncio.gather(*(task(1) for _ in range(concurrency)))
    latencies.clear()
    began = time.perf_counter()
    await asyncio.gather(*(task(per_task) for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    await engine.dispose()
    print(json.dumps({"elapsed_s": elapsed, "latencies_ms": latencies}))


def _round(url: str, side: str, appends: int, concurrency: int, tag: int) -> dict[str, Any]:
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.event_append_bench",
                "--worker",
                "--url",
                url,
                "--side",
                side,
                "--workspace",
                f"ws-{tag}-{n}",
                "--appends",
                str(appends),
                "--concurrency",
                str(concurrency),
            ],
            stdout=subprocess.PIPE,
        )
        for n in range(2)
    ]
    outputs = [json.loads(worker.communicate(timeout=600)[0]) for worker in workers]
    latencies = [value for output in outputs for value in output["latencies_ms"]]
    elapsed = max(output["elapsed_s"] for output in outputs)
    return {"appends_per_s": len(latencies) / elapsed, "latencies_ms": latencies}


def main() -> None:
    """Run the benchmark (or, with ``--worker``, one worker)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--appends", type=int, default=400, help="appends per worker per round")
    parser.add_argument("--concurrency", type=int, default=4, help="tasks per worker")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--workspace", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(_worker(args.url, args.side, args.workspace, args.appends, args.concurrency))
        return
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as tmp, database("postgres", Path(tmp)) as url:
        for round_index in range(args.rounds):
            order = SIDES if round_index % 2 == 0 else tuple(reversed(SIDES))
            for side in order:
                measured = _round(
                    url, side, args.appends, args.concurrency, tag=len(results[side]) * 10
                )
                results[side].append(measured)
                print(f"round {round_index + 1} {side}: {measured['appends_per_s']:.0f} appends/s")
    summary: dict[str, Any] = {}
    for side in SIDES:
        rates = [r["appends_per_s"] for r in results[side]]
        latencies = [value for r in results[side] for value in r["latencies_ms"]]
        summary[side] = {
            "appends_per_s_median": statistics.median(rates),
            "appends_per_s_rounds": rates,
            "latency_p50_ms": statistics.median(latencies),
            "latency_p99_ms": percentile(latencies, 0.99),
            "transactions": len(latencies),
        }
    ratio = (
        summary["row-lock"]["appends_per_s_median"] / summary["global-lock"]["appends_per_s_median"]
    )
    for side in SIDES:
        s = summary[side]
        print(
            f"{side}: {s['appends_per_s_median']:.0f} appends/s (median of {args.rounds}), "
            f"p50 {s['latency_p50_ms']:.2f} ms, p99 {s['latency_p99_ms']:.2f} ms"
        )
    print(f"row-lock / global-lock throughput: {ratio:.2f}x")
    path = write_results(
        "event_append_bench",
        {
            "workload": {
                "processes": 2,
                "workspaces": 2,
                "appends_per_worker_per_round": args.appends,
                "tasks_per_worker": args.concurrency,
                "rounds": args.rounds,
                "store": "postgres",
            },
            "sides": summary,
            "throughput_ratio_row_lock_over_global_lock": ratio,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
