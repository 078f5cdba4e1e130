"""Process wiring of the appcenter service: ``tutti serve appcenter``."""

from __future__ import annotations

from agentactivity.appcenter.v1 import appcenter_pb2, appcenter_pb2_grpc
from grpcserver.app import ServiceDefinition, definition_for
from services.appcenter.servicer import AppCenterServicer
from services.appcenter.settings import Settings

__all__ = ["Settings", "build"]


def build(settings: Settings) -> ServiceDefinition:
    """Assemble the appcenter service for :func:`grpcserver.app.serve`."""
    return definition_for(
        "appcenter",
        [
            (
                appcenter_pb2.DESCRIPTOR.services_by_name["AppCenterService"],
                appcenter_pb2_grpc.add_AppCenterServiceServicer_to_server,
                AppCenterServicer(),  # type: ignore[abstract]  # unimplemented RPCs: UNIMPLEMENTED
            )
        ],
    )
