"""A draining Host ends its long-lived streams at once instead of waiting out the grace (OPS-3).

``WatchActivity`` and ``RuntimeLink`` never finish by themselves, so without the drain hooks a
SIGTERM would hold the process for the whole grace period and then cut the streams with
``CANCELLED``. With them, both end with ``UNAVAILABLE`` (reason ``DRAINING``) as soon as new
RPCs are refused, and the process exits 0 well inside its grace.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tests.support.activity_watch import Watcher
from tests.support.runtime_client import ScriptedRuntime
from tests.support.servers import write_test_token_file

pytestmark = pytest.mark.slow

GRACE_SECONDS = 20.0


def _reason(error: grpc.RpcError) -> str:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return str(info.reason)
    return ""


def _start_host(tmp_path: Path, database_url: str) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp_path / "host.port"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUTTI_")}
    env.update(
        TUTTI_LISTEN_ADDRESS="127.0.0.1:0",
        TUTTI_DATA_DIR=str(tmp_path / "data"),
        TUTTI_DATABASE_URL=database_url,
        TUTTI_AUTH_TOKENS_FILE=str(write_test_token_file(tmp_path / "tokens.yaml")),
        TUTTI_GRACE_PERIOD_SECONDS=str(GRACE_SECONDS),
        TUTTI_DRAIN_DELAY_SECONDS="0.2",
        TUTTI_LOG_FORMAT="text",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "tutti", "serve", "host", "--port-file", str(port_file)],
        env=env,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text().strip()):
        assert process.poll() is None, "host exited during start"
        assert time.monotonic() < deadline, "host did not start"
        time.sleep(0.05)
    return process, f"127.0.0.1:{port_file.read_text().strip()}"


@pytest.mark.spec("OPS-3", "ARCH-4", "HOST-OBS-2", "HOST-RT-1")
def test_sigterm_ends_watches_and_runtime_links_with_draining_and_exits_fast(
    tmp_path: Path, migrated_db_url: str
) -> None:
    process, address = _start_host(tmp_path, migrated_db_url)
    try:
        with grpc.insecure_channel(address) as channel:
            watcher = Watcher(channel, "ws-1")
            watcher.wait_ready()
            runtime = ScriptedRuntime(channel, runtime_id="rt-drain")
            assert runtime.welcome is not None
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)

            watcher.wait_done(timeout=GRACE_SECONDS)
            assert watcher.error is not None, "the watch did not end"
            assert watcher.error.code() == grpc.StatusCode.UNAVAILABLE, watcher.error
            assert _reason(watcher.error) == "DRAINING"

            ended = runtime.next_frame(timeout=GRACE_SECONDS)
            assert isinstance(ended, grpc.RpcError), ended
            assert ended.code() == grpc.StatusCode.UNAVAILABLE, ended
            assert _reason(ended) == "DRAINING"

        assert process.wait(timeout=GRACE_SECONDS) == 0
        # Far inside the grace: the streams did not hold the drain.
        assert time.monotonic() - signalled < GRACE_SECONDS / 2
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
