"""Wire layer of ``MaintenanceService`` (MAINT-PREF-1, MAINT-MAN-1, MAINT-STAT-1).

Methods not overridden here fall through to the generated base class, which the
server interceptor answers with ``UNIMPLEMENTED`` (reason ``NOT_IMPLEMENTED``): an
RPC of the contract that this build does not serve yet never pretends to succeed.
"""

from __future__ import annotations

from agentactivity.maintenance.v1 import maintenance_pb2_grpc


class MaintenanceServicer(maintenance_pb2_grpc.MaintenanceServiceServicer):
    """Serves ``agentactivity.maintenance.v1.MaintenanceService``."""
