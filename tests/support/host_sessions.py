"""Helpers for Host target/project/Session tests: a stub and typed-error readers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from tests.support.rpc_errors import error_details
from tests.support.servers import LiveServer, auth_metadata

ADMIN = auth_metadata("admin")
WS1 = auth_metadata("ws1-device")


def demo_target(agent_target_id: str = "demo", **overrides: Any) -> host_pb2.AgentTarget:
    """A complete, valid target record."""
    target = host_pb2.AgentTarget(
        agent_target_id=agent_target_id,
        provider="demo-provider",
        display_name="Demo",
        enabled=True,
        launch_ref=host_pb2.AgentLaunchRef(
            runtime_target_ref=f"runtime://{agent_target_id}", options_json='{"x": 1}'
        ),
        capabilities=canonical_pb2.RuntimeCapabilities(guidance=True, interrupt=True),
        subagents=[host_pb2.SubagentDescriptor(name="explorer", description="Reads code")],
        settings_catalog=host_pb2.AgentSettingsCatalog(
            models=[
                host_pb2.ModelOption(
                    model_id="fast",
                    display_name="Fast",
                    reasoning_efforts=["low", "high"],
                    default_reasoning_effort="low",
                ),
                host_pb2.ModelOption(model_id="plain", display_name="Plain"),
            ],
            default_model_id="fast",
            permission_modes=["default", "accept_edits"],
            default_permission_mode="default",
            speed_configurable=True,
        ),
        locality=host_pb2.AGENT_TARGET_LOCALITY_LOCAL,
    )
    for name, value in overrides.items():
        setattr(target, name, value)
    return target


class HostClient:
    """A HostService stub with the common setup calls."""

    def __init__(self, server: LiveServer) -> None:
        self.stub = host_pb2_grpc.HostServiceStub(server.channel)

    def call(self, method: str, request: Any, metadata: Any = WS1) -> Any:
        """Invoke ``method`` with a 10 s deadline."""
        rpc: Callable[..., Any] = getattr(self.stub, method)
        return rpc(request, metadata=metadata, timeout=10)

    def register(self, target: host_pb2.AgentTarget | None = None) -> host_pb2.AgentTarget:
        """Register a target (as admin)."""
        response: host_pb2.RegisterAgentTargetResponse = self.call(
            "RegisterAgentTarget",
            host_pb2.RegisterAgentTargetRequest(target=target or demo_target()),
            ADMIN,
        )
        return response.target

    def create(self, workspace_id: str = "ws-1", **fields: Any) -> canonical_pb2.Session:
        """Create a Session on target ``demo`` (unless overridden)."""
        fields.setdefault("agent_target_id", "demo")
        fields.setdefault("cwd", "/work/elsewhere")
        response: host_pb2.CreateSessionResponse = self.call(
            "CreateSession",
            host_pb2.CreateSessionRequest(workspace_id=workspace_id, **fields),
            ADMIN,
        )
        return response.session


def error_of(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str, set[str], grpc.RpcError]:
    """Run ``call``, expect an RpcError; return its code, ErrorInfo reason and violated fields."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    code, reason, fields = error_details(caught.value)
    return code, reason, fields, caught.value
