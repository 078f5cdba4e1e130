"""Process wiring of the maintenance service: ``tutti serve maintenance``."""

from __future__ import annotations

from agentactivity.maintenance.v1 import maintenance_pb2, maintenance_pb2_grpc
from grpcserver.app import ServiceDefinition, definition_for
from services.maintenance.authorization import AUTHORIZATION
from services.maintenance.retention import RetentionPreferences
from services.maintenance.servicer import MaintenanceServicer
from services.maintenance.settings import Settings
from store.database import Database

__all__ = ["Settings", "build"]


def build(settings: Settings) -> ServiceDefinition:
    """Assemble the maintenance service for :func:`grpcserver.app.serve`."""
    database = Database(
        settings.resolved_database_url(),
        sqlite_write_queue_seconds=settings.sqlite_write_queue_seconds,
    )
    servicer = MaintenanceServicer(RetentionPreferences(database))  # type: ignore[abstract]
    return definition_for(
        "maintenance",
        [
            (
                maintenance_pb2.DESCRIPTOR.services_by_name["MaintenanceService"],
                maintenance_pb2_grpc.add_MaintenanceServiceServicer_to_server,
                servicer,
            )
        ],
        authorization=AUTHORIZATION,
        on_start=[database.start],
        on_stop=[database.stop],
    )
