"""Process wiring of the appcenter service: ``tutti serve appcenter``."""

from __future__ import annotations

from agentactivity.appcenter.v1 import appcenter_pb2, appcenter_pb2_grpc
from grpcserver.app import ServiceDefinition, definition_for
from services.appcenter.app_store import AppStore
from services.appcenter.authorization import AUTHORIZATION
from services.appcenter.load_validation import LoadBounds
from services.appcenter.servicer import AppCenterServicer
from services.appcenter.settings import Settings
from store.database import Database

__all__ = ["Settings", "build"]


def build(settings: Settings) -> ServiceDefinition:
    """Assemble the appcenter service for :func:`grpcserver.app.serve`."""
    database = Database(
        settings.resolved_database_url(),
        sqlite_write_queue_seconds=settings.sqlite_write_queue_seconds,
        sqlite_group_commit=settings.sqlite_group_commit,
        sqlite_synchronous=settings.sqlite_synchronous,
    )
    servicer = AppCenterServicer(
        AppStore(database),
        LoadBounds(
            max_depth=settings.appcenter_load_max_depth,
            max_groups=settings.appcenter_load_max_groups,
            max_artifacts=settings.appcenter_load_max_artifacts,
        ),
    )
    return definition_for(
        "appcenter",
        [
            (
                appcenter_pb2.DESCRIPTOR.services_by_name["AppCenterService"],
                appcenter_pb2_grpc.add_AppCenterServiceServicer_to_server,
                servicer,
            )
        ],
        authorization=AUTHORIZATION,
        on_start=[database.start],
        on_stop=[database.stop],
    )
