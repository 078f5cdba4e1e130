"""Who may call each AppCenterService RPC, and where its workspace comes from (SEC-3).

The one authorization table of appcenter; the server interceptor enforces it before any
handler runs (see :mod:`grpcserver.authorization`). Reads are open to any principal of
the workspace (refresolve reads with its service token); loading and deleting reference
data is an ``admin`` job.
"""

from __future__ import annotations

from agentactivity.appcenter.v1 import appcenter_pb2
from grpcserver.auth import Role
from grpcserver.authorization import ANY_ROLE, ServiceAuthorization, workspace_field

APP_CENTER_SERVICE = ServiceAuthorization(
    appcenter_pb2.DESCRIPTOR.services_by_name["AppCenterService"],
    {
        "ListReferences": workspace_field(*ANY_ROLE),
        "LoadApps": workspace_field(Role.ADMIN),
        "DeleteApp": workspace_field(Role.ADMIN),
    },
)

AUTHORIZATION = (APP_CENTER_SERVICE,)
"""The tables of every service the appcenter server serves."""
