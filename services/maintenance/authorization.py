"""Who may call each MaintenanceService RPC, and where its workspace comes from (SEC-3).

The one authorization table of maintenance; the server interceptor enforces it before
any handler runs (see :mod:`grpcserver.authorization`). The retention preference is a
deployment-wide record: anyone may read it, only a deployment-wide ``admin`` may set it.
The manual purge is permanent: ``service``/``admin`` only.
"""

from __future__ import annotations

from agentactivity.maintenance.v1 import maintenance_pb2
from grpcserver.auth import Role
from grpcserver.authorization import (
    ANY_ROLE,
    OPERATORS,
    ServiceAuthorization,
    deployment_read,
    deployment_write,
    optional_workspace,
    workspace_field,
)

MAINTENANCE_SERVICE = ServiceAuthorization(
    maintenance_pb2.DESCRIPTOR.services_by_name["MaintenanceService"],
    {
        "GetRetentionPreference": deployment_read(*ANY_ROLE),
        "SetRetentionPreference": deployment_write(Role.ADMIN),
        "RunManualPurge": workspace_field(*OPERATORS),
        "GetMaintenanceStatus": optional_workspace(*ANY_ROLE, path="preview_workspace_id"),
    },
)

AUTHORIZATION = (MAINTENANCE_SERVICE,)
"""The tables of every service the maintenance server serves."""
