"""Wire layer of ``MaintenanceService`` (MAINT-PREF-1, MAINT-MAN-1, MAINT-STAT-1).

Methods not overridden here fall through to the generated base class, which the
server interceptor answers with ``UNIMPLEMENTED`` (reason ``NOT_IMPLEMENTED``): an
RPC of the contract that this build does not serve yet never pretends to succeed.
"""

from __future__ import annotations

from typing import Any

from agentactivity.maintenance.v1 import maintenance_pb2, maintenance_pb2_grpc
from domainerrors import InvalidArgument
from services.maintenance.retention import RetentionPreference, RetentionPreferences

_PERIOD_BY_DAYS = {
    15: maintenance_pb2.RETENTION_PERIOD_15_DAYS,
    30: maintenance_pb2.RETENTION_PERIOD_30_DAYS,
}
_DAYS_BY_PERIOD = {period: days for days, period in _PERIOD_BY_DAYS.items()}


def _preference(value: RetentionPreference) -> maintenance_pb2.RetentionPreference:
    message = maintenance_pb2.RetentionPreference(
        retention=_PERIOD_BY_DAYS[value.days],
        retention_days=value.days,
        is_default=value.is_default,
    )
    if value.updated_at_unix_ms is not None:
        message.updated_at_unix_ms = value.updated_at_unix_ms
    return message


class MaintenanceServicer(maintenance_pb2_grpc.MaintenanceServiceServicer):
    """Serves ``agentactivity.maintenance.v1.MaintenanceService``."""

    def __init__(self, retention: RetentionPreferences) -> None:
        self._retention = retention

    async def GetRetentionPreference(
        self, request: maintenance_pb2.GetRetentionPreferenceRequest, context: Any
    ) -> maintenance_pb2.GetRetentionPreferenceResponse:
        """Return the effective retention preference (MAINT-PREF-1)."""
        return maintenance_pb2.GetRetentionPreferenceResponse(
            preference=_preference(await self._retention.get())
        )

    async def SetRetentionPreference(
        self, request: maintenance_pb2.SetRetentionPreferenceRequest, context: Any
    ) -> maintenance_pb2.SetRetentionPreferenceResponse:
        """Persist 15 or 30 days (MAINT-PREF-1); a deployment-wide admin only (SEC-3)."""
        days = _DAYS_BY_PERIOD.get(request.retention)
        if days is None:
            raise InvalidArgument.for_field(
                "retention", "must be RETENTION_PERIOD_15_DAYS or RETENTION_PERIOD_30_DAYS"
            )
        return maintenance_pb2.SetRetentionPreferenceResponse(
            preference=_preference(await self._retention.set(days))
        )
