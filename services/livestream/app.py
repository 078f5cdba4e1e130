"""Process wiring of the livestream service: ``tutti serve livestream``."""

from __future__ import annotations

from agentactivity.livestream.v1 import livestream_pb2
from grpcserver.app import Hook, ServiceDefinition, definition_for
from livelog.settings import LiveLogSettings
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


HANDOVER_STOP_MARGIN_SECONDS = 1.0
"""Grace left for the stop hooks after a drain stopped answering hand-overs."""


def build(
    settings: Settings,
    source: ActivitySource | None = None,
    live_log: LiveLogSettings | None = None,
) -> ServiceDefinition:
    """Assemble the livestream service for :func:`grpcserver.app.serve`.

    ``source`` is how it reads Host; by default Host's gRPC API at ``TUTTI_HOST_ADDRESS``
    with ``TUTTI_SERVICE_TOKEN``. With ``TUTTI_BUS=nats`` (``live_log``, read from the
    environment by default) publishers are handed over between replicas (SCALE-4).
    """
    bus = live_log or LiveLogSettings()
    transport = None
    on_start: list[Hook] = []
    if bus.bus == "nats":
        # Imported here: nats-py is the ``scale`` extra, not needed by a single node.
        from services.livestream.handover.nats_transport import NatsHandover

        transport = NatsHandover(bus, timeout_seconds=settings.live_handover_timeout_seconds)
        on_start.append(transport.start)
    registry = PublisherRegistry(
        settings, source or HostActivitySource(settings), handover=transport
    )
    if transport is not None:
        transport.bind(registry.hand_over)
    on_start.append(registry.start)
    # ADR 0005: the drain hooks run once new RPCs are refused, after the drain delay; a
    # draining owner answers hand-overs for the rest of the grace (ADR 0043).
    grace = settings.grace_period_seconds
    handover_seconds = grace - min(settings.drain_delay_seconds, grace / 2)
    handover_seconds -= HANDOVER_STOP_MARGIN_SECONDS

    async def drain() -> None:
        await registry.drain(handover_seconds)

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
        on_start=on_start,
        # Device links end as soon as new RPCs are refused (OPS-3); devices resume elsewhere.
        on_drain=[drain],
        on_stop=[registry.stop],
        server_options=SERVER_OPTIONS,
    )
