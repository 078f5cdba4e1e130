"""Livestream (issue 12, "Performance"): device fan-out, resume, latency, reconnect storm, memory.

Run: ``.venv/bin/python -m bench.live_bench`` (2.5-3.5 minutes on the 2-core machine;
``--help`` lists the sizes; ``LIVE_BENCH_<OPTION>`` environment variables set the same
options, e.g. ``LIVE_BENCH_FANOUT_DELTAS=20000``; ``--parts`` picks among ``fanout``,
``latency``, ``resume``, ``memory`` and ``storm``, which measures memory first).

Everything is a real process with default settings: ``tutti serve host`` (a migrated SQLite
file), ``tutti serve livestream`` (a fresh one per part), a runtime/producer process
(``bench.live_bench_sources.Producer``) on Host's ``RuntimeLink`` with a running Turn, and
``--device-procs`` device worker processes (``bench.live_bench_devices``) holding the links,
each link on its own TCP connection, each device its own principal (the per-principal
publisher bound is 16). Every delta's text carries its send time and index
(``bench.live_bench_common``): devices count the source deltas (ops) inside what they receive,
because the livestream coalesces adjacent appends, and check that they continue exactly.

1. **fan-out**: ``--fanout-links`` devices of one workspace; the runtime sends
   ``--fanout-deltas`` text deltas as fast as Host takes them (``--fanout-batch`` per
   ``RuntimeLink`` frame). Reported: deliveries/s (``message_delta`` deliveries counted at
   the devices) and **source deltas/s delivered**, summed over all devices, from the first
   send to the last device holding the last delta. The ratio uses source deltas/s: a baseline
   message is one source delta. Beside it, in interleaved rounds with the same producer, the
   same devices' processes and the same frames in:
   (a) **bare**: a ``grpc.aio`` server-stream process that writes one message per delta to
   every client (target: ours >= 2x); (b) **NATS core**: nats-py publish, one message per
   delta, to one subscriber connection per device on a nats-server started here (goal >= 1x);
   and, for information, **bare batched**: the bare server writing each ingested runtime
   frame as one message (what batching alone buys on this transport).
2. **resume**: a device disconnects; the runtime sends deltas until that publisher's replay
   buffer holds its full window (8 MiB by default, checked with ``ListPublishers``, never
   past it); the device reconnects on its open channel with its cursor. Time from the hello
   to ``stream_ready`` (after the replay) beside a JetStream ordered consumer (memory
   stream) replaying the same deliveries, the same bytes, from a sequence, and the same
   source deltas as one message each.
3. **latency**: runtime report -> device p50/p99 at ``--latency-rate`` deltas/s (one delta
   per frame), once per ``--latency-links`` entry (devices of their own, before any
   fan-out device exists), beside the bare stream and NATS with as many subscribers.
4. **reconnect storm**: ``--storm-links`` links drop at one instant (calls cancelled,
   channels closed) and reconnect at once with their cursors (a refused one retries with a
   jittered backoff); reported: how many resumed, time to all resumed, every error code,
   whether every device then holds every delta. Beside it, the bare server's streams doing
   the same (target: all resumed, none ``CANCELLED``).
5. **memory**: RSS of the livestream process with ``--memory-links`` idle links above the
   empty server (target <= 20 KB per link), beside the bare server's RSS per idle stream.

Every part records the CPU time of each process role (``/proc``), per source delta in the
fan-out. ``--device-check raw`` checks continuity on the generated messages instead of the
device library's machine (to attribute device-side cost); ``--livestream-command`` runs
another command in place of ``tutti serve livestream`` (a profiler such as ``python -m
pyinstrument -r text -o FILE -m tutti serve livestream``, or a candidate build);
``--workdir DIR`` keeps the service logs. Results go to ``bench/results/live_bench.json``
(``--output`` names another file).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shlex
import statistics
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import yaml

from agentactivity.livestream.v1 import livestream_pb2, livestream_pb2_grpc
from bench.live_bench_common import MIN_WIDTH, WORKSPACE
from bench.live_bench_procs import (
    Service,
    Worker,
    cpu_seconds,
    migrate,
    rss_bytes,
    start_nats,
    start_service,
)
from bench.stats import summarize, write_results
from grpcserver.auth import token_digest

MIB = 1024 * 1024
REPLAY_BUDGET_BYTES = 8 * MIB
"""The livestream's default replay budget per publisher (``TUTTI_LIVE_REPLAY_BUDGET_BYTES``)."""
DELIVERY_OVERHEAD_BYTES = 128
"""More than one delivery adds around its text (sequence, identity fields, tags)."""
FILL_STEP_MAX = 2048
"""Deltas per fill step: far below Host's default watch queue (10,000 items)."""
SYSTEMS = ("live", "bare", "nats")
FANOUT_SYSTEMS = (*SYSTEMS, "bare_batched")
"""``bare_batched`` (the bare server writing each ingested frame as one message) is an
informative series of the fan-out: what batching alone buys on this transport."""

T = TypeVar("T")


@dataclass(frozen=True)
class Options:
    """Sizes of one run (``--help``)."""

    device_procs: int = 4
    fanout_links: int = 100
    fanout_deltas: int = 1500
    fanout_batch: int = 10
    rounds: int = 3
    delta_bytes: int = 40
    latency_rate: float = 1000.0
    latency_seconds: float = 3.0
    resume_rounds: int = 3
    resume_delta_bytes: int = 1024
    resume_batch: int = 16
    storm_links: int = 2000
    latency_links: str = "1"
    latency_rounds: int = 3
    memory_links: int = 1000
    wait_seconds: float = 120.0
    parts: str = "fanout,latency,resume,storm"
    output: str = "live_bench"
    livestream_command: str = ""
    device_check: str = "library"
    workdir: str = ""


def parse_options(argv: Sequence[str] | None = None) -> Options:
    """Options from the command line, defaults from ``LIVE_BENCH_<NAME>`` variables."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.live_bench", description=__doc__.split("\n\n")[0]
    )
    for name, default in asdict(Options()).items():
        env = os.environ.get(f"LIVE_BENCH_{name.upper()}")
        kind = type(default)
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=kind,
            default=kind(env) if env is not None else default,
            help=f"default {default!r} (env LIVE_BENCH_{name.upper()})",
        )
    options = Options(**vars(parser.parse_args(argv)))
    if options.delta_bytes < MIN_WIDTH or options.resume_delta_bytes < MIN_WIDTH:
        parser.error(f"delta sizes must be at least {MIN_WIDTH} bytes")
    return options


def split(items: Sequence[T], parts: int) -> list[list[T]]:
    """``items`` in ``parts`` contiguous chunks of near-equal size (none empty)."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for k in range(parts):
        end = start + size + (1 if k < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return out


def gather(futures: Sequence[Future[T]], timeout: float = 600.0) -> list[T]:
    """Every result, in order."""
    return [future.result(timeout=timeout) for future in futures]


def quantiles(values: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / max of ``values``."""
    summary = summarize("values", list(values))
    return {"p50": summary.p50_ms, "p99": summary.p99_ms, "max": max(values)}


def write_tokens(path: Path, devices: Sequence[str]) -> dict[str, str]:
    """A token registry: an admin, the service principal, and one device principal each.

    Device principals have role ``device`` in the bench workspace; returns name -> token.
    """
    tokens = {name: secrets.token_urlsafe(18) for name in ("admin", "service", *devices)}
    roles = {"admin": "admin", "service": "service"}
    entries = [
        {
            "subject": f"bench-{name}",
            "role": roles.get(name, "device"),
            "workspaces": ["*"] if name in roles else [WORKSPACE],
            "sha256": token_digest(token),
        }
        for name, token in tokens.items()
    ]
    path.write_text(yaml.safe_dump({"tokens": entries}))
    return tokens


class Bench:
    """One run: the processes and the parts (see the module docstring)."""

    def __init__(self, options: Options, workdir: Path, stack: ExitStack) -> None:
        self.o = options
        self.workdir = workdir
        self.stack = stack
        self.next_index = dict.fromkeys(FANOUT_SYSTEMS, 0)
        self.latency_fanouts = [int(n) for n in options.latency_links.split(",") if n.strip()]
        self.latency_devices = [f"lat{n}-{k:04d}" for n in self.latency_fanouts for k in range(n)]
        self.fan_devices = [f"fan-{k:04d}" for k in range(options.fanout_links)]
        self.resume_devices = [f"resume-{k}" for k in range(options.resume_rounds)]
        self.storm_devices = [
            f"storm-{k:04d}" for k in range(max(options.storm_links, options.memory_links))
        ]
        self.tokens_file = workdir / "tokens.yaml"
        self.tokens = write_tokens(
            self.tokens_file,
            [
                *self.latency_devices,
                *self.fan_devices,
                *self.resume_devices,
                "witness",
                *self.storm_devices,
            ],
        )
        self.database_url = f"sqlite:///{workdir / 'host.db'}"
        migrate(self.database_url)
        self.host = self._service(
            "host",
            {
                "data_dir": str(workdir / "host-data"),
                "database_url": self.database_url,
                "auth_tokens_file": str(self.tokens_file),
            },
        )
        self.nats = start_nats(workdir)
        stack.callback(self.nats.stop)
        self.producer = self._worker("bench.live_bench_sources:Producer", "producer")
        self.producer.call(
            "setup_host",
            address=self.host.address,
            admin_token=self.tokens["admin"],
            service_token=self.tokens["service"],
        )
        self.bare = self._worker("bench.live_bench_sources:BareServer", "bare-server")
        self.bare_address = f"127.0.0.1:{self.bare.call('start')}"
        self.producer.call("connect_bare", address=self.bare_address)
        self.producer.call("connect_nats", url=self.nats.address)
        self.devices = [
            self._worker(
                "bench.live_bench_devices:DeviceWorker", f"devices-{k}", check=options.device_check
            )
            for k in range(options.device_procs)
        ]

    # ---- processes ---------------------------------------------------------------------------

    def _service(self, name: str, settings: dict[str, str]) -> Service:
        service = start_service(name, self.workdir, settings)
        self.stack.callback(service.stop)
        return service

    def _worker(self, handler: str, name: str, **init: Any) -> Worker:
        worker = Worker(handler, name, **init)
        self.stack.callback(worker.stop)
        return worker

    def livestream(self) -> Service:
        """A fresh ``tutti serve livestream`` on the benchmark's Host (default limits).

        ``--livestream-command`` replaces ``tutti serve livestream`` (a profiler, or a
        candidate build to compare; ``--port-file`` is appended).
        """
        command = self.o.livestream_command
        settings = {
            "data_dir": str(self.workdir / "live-data"),
            "auth_tokens_file": str(self.tokens_file),
            "service_token": self.tokens["service"],
            "host_address": self.host.address,
        }
        argv = shlex.split(command) if command else None
        service = start_service("livestream", self.workdir, settings, argv=argv)
        self.stack.callback(service.stop)
        return service

    def pids(self, system: str, live: Service | None) -> dict[str, list[int]]:
        """The processes of one system, by role (for CPU accounting)."""
        roles: dict[str, list[int]] = {
            "producer": [self.producer.pid],
            "devices": [w.pid for w in self.devices],
        }
        if system == "live":
            roles["host"] = [self.host.pid]
            if live is not None:
                roles["livestream"] = [live.pid]
        elif system in ("bare", "bare_batched"):
            roles["bare_server"] = [self.bare.pid]
        else:
            roles["nats_server"] = [self.nats.pid]
        return roles

    @staticmethod
    def cpu(roles: dict[str, list[int]]) -> dict[str, float]:
        """CPU seconds used so far, by role."""
        return {role: sum(cpu_seconds(pid) for pid in pids) for role, pids in roles.items()}

    def on_devices(self, command: str, **per_call: Any) -> list[Any]:
        """Run one command on every device worker at once."""
        return gather([w.request(command, **per_call) for w in self.devices], 900)

    # ---- connecting --------------------------------------------------------------------------

    def connect_live(
        self, group: str, live: Service, devices: Sequence[str], width: int
    ) -> dict[str, Any]:
        """One ``DeviceLink`` per device, spread over the device workers."""
        chunks = split(devices, len(self.devices))
        started = time.perf_counter()
        replies = gather(
            [
                worker.request(
                    "connect_live",
                    group=group,
                    address=live.address,
                    devices=[(d, self.tokens[d]) for d in chunk],
                    first_index=self.next_index["live"],
                    width=width,
                )
                for worker, chunk in zip(self.devices, chunks, strict=False)
            ]
        )
        errors: dict[str, int] = {}
        for reply in replies:
            for code, count in reply["errors"].items():
                errors[code] = errors.get(code, 0) + count
        ready = sum(reply["ready"] for reply in replies)
        if ready != len(devices):
            raise RuntimeError(f"{group}: {ready} of {len(devices)} links ready; {errors}")
        return {"links": ready, "seconds": time.perf_counter() - started, "errors": errors}

    def connect_baselines(
        self, group: str, links: int, width: int, *, batched: bool = False
    ) -> None:
        """``links`` bare streams and ``links`` NATS subscribers over the device workers.

        Also ``links`` batched bare streams when asked.
        """
        counts = [len(c) for c in split(range(links), len(self.devices))]
        if batched:
            gather(
                [
                    w.request(
                        "connect_bare",
                        group=f"{group}-bare_batched",
                        address=self.bare_address,
                        count=n,
                        first_index=self.next_index["bare_batched"],
                        width=width,
                        method_name="BatchedStream",
                    )
                    for w, n in zip(self.devices, counts, strict=False)
                ]
            )
        gather(
            [
                w.request(
                    "connect_bare",
                    group=f"{group}-bare",
                    address=self.bare_address,
                    count=n,
                    first_index=self.next_index["bare"],
                    width=width,
                )
                for w, n in zip(self.devices, counts, strict=False)
            ]
        )
        gather(
            [
                w.request(
                    "connect_nats",
                    group=f"{group}-nats",
                    url=self.nats.address,
                    subject="live.ws-bench",
                    count=n,
                    first_index=self.next_index["nats"],
                    width=width,
                )
                for w, n in zip(self.devices, counts, strict=False)
            ]
        )

    # ---- one measured burst ------------------------------------------------------------------

    def burst(
        self,
        system: str,
        group: str,
        count: int,
        *,
        width: int,
        batch: int,
        rate: float | None = None,
        latencies: bool = False,
        live: Service | None = None,
        workers: Sequence[Worker] | None = None,
    ) -> dict[str, Any]:
        """Send ``count`` deltas through ``system``; wait until ``group`` holds the last one.

        Every link of ``group`` must hold it; returns what arrived, how fast, and the CPU each
        role used.
        """
        workers = list(workers or self.devices)
        first = self.next_index[system]
        last = first + count - 1
        gather(
            [w.request("arm", group=group, target_index=last, latencies=latencies) for w in workers]
        )
        roles = self.pids(system, live)
        cpu_before = self.cpu(roles)
        sent = self.producer.call(
            "send",
            system=system,
            first_index=first,
            count=count,
            width=width,
            batch=batch,
            rate=rate,
        )
        self.next_index[system] += count
        waited = gather(
            [w.request("wait", group=group, seconds=self.o.wait_seconds) for w in workers]
        )
        cpu_after = self.cpu(roles)
        links = [link for reply in waited for link in reply["links"]]
        done = [link["done_at_ns"] for link in links if link["done_at_ns"] is not None]
        end_ns = max(done) if done else time.perf_counter_ns()
        elapsed = max(1e-9, (end_ns - sent["start_ns"]) / 1e9)
        ops = sum(link["ops"] for link in links)
        deliveries = sum(link["deliveries"] for link in links)
        frames = sum(link["frames"] for link in links)
        problems = [f"{link['name']}: {p}" for link in links for p in link["problems"]][:20]
        errors = [f"{link['name']}: {link['error']}" for link in links if link["error"]][:20]
        result: dict[str, Any] = {
            "system": system,
            "links": len(links),
            "source_deltas": count,
            "batch": batch,
            "rate_per_s": rate,
            "complete_links": len(done),
            "seconds": elapsed,
            "send_seconds": (sent["end_ns"] - sent["start_ns"]) / 1e9,
            "source_deltas_delivered": ops,
            "source_deltas_per_s": ops / elapsed,
            "deliveries": deliveries,
            "deliveries_per_s": deliveries / elapsed,
            "frames": frames,
            "source_deltas_per_delivery": ops / deliveries if deliveries else 0.0,
            "cpu_seconds": {role: round(cpu_after[role] - cpu_before[role], 3) for role in roles},
            "cpu_us_per_source_delta": {
                role: round((cpu_after[role] - cpu_before[role]) / max(1, ops) * 1e6, 2)
                for role in roles
            },
            "problems": problems,
            "errors": errors,
        }
        if latencies:
            samples = [x for reply in waited for x in reply["latencies_ms"]]
            result["latency_ms"] = quantiles(samples) if samples else None
            result["latency_samples"] = len(samples)
        return result

    # ---- 1 + 3: fan-out and latency -----------------------------------------------------------

    def fanout_and_latency(self, parts: set[str]) -> dict[str, Any]:
        """Latency first, then the fan-out rounds, on one fresh livestream process.

        The latency part uses ``--latency-links`` devices with nothing else attached.
        """
        live = self.livestream()
        out: dict[str, Any] = {}
        if "latency" in parts:
            out["latency"] = self._latency(live)
        if "fanout" in parts:
            out["fanout"] = self._fanout(live)
        live.stop()
        return out

    def _connect_all(self, prefix: str, live: Service, devices: Sequence[str], width: int) -> None:
        """Live links of ``devices`` and as many bare streams and NATS subscribers."""
        self.connect_live(prefix, live, devices, width)
        self.connect_baselines(prefix, len(devices), width)

    def _close_all(self, prefix: str) -> None:
        for group in (prefix, f"{prefix}-bare", f"{prefix}-nats"):
            self.on_devices("close", group=group)

    def _latency(self, live: Service) -> dict[str, Any]:
        """One latency run per ``--latency-links`` entry (each on its own devices)."""
        runs = []
        for fanout in self.latency_fanouts:
            runs.append(self._latency_run(live, fanout))
        return {
            "runs": runs,
            "ratio_basis": "latency, ours / baseline (below 1: ours is faster)",
        }

    def _latency_run(self, live: Service, fanout: int) -> dict[str, Any]:
        """``--latency-rounds`` interleaved rounds (the order rotates) at ``fanout`` devices.

        Returns medians over the rounds of each system's p50 and p99.
        """
        o = self.o
        prefix = f"lat{fanout}"
        devices = [d for d in self.latency_devices if d.startswith(f"{prefix}-")]
        self._connect_all(prefix, live, devices, o.delta_bytes)
        groups = {"live": prefix, "bare": f"{prefix}-bare", "nats": f"{prefix}-nats"}
        count = int(o.latency_rate * o.latency_seconds)
        for system in SYSTEMS:  # a short warm-up at the same rate, not recorded
            self.burst(
                system,
                groups[system],
                min(200, count),
                width=o.delta_bytes,
                batch=1,
                rate=o.latency_rate,
                live=live,
            )
        rounds = []
        for number in range(o.latency_rounds):
            order = SYSTEMS[number % 3 :] + SYSTEMS[: number % 3]
            entry: dict[str, Any] = {"order": list(order)}
            for system in order:
                entry[system] = self.burst(
                    system,
                    groups[system],
                    count,
                    width=o.delta_bytes,
                    batch=1,
                    rate=o.latency_rate,
                    latencies=True,
                    live=live,
                )
            rounds.append(entry)
            print(
                f"latency round {number + 1} @ {o.latency_rate:,.0f}/s to {fanout} device(s): "
                + " | ".join(
                    f"{s} p50 {entry[s]['latency_ms']['p50']:.2f} ms "
                    f"p99 {entry[s]['latency_ms']['p99']:.2f} ms"
                    for s in SYSTEMS
                ),
                flush=True,
            )
        self._close_all(prefix)
        run: dict[str, Any] = {"links": fanout, "rate_per_s": o.latency_rate, "rounds": rounds}
        for system in SYSTEMS:
            run[system] = {
                q: statistics.median(r[system]["latency_ms"][q] for r in rounds)
                for q in ("p50", "p99", "max")
            }
            run[system]["complete"] = all(
                r[system]["complete_links"] == fanout and not r[system]["problems"] for r in rounds
            )
        for base in ("bare", "nats"):
            for q in ("p50", "p99"):
                run[f"median_{q}_ratio_vs_{base}"] = run["live"][q] / run[base][q]
        return run

    def _fanout(self, live: Service) -> dict[str, Any]:
        o = self.o
        connect = self.connect_live("fan", live, self.fan_devices, o.delta_bytes)
        self.connect_baselines("fan", o.fanout_links, o.delta_bytes, batched=True)
        groups = {
            "live": "fan",
            "bare": "fan-bare",
            "nats": "fan-nats",
            "bare_batched": "fan-bare_batched",
        }
        for system in FANOUT_SYSTEMS:  # warm-up, not recorded
            self.burst(
                system, groups[system], 200, width=o.delta_bytes, batch=o.fanout_batch, live=live
            )
        rounds = []
        for number in range(o.rounds):
            order = FANOUT_SYSTEMS[number % 4 :] + FANOUT_SYSTEMS[: number % 4]
            entry: dict[str, Any] = {"order": list(order)}
            for system in order:
                entry[system] = self.burst(
                    system,
                    groups[system],
                    o.fanout_deltas,
                    width=o.delta_bytes,
                    batch=o.fanout_batch,
                    live=live,
                )
            entry["ratio_vs_bare"] = (
                entry["live"]["source_deltas_per_s"] / entry["bare"]["source_deltas_per_s"]
            )
            entry["ratio_vs_nats"] = (
                entry["live"]["source_deltas_per_s"] / entry["nats"]["source_deltas_per_s"]
            )
            rounds.append(entry)
            print(
                f"fan-out round {number + 1}: "
                + " | ".join(
                    f"{s} {entry[s]['source_deltas_per_s']:,.0f} source deltas/s "
                    f"({entry[s]['deliveries_per_s']:,.0f} deliveries/s, "
                    f"{entry[s]['complete_links']}/{entry[s]['links']} complete)"
                    for s in FANOUT_SYSTEMS
                )
                + f" | ours/bare {entry['ratio_vs_bare']:.2f}x"
                f" ours/nats {entry['ratio_vs_nats']:.2f}x",
                flush=True,
            )
        self._close_all("fan")
        self.on_devices("close", group="fan-bare_batched")
        return {"connect": connect, "rounds": rounds, **self._fanout_medians(rounds)}

    @staticmethod
    def _fanout_medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
        medians: dict[str, Any] = {}
        for system in FANOUT_SYSTEMS:
            medians[system] = {
                key: statistics.median(r[system][key] for r in rounds)
                for key in (
                    "source_deltas_per_s",
                    "deliveries_per_s",
                    "seconds",
                    "source_deltas_per_delivery",
                )
            }
            medians[system]["frames_per_delivery"] = statistics.median(
                r[system]["frames"] / max(1, r[system]["deliveries"]) for r in rounds
            )
            medians[system]["cpu_us_per_source_delta"] = {
                role: statistics.median(r[system]["cpu_us_per_source_delta"][role] for r in rounds)
                for role in rounds[0][system]["cpu_us_per_source_delta"]
            }
        medians["median_ratio_vs_bare"] = statistics.median(r["ratio_vs_bare"] for r in rounds)
        medians["median_ratio_vs_nats"] = statistics.median(r["ratio_vs_nats"] for r in rounds)
        medians["median_bare_batched_vs_bare"] = statistics.median(
            r["bare_batched"]["source_deltas_per_s"] / r["bare"]["source_deltas_per_s"]
            for r in rounds
        )
        medians["ratio_basis"] = (
            "source deltas per second delivered, summed over all devices (a baseline message "
            "is one source delta)"
        )
        medians["target_ratio_vs_bare"] = 2.0
        medians["goal_ratio_vs_nats"] = 1.0
        return medians

    # ---- 2: resume ---------------------------------------------------------------------------

    def _publisher(self, stub: Any, device: str) -> livestream_pb2.PublisherInfo:
        page = stub.ListPublishers(
            livestream_pb2.ListPublishersRequest(device_id=device),
            metadata=(("authorization", f"Bearer {self.tokens['admin']}"),),
        )
        if len(page.publishers) != 1:
            raise RuntimeError(f"expected one publisher of {device}, got {len(page.publishers)}")
        info: livestream_pb2.PublisherInfo = page.publishers[0]
        return info

    def _fill(self, stub: Any, device: str, cursor_sequence: int, witness: Worker) -> int:
        """Send deltas until ``device``'s publisher holds nearly its whole replay budget.

        It must still hold everything after the cursor; returns how many deltas were sent.
        """
        o = self.o
        per_op = o.resume_delta_bytes + DELIVERY_OVERHEAD_BYTES
        sent = 0
        while True:
            info = self._publisher(stub, device)
            if info.oldest_replayable_sequence > cursor_sequence + 1:
                raise RuntimeError(f"{device}: the fill evicted the cursor's next delivery")
            step = min(FILL_STEP_MAX, (REPLAY_BUDGET_BYTES - info.replay_bytes) // per_op - 1)
            if step < 1:
                return sent
            self.burst(
                "live",
                "witness",
                step,
                width=o.resume_delta_bytes,
                batch=o.resume_batch,
                workers=[witness],
            )
            sent += step

    def resume(self) -> dict[str, Any]:
        """Resume after a disconnect, ours against a JetStream replay of the same deltas.

        Each round disconnects one device, fills its publisher's replay budget while a
        witness link keeps receiving, then times the device's resume to ``stream_ready``
        and JetStream replays of the same deliveries and of one message per delta.

        Returns:
            The rounds and the medians of their times and ratios.
        """
        o = self.o
        live = self.livestream()
        channel = grpc.insecure_channel(live.address)
        stub: Any = livestream_pb2_grpc.DeviceLinkServiceStub(channel)
        witness, device_worker = self.devices[0], self.devices[-1]
        witness.call(
            "connect_live",
            group="witness",
            address=live.address,
            devices=[("witness", self.tokens["witness"])],
            first_index=self.next_index["live"],
            width=o.resume_delta_bytes,
        )
        rounds = []
        for number, device in enumerate(self.resume_devices):
            group = f"resume-{number}"
            device_worker.call(
                "connect_live",
                group=group,
                address=live.address,
                devices=[(device, self.tokens[device])],
                first_index=self.next_index["live"],
                width=o.resume_delta_bytes,
            )
            # One delta, so the cursor is past the start of the epoch.
            self.burst(
                "live", group, 1, width=o.resume_delta_bytes, batch=1, workers=[device_worker]
            )
            (cursor,) = device_worker.call("disconnect", group=group)
            sent = self._fill(stub, device, cursor[1], witness)
            info = self._publisher(stub, device)
            (ours,) = device_worker.call("resume", group=group)
            deliveries: list[bytes] = ours.pop("deliveries")
            js_same = self._js_replay(f"SAME{number}", deliveries, device_worker)
            js_each = self._js_replay(f"EACH{number}", per_op_messages(deliveries), device_worker)
            entry = {
                "cursor_sequence": cursor[1],
                "deltas_sent_while_disconnected": sent,
                "publisher_replay_bytes": info.replay_bytes,
                "publisher_latest_sequence": info.latest_sequence,
                "ours": ours,
                "jetstream_same_deliveries": js_same,
                "jetstream_one_message_per_delta": js_each,
                "ratio_vs_jetstream_same": ours["seconds"] / js_same["seconds"],
                "ratio_vs_jetstream_per_delta": ours["seconds"] / js_each["seconds"],
                "complete": ours["resumed"] is True
                and ours["replayed_ops"] == sent
                and not ours["problems"],
            }
            rounds.append(entry)
            print(
                f"resume round {number + 1}: {ours['replayed_bytes'] / MIB:.2f} MiB in "
                f"{ours['replayed_deliveries']} deliveries ({ours['replayed_ops']} source "
                f"deltas) to stream_ready in {ours['seconds'] * 1000:.1f} ms "
                f"(resumed={ours['resumed']}) | JetStream same deliveries "
                f"{js_same['seconds'] * 1000:.1f} ms, one message per delta "
                f"{js_each['seconds'] * 1000:.1f} ms | ours/JetStream time "
                f"{entry['ratio_vs_jetstream_same']:.2f}x / "
                f"{entry['ratio_vs_jetstream_per_delta']:.2f}x",
                flush=True,
            )
            device_worker.call("close", group=group)
        witness.call("close", group="witness")
        channel.close()
        live.stop()
        return {
            "rounds": rounds,
            "median_ours_seconds": statistics.median(r["ours"]["seconds"] for r in rounds),
            "median_jetstream_same_seconds": statistics.median(
                r["jetstream_same_deliveries"]["seconds"] for r in rounds
            ),
            "median_jetstream_per_delta_seconds": statistics.median(
                r["jetstream_one_message_per_delta"]["seconds"] for r in rounds
            ),
            "median_ratio_vs_jetstream_same": statistics.median(
                r["ratio_vs_jetstream_same"] for r in rounds
            ),
            "median_ratio_vs_jetstream_per_delta": statistics.median(
                r["ratio_vs_jetstream_per_delta"] for r in rounds
            ),
            "ratio_basis": "time to caught up, ours / JetStream (below 1: ours is faster)",
        }

    def _js_replay(self, stream: str, payloads: list[bytes], worker: Worker) -> dict[str, Any]:
        filled = self.producer.call(
            "js_fill", stream=stream, subject=f"{stream}.d", payloads=payloads
        )
        result: dict[str, Any] = worker.call(
            "js_replay",
            url=self.nats.address,
            subject=f"{stream}.d",
            start_sequence=filled["first_sequence"],
            count=len(payloads),
            width=self.o.resume_delta_bytes,
        )
        return result

    # ---- 4 + 5: memory and reconnect storm --------------------------------------------------

    def _connect_spread(self, kind: str, address: str, names: Sequence[str], width: int) -> None:
        """Add links to the per-worker groups ``<kind>-<k>`` (``live``: one per device)."""
        futures = []
        for k, (worker, chunk) in enumerate(
            zip(self.devices, split(names, len(self.devices)), strict=False)
        ):
            if kind == "live":
                futures.append(
                    worker.request(
                        "connect_live",
                        group=f"storm-{k}",
                        address=address,
                        devices=[(d, self.tokens[d]) for d in chunk],
                        first_index=self.next_index["live"],
                        width=width,
                        append=True,
                    )
                )
            else:
                futures.append(
                    worker.request(
                        "connect_bare",
                        group=f"idle-bare-{k}",
                        address=address,
                        count=len(chunk),
                        first_index=0,
                        width=width,
                        append=True,
                    )
                )
        for reply in gather(futures, 900):
            if kind == "live" and reply["ready"] != reply["links"]:
                raise RuntimeError(f"storm links not ready: {reply}")

    def memory_and_storm(self, parts: set[str]) -> dict[str, Any]:
        """Idle-link memory of livestream and the bare server, then the reconnect storm.

        Args:
            parts: The selected parts; the storm runs when it holds ``"storm"``.

        Returns:
            ``memory`` (RSS per idle link and stream) and, when run, ``storm``.
        """
        o = self.o
        out: dict[str, Any] = {}
        live = self.livestream()
        devices = self.storm_devices
        memory: dict[str, Any] = {"links": o.memory_links}
        time.sleep(1.0)
        memory["empty_rss_bytes"] = settled_rss(live.pid)
        self._connect_spread("live", live.address, devices[:1], o.delta_bytes)
        memory["one_link_rss_bytes"] = settled_rss(live.pid)
        started = time.perf_counter()
        self._connect_spread("live", live.address, devices[1 : o.memory_links], o.delta_bytes)
        memory["connect_seconds"] = time.perf_counter() - started
        memory["idle_rss_bytes"] = settled_rss(live.pid)
        memory["bytes_per_idle_link"] = (
            memory["idle_rss_bytes"] - memory["empty_rss_bytes"]
        ) / o.memory_links
        memory["bytes_per_idle_link_above_one"] = (
            memory["idle_rss_bytes"] - memory["one_link_rss_bytes"]
        ) / max(1, o.memory_links - 1)
        memory["target_bytes_per_idle_link"] = 20 * 1000
        bare = self._worker("bench.live_bench_sources:BareServer", "bare-idle")
        bare_address = f"127.0.0.1:{bare.call('start')}"
        time.sleep(1.0)
        memory["bare_empty_rss_bytes"] = settled_rss(bare.pid)
        names = [f"bare-{k}" for k in range(o.memory_links)]
        self._connect_spread("bare", bare_address, names, o.delta_bytes)
        memory["bare_idle_rss_bytes"] = settled_rss(bare.pid)
        memory["bare_bytes_per_idle_stream"] = (
            memory["bare_idle_rss_bytes"] - memory["bare_empty_rss_bytes"]
        ) / o.memory_links
        out["memory"] = memory
        print(
            f"memory: {o.memory_links} idle links add "
            f"{memory['bytes_per_idle_link'] / 1000:.1f} KB each to the livestream RSS "
            f"({memory['empty_rss_bytes'] / MIB:.1f} -> {memory['idle_rss_bytes'] / MIB:.1f} MiB; "
            f"{memory['bytes_per_idle_link_above_one'] / 1000:.1f} KB above one link) | bare "
            f"server {memory['bare_bytes_per_idle_stream'] / 1000:.1f} KB per idle stream",
            flush=True,
        )
        if "storm" in parts:
            more = devices[o.memory_links : o.storm_links]
            self._connect_spread("live", live.address, more, o.delta_bytes)
            out["memory"]["storm_links_rss_bytes"] = settled_rss(live.pid, samples=2)
            extra = [f"bare-{k}" for k in range(o.memory_links, o.storm_links)]
            self._connect_spread("bare", bare_address, extra, o.delta_bytes)
            out["storm"] = self._storm(live, bare_address)
        for k in range(len(self.devices)):
            self.on_devices("close", group=f"storm-{k}")
            self.on_devices("close", group=f"idle-bare-{k}")
        bare.stop()
        live.stop()
        return out

    def _storm(self, live: Service, bare_address: str) -> dict[str, Any]:
        o = self.o
        groups = [(w, f"storm-{k}") for k, w in enumerate(self.devices)]
        # Every device holds a cursor past the epoch start before the drop.
        before = self._storm_burst(groups, 3)
        log_start = live.log_path.stat().st_size
        at_ns = time.perf_counter_ns() + int(0.5e9)
        storms = [
            worker.request("storm", group=group, address=live.address, at_ns=at_ns)
            for worker, group in groups
        ]
        # Deltas keep coming while the links are down and coming back.
        sent = self.producer.request(
            "send",
            system="live",
            first_index=self.next_index["live"],
            count=3,
            width=o.delta_bytes,
            batch=1,
            rate=20.0,
            at_ns=at_ns,
        )
        self.next_index["live"] += 3
        results = gather(storms, 900)
        sent.result(timeout=60)
        links = sum(r["links"] for r in results)
        ready = [t for r in results for t in r["ready_at_ns"]]
        dropped = min(r["dropped_at_ns"] for r in results)
        errors: dict[str, int] = {}
        for r in results:
            for code, count in r["errors"].items():
                errors[code] = errors.get(code, 0) + count
        after = self._storm_burst(groups, 3)
        storm_log = log_problems(live.log_path, log_start)
        storm = {
            "links": links,
            "with_cursor": sum(r["with_cursor"] for r in results),
            "resumed": sum(r["resumed"] for r in results),
            "ready": len(ready),
            "attempts": sum(r["attempts"] for r in results),
            "seconds_to_all_resumed": (max(ready) - dropped) / 1e9 if ready else None,
            "seconds_to_half_resumed": (sorted(ready)[len(ready) // 2] - dropped) / 1e9
            if ready
            else None,
            "seconds_from_reconnect_to_all_resumed": (
                max(ready) - min(r["reconnect_at_ns"] for r in results)
            )
            / 1e9
            if ready
            else None,
            "drop_seconds": max(r["drop_seconds"] for r in results),
            "errors": errors,
            "error_samples": [x for r in results for x in r["error_samples"]][:20],
            "cancelled": sum(n for code, n in errors.items() if code.startswith("CANCELLED")),
            "problems": [p for r in results for p in r["problems"]][:20],
            "before": before,
            "after": after,
            "every_delta_arrived_after": after["complete_links"] == links and not after["problems"],
            "livestream_log_during_storm": storm_log,
        }
        print(
            f"storm: {storm['resumed']}/{links} resumed, all in "
            f"{storm['seconds_to_all_resumed']:.2f} s (half in "
            f"{storm['seconds_to_half_resumed']:.2f} s), {storm['attempts']} attempts, "
            f"errors {errors or 'none'}; every delta arrived afterwards: "
            f"{storm['every_delta_arrived_after']}; livestream logged "
            f"{storm_log['error_records']} ERROR records {storm_log['exceptions'] or ''}",
            flush=True,
        )
        storm["bare"] = self._bare_storm(bare_address)
        print(
            f"storm bare: {storm['bare']['ready']}/{storm['bare']['links']} streams back in "
            f"{storm['bare']['seconds_to_all_ready']:.2f} s, {storm['bare']['attempts']} "
            f"attempts, errors {storm['bare']['errors'] or 'none'}",
            flush=True,
        )
        return storm

    def _storm_burst(self, groups: list[tuple[Worker, str]], count: int) -> dict[str, Any]:
        """``count`` deltas; waits until every storm link holds them."""
        first = self.next_index["live"]
        gather([w.request("arm", group=g, target_index=first + count - 1) for w, g in groups])
        started = time.perf_counter_ns()
        self.producer.call(
            "send", system="live", first_index=first, count=count, width=self.o.delta_bytes, batch=1
        )
        self.next_index["live"] += count
        replies = gather(
            [w.request("wait", group=g, seconds=self.o.wait_seconds) for w, g in groups], 900
        )
        links = [link for reply in replies for link in reply["links"]]
        done = [link["done_at_ns"] for link in links if link["done_at_ns"] is not None]
        return {
            "links": len(links),
            "complete_links": len(done),
            "seconds": (max(done) - started) / 1e9 if done else None,
            "problems": [f"{link['name']}: {p}" for link in links for p in link["problems"]][:20],
            "errors": [f"{link['name']}: {link['error']}" for link in links if link["error"]][:20],
        }

    def _bare_storm(self, bare_address: str) -> dict[str, Any]:
        """The bare server's streams dropped and reopened at once."""
        at_ns = time.perf_counter_ns() + int(0.5e9)
        results = gather(
            [
                w.request("bare_storm", group=f"idle-bare-{k}", address=bare_address, at_ns=at_ns)
                for k, w in enumerate(self.devices)
            ],
            900,
        )
        ready = [t for r in results for t in r["ready_at_ns"]]
        dropped = min(r["dropped_at_ns"] for r in results)
        errors: dict[str, int] = {}
        for r in results:
            for code, count in r["errors"].items():
                errors[code] = errors.get(code, 0) + count
        return {
            "links": sum(r["links"] for r in results),
            "ready": len(ready),
            "attempts": sum(r["attempts"] for r in results),
            "seconds_to_all_ready": (max(ready) - dropped) / 1e9 if ready else None,
            "seconds_from_reconnect_to_all_ready": (
                max(ready) - min(r["reconnect_at_ns"] for r in results)
            )
            / 1e9
            if ready
            else None,
            "errors": errors,
            "error_samples": [x for r in results for x in r["error_samples"]][:20],
        }


def log_problems(path: Path, offset: int = 0) -> dict[str, Any]:
    """ERROR records of a service log after ``offset``, and its exception lines by kind."""
    with path.open("rb") as log:
        log.seek(offset)
        lines = log.read().decode(errors="replace").splitlines()
    kinds: dict[str, int] = {}
    for line in lines:
        if re.match(r"^[A-Za-z_.]*(Error|Exception): ", line):
            key = re.sub(r"0x[0-9a-f]+", "0x…", line)[:200]
            kinds[key] = kinds.get(key, 0) + 1
    return {"error_records": sum(1 for line in lines if " ERROR " in line), "exceptions": kinds}


def settled_rss(pid: int, samples: int = 5, interval: float = 0.2) -> int:
    """The median of a few RSS samples once the process is idle."""
    time.sleep(0.5)
    values = []
    for _ in range(samples):
        values.append(rss_bytes(pid))
        time.sleep(interval)
    return int(statistics.median(values))


def per_op_messages(deliveries: list[bytes]) -> list[bytes]:
    """The source deltas inside ``deliveries``, one ``Delivery`` message each.

    That is what a broker storing every delta as it arrives would replay.
    """
    out: list[bytes] = []
    sequence = 0
    for encoded in deliveries:
        delivery = livestream_pb2.Delivery.FromString(encoded)
        if delivery.WhichOneof("kind") != "message_delta":
            continue
        text = delivery.message_delta.text
        width = _op_width(text)
        for start in range(0, len(text), width):
            sequence += 1
            piece = livestream_pb2.Delivery(sequence=sequence)
            piece.message_delta.CopyFrom(delivery.message_delta)
            piece.message_delta.text = text[start : start + width]
            out.append(piece.SerializeToString())
    return out


def _op_width(text: str) -> int:
    """The op width of a coalesced text: the distance to the next op's index."""
    first = int(text[19:29])
    for width in range(MIN_WIDTH, len(text) + 1):
        if width == len(text):
            return width
        if text[width : width + 19].isdigit() and int(text[width + 19 : width + 29]) == first + 1:
            return width
    return len(text)


def _headline(results: dict[str, Any]) -> list[str]:
    lines = []
    fan = results.get("fanout")
    if fan:
        lines.append(
            "fan-out medians: "
            + ", ".join(
                f"{s} {fan[s]['source_deltas_per_s']:,.0f} source deltas/s "
                f"({fan[s]['deliveries_per_s']:,.0f} deliveries/s)"
                for s in FANOUT_SYSTEMS
            )
            + f"; median ratio ours/bare {fan['median_ratio_vs_bare']:.2f}x (target >= 2), "
            f"ours/NATS {fan['median_ratio_vs_nats']:.2f}x (goal >= 1); bare batched/bare "
            f"{fan['median_bare_batched_vs_bare']:.2f}x"
        )
    for run in (results.get("latency") or {}).get("runs", []):
        lines.append(
            f"latency medians @ {run['rate_per_s']:,.0f}/s to {run['links']} device(s): "
            + ", ".join(
                f"{s} p50 {run[s]['p50']:.2f} ms p99 {run[s]['p99']:.2f} ms" for s in SYSTEMS
            )
            + f"; ours/bare p50 {run['median_p50_ratio_vs_bare']:.2f}x, "
            f"ours/NATS p50 {run['median_p50_ratio_vs_nats']:.2f}x"
        )
    resume = results.get("resume")
    if resume:
        lines.append(
            f"resume medians: ours {resume['median_ours_seconds'] * 1000:.1f} ms, JetStream "
            f"same deliveries {resume['median_jetstream_same_seconds'] * 1000:.1f} ms "
            f"({resume['median_ratio_vs_jetstream_same']:.2f}x time), one message per delta "
            f"{resume['median_jetstream_per_delta_seconds'] * 1000:.1f} ms "
            f"({resume['median_ratio_vs_jetstream_per_delta']:.2f}x time)"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    """Run the parts named by ``--parts`` and write the result file."""
    options = parse_options(argv)
    parts = {p.strip() for p in options.parts.split(",") if p.strip()}
    started = time.monotonic()
    load = os.getloadavg()
    results: dict[str, Any] = {"options": asdict(options), "load_average_at_start": load}
    with ExitStack() as stack:
        if options.workdir:  # kept afterwards: service logs, the database, the NATS store
            workdir = Path(options.workdir)
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="live-bench-")))
        bench = Bench(options, workdir, stack)
        if parts & {"fanout", "latency"}:
            results.update(bench.fanout_and_latency(parts))
        if "resume" in parts:
            results["resume"] = bench.resume()
        if parts & {"storm", "memory"}:
            results.update(bench.memory_and_storm(parts))
    results["wall_seconds"] = time.monotonic() - started
    results["load_average_at_end"] = os.getloadavg()
    for line in _headline(results):
        print(line)
    path = write_results(options.output, results)
    print(f"wrote {path} ({results['wall_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
