"""``tutti up`` brings up all six servers (ARCH-1, ARCH-3, ARCH-4)."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from agentactivity.refresolve.v1 import refresolve_pb2, refresolve_pb2_grpc
from grpcserver.probes import check_health, list_services
from tests.support.suite_process import running_suite
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


@pytest.mark.spec("ARCH-1", "ARCH-3", "ARCH-4", "OPS-2", "OPS-3")
def test_tutti_up_serves_all_six_with_health_and_reflection(tmp_path: Path) -> None:
    with running_suite(tmp_path) as suite:
        suite.wait_ready()
        for name in SUITE:
            port = suite.port(name)
            assert any(f"{name} " in line and f":{port}" in line for line in suite.lines)
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                for service in ("", *EXPECTED_SERVICES[name]):
                    status = check_health(channel, service)
                    assert status == health_pb2.HealthCheckResponse.SERVING, (name, service)
                listed = list_services(channel)
                assert EXPECTED_SERVICES[name] <= listed, (name, listed)
                assert "grpc.health.v1.Health" in listed
        # With free ports, callers were started after their callees and know their real
        # addresses: refresolve reaches AppCenter (NOT_FOUND from it, not UNAVAILABLE).
        token = (tmp_path / "auth" / "cli-token").read_text().strip()
        workspace = (tmp_path / "auth" / "workspace").read_text().strip()
        with grpc.insecure_channel(f"127.0.0.1:{suite.port('refresolve')}") as channel:
            stub = refresolve_pb2_grpc.ReferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as missing:
                stub.ListReferences(
                    refresolve_pb2.ListReferencesRequest(
                        workspace_id=workspace,
                        source=refresolve_pb2.REFERENCE_SOURCE_APP,
                        id="no-such-app",
                    ),
                    metadata=(("authorization", f"Bearer {token}"),),
                    timeout=30,
                )
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND, missing.value
        assert (tmp_path / "tutti.db").exists(), "the default store is SQLite in the data dir"
        assert (tmp_path / "auth" / "cli-token").stat().st_mode & 0o077 == 0
        suite.signal(signal.SIGINT)
        assert suite.wait_exit(timeout=60) == 0, suite.output
        suite.wait_for("stopped", timeout=10)
