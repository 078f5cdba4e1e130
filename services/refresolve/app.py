"""Process wiring of the refresolve service: ``tutti serve refresolve``."""

from __future__ import annotations

from agentactivity.refresolve.v1 import refresolve_pb2, refresolve_pb2_grpc
from grpcserver.app import ServiceDefinition, definition_for
from services.refresolve.app_traversal import TraversalBounds
from services.refresolve.authorization import AUTHORIZATION
from services.refresolve.grpc_backends import GrpcReferenceBackends
from services.refresolve.resolver import Resolver
from services.refresolve.servicer import ReferenceServicer
from services.refresolve.settings import Settings

__all__ = ["Settings", "build"]


def build(settings: Settings) -> ServiceDefinition:
    """Assemble the refresolve service for :func:`grpcserver.app.serve`."""
    backends = GrpcReferenceBackends(
        appcenter_address=settings.appcenter_address,
        issuemanager_address=settings.issuemanager_address,
        service_token=(
            settings.service_token.get_secret_value() if settings.service_token else None
        ),
        page_size=settings.refresolve_backend_page_size,
        channel_settings=settings,
    )
    resolver = Resolver(
        backends,
        TraversalBounds(
            max_depth=settings.refresolve_max_depth,
            max_groups=settings.refresolve_max_groups,
            max_pages=settings.refresolve_max_pages,
            concurrency=settings.refresolve_backend_concurrency,
        ),
    )
    servicer = ReferenceServicer(resolver, timeout_seconds=settings.refresolve_timeout_seconds)
    return definition_for(
        "refresolve",
        [
            (
                refresolve_pb2.DESCRIPTOR.services_by_name["ReferenceService"],
                refresolve_pb2_grpc.add_ReferenceServiceServicer_to_server,
                servicer,
            )
        ],
        authorization=AUTHORIZATION,
        on_start=[backends.start],
        on_stop=[backends.stop],
    )
