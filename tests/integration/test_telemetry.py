"""Metrics, traces and structured logs of a real service process (ARCH-4)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from agentactivity.refresolve.v1 import refresolve_pb2
from tests.support.servers import write_admin_token_file

pytestmark = pytest.mark.slow


@contextmanager
def _reserved_port() -> Iterator[int]:
    """A port held for the whole block, for a server that can only be given a number.

    The metrics endpoint takes a fixed port (0 disables it) and does not report one, so the
    test cannot let it pick. Instead of binding, closing and hoping nobody takes the number
    meanwhile, a socket stays bound to it (never listening) until the block ends: the kernel
    hands a bound port to no other ``bind(0)`` or outgoing connection. Both sockets set
    ``SO_REUSEADDR`` (Prometheus's HTTP server does), which on Linux lets the server bind
    and listen on the port while this one, not listening, holds it.
    """
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("0.0.0.0", 0))  # noqa: S104 - the address the metrics server binds
        yield int(holder.getsockname()[1])


@pytest.mark.spec("ARCH-4")
def test_rpc_metrics_traces_and_json_logs(tmp_path: Path) -> None:
    with _reserved_port() as metrics_port:
        _check_metrics_traces_and_logs(tmp_path, metrics_port)


def _check_metrics_traces_and_logs(tmp_path: Path, metrics_port: int) -> None:
    tokens = write_admin_token_file(tmp_path / "tokens.yaml", "secret")
    port_file = tmp_path / "port"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUTTI_")}
    env.update(
        TUTTI_LISTEN_ADDRESS="127.0.0.1:0",
        TUTTI_DATA_DIR=str(tmp_path),
        TUTTI_AUTH_TOKENS_FILE=str(tokens),
        TUTTI_METRICS_PORT=str(metrics_port),
        TUTTI_OTEL_EXPORTER="console",
        TUTTI_LOG_FORMAT="json",
        TUTTI_DRAIN_DELAY_SECONDS="0",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "tutti", "serve", "refresolve", "--port-file", str(port_file)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        address = f"127.0.0.1:{port_file.read_text().strip()}"
        with grpc.insecure_channel(address) as channel:
            call = channel.unary_unary(
                "/agentactivity.refresolve.v1.ReferenceService/ListReferences",
                request_serializer=refresolve_pb2.ListReferencesRequest.SerializeToString,
                response_deserializer=refresolve_pb2.ListReferencesResponse.FromString,
            )
            with pytest.raises(grpc.RpcError):
                call(
                    refresolve_pb2.ListReferencesRequest(workspace_id="ws-1"),
                    metadata=(("authorization", "Bearer wrong"),),
                    timeout=5,
                )
        # The server records the RPC just after the client sees its status: poll briefly.
        scraped = ""
        deadline = time.monotonic() + 10
        while "rpc_server_calls" not in scraped and time.monotonic() < deadline:
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as reply:
                scraped = reply.read().decode()
            time.sleep(0.05)
        assert "rpc_server_calls" in scraped
        assert 'rpc_grpc_status_code="UNAUTHENTICATED"' in scraped
        assert "ListReferences" in scraped
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=30)
        assert process.returncode == 0
        assert "ListReferences" in stdout, "the console exporter printed the RPC span"
        records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
        assert records, stderr
        assert {r["service"] for r in records} == {"refresolve"}
        assert any(r["msg"] == "serving" and "port" in r for r in records)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
