"""Runtime delta -> Host -> ``WatchActivity`` consumer, beside a bare relay with the same hops.

Run: ``.venv/bin/python -m bench.activity_bench [--rate 1000] [--seconds 3] [--burst 8000]
[--rounds 3]``

Four kinds of process, each on its own (``bench.activity_bench_procs``):

* **Host**: ``tutti serve host`` on a migrated SQLite database with default settings (only
  the address, data directory, database and token file are given; the watch queue keeps its
  default bound, ``watch_queue_max_items`` 10,000);
* **producer**: the runtime on Host's ``RuntimeLink`` with a running Turn; it sends one text
  delta per ``RuntimeLinkRequest`` frame, each carrying its send time;
* **consumer**: reads ``WatchActivity`` and records send-to-receive latency per delta;
* **bare relay**: the baseline, a ``grpc.aio`` server with the same hops (the producer's frames
  come in on a bidi stream like ``RuntimeLink``; each delta goes out as a
  ``WatchActivityResponse`` on a server-stream to the consumer) and nothing else.

Each round measures both systems, in alternating order (interleaved rounds on a noisy
machine):

* ``latency``: ``--rate`` deltas/s for ``--seconds``; p50/p99 from producer send to consumer
  receive;
* ``throughput``: ``--burst`` deltas as fast as the producer's stream takes them; the consumer's
  receive rate from first to last delta. The default burst stays below the default watch queue
  bound, so a consumer that falls behind is measured, not cut off; an overflow would show as
  ``RESOURCE_EXHAUSTED`` in the round's ``error``.

The CPU seconds Host and the bare relay spend per delta (``/proc``) are recorded beside the
rates. Target (issue #15): throughput >= 0.5x the bare relay, median of the rounds. Results go
to ``bench/results/activity_bench.json`` with the command line and the baseline figures.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from bench.live_bench_procs import Worker, cpu_seconds, migrate, start_service
from bench.stats import Summary, ratio_line, summarize, write_results
from grpcserver.auth import token_digest

SYSTEMS = ("host", "bare")
_PROCS = "bench.activity_bench_procs"


def _write_tokens(path: Path) -> dict[str, str]:
    """A token registry with an admin and a service principal; returns role -> token."""
    tokens = {role: secrets.token_urlsafe(18) for role in ("admin", "service")}
    entries = [
        {
            "subject": f"bench-{role}",
            "role": role,
            "workspaces": ["*"],
            "sha256": token_digest(token),
        }
        for role, token in tokens.items()
    ]
    path.write_text(yaml.safe_dump({"tokens": entries}))
    return tokens


class Bench:
    """The processes of one run (see the module docstring)."""

    def __init__(self, workdir: Path, stack: ExitStack) -> None:
        tokens = _write_tokens(workdir / "tokens.yaml")
        database_url = f"sqlite:///{workdir / 'host.db'}"
        migrate(database_url)
        self.host = start_service(
            "host",
            workdir,
            {
                "data_dir": str(workdir / "host-data"),
                "database_url": database_url,
                "auth_tokens_file": str(workdir / "tokens.yaml"),
                "log_level": "WARNING",
            },
        )
        stack.callback(self.host.stop)
        self.bare = self._worker(stack, "BareRelay", "bare-relay")
        bare_address = f"127.0.0.1:{self.bare.call('start')}"
        self.producer = self._worker(stack, "Producer", "producer")
        self.producer.call(
            "setup_host",
            address=self.host.address,
            admin_token=tokens["admin"],
            service_token=tokens["service"],
        )
        self.producer.call("connect_bare", address=bare_address)
        self.consumer = self._worker(stack, "Consumer", "consumer")
        self.consumer.call(
            "connect", system="host", address=self.host.address, token=tokens["service"]
        )
        self.consumer.call("connect", system="bare", address=bare_address)
        self.server_pids = {"host": self.host.pid, "bare": self.bare.pid}

    @staticmethod
    def _worker(stack: ExitStack, handler: str, name: str) -> Worker:
        worker = Worker(f"{_PROCS}:{handler}", name)
        stack.callback(worker.stop)
        return worker

    def phase(self, system: str, count: int, rate: float | None) -> dict[str, Any]:
        """One measured series: arm the consumer, send ``count`` deltas, collect."""
        self.consumer.call("arm", system=system, count=count)
        cpu_before = cpu_seconds(self.server_pids[system])
        self.producer.call("send", system=system, count=count, rate=rate)
        got = self.consumer.call("wait", seconds=300.0, timeout=310.0)
        cpu = cpu_seconds(self.server_pids[system]) - cpu_before
        received = len(got["latencies_ms"])
        elapsed = (got["last_ns"] - got["first_ns"]) / 1e9 if received > 1 else None
        name = "throughput" if rate is None else "latency"
        summary = summarize(name, got["latencies_ms"] or [0.0], elapsed)
        return {
            "summary": summary,
            "received": received,
            "sent": count,
            "server_cpu_us_per_delta": cpu * 1e6 / max(received, 1),
            "error": got["error"],
        }


def _one_round(bench: Bench, args: argparse.Namespace, number: int) -> dict[str, Any]:
    order = SYSTEMS if number % 2 else tuple(reversed(SYSTEMS))
    out: dict[str, Any] = {"order": list(order)}
    for system in order:
        out[f"{system}_latency"] = bench.phase(system, int(args.rate * args.seconds), args.rate)
        out[f"{system}_throughput"] = bench.phase(system, args.burst, None)
    ours = out["host_throughput"]["summary"].throughput_per_s or 0.0
    bare = out["bare_throughput"]["summary"].throughput_per_s or 1.0
    out["throughput_ratio"] = ours / bare
    print(
        f"round {number}: "
        + ratio_line(out["host_latency"]["summary"], out["bare_latency"]["summary"])
    )
    print(
        f"round {number}: sustained {ours:,.0f}/s vs bare {bare:,.0f}/s: "
        f"{out['throughput_ratio']:.2f}x; server CPU per delta "
        f"host {out['host_throughput']['server_cpu_us_per_delta']:.0f} us, "
        f"bare {out['bare_throughput']['server_cpu_us_per_delta']:.0f} us"
        + "".join(
            f"; {key} ERROR {out[key]['error']}"
            for key in ("host_latency", "host_throughput", "bare_latency", "bare_throughput")
            if out[key]["error"]
        )
    )
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, Summary):
        return asdict(value)
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    return value


def main() -> None:
    """Run ``--rounds`` interleaved rounds and write ``bench/results/activity_bench.json``.

    The machines are noisy, so the verdict uses the median of the per-round throughput
    ratios; every round's numbers are kept in the result file.
    """
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--burst", type=int, default=8_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        bench = Bench(Path(tmp), stack)
        print(f"host pid {bench.host.pid}, bare relay pid {bench.bare.pid}", flush=True)
        for number in range(1, args.rounds + 1):
            rounds.append(_one_round(bench, args, number))
    median = statistics.median
    result = {
        "rate_per_s": args.rate,
        "seconds": args.seconds,
        "burst": args.burst,
        "rounds": [_jsonable(entry) for entry in rounds],
        "median_throughput_ratio": median(r["throughput_ratio"] for r in rounds),
        "median_watch_throughput_per_s": median(
            r["host_throughput"]["summary"].throughput_per_s or 0.0 for r in rounds
        ),
        "median_bare_throughput_per_s": median(
            r["bare_throughput"]["summary"].throughput_per_s or 0.0 for r in rounds
        ),
        "median_watch_p50_ms": median(r["host_latency"]["summary"].p50_ms for r in rounds),
        "median_watch_p99_ms": median(r["host_latency"]["summary"].p99_ms for r in rounds),
        "median_bare_p50_ms": median(r["bare_latency"]["summary"].p50_ms for r in rounds),
        "median_bare_p99_ms": median(r["bare_latency"]["summary"].p99_ms for r in rounds),
        "median_host_cpu_us_per_delta": median(
            r["host_throughput"]["server_cpu_us_per_delta"] for r in rounds
        ),
        "median_bare_cpu_us_per_delta": median(
            r["bare_throughput"]["server_cpu_us_per_delta"] for r in rounds
        ),
        "target_throughput_ratio": 0.5,
    }
    result["meets_target"] = result["median_throughput_ratio"] >= 0.5
    print(
        f"median over {len(rounds)} rounds: throughput "
        f"{result['median_watch_throughput_per_s']:,.0f}/s vs bare "
        f"{result['median_bare_throughput_per_s']:,.0f}/s, ratio "
        f"{result['median_throughput_ratio']:.2f}x; latency p50/p99 watch "
        f"{result['median_watch_p50_ms']:.3f}/{result['median_watch_p99_ms']:.3f} ms, bare "
        f"{result['median_bare_p50_ms']:.3f}/{result['median_bare_p99_ms']:.3f} ms; server CPU per "
        f"delta host {result['median_host_cpu_us_per_delta']:.0f} us, bare "
        f"{result['median_bare_cpu_us_per_delta']:.0f} us"
    )
    print(f"wrote {write_results('activity_bench', result)}")


if __name__ == "__main__":
    main()
