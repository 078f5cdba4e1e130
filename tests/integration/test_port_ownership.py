"""A server never shares its port (SEC-5).

gRPC binds with ``SO_REUSEPORT`` by default, so a second server on an occupied port used to
start and share it. Now a second ``tutti serve host`` on the first one's address exits 1
at once with one line naming the port, and the first keeps serving alone.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from grpcserver.app import ServiceDefinition, server_options, start_server
from grpcserver.auth import TokenRegistry
from grpcserver.probes import check_health
from grpcserver.settings import ServerSettings, StartupError
from tests.support.servers import write_test_token_file
from tests.support.service_process import service_process


@pytest.mark.slow
@pytest.mark.spec("SEC-5")
def test_a_second_host_on_an_occupied_port_fails_with_one_line(
    migrated_db_url: str, tmp_path: Path
) -> None:
    with service_process("host", tmp_path, database_url=migrated_db_url) as first:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TUTTI_")}
        env.update(
            TUTTI_LISTEN_ADDRESS=first.address,
            TUTTI_DATA_DIR=str(tmp_path / "data-second"),
            TUTTI_DATABASE_URL=migrated_db_url,
            TUTTI_AUTH_TOKENS_FILE=str(write_test_token_file(tmp_path / "second-tokens.yaml")),
            TUTTI_LOG_FORMAT="text",
        )
        second = subprocess.run(
            [sys.executable, "-m", "tutti", "serve", "host"],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert second.returncode == 1, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert f"cannot listen on {first.address}: the port is already in use" in lines[0]
        assert "Traceback" not in second.stderr
        # The first server still owns the port and answers.
        with grpc.insecure_channel(first.address) as channel:
            assert check_health(channel, timeout=10) == health_pb2.HealthCheckResponse.SERVING
        assert first.process.poll() is None
        assert first.stop() == 0


def _definition() -> ServiceDefinition:
    return ServiceDefinition(name="probe", service_names=[], register=lambda server: None)


@pytest.mark.spec("SEC-5")
def test_start_server_refuses_an_occupied_port_and_never_sets_so_reuseport() -> None:
    assert ("grpc.so_reuseport", 0) in server_options(_definition())
    # A service's own options are added; the base ones stay unless it overrides them.
    definition = _definition()
    definition.server_options = [("grpc.max_receive_message_length", 123)]
    options = dict(server_options(definition))
    assert options["grpc.max_receive_message_length"] == 123
    assert options["grpc.so_reuseport"] == 0
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        address = f"127.0.0.1:{holder.getsockname()[1]}"
        settings = ServerSettings(listen_address=address, reflection=False)
        with pytest.raises(StartupError, match=f"cannot listen on {address}: .*already in use"):
            asyncio.run(start_server(_definition(), settings, tokens=TokenRegistry.empty()))
