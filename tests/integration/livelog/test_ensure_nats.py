"""scripts/ensure-nats: starts the project's own JetStream nats-server once, refuses others
(SCALE-3 asks for server >= 2.11; Debian's 2.9 must never be taken for it)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.nats_server import free_port

pytestmark = [pytest.mark.spec("SCALE-3"), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "ensure-nats"


def _run(port: int, directory: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUTTI_NATS_PORT": str(port), "TUTTI_NATS_DIR": str(directory)}
    return subprocess.run(
        [str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def started_dir(tmp_path: Path) -> Iterator[Path]:
    """A store directory; the server the script starts there is stopped afterwards."""
    directory = tmp_path / "nats"
    yield directory
    pid_file = directory / "nats-server.pid"
    if pid_file.exists():
        os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)


def test_it_starts_the_server_once_and_prints_its_url(started_dir: Path) -> None:
    port = free_port()
    first = _run(port, started_dir)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"nats://127.0.0.1:{port}"
    assert "starting nats-server" in first.stderr
    pid = (started_dir / "nats-server.pid").read_text().strip()

    again = _run(port, started_dir)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"nats://127.0.0.1:{port}"
    assert "starting" not in again.stderr
    assert (started_dir / "nats-server.pid").read_text().strip() == pid

    with socket.create_connection(("127.0.0.1", port), 2) as conn:
        info = json.loads(conn.makefile("rb").readline().decode()[5:])
    assert info["jetstream"] is True
    major, minor = (int(part) for part in info["version"].split(".")[:2])
    assert (major, minor) >= (2, 11)


def test_it_refuses_an_old_server_on_its_port(tmp_path: Path) -> None:
    """A server announcing 2.9.10 (Debian's) is not taken for the project's."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    info = {"server_id": "old", "version": "2.9.10", "jetstream": True}

    def answer() -> None:
        for _ in range(2):
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.sendall(f"INFO {json.dumps(info)}\r\n".encode())

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        result = _run(port, tmp_path / "unused")
    finally:
        listener.close()
    assert result.returncode == 1
    assert result.stdout == ""
    assert "2.9.10" in result.stderr
