"""Wire layer of ``HostService`` and ``RuntimeLinkService`` (HOST-*).

Methods not overridden here fall through to the generated base classes, which the
server interceptor answers with ``UNIMPLEMENTED`` (reason ``NOT_IMPLEMENTED``): an
RPC of the contract that this build does not serve yet never pretends to succeed.
"""

from __future__ import annotations

import time
from typing import Any

from agentactivity.host.v1 import host_pb2, host_pb2_grpc, runtime_pb2_grpc
from grpcserver.auth import Role, current_principal
from services.host.activity_state import read_activity_state
from store.database import Database


class HostServicer(host_pb2_grpc.HostServiceServicer):
    """Serves ``agentactivity.host.v1.HostService``."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def GetActivityState(
        self, request: host_pb2.GetActivityStateRequest, context: Any
    ) -> host_pb2.GetActivityStateResponse:
        """Report active Turns overall and per workspace (HOST-ACT-1).

        Without ``workspace_id`` the answer spans every workspace, which only a
        ``service`` or ``admin`` principal may ask.
        """
        workspace_id = request.workspace_id if request.HasField("workspace_id") else None
        if workspace_id is None:
            current_principal().require_role(Role.SERVICE, Role.ADMIN)
        state = await read_activity_state(self._database, workspace_id)
        return host_pb2.GetActivityStateResponse(
            any_turn_active=state.any_turn_active,
            active_turn_count=state.active_turn_count,
            workspaces=[
                host_pb2.WorkspaceActivity(workspace_id=ws, active_turn_count=count)
                for ws, count in state.per_workspace.items()
            ],
            observed_at_unix_ms=time.time_ns() // 1_000_000,
        )


class RuntimeLinkServicer(runtime_pb2_grpc.RuntimeLinkServiceServicer):
    """Serves ``agentactivity.host.v1.RuntimeLinkService`` (HOST-RT-1)."""
