"""RPCs about agent activity: ``GetActivityState`` (HOST-ACT-1)."""

from __future__ import annotations

from typing import Any

from agentactivity.host.v1 import host_pb2
from grpcserver.authorization import current_scope
from services.host.activity.state import read_activity_state
from services.host.context import HostContext


class ActivityRpcs:
    """Serves the activity-state RPC."""

    ctx: HostContext

    async def GetActivityState(
        self, request: host_pb2.GetActivityStateRequest, context: Any
    ) -> host_pb2.GetActivityStateResponse:
        """Report active Turns overall and per workspace (HOST-ACT-1).

        Without ``workspace_id`` the answer spans the principal's workspaces (every
        workspace only for a deployment-wide principal): the scope the interceptor bound.
        """
        state = await read_activity_state(self.ctx.database, current_scope().workspaces)
        return host_pb2.GetActivityStateResponse(
            any_turn_active=state.any_turn_active,
            active_turn_count=state.active_turn_count,
            workspaces=[
                host_pb2.WorkspaceActivity(workspace_id=ws, active_turn_count=count)
                for ws, count in state.per_workspace.items()
            ],
            observed_at_unix_ms=self.ctx.clock(),
        )
