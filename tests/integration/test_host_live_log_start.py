"""``tutti serve host`` with ``TUTTI_BUS=nats``: a bounded first connection (SCALE-3, ADR 0041).

Real processes only. With nothing listening at ``TUTTI_NATS_URL`` the Host must exit non-zero
once ``TUTTI_NATS_CONNECT_TIMEOUT_SECONDS`` has passed, with one ERROR line naming the URL (the
orchestrator then restarts it with backoff); a SIGTERM while it waits must stop it at once,
exit 0; with a real nats-server it starts as before and creates its stream there.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nats
import pytest

from tests.support.nats_server import free_port
from tests.support.servers import write_test_token_file
from tests.support.service_process import service_process

pytestmark = pytest.mark.slow

WAIT_SECONDS = 60.0
"""Upper bound of a wait for something that must happen; only a failing test reaches it."""
CONNECTING = "live log: connecting to NATS at"


def _start_host(
    tmp_path: Path, database_url: str, nats_url: str, connect_timeout: float
) -> tuple[subprocess.Popen[bytes], Path]:
    """``tutti serve host`` on the bus at ``nats_url``; its stderr goes to the returned file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUTTI_")}
    env.update(
        TUTTI_LISTEN_ADDRESS="127.0.0.1:0",
        TUTTI_DATA_DIR=str(tmp_path / "data-host"),
        TUTTI_DATABASE_URL=database_url,
        TUTTI_AUTH_TOKENS_FILE=str(write_test_token_file(tmp_path / "host-tokens.yaml")),
        TUTTI_LOG_FORMAT="text",
        TUTTI_BUS="nats",
        TUTTI_NATS_URL=nats_url,
        TUTTI_NATS_CONNECT_TIMEOUT_SECONDS=f"{connect_timeout:g}",
    )
    stderr_path = tmp_path / "host.stderr"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tutti",
                "serve",
                "host",
                "--port-file",
                str(tmp_path / "host.port"),
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    return process, stderr_path


def _wait_for_line(process: subprocess.Popen[bytes], stderr_path: Path, text: str) -> float:
    """Wait until the process logged ``text``; the monotonic time it was seen."""
    deadline = time.monotonic() + WAIT_SECONDS
    while text not in stderr_path.read_text(errors="replace"):
        assert process.poll() is None, stderr_path.read_text(errors="replace")
        assert time.monotonic() < deadline, f"no {text!r} within {WAIT_SECONDS} s"
        time.sleep(0.05)
    return time.monotonic()


def _exit_code(process: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
        raise AssertionError(f"host still running {timeout} s later") from None


@pytest.mark.spec("SCALE-3")
def test_unreachable_bus_exits_non_zero_after_the_bound_with_one_line(
    migrated_db_url: str, tmp_path: Path
) -> None:
    """Nothing listens at the URL: exit 1 once the bound has passed, one ERROR line, no hang."""
    url = f"nats://127.0.0.1:{free_port()}"
    bound = 2.0
    process, stderr_path = _start_host(tmp_path, migrated_db_url, url, bound)
    try:
        waiting_since = _wait_for_line(process, stderr_path, CONNECTING)
        code = _exit_code(process, timeout=bound + 15)
        waited = time.monotonic() - waiting_since
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    log = stderr_path.read_text(errors="replace")
    assert code == 1, log
    # It waited out the bound (retrying meanwhile), not a first refusal.
    assert waited >= bound * 0.9, log
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1, log
    assert url in errors[0]
    assert "unreachable within 2 s" in errors[0]
    assert "Traceback" not in log
    assert not (tmp_path / "host.port").exists()


@pytest.mark.spec("SCALE-3")
def test_sigterm_while_waiting_for_the_bus_stops_at_once(
    migrated_db_url: str, tmp_path: Path
) -> None:
    """A stop signal during the first connection ends the start promptly, exit 0."""
    url = f"nats://127.0.0.1:{free_port()}"
    process, stderr_path = _start_host(tmp_path, migrated_db_url, url, 600.0)
    try:
        _wait_for_line(process, stderr_path, CONNECTING)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = _exit_code(process, timeout=20)
        took = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    log = stderr_path.read_text(errors="replace")
    assert code == 0, log
    # Far below the 600 s bound: the wait itself was cancelled.
    assert took < 20, log
    assert "stopped during start" in log
    assert "Traceback" not in log


@pytest.mark.spec("SCALE-3")
def test_with_the_bus_up_host_starts_as_before(
    migrated_db_url: str, tmp_path: Path, nats_url: str
) -> None:
    """A reachable server: Host serves, has created its stream there, and drains with 0."""
    stream = f"TUTTI_START_{uuid.uuid4().hex[:12]}"
    with service_process(
        "host",
        tmp_path,
        database_url=migrated_db_url,
        bus="nats",
        nats_url=nats_url,
        nats_connect_timeout_seconds="10",
        live_log_stream=stream,
        live_log_subject_prefix=f"tutti.start{uuid.uuid4().hex[:12]}",
    ) as host:
        assert asyncio.run(_stream_exists(nats_url, stream))
        assert host.stop() == 0
    asyncio.run(_delete_stream(nats_url, stream))


async def _stream_exists(url: str, stream: str) -> bool:
    client = await nats.connect(url)
    try:
        info = await client.jetstream().stream_info(stream)
        return info.config.name == stream
    finally:
        await client.close()


async def _delete_stream(url: str, stream: str) -> None:
    client = await nats.connect(url)
    try:
        await client.jetstream().delete_stream(stream)
    finally:
        await client.close()
