"""Smoke tests of the host and maintenance benchmarks' machinery (no timing assertions: bench/
measures)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

import bench.stats
from bench import maintenance_bench
from bench.host_bench import Comparison, drive, echo_call, echo_server, table, verdicts
from bench.stats import summarize


def test_drive_issues_every_call_once_and_counts_failures() -> None:
    seen: list[int] = []

    async def call(index: int) -> object:
        await asyncio.sleep(0)
        seen.append(index)
        if index == 7:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata()
            )
        return index

    series = asyncio.run(drive(call, 20, 4, first=5))
    assert sorted(seen) == list(range(5, 25))
    assert len(series.latencies_ms) == 19
    assert series.errors == {"UNAVAILABLE": 1}


def test_echo_answers_with_the_requested_response_size() -> None:
    async def run() -> int:
        server, port = await echo_server()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                series = await drive(echo_call(channel, 300, 1234), 10, 2)
            return len(series.latencies_ms)
        finally:
            await server.stop(0)

    assert asyncio.run(run()) == 10


def test_report_helpers_check_targets_at_concurrency_32() -> None:
    def result(rpc: str, host_rate: float) -> Comparison:
        return Comparison(
            rpc=rpc,
            concurrency=32,
            host=summarize("host", [1.0], 1 / host_rate),
            echo=summarize("echo", [1.0], 1 / 1000),
            storage=summarize("storage", [1.0], 1 / 500),
            host_cpu_ms_per_request=1.0,
            echo_cpu_ms_per_request=0.1,
            storage_cpu_ms_per_request=0.5,
            request_bytes=10,
            response_bytes=20,
        )

    results = [result("GetSession", 600), result("SendInput new", 100)]
    checked = verdicts(results)
    assert checked["GetSession"]["met"] is True
    assert checked["SendInput new"]["met"] is False
    assert "| GetSession | 32 | 600 |" in table("sqlite", results)


def test_maintenance_bench_shape_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    shape = maintenance_bench.Shape(3, 2, 4, 10, 2)
    parents = maintenance_bench.tree_parents("x", shape)
    assert (shape.components, shape.sessions, len(parents)) == (5, 11, 11)
    assert sum(parent is None for parent in parents.values()) == shape.components
    assert parents["x00002-3"] == "x00002-1"  # one grandchild per tree of 4
    assert [parents.get(f"x{index:05d}-1") for index in range(5)] == [
        "x00000",
        None,
        "x00002",
        None,
        None,
    ]  # the trees spread among the single Sessions
    assert shape.rows() == {"sessions": 11, "turns": 22, "messages": 110}
    monkeypatch.setenv("MAINTENANCE_BENCH_TRIALS", "7")
    options, raw = maintenance_bench.parse_options([])
    assert (options.trials, raw) == (7, None)


@pytest.mark.slow
def test_maintenance_bench_tiny_run_writes_every_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench.stats, "RESULTS", tmp_path)
    path = maintenance_bench.main(
        [
            "--backends=sqlite",
            "--rounds=1",
            "--single-sessions=4",
            "--trees=2",
            "--messages-per-session=20",
            "--turns-per-session=2",
            "--trials=2",
            "--warmup-trials=0",
            "--pause-messages-per-session=10",
            "--pause-chunk-components=40",
            "--pause-reserve-components=30",
            "--calibration-components=12",
            "--calibration-runs=1",
            "--output=maintenance_bench_smoke",
        ]
    )
    assert path == tmp_path / "maintenance_bench_smoke.json"
    result = json.loads(path.read_text())
    purge = result["backends"]["sqlite"]["purge"]
    (round_,) = purge["rounds"]
    assert round_["deleted"]["messages"] == 6 * 20 + 2 * 3 * 20
    assert round_["deleted"]["sessions"] == 12
    assert round_["components"] == 6
    for key in ("purge_rows_per_s_median", "raw_rows_per_s_median", "ratio_median"):
        assert purge[key] > 0
    assert isinstance(purge["met"], bool)
    pause = result["backends"]["sqlite"]["pause"]
    assert pause["trials"] == 2
    assert len(pause["purge_trials"]) == 2
    assert pause["batch_ms"]["median_ms"] > 0
    for key in ("p50", "p99", "p99_in_batches"):
        assert isinstance(pause["pause_ms"][key], float)
    for key in ("purge_p99", "idle_p99", "p99_ratio"):
        assert pause["send_input_ms"][key] > 0
    assert set(result["targets_met"]["sqlite"]) == {"purge", "pause"}


@pytest.mark.slow
@pytest.mark.parametrize("transaction", ["ack", "submit"])
def test_write_stack_bench_every_sqlite_stack_runs_its_transaction(
    tmp_path: Path, transaction: str
) -> None:
    """Each stack's worker commits its transaction against today's schema (a model that drifts
    from the schema fails here, not in the next recorded run)."""
    from bench import write_stack_bench
    from bench.host_bench import database
    from bench.storage_stack_bench import seed

    with database("sqlite", tmp_path) as url:
        seed(url)
        for stack in write_stack_bench.STACKS[(transaction, "sqlite")]:
            figures = write_stack_bench.measure(transaction, stack, url, f"smoke-{stack}", 8)
            assert figures["throughput_per_s"] > 0, stack
            assert figures["cpu_ms_per_call"] >= 0, stack
