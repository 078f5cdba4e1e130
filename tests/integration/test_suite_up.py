"""``tutti up`` brings up all six servers (ARCH-1, ARCH-3, ARCH-4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from grpcserver.probes import check_health, list_services
from tutti.suite import SUITE

pytestmark = pytest.mark.slow

EXPECTED_SERVICES = {
    "host": {"agentactivity.host.v1.HostService", "agentactivity.host.v1.RuntimeLinkService"},
    "refresolve": {"agentactivity.refresolve.v1.ReferenceService"},
    "livestream": {"agentactivity.livestream.v1.DeviceLinkService"},
    "maintenance": {"agentactivity.maintenance.v1.MaintenanceService"},
    "appcenter": {"agentactivity.appcenter.v1.AppCenterService"},
    "issuemanager": {"agentactivity.issuemanager.v1.IssueManagerService"},
}


@pytest.mark.spec("ARCH-1", "ARCH-3", "ARCH-4", "OPS-2")
def test_tutti_up_serves_all_six_with_health_and_reflection(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUTTI_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "tutti", "up", "--data-dir", str(tmp_path), "--base-port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            output.append(line)
            if line.startswith("suite ready"):
                break
        assert any(line.startswith("suite ready") for line in output), "".join(output)
        for name in SUITE:
            port = int((tmp_path / "run" / f"{name}.port").read_text())
            assert any(f"{name} " in line and f":{port}" in line for line in output)
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                for service in ("", *EXPECTED_SERVICES[name]):
                    status = check_health(channel, service)
                    assert status == health_pb2.HealthCheckResponse.SERVING, (name, service)
                listed = list_services(channel)
                assert EXPECTED_SERVICES[name] <= listed, (name, listed)
                assert "grpc.health.v1.Health" in listed
        assert (tmp_path / "tutti.db").exists(), "the default store is SQLite in the data dir"
        assert (tmp_path / "auth" / "cli-token").stat().st_mode & 0o077 == 0
        process.send_signal(signal.SIGINT)
        remaining, _ = process.communicate(timeout=60)
        output.append(remaining)
        assert process.returncode == 0, "".join(output)
        assert "stopped" in remaining
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
