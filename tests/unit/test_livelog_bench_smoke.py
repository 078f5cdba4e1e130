"""Smoke test of bench/livelog_bench.py's worker (no timing assertions: bench/ measures)."""

from __future__ import annotations

import asyncio

from bench.livelog_bench import _worker


def test_the_worker_publishes_and_its_subscriber_receives_every_item_once() -> None:
    result = asyncio.run(_worker("inprocess", "", 50, 16, 4))
    assert result["received"] == result["distinct_received"] == result["expected"] == 150
    assert result["latency_p50_ms"] <= result["latency_p99_ms"]
