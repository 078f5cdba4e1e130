"""SIGTERM drain of a real server process (ARCH-4).

Nothing here sleeps to decide order: the slow RPC writes a marker once its handler has
started (``tests.support.slow_service``), health is polled until it reports NOT_SERVING,
and the RPC that must outlive the SIGTERM finishes only when the test releases it.
"""

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
from tests.support.slow_service import RELEASE, STARTED

pytestmark = pytest.mark.slow

AUTH = (("authorization", "Bearer secret"),)


def _start(tmp_path: Path, grace: float) -> tuple[subprocess.Popen[bytes], str]:
    tokens = write_admin_token_file(tmp_path / "tokens.yaml", "secret")
    port_file = tmp_path / "port"
    env = dict(
        os.environ,
        TUTTI_LISTEN_ADDRESS="127.0.0.1:0",
        TUTTI_AUTH_TOKENS_FILE=str(tokens),
        TUTTI_GRACE_PERIOD_SECONDS=str(grace),
        # The window in which health answers NOT_SERVING before new RPCs are refused.
        TUTTI_DRAIN_DELAY_SECONDS="2.0",
        TUTTI_REFLECTION="false",
        TUTTI_LOG_FORMAT="text",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.slow_service", str(port_file), str(tmp_path)],
        env=env,
    )
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text()):
        assert process.poll() is None, "server exited during start"
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    return process, f"127.0.0.1:{port_file.read_text()}"


def _wait_in_flight(tmp_path: Path, process: subprocess.Popen[bytes]) -> None:
    """Return once the slow RPC's handler has started in the server."""
    deadline = time.monotonic() + 30
    while not (tmp_path / STARTED).exists():
        assert process.poll() is None, "server exited before the RPC started"
        assert time.monotonic() < deadline, "the RPC never reached its handler"
        time.sleep(0.01)


def _wait_not_serving(channel: grpc.Channel) -> None:
    """Poll health until NOT_SERVING; it must say so while it still answers (drain delay)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            status = check_health(channel, timeout=2)
        except grpc.RpcError as error:
            raise AssertionError(f"health stopped answering before NOT_SERVING: {error}") from error
        if status == health_pb2.HealthCheckResponse.NOT_SERVING:
            return
        assert status == health_pb2.HealthCheckResponse.SERVING, status
        assert time.monotonic() < deadline, "health never reported NOT_SERVING"
        time.sleep(0.01)


def _wait_refusing(channel: grpc.Channel) -> None:
    """Poll until the server refuses new RPCs (the drain delay is over, the stop began)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            status = check_health(channel, timeout=2)
        except grpc.RpcError as error:
            refused = error
            break
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING, status
        assert time.monotonic() < deadline, "the server kept accepting RPCs"
        time.sleep(0.01)
    # A check arriving as the stop begins may be accepted and then cancelled.
    assert refused.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), refused


@pytest.mark.spec("ARCH-4")
def test_sigterm_reports_not_serving_finishes_inflight_rpc_and_exits_zero(tmp_path: Path) -> None:
    """Health turns NOT_SERVING, new RPCs are refused, the in-flight RPC completes, exit 0."""
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
                    outcome["reply"] = sleep(RELEASE.encode(), metadata=AUTH, timeout=20)
                except grpc.RpcError as error:
                    outcome["error"] = error

            caller = threading.Thread(target=call)
            caller.start()
            _wait_in_flight(tmp_path, process)  # the RPC is now in flight
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            _wait_not_serving(channel)
            _wait_refusing(channel)
            # Still in flight (it waits for the release, sent only now) while the server
            # refuses new RPCs: the stop lets it finish.
            assert caller.is_alive()
            assert not outcome
            (tmp_path / RELEASE).touch()
            caller.join(timeout=20)
            assert not caller.is_alive()
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
            # Never released: it outlives any grace.
            future = sleep.future(RELEASE.encode(), metadata=AUTH, timeout=30)
            _wait_in_flight(tmp_path, process)
            process.send_signal(signal.SIGTERM)
            with pytest.raises(grpc.RpcError) as raised:
                future.result(timeout=grace + 5)
            assert raised.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
        assert process.wait(timeout=grace + 5) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
