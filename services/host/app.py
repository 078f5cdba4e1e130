"""Process wiring of the host service: ``tutti serve host``."""

from __future__ import annotations

from agentactivity.host.v1 import host_pb2, host_pb2_grpc, runtime_pb2, runtime_pb2_grpc
from grpcserver.app import ServiceDefinition, definition_for
from services.host.context import HostContext
from services.host.servicer import HostServicer, RuntimeLinkServicer
from services.host.settings import Settings
from store.database import Database

__all__ = ["Settings", "build"]


def build(settings: Settings) -> ServiceDefinition:
    """Assemble the host service for :func:`grpcserver.app.serve`."""
    database = Database(settings.resolved_database_url())
    ctx = HostContext(
        database=database,
        runtime_loss_grace_seconds=settings.runtime_loss_grace_seconds,
        runtime_command_timeout_seconds=settings.runtime_command_timeout_seconds,
    )
    return definition_for(
        "host",
        [
            (
                host_pb2.DESCRIPTOR.services_by_name["HostService"],
                host_pb2_grpc.add_HostServiceServicer_to_server,
                HostServicer(ctx),  # type: ignore[abstract]  # unimplemented RPCs: UNIMPLEMENTED
            ),
            (
                runtime_pb2.DESCRIPTOR.services_by_name["RuntimeLinkService"],
                runtime_pb2_grpc.add_RuntimeLinkServiceServicer_to_server,
                RuntimeLinkServicer(ctx),
            ),
        ],
        on_start=[database.start],
        on_stop=[ctx.runtimes.shutdown, database.stop],
    )
