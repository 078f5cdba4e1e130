"""RPCs about user projects (HOST-PROJ-1)."""

from __future__ import annotations

from typing import Any

from agentactivity.host.v1 import host_pb2
from services.host.context import HostContext
from services.host.deletion import project_removal
from services.host.sessions import projects
from services.host.wire.deletion import deletion_result_to_proto


def project_to_proto(record: projects.ProjectRecord) -> host_pb2.Project:
    """A stored project as the wire shows it."""
    return host_pb2.Project(
        workspace_id=record.workspace_id,
        section_key=record.section_key,
        label=record.label,
        path=record.path,
        created_at_unix_ms=record.created_at_unix_ms,
    )


class ProjectRpcs:
    """Serves the user-project RPCs (the interceptor has checked ``workspace_id``)."""

    ctx: HostContext

    async def AddProject(
        self, request: host_pb2.AddProjectRequest, context: Any
    ) -> host_pb2.AddProjectResponse:
        """Create a project, or return it for an identical keyed replay (HOST-PROJ-1)."""
        section_key = request.section_key if request.HasField("section_key") else None
        stored = await projects.add_project(
            self.ctx, request.workspace_id, section_key, request.label, request.path
        )
        return host_pb2.AddProjectResponse(project=project_to_proto(stored))

    async def ListProjects(
        self, request: host_pb2.ListProjectsRequest, context: Any
    ) -> host_pb2.ListProjectsResponse:
        """List the workspace's projects by label, then key (HOST-PROJ-1)."""
        found = await projects.list_projects(self.ctx, request.workspace_id)
        return host_pb2.ListProjectsResponse(projects=[project_to_proto(p) for p in found])

    async def RemoveProject(
        self, request: host_pb2.RemoveProjectRequest, context: Any
    ) -> host_pb2.RemoveProjectResponse:
        """Delete the live unpinned roots, rehome the rest, remove the project (HOST-PROJ-1)."""
        removal = await project_removal.remove_project(
            self.ctx, request.workspace_id, request.section_key
        )
        return host_pb2.RemoveProjectResponse(
            deletion=deletion_result_to_proto(removal.deletion),
            rehomed_session_ids=list(removal.rehomed_session_ids),
        )
