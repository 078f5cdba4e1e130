"""Every benchmark of bench/README.md runs end to end from its command, in a tiny configuration.

No timing assertions (bench/ measures): a benchmark that no longer runs against today's
schema or API should fail here, not on the day someone needs its figures. Each runs as its
README command does (``python -m bench.<name>``, its own processes, real servers), with
small counts, and must write its result file with the command line that produced it.
Benchmarks with smoke tests of their own (live, livelog, maintenance, scaleout) are not
repeated here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.database import requested_backends

ROOT = Path(__file__).resolve().parents[2]

BENCHMARKS: dict[str, tuple[str, list[str], tuple[str, ...]]] = {
    # id: (module, tiny arguments, backends it can run on)
    "host": ("host_bench", ["--requests=8", "--warmup=2"], ("sqlite", "postgres")),
    "activity": (
        "activity_bench",
        ["--rate=200", "--seconds=0.2", "--burst=200", "--rounds=1"],
        ("sqlite",),
    ),
    "listing": (
        "listing_bench",
        ["--sizes=200,400", "--calls=2", "--warmup=1", "--output=listing_bench"],
        ("sqlite", "postgres"),
    ),
    "deletion": (
        "deletion_bench",
        ["--parts=purge,grpc_purge", "--trees=20", "--purge-rounds=1", "--grpc-rounds=1"],
        ("sqlite", "postgres"),
    ),
    "purge_interference": (
        "purge_interference_bench",
        ["--rate=5", "--idle-submits=3", "--rounds=1", "--trees=20"],
        ("sqlite", "postgres"),
    ),
    "group_commit": (
        "group_commit_bench",
        [
            "--requests=8",
            "--warmup=2",
            "--rounds=1",
            "--concurrency=4",
            "--store-writers=2",
            "--store-writes=3",
            "--store-rounds=1",
        ],
        ("sqlite",),
    ),
    "event_append": ("event_append_bench", ["--appends=8", "--rounds=1"], ("postgres",)),
    "storage_stack": (
        "storage_stack_bench",
        ["--calls=20", "--rounds=1"],
        ("sqlite", "postgres"),
    ),
    "write_stack": ("write_stack_bench", ["--calls=20", "--rounds=1"], ("sqlite", "postgres")),
    "refresolve": ("refresolve_bench", ["--iterations=2", "--warmup=1"], ("sqlite",)),
}
"""The benchmarks without a smoke test of their own, as bench/README.md runs them."""

# Which benchmarks take a --backends option (the rest run on the backend(s) listed above).
TAKES_BACKENDS = {
    "host_bench",
    "listing_bench",
    "deletion_bench",
    "purge_interference_bench",
    "storage_stack_bench",
    "write_stack_bench",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_the_benchmark_runs_from_its_command_and_writes_its_results(
    name: str, tmp_path: Path
) -> None:
    module, arguments, backends = BENCHMARKS[name]
    usable = [backend for backend in backends if backend in requested_backends()]
    if not usable:
        pytest.skip(f"{module} runs on {', '.join(backends)}, not requested here")
    if module in TAKES_BACKENDS:
        arguments = [*arguments, f"--backends={','.join(usable)}"]
    command = [sys.executable, "-m", f"bench.{module}", *arguments]
    completed = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, "TUTTI_BENCH_RESULTS": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, (
        f"{' '.join(command)} exited {completed.returncode}\n"
        f"--- stdout\n{completed.stdout[-4000:]}\n--- stderr\n{completed.stderr[-4000:]}"
    )
    (written,) = tmp_path.glob("*.json")
    document = json.loads(written.read_text())
    assert module in document["command"]
    assert document["benchmark"] == written.stem
