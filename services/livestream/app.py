"""Process wiring of the livestream service: ``tutti serve livestream``."""

from __future__ import annotations

from agentactivity.livestream.v1 import livestream_pb2, livestream_pb2_grpc
from grpcserver.app import ServiceDefinition, definition_for
from services.livestream.authorization import AUTHORIZATION
from services.livestream.servicer import DeviceLinkServicer
from services.livestream.settings import Settings

__all__ = ["Settings", "build"]


def build(settings: Settings) -> ServiceDefinition:
    """Assemble the livestream service for :func:`grpcserver.app.serve`."""
    return definition_for(
        "livestream",
        [
            (
                livestream_pb2.DESCRIPTOR.services_by_name["DeviceLinkService"],
                livestream_pb2_grpc.add_DeviceLinkServiceServicer_to_server,
                DeviceLinkServicer(),  # type: ignore[abstract]  # unimplemented RPCs: UNIMPLEMENTED
            )
        ],
        authorization=AUTHORIZATION,
    )
