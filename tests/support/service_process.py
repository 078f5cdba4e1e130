"""One service as a real ``tutti serve`` process on port 0, with the test principals."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.servers import write_test_token_file

__all__ = ["ServiceProcess", "service_process", "start_service_process"]


class ServiceProcess:
    """A started ``tutti serve NAME``: its process and address."""

    def __init__(self, process: subprocess.Popen[bytes], address: str) -> None:
        self.process = process
        self.address = address

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, then the exit code (killed past ``timeout``)."""
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL (a crash), and reap the process."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


def start_service_process(
    name: str, tmp_path: Path, *, database_url: str, **settings: str
) -> ServiceProcess:
    """Start ``tutti serve NAME`` and return once it listens; the caller stops it.

    Args:
        name: the service.
        tmp_path: where its data dir, token registry and port file go.
        database_url: its store.
        **settings: more ``TUTTI_<NAME>`` settings (``grace_period_seconds="5"``;
            ``listen_address="127.0.0.1:PORT"`` pins the port, e.g. to restart a replica
            where its clients expect it).
    """
    port_file = tmp_path / f"{name}.port"
    port_file.unlink(missing_ok=True)  # a restart must not read its predecessor's port
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUTTI_")}
    env.update(
        TUTTI_LISTEN_ADDRESS="127.0.0.1:0",
        TUTTI_DATA_DIR=str(tmp_path / f"data-{name}"),
        TUTTI_DATABASE_URL=database_url,
        TUTTI_AUTH_TOKENS_FILE=str(write_test_token_file(tmp_path / f"{name}-tokens.yaml")),
        TUTTI_LOG_FORMAT="text",
    )
    env.update({f"TUTTI_{key.upper()}": value for key, value in settings.items()})
    process = subprocess.Popen(
        [sys.executable, "-m", "tutti", "serve", name, "--port-file", str(port_file)],
        env=env,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.poll() is not None:
                raise AssertionError(f"{name} exited during start ({process.returncode})")
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} did not start within 60 s")
            time.sleep(0.05)
    except BaseException:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        raise
    return ServiceProcess(process, f"127.0.0.1:{port_file.read_text().strip()}")


@contextmanager
def service_process(
    name: str, tmp_path: Path, *, database_url: str, **settings: str
) -> Iterator[ServiceProcess]:
    """Run ``tutti serve NAME`` until the block ends (see :func:`start_service_process`)."""
    started = start_service_process(name, tmp_path, database_url=database_url, **settings)
    try:
        yield started
    finally:
        started.kill()
