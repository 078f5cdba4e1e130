"""Process wiring of the issuemanager service: ``tutti serve issuemanager``."""

from __future__ import annotations

from agentactivity.issuemanager.v1 import issuemanager_pb2, issuemanager_pb2_grpc
from grpcserver.app import ServiceDefinition, definition_for
from services.issuemanager.servicer import IssueManagerServicer
from services.issuemanager.settings import Settings

__all__ = ["Settings", "build"]


def build(settings: Settings) -> ServiceDefinition:
    """Assemble the issuemanager service for :func:`grpcserver.app.serve`."""
    return definition_for(
        "issuemanager",
        [
            (
                issuemanager_pb2.DESCRIPTOR.services_by_name["IssueManagerService"],
                issuemanager_pb2_grpc.add_IssueManagerServiceServicer_to_server,
                IssueManagerServicer(),  # type: ignore[abstract]  # unimplemented RPCs: UNIMPLEMENTED
            )
        ],
    )
