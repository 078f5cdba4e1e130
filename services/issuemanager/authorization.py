"""Who may call each IssueManagerService RPC, and where its workspace comes from (SEC-3).

The one authorization table of issuemanager; the server interceptor enforces it before
any handler runs (see :mod:`grpcserver.authorization`). Reads are open to any principal
of the workspace (refresolve reads with its service token); loading and deleting
reference data is an ``admin`` job.
"""

from __future__ import annotations

from agentactivity.issuemanager.v1 import issuemanager_pb2
from grpcserver.auth import Role
from grpcserver.authorization import ANY_ROLE, ServiceAuthorization, workspace_field

ISSUE_MANAGER_SERVICE = ServiceAuthorization(
    issuemanager_pb2.DESCRIPTOR.services_by_name["IssueManagerService"],
    {
        "GetIssueDetail": workspace_field(*ANY_ROLE),
        "SearchIssueOutputs": workspace_field(*ANY_ROLE),
        "LoadTopics": workspace_field(Role.ADMIN),
        "DeleteTopic": workspace_field(Role.ADMIN),
    },
)

AUTHORIZATION = (ISSUE_MANAGER_SERVICE,)
"""The tables of every service the issuemanager server serves."""
