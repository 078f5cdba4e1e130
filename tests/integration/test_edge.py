"""Authentication, workspace scope and typed errors through real servers (SEC-1, SEC-2, CON-5)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2
from grpc_status import rpc_status

from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from agentactivity.maintenance.v1 import maintenance_pb2, maintenance_pb2_grpc
from agentactivity.refresolve.v1 import refresolve_pb2, refresolve_pb2_grpc
from grpcserver.probes import check_health, list_services
from tests.support.servers import LiveServer, auth_metadata


def _details(error: grpc.RpcError) -> tuple[set[str], set[str], bool]:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, "error carries no google.rpc.Status"
    reasons: set[str] = set()
    fields: set[str] = set()
    retry = False
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reasons.add(info.reason)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields.update(v.field for v in bad.field_violations)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = True
    return reasons, fields, retry


@pytest.fixture
def maintenance(live_server: Callable[..., LiveServer], migrated_db_url: str) -> LiveServer:
    return live_server("maintenance", database_url=migrated_db_url)


@pytest.mark.spec("SEC-1")
def test_no_token_is_unauthenticated(maintenance: LiveServer) -> None:
    stub = maintenance_pb2_grpc.MaintenanceServiceStub(maintenance.channel)
    with pytest.raises(grpc.RpcError) as raised:
        stub.GetRetentionPreference(maintenance_pb2.GetRetentionPreferenceRequest(), timeout=5)
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    reasons, _, _ = _details(raised.value)
    assert reasons == {"MISSING_CREDENTIALS"}


@pytest.mark.spec("SEC-1")
def test_unknown_token_is_unauthenticated(maintenance: LiveServer) -> None:
    stub = maintenance_pb2_grpc.MaintenanceServiceStub(maintenance.channel)
    with pytest.raises(grpc.RpcError) as raised:
        stub.GetRetentionPreference(
            maintenance_pb2.GetRetentionPreferenceRequest(),
            metadata=(("authorization", "Bearer not-a-token"),),
            timeout=5,
        )
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _details(raised.value)[0] == {"INVALID_CREDENTIALS"}


@pytest.mark.spec("ARCH-4", "SEC-1")
def test_health_and_reflection_answer_without_a_token(maintenance: LiveServer) -> None:
    status = check_health(maintenance.channel, "agentactivity.maintenance.v1.MaintenanceService")
    assert status == health_pb2.HealthCheckResponse.SERVING
    assert "agentactivity.maintenance.v1.MaintenanceService" in list_services(maintenance.channel)


@pytest.mark.spec("SEC-1", "CON-5")
def test_token_for_another_workspace_is_permission_denied(
    live_server: Callable[..., LiveServer],
) -> None:
    server = live_server("refresolve")
    stub = refresolve_pb2_grpc.ReferenceServiceStub(server.channel)
    request = refresolve_pb2.ListReferencesRequest(
        workspace_id="ws-2", source=refresolve_pb2.REFERENCE_SOURCE_APP, id="app-1"
    )
    with pytest.raises(grpc.RpcError) as raised:
        stub.ListReferences(request, metadata=auth_metadata("ws1-device"), timeout=5)
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert _details(raised.value)[0] == {"WORKSPACE_SCOPE_MISMATCH"}


@pytest.mark.spec("SEC-2", "CON-5")
def test_missing_workspace_is_invalid_argument_with_a_field_violation(
    live_server: Callable[..., LiveServer],
) -> None:
    server = live_server("refresolve")
    stub = refresolve_pb2_grpc.ReferenceServiceStub(server.channel)
    with pytest.raises(grpc.RpcError) as raised:
        stub.ListReferences(
            refresolve_pb2.ListReferencesRequest(id="app-1"),
            metadata=auth_metadata("ws1-device"),
            timeout=5,
        )
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _details(raised.value)[1] == {"workspace_id"}


@pytest.mark.spec("CON-5")
def test_unbuilt_rpc_is_unimplemented_for_an_authorized_caller(
    live_server: Callable[..., LiveServer], migrated_db_url: str
) -> None:
    # ForkSession is a second-phase RPC of the contract that this build does not serve.
    host = live_server("host", database_url=migrated_db_url)
    stub = host_pb2_grpc.HostServiceStub(host.channel)
    with pytest.raises(grpc.RpcError) as raised:
        stub.ForkSession(
            host_pb2.ForkSessionRequest(workspace_id="ws-1", session_id="s-1"),
            metadata=auth_metadata("admin"),
            timeout=5,
        )
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert _details(raised.value)[0] == {"NOT_IMPLEMENTED"}


@pytest.mark.spec("SEC-2", "CON-5", "MAINT-PREF-1")
def test_malformed_input_is_invalid_argument_and_changes_nothing(maintenance: LiveServer) -> None:
    stub = maintenance_pb2_grpc.MaintenanceServiceStub(maintenance.channel)
    admin = auth_metadata("admin")
    stub.SetRetentionPreference(
        maintenance_pb2.SetRetentionPreferenceRequest(
            retention=maintenance_pb2.RETENTION_PERIOD_15_DAYS
        ),
        metadata=admin,
        timeout=5,
    )
    for bad in (maintenance_pb2.RETENTION_PERIOD_UNSPECIFIED, 99):
        with pytest.raises(grpc.RpcError) as raised:
            stub.SetRetentionPreference(
                maintenance_pb2.SetRetentionPreferenceRequest(retention=bad),  # type: ignore[arg-type]
                metadata=admin,
                timeout=5,
            )
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        reasons, fields, _ = _details(raised.value)
        assert fields == {"retention"}
        assert reasons == {"INVALID_ARGUMENT"}
    after = stub.GetRetentionPreference(
        maintenance_pb2.GetRetentionPreferenceRequest(), metadata=admin, timeout=5
    )
    assert after.preference.retention_days == 15


@pytest.mark.spec("SEC-1")
def test_device_role_may_not_change_the_deployment_preference(maintenance: LiveServer) -> None:
    stub = maintenance_pb2_grpc.MaintenanceServiceStub(maintenance.channel)
    with pytest.raises(grpc.RpcError) as raised:
        stub.SetRetentionPreference(
            maintenance_pb2.SetRetentionPreferenceRequest(
                retention=maintenance_pb2.RETENTION_PERIOD_15_DAYS
            ),
            metadata=auth_metadata("ws1-device"),
            timeout=5,
        )
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert _details(raised.value)[0] == {"ROLE_NOT_ALLOWED"}
    stub_reply = stub.GetRetentionPreference(
        maintenance_pb2.GetRetentionPreferenceRequest(),
        metadata=auth_metadata("ws1-device"),
        timeout=5,
    )
    assert stub_reply.preference.is_default
    assert stub_reply.preference.retention_days == 30
