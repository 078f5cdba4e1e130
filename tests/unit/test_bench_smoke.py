"""Smoke test of the host benchmark's own machinery (no timing assertions: bench/ measures)."""

from __future__ import annotations

import asyncio

import grpc

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
            request_bytes=10,
            response_bytes=20,
        )

    results = [result("GetSession", 600), result("SendInput new", 100)]
    checked = verdicts(results)
    assert checked["GetSession"]["met"] is True
    assert checked["SendInput new"]["met"] is False
    assert "| GetSession | 32 | 600 |" in table("sqlite", results)
