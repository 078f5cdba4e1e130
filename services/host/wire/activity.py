"""RPCs about agent activity: ``GetActivityState`` (HOST-ACT-1)."""

from __future__ import annotations

from typing import Any

from agentactivity.host.v1 import host_pb2
from grpcserver.auth import Role, current_principal
from services.host.activity_state import read_activity_state
from services.host.context import HostContext


class ActivityRpcs:
    """Serves the activity-state RPC."""

    ctx: HostContext

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
        state = await read_activity_state(self.ctx.database, workspace_id)
        return host_pb2.GetActivityStateResponse(
            any_turn_active=state.any_turn_active,
            active_turn_count=state.active_turn_count,
            workspaces=[
                host_pb2.WorkspaceActivity(workspace_id=ws, active_turn_count=count)
                for ws, count in state.per_workspace.items()
            ],
            observed_at_unix_ms=self.ctx.clock(),
        )
