"""Process wiring of the livestream service: ``tutti serve livestream``."""

from __future__ import annotations

from agentactivity.livestream.v1 import livestream_pb2
from grpcserver.app import ServiceDefinition, definition_for
from services.livestream.authorization import AUTHORIZATION
from services.livestream.registry import PublisherRegistry
from services.livestream.servicer import DeviceLinkServicer, add_to_server
from services.livestream.settings import Settings
from services.livestream.source import ActivitySource, HostActivitySource

__all__ = ["SERVER_OPTIONS", "Settings", "build"]

SERVER_OPTIONS = (
    # LIVE-FLOW-1: a reconnect storm (every phone of a cell tower, a replica draining) puts
    # thousands of new calls in gRPC core's queue before the Python server picks them up;
    # past its default 1,000 (hard limit 3,000) core refuses calls at random (CANCELLED /
    # INTERNAL). Above the publisher bound, no device is refused by the queue.
    ("grpc.server.max_pending_requests", 20_000),
    ("grpc.server.max_pending_requests_hard_limit", 40_000),
)


def build(settings: Settings, source: ActivitySource | None = None) -> ServiceDefinition:
    """Assemble the livestream service for :func:`grpcserver.app.serve`.

    ``source`` is how it reads Host; by default Host's gRPC API at ``TUTTI_HOST_ADDRESS``
    with ``TUTTI_SERVICE_TOKEN``.
    """
    registry = PublisherRegistry(settings, source or HostActivitySource(settings))
    return definition_for(
        "livestream",
        [
            (
                livestream_pb2.DESCRIPTOR.services_by_name["DeviceLinkService"],
                add_to_server,
                DeviceLinkServicer(registry),
            )
        ],
        authorization=AUTHORIZATION,
        on_start=[registry.start],
        # Device links end as soon as new RPCs are refused (OPS-3); devices resume elsewhere.
        on_drain=[registry.drain],
        on_stop=[registry.stop],
        server_options=SERVER_OPTIONS,
    )
