"""SIGTERM drain of a real server process (ARCH-4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from grpcserver.probes import check_health
from tests.support.servers import write_admin_token_file

pytestmark = pytest.mark.slow


def _start(tmp_path: Path, grace: float) -> tuple[subprocess.Popen[bytes], str]:
    tokens = write_admin_token_file(tmp_path / "tokens.yaml", "secret")
    port_file = tmp_path / "port"
    env = dict(
        os.environ,
        TUTTI_LISTEN_ADDRESS="127.0.0.1:0",
        TUTTI_AUTH_TOKENS_FILE=str(tokens),
        TUTTI_GRACE_PERIOD_SECONDS=str(grace),
        TUTTI_DRAIN_DELAY_SECONDS="1.0",
        TUTTI_REFLECTION="false",
        TUTTI_LOG_FORMAT="text",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.slow_service", str(port_file)], env=env
    )
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text()):
        assert process.poll() is None, "server exited during start"
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    return process, f"127.0.0.1:{port_file.read_text()}"


@pytest.mark.spec("ARCH-4")
def test_sigterm_reports_not_serving_finishes_inflight_rpc_and_exits_zero(tmp_path: Path) -> None:
    """Health turns NOT_SERVING, the in-flight RPC completes, exit 0 within the grace."""
    grace = 8.0
    process, address = _start(tmp_path, grace)
    try:
        with grpc.insecure_channel(address) as channel:
            assert check_health(channel) == health_pb2.HealthCheckResponse.SERVING
            sleep: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
                "/tutti.test.v1.SlowService/Sleep"
            )
            outcome: dict[str, object] = {}

            def call() -> None:
                try:
                    outcome["reply"] = sleep(
                        b"3", metadata=(("authorization", "Bearer secret"),), timeout=20
                    )
                except grpc.RpcError as error:
                    outcome["error"] = error

            caller = threading.Thread(target=call)
            caller.start()
            time.sleep(0.5)  # the RPC is now in flight
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            status = check_health(channel)
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
            caller.join(timeout=20)
            assert outcome.get("reply") == b"done", outcome.get("error")
        assert process.wait(timeout=grace + 5) == 0
        assert time.monotonic() - signalled < grace + 1
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.spec("ARCH-4")
def test_rpc_still_running_at_the_end_of_the_grace_is_cancelled_not_torn(tmp_path: Path) -> None:
    """An RPC outliving the grace period fails explicitly (CANCELLED/UNAVAILABLE)."""
    grace = 2.0
    process, address = _start(tmp_path, grace)
    try:
        with grpc.insecure_channel(address) as channel:
            sleep: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
                "/tutti.test.v1.SlowService/Sleep"
            )
            future = sleep.future(b"30", metadata=(("authorization", "Bearer secret"),), timeout=30)
            time.sleep(0.5)
            process.send_signal(signal.SIGTERM)
            with pytest.raises(grpc.RpcError) as raised:
                future.result(timeout=grace + 5)
            assert raised.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        assert process.wait(timeout=grace + 5) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
