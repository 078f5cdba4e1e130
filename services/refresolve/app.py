"""Process wiring of the refresolve service: ``tutti serve refresolve``."""

from __future__ import annotations

from agentactivity.refresolve.v1 import refresolve_pb2, refresolve_pb2_grpc
from grpcserver.app import ServiceDefinition, definition_for
from services.refresolve.servicer import ReferenceServicer
from services.refresolve.settings import Settings

__all__ = ["Settings", "build"]


def build(settings: Settings) -> ServiceDefinition:
    """Assemble the refresolve service for :func:`grpcserver.app.serve`."""
    return definition_for(
        "refresolve",
        [
            (
                refresolve_pb2.DESCRIPTOR.services_by_name["ReferenceService"],
                refresolve_pb2_grpc.add_ReferenceServiceServicer_to_server,
                ReferenceServicer(),  # type: ignore[abstract]  # unimplemented RPCs: UNIMPLEMENTED
            )
        ],
    )
