"""``tutti up``: run the whole suite on one machine, one process per service (ARCH-3).

Each service runs as its own ``tutti serve <name>`` child process (as it would in its
own pod). The supervisor prepares the data directory (local credentials, SQLite
schema), starts the children, waits until every one reports SERVING through
``grpc.health.v1``, prints the endpoints, and on Ctrl-C or SIGTERM drains them all.
"""

from __future__ import annotations

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

from grpcserver.probes import check_health
from grpcserver.settings import DEFAULT_PORTS

SUITE = ("host", "refresolve", "livestream", "maintenance", "appcenter", "issuemanager")
"""Every server ``tutti up`` starts, in start order."""

COMPANIONS = ("demoruntime",)
"""Local-only processes ``tutti up`` starts after the suite, on a free port (health only):
the demo runtime connects to Host and registers the demo agent target (ARCH-3). They are
not deployable services (no manifest, no contract of their own)."""


@dataclass
class Child:
    """One supervised service process."""

    name: str
    process: subprocess.Popen[bytes]
    port_file: Path
    port: int = 0


def _wait_for_port(child: Child, deadline: float) -> int:
    while time.monotonic() < deadline:
        if child.process.poll() is not None:
            raise RuntimeError(f"{child.name} exited with code {child.process.returncode}")
        if child.port_file.exists():
            text = child.port_file.read_text().strip()
            if text:
                return int(text)
        time.sleep(0.05)
    raise TimeoutError(f"{child.name} did not bind a port in time")


def wait_serving(address: str, *, timeout: float) -> None:
    """Block until ``address`` answers health SERVING, or raise ``TimeoutError``."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        while time.monotonic() < deadline:
            try:
                if check_health(channel, timeout=1) == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise TimeoutError(f"{address} did not report SERVING within {timeout}s")


class Suite:
    """Starts and stops the six service processes."""

    def __init__(
        self,
        *,
        data_dir: Path,
        base_port: int,
        env: dict[str, str],
        log: Callable[[str], None],
        grace_period_seconds: float,
    ) -> None:
        self.data_dir = data_dir
        self.base_port = base_port
        self.env = env
        self.log = log
        self.grace = grace_period_seconds
        self.children: list[Child] = []

    def _port_for(self, name: str) -> int:
        if self.base_port == 0 or name not in DEFAULT_PORTS:
            return 0
        return self.base_port + (DEFAULT_PORTS[name] - DEFAULT_PORTS["host"])

    def start(self, *, timeout: float = 60.0) -> dict[str, str]:
        """Start every service and return ``{name: address}`` once all are SERVING."""
        run_dir = self.data_dir / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        addresses = {name: f"127.0.0.1:{self._port_for(name)}" for name in SUITE}
        addresses.update(dict.fromkeys(COMPANIONS, "127.0.0.1:0"))
        deadline = time.monotonic() + timeout
        # Backends first, so callers find them; each child learns the others' ports. Host
        # reports its port only once SERVING, so the companions find it ready.
        for name in (*SUITE, *COMPANIONS):
            port_file = run_dir / f"{name}.port"
            port_file.unlink(missing_ok=True)
            env = dict(self.env)
            env.update(
                TUTTI_LISTEN_ADDRESS=addresses[name],
                TUTTI_HOST_ADDRESS=addresses["host"],
                TUTTI_APPCENTER_ADDRESS=addresses["appcenter"],
                TUTTI_ISSUEMANAGER_ADDRESS=addresses["issuemanager"],
            )
            process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                [sys.executable, "-m", "tutti", "serve", name, "--port-file", str(port_file)],
                env=env,
            )
            child = Child(name=name, process=process, port_file=port_file)
            self.children.append(child)
            child.port = _wait_for_port(child, deadline)
            addresses[name] = f"127.0.0.1:{child.port}"
        for name, address in addresses.items():
            wait_serving(address, timeout=max(0.1, deadline - time.monotonic()))
            self.log(f"  {name:<13} {address}  SERVING")
        return addresses

    def stop(self) -> int:
        """SIGTERM every child, wait for the drain, and return the worst exit code."""
        for child in self.children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        worst = 0
        deadline = time.monotonic() + self.grace + 5
        for child in self.children:
            try:
                code = child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                code = child.process.wait()
            worst = max(worst, abs(code))
        self.children.clear()
        return worst

    def wait(self) -> str | None:
        """Block until a child exits; return its name (None if none was running)."""
        while self.children:
            for child in self.children:
                if child.process.poll() is not None:
                    return child.name
            time.sleep(0.2)
        return None


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
