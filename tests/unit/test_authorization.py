"""The declared authorization table and its enforcement rules (SEC-1, SEC-3)."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from agentactivity.host.v1 import host_pb2
from agentactivity.livestream.v1 import livestream_pb2
from agentactivity.maintenance.v1 import maintenance_pb2
from domainerrors import InvalidArgument, PermissionDenied
from grpcserver.app import ServiceDefinition, start_server
from grpcserver.auth import Principal, Role
from grpcserver.authorization import (
    ANY_ROLE,
    OPERATORS,
    MethodPolicy,
    ServiceAuthorization,
    WorkspaceSource,
    deployment_read,
    deployment_write,
    first_message,
    optional_workspace,
    workspace_field,
)
from grpcserver.settings import ServerSettings
from tests.support import servers
from tests.support.servers import auth_metadata
from tutti.suite import SUITE

ROOT = Path(__file__).resolve().parents[2]

DEVICE = Principal("phone", Role.DEVICE, frozenset({"ws-1"}))
WS1_SERVICE = Principal("ws1-svc", Role.SERVICE, frozenset({"ws-1"}))
WS12_ADMIN = Principal("ws12-admin", Role.ADMIN, frozenset({"ws-1", "ws-2"}))
WIDE_SERVICE = Principal("svc", Role.SERVICE, frozenset({"*"}))

HOST = "/agentactivity.host.v1.HostService/"
MAINTENANCE = "/agentactivity.maintenance.v1.MaintenanceService/"

# Hand-written, independent of the tables: the security-relevant RPCs (permanent purge,
# resource cleanup, retention preference, targets, cross-workspace reads, the links).
# (allowed roles, workspace source, needs a deployment-wide principal)
EXPECTED: dict[str, tuple[set[str], WorkspaceSource, bool]] = {
    HOST + "PurgeDeletedSessions": ({"service", "admin"}, WorkspaceSource.OPTIONAL_FIELD, False),
    HOST + "PurgeWorkspaceTombstones": ({"service", "admin"}, WorkspaceSource.FIELD, False),
    HOST + "ListPendingResourceCleanups": (
        {"service", "admin"},
        WorkspaceSource.OPTIONAL_FIELD,
        False,
    ),
    HOST + "CompleteResourceCleanup": ({"service", "admin"}, WorkspaceSource.FIELD, False),
    HOST + "CompleteResourceCleanups": (
        {"service", "admin"},
        WorkspaceSource.OPTIONAL_FIELD,
        False,
    ),
    HOST + "GetActivityState": (
        {"device", "service", "admin"},
        WorkspaceSource.OPTIONAL_FIELD,
        False,
    ),
    HOST + "WatchActivity": ({"service", "admin"}, WorkspaceSource.FIELD, False),
    HOST + "RegisterAgentTarget": ({"service", "admin"}, WorkspaceSource.DEPLOYMENT, True),
    HOST + "SetAgentTargetEnabled": ({"service", "admin"}, WorkspaceSource.DEPLOYMENT, True),
    HOST + "ListAgentTargets": (
        {"device", "service", "admin"},
        WorkspaceSource.DEPLOYMENT,
        False,
    ),
    HOST + "DeleteSessions": ({"device", "service", "admin"}, WorkspaceSource.FIELD, False),
    "/agentactivity.host.v1.RuntimeLinkService/RuntimeLink": (
        {"service", "admin"},
        WorkspaceSource.EACH_FRAME,
        False,
    ),
    MAINTENANCE + "SetRetentionPreference": ({"admin"}, WorkspaceSource.DEPLOYMENT, True),
    MAINTENANCE + "GetRetentionPreference": (
        {"device", "service", "admin"},
        WorkspaceSource.DEPLOYMENT,
        False,
    ),
    MAINTENANCE + "RunManualPurge": ({"service", "admin"}, WorkspaceSource.FIELD, False),
    MAINTENANCE + "GetMaintenanceStatus": (
        {"device", "service", "admin"},
        WorkspaceSource.OPTIONAL_FIELD,
        False,
    ),
    "/agentactivity.livestream.v1.DeviceLinkService/DeviceLink": (
        {"device", "admin"},
        WorkspaceSource.FIRST_MESSAGE,
        False,
    ),
    "/agentactivity.appcenter.v1.AppCenterService/LoadApps": (
        {"admin"},
        WorkspaceSource.FIELD,
        False,
    ),
    "/agentactivity.issuemanager.v1.IssueManagerService/LoadTopics": (
        {"admin"},
        WorkspaceSource.FIELD,
        False,
    ),
}


class _RecordingServer:
    """Stands in for ``grpc.aio.Server``: records every method a servicer registers."""

    def __init__(self) -> None:
        self.methods: set[str] = set()

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        """Ignored: the registered method handlers below name the same methods."""

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.methods.update(f"/{service}/{name}" for name in handlers)


def _served(name: str, tmp_path: Path) -> tuple[ServiceDefinition, set[str]]:
    """Build service ``name`` as ``tutti serve`` would and record what it registers."""
    module = importlib.import_module(f"services.{name}.app")
    settings = module.Settings(
        listen_address="127.0.0.1:0", data_dir=tmp_path / name, log_format="text"
    )

    async def build() -> tuple[ServiceDefinition, set[str]]:
        definition: ServiceDefinition = module.build(settings)
        server = _RecordingServer()
        definition.register(server)  # type: ignore[arg-type]
        return definition, server.methods

    return asyncio.run(build())


def _policies() -> dict[str, MethodPolicy]:
    merged: dict[str, MethodPolicy] = {}
    for name in SUITE:
        for table in importlib.import_module(f"services.{name}.authorization").AUTHORIZATION:
            merged.update(table.by_path())
    return merged


@pytest.mark.spec("SEC-3")
@pytest.mark.parametrize("name", SUITE)
def test_every_served_method_is_declared(name: str, tmp_path: Path) -> None:
    definition, served = _served(name, tmp_path)
    assert served, f"{name} registers no method"
    undeclared = sorted(served - set(definition.authorization))
    assert not undeclared, f"{name} serves methods without an authorization declaration"
    assert set(definition.authorization) <= served, "declared but not served"
    for table in importlib.import_module(f"services.{name}.authorization").AUTHORIZATION:
        assert table.undeclared() == []


@pytest.mark.spec("SEC-3")
def test_the_suite_declares_every_rpc_of_its_contracts() -> None:
    policies = _policies()
    assert len(policies) == 60
    assert set(EXPECTED) <= set(policies)


@pytest.mark.spec("SEC-1", "SEC-3")
@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_security_relevant_declarations_match_the_written_expectation(path: str) -> None:
    policy = _policies()[path]
    roles, source, deployment_wide = EXPECTED[path]
    assert {role.value for role in policy.roles} == roles
    assert policy.workspace is source
    assert policy.deployment_wide is deployment_wide


@pytest.mark.spec("SEC-3")
def test_no_device_may_purge_or_clean_up() -> None:
    policies = _policies()
    for method in (
        "PurgeDeletedSessions",
        "PurgeWorkspaceTombstones",
        "ListPendingResourceCleanups",
        "CompleteResourceCleanup",
        "CompleteResourceCleanups",
    ):
        assert Role.DEVICE not in policies[HOST + method].roles
    assert Role.DEVICE not in policies[MAINTENANCE + "RunManualPurge"].roles


def _denied(call: Any) -> tuple[str, str]:
    with pytest.raises(PermissionDenied) as raised:
        call()
    return raised.value.status, raised.value.reason


@pytest.mark.spec("SEC-3")
def test_a_role_outside_the_declaration_is_refused_before_the_workspace() -> None:
    policy = workspace_field(*OPERATORS)
    request = host_pb2.PurgeWorkspaceTombstonesRequest(workspace_id="ws-2")
    assert _denied(lambda: policy.admit(DEVICE, request)) == (
        "PERMISSION_DENIED",
        "ROLE_NOT_ALLOWED",
    )


@pytest.mark.spec("SEC-1", "SEC-3")
def test_a_required_workspace_field_is_checked_against_the_principal() -> None:
    policy = workspace_field(*ANY_ROLE)
    own = policy.admit(DEVICE, host_pb2.GetSessionRequest(workspace_id="ws-1"))
    assert own.workspaces == frozenset({"ws-1"})
    foreign = host_pb2.GetSessionRequest(workspace_id="ws-2")
    assert _denied(lambda: policy.admit(DEVICE, foreign))[1] == "WORKSPACE_SCOPE_MISMATCH"
    with pytest.raises(InvalidArgument) as raised:
        policy.admit(DEVICE, host_pb2.GetSessionRequest())
    assert [v.field for v in raised.value.field_violations] == ["workspace_id"]
    wide = policy.admit(WIDE_SERVICE, foreign)
    assert wide.workspaces == frozenset({"ws-2"})


@pytest.mark.spec("SEC-1", "SEC-3")
def test_an_unset_optional_workspace_is_the_principals_own_never_all() -> None:
    policy = optional_workspace(*OPERATORS)
    unset = host_pb2.PurgeDeletedSessionsRequest(cutoff_unix_ms=2**62, max_trees=1000)
    assert policy.admit(WS1_SERVICE, unset).workspaces == frozenset({"ws-1"})
    assert policy.admit(WS12_ADMIN, unset).workspaces == frozenset({"ws-1", "ws-2"})
    assert policy.admit(WIDE_SERVICE, unset).workspaces is None  # deployment-wide only
    set_one = host_pb2.PurgeDeletedSessionsRequest(workspace_id="ws-2")
    assert policy.admit(WS12_ADMIN, set_one).workspaces == frozenset({"ws-2"})
    assert _denied(lambda: policy.admit(WS1_SERVICE, set_one))[1] == "WORKSPACE_SCOPE_MISMATCH"
    with pytest.raises(InvalidArgument):  # set, but empty
        policy.admit(WS1_SERVICE, host_pb2.PurgeDeletedSessionsRequest(workspace_id=""))


@pytest.mark.spec("SEC-1", "SEC-3")
def test_a_first_stream_message_names_every_workspace_of_the_call() -> None:
    policy = first_message(Role.DEVICE, Role.ADMIN, path="hello.workspace_ids")
    admitted = policy.admit(WS12_ADMIN, object())  # the request iterator: nothing read yet
    assert admitted.workspaces == frozenset({"ws-1", "ws-2"})

    def hello(*workspaces: str) -> livestream_pb2.DeviceLinkRequest:
        return livestream_pb2.DeviceLinkRequest(
            hello=livestream_pb2.ClientHello(device_id="d", workspace_ids=list(workspaces))
        )

    assert policy.admit_first_message(WS12_ADMIN, hello("ws-2")).workspaces == frozenset({"ws-2"})
    mixed = hello("ws-1", "ws-3")
    assert _denied(lambda: policy.admit_first_message(WS12_ADMIN, mixed))[1] == (
        "WORKSPACE_SCOPE_MISMATCH"
    )
    for first in (hello(), livestream_pb2.DeviceLinkRequest()):
        with pytest.raises(InvalidArgument) as raised:
            policy.admit_first_message(WS12_ADMIN, first)
        assert [v.field for v in raised.value.field_violations] == ["hello.workspace_ids"]


@pytest.mark.spec("SEC-3")
def test_deployment_wide_writes_need_a_deployment_wide_principal() -> None:
    write, read = deployment_write(*OPERATORS), deployment_read(*ANY_ROLE)
    request = host_pb2.RegisterAgentTargetRequest()
    assert _denied(lambda: write.admit(WS1_SERVICE, request))[1] == "DEPLOYMENT_SCOPE_REQUIRED"
    assert write.admit(WIDE_SERVICE, request).workspaces is None
    assert read.admit(DEVICE, host_pb2.ListAgentTargetsRequest()).workspaces == frozenset({"ws-1"})


@pytest.mark.spec("SEC-3")
def test_a_table_that_does_not_fit_its_service_fails_at_import() -> None:
    host = host_pb2.DESCRIPTOR.services_by_name["HostService"]
    link = livestream_pb2.DESCRIPTOR.services_by_name["DeviceLinkService"]
    maintenance = maintenance_pb2.DESCRIPTOR.services_by_name["MaintenanceService"]
    bad: list[tuple[Any, dict[str, MethodPolicy], str]] = [
        (host, {"NoSuchRpc": workspace_field(*ANY_ROLE)}, "no method"),
        (host, {"GetSession": workspace_field(*ANY_ROLE, path="session")}, "not a string"),
        (host, {"GetSession": optional_workspace(*ANY_ROLE)}, "not optional"),
        (host, {"GetSession": MethodPolicy(frozenset(), WorkspaceSource.FIELD, "x")}, "no role"),
        (link, {"DeviceLink": workspace_field(Role.DEVICE)}, "first message"),
        (host, {"GetSession": first_message(Role.DEVICE, path="workspace_id")}, "client-stream"),
        (
            maintenance,
            {
                "SetRetentionPreference": MethodPolicy(
                    frozenset(ANY_ROLE), WorkspaceSource.DEPLOYMENT, "retention"
                )
            },
            "takes no field",
        ),
    ]
    for service, policies, message in bad:
        with pytest.raises(ValueError, match=message):
            ServiceAuthorization(service, policies)


def _load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.spec("SEC-3")
def test_docs_auth_table_is_generated_from_the_declarations() -> None:
    script = _load_script("auth_table")
    text = (ROOT / "docs" / "auth.md").read_text(encoding="utf-8")
    assert script.updated(text) == text, "run python scripts/auth_table.py"
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) == len(_policies())
    assert "**not declared**" not in text
    drifted = text.replace("| `HostService.PurgeDeletedSessions` | service, admin", "| x")
    assert script.updated(drifted) != drifted, "the check notices a hand edit"


def _probe_definition() -> tuple[ServiceDefinition, list[str]]:
    """A service with one declared and one undeclared method, and its handler entries."""
    entered: list[str] = []

    def handler(name: str) -> grpc.RpcMethodHandler[bytes, bytes]:
        async def answer(request: bytes, context: Any) -> bytes:
            entered.append(name)
            return b"ok"

        return grpc.unary_unary_rpc_method_handler(answer)

    generic = grpc.method_handlers_generic_handler(
        "tutti.test.v1.Probe", {"Declared": handler("Declared"), "Undeclared": handler("U")}
    )
    definition = ServiceDefinition(
        name="probe",
        service_names=["tutti.test.v1.Probe"],
        register=lambda server: server.add_generic_rpc_handlers([generic]),
        authorization={"/tutti.test.v1.Probe/Declared": deployment_read(*ANY_ROLE)},
    )
    return definition, entered


def _reason(error: grpc.aio.AioRpcError) -> str | None:
    """The ErrorInfo reason of a refused aio call (from its status details trailer)."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return str(info.reason)
    return None


@pytest.mark.spec("SEC-3")
def test_an_undeclared_method_fails_closed_on_a_real_server(tmp_path: Path) -> None:
    definition, entered = _probe_definition()

    async def scenario() -> list[tuple[grpc.StatusCode, str | None]]:
        settings = ServerSettings(data_dir=tmp_path, log_format="text")
        running = await start_server(definition, settings, tokens=servers.test_registry())
        outcomes: list[tuple[grpc.StatusCode, str | None]] = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
                for method, principal in (
                    ("Declared", "ws1-device"),
                    ("Undeclared", "admin"),
                    ("Undeclared", "ws1-device"),
                ):
                    call: Any = channel.unary_unary(f"/tutti.test.v1.Probe/{method}")
                    try:
                        await call(b"", metadata=auth_metadata(principal), timeout=10)
                        outcomes.append((grpc.StatusCode.OK, None))
                    except grpc.aio.AioRpcError as error:
                        outcomes.append((error.code(), _reason(error)))
        finally:
            await running.stop(0)
        return outcomes

    outcomes = asyncio.run(scenario())
    assert outcomes == [
        (grpc.StatusCode.OK, None),
        (grpc.StatusCode.PERMISSION_DENIED, "METHOD_NOT_DECLARED"),
        (grpc.StatusCode.PERMISSION_DENIED, "METHOD_NOT_DECLARED"),
    ]
    assert entered == ["Declared"], "the undeclared handler never ran"
