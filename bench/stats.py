"""Latency/throughput summaries and the JSON result files every benchmark writes.

Benchmarks run our code and its baseline side by side in one run (these machines are
noisy), report medians and p99, print the ratio to the baseline, and write a JSON file
under ``bench/results/`` together with the command that produced it.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(os.environ.get("TUTTI_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")
"""Where result files go: ``bench/results/`` unless ``TUTTI_BENCH_RESULTS`` names another
directory (the benchmarks' smoke tests write to a temporary one)."""


@dataclass(frozen=True)
class Summary:
    """Summary of one measured series (latencies in milliseconds)."""

    name: str
    samples: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    throughput_per_s: float | None = None


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of ``values`` (``fraction`` in [0, 1])."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return ordered[index]


def summarize(name: str, latencies_ms: list[float], elapsed_s: float | None = None) -> Summary:
    """Summarize latencies; with ``elapsed_s`` also the throughput of the whole series."""
    return Summary(
        name=name,
        samples=len(latencies_ms),
        p50_ms=statistics.median(latencies_ms),
        p99_ms=percentile(latencies_ms, 0.99),
        mean_ms=statistics.fmean(latencies_ms),
        throughput_per_s=(len(latencies_ms) / elapsed_s) if elapsed_s else None,
    )


def ratio_line(ours: Summary, baseline: Summary) -> str:
    """A one-line comparison: medians, p99 and the ratio of medians (ours / baseline)."""
    ratio = ours.p50_ms / baseline.p50_ms if baseline.p50_ms else float("inf")
    line = (
        f"{ours.name}: p50 {ours.p50_ms:.3f} ms p99 {ours.p99_ms:.3f} ms | "
        f"{baseline.name}: p50 {baseline.p50_ms:.3f} ms p99 {baseline.p99_ms:.3f} ms | "
        f"latency ratio {ratio:.2f}x"
    )
    if ours.throughput_per_s and baseline.throughput_per_s:
        line += f" | throughput ratio {ours.throughput_per_s / baseline.throughput_per_s:.2f}"
    return line


def write_results(name: str, payload: dict[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` with the machine, command and the payload."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "recorded_at_unix_ms": time.time_ns() // 1_000_000,
        "python": platform.python_version(),
        "machine": platform.machine(),
        **{
            key: (asdict(value) if isinstance(value, Summary) else value)
            for key, value in payload.items()
        },
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return path
