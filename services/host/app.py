"""Process wiring of the host service: ``tutti serve host``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agentactivity.host.v1 import host_pb2, host_pb2_grpc, runtime_pb2, runtime_pb2_grpc
from grpcserver.app import ServiceDefinition, definition_for
from grpcserver.settings import StartupError
from livelog.factory import open_live_log
from livelog.interface import LiveLog, LiveLogUnavailable
from livelog.settings import LiveLogSettings
from services.host.activity.feed import ActivityFeed, FeedSettings
from services.host.activity.shared_lane import LaneItem
from services.host.authorization import AUTHORIZATION
from services.host.context import HostContext
from services.host.runtime.link import MAX_REPORT_BYTES, start_loss_grace
from services.host.runtime.live_settings import LinkedRuntimeSettings
from services.host.runtime.presence import ReplicaPresence
from services.host.runtime.registry import RuntimeIdentity
from services.host.runtime.wakeups import CommandWakeups
from services.host.servicer import HostServicer, RuntimeLinkServicer
from services.host.settings import Settings
from services.host.turns.disposition_queries import DispositionQuerier
from services.host.turns.workspace_index import WorkspaceIndexFactory, local_workspace_index
from services.host.wire.activity_codec import ProtoEventCodec
from services.host.wire.command_codec import ProtoCommandCodec
from services.host.wire.live_lane_codec import LiveLaneCodec
from store.database import Database

__all__ = ["RECEIVE_LIMIT_BYTES", "Settings", "build"]

RECEIVE_LIMIT_BYTES = 2 * MAX_REPORT_BYTES
"""Largest message Host's server reads (``grpc.max_receive_message_length``; gRPC's default
is 4 MiB). Twice the advertised ``RuntimeWelcome.max_report_bytes`` (8 MiB), so a runtime
frame with a report over that still arrives and is answered ``REPORT_OUTCOME_REJECTED``
``REPORT_TOO_LARGE`` on a link that stays up; a larger message is refused by the transport
with ``RESOURCE_EXHAUSTED`` (the stream ends)."""


def build(
    settings: Settings, *, workspace_index: WorkspaceIndexFactory = local_workspace_index
) -> ServiceDefinition:
    """Assemble the host service for :func:`grpcserver.app.serve`.

    ``workspace_index`` replaces the local file-system index of ``@name`` shadowing
    (tests install one that fails, HOST-MENT-4).
    """
    database = Database(
        settings.resolved_database_url(),
        sqlite_write_queue_seconds=settings.sqlite_write_queue_seconds,
        sqlite_group_commit=settings.sqlite_group_commit,
        sqlite_synchronous=settings.sqlite_synchronous,
    )
    ctx = HostContext(
        database=database,
        command_codec=ProtoCommandCodec(),
        runtime_loss_grace_seconds=settings.runtime_loss_grace_seconds,
        runtime_command_timeout_seconds=settings.runtime_command_timeout_seconds,
        interaction_disposition_query_seconds=settings.interaction_disposition_query_seconds,
        workspace_index=workspace_index,
        project_removal_max_rounds=settings.project_removal_max_rounds,
    )
    # SCALE-3: with TUTTI_BUS=nats the live lane is shared with the other replicas through
    # JetStream (ADR 0041); the in-process default opens nothing.
    live_log_settings = LiveLogSettings()

    async def shared_live_log() -> LiveLog[LaneItem]:
        return await open_live_log(live_log_settings, LiveLaneCodec())

    # HOST-OBS-1/2: the durable event log (wire codec), live lane and pruning bounds.
    ctx.activity = ActivityFeed(
        ctx.clock,
        ProtoEventCodec(),
        FeedSettings(
            queue_max_items=settings.watch_queue_max_items,
            idle_check_seconds=settings.activity_follow_interval_seconds,
            retention_seconds=settings.activity_event_retention_seconds,
            max_rows=settings.activity_event_max_rows,
            prune_interval_seconds=settings.activity_event_prune_interval_seconds,
        ),
        live_log=shared_live_log if live_log_settings.bus == "nats" else None,
    )

    async def start_activity() -> None:
        try:
            await ctx.activity.start(database)
        except LiveLogUnavailable as error:
            # One line naming the URL and a non-zero exit: the orchestrator restarts the pod
            # with backoff rather than keeping one that can never serve the live lane.
            raise StartupError(f"live log: {error}") from error

    async def stop_activity() -> None:
        await ctx.activity.stop(database)

    # HOST-INT-6: delivered answers without a disposition are queried on a durable schedule.
    querier = DispositionQuerier(ctx)

    # HOST-SES-6: settings updates reach connected runtimes over the runtime link.
    ctx.runtime_settings = LinkedRuntimeSettings(ctx)

    # SCALE-2: with the shared bus a runtime may attach to any replica (ADR 0042).
    start_replicas, stop_replicas = _replica_hooks(ctx, settings, live_log_settings)
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
        authorization=AUTHORIZATION,
        on_start=[database.start, start_activity, start_replicas, querier.start],
        # Runtime links and watches end as soon as new RPCs are refused (OPS-3); the querier
        # stops first so no query is queued for a link being shut (its stop in on_stop is a
        # no-op then).
        on_drain=[querier.stop, ctx.runtimes.shutdown, ctx.activity.end_watches],
        on_stop=[database.stop, stop_activity, stop_replicas, querier.stop],  # run in reverse
        server_options=[("grpc.max_receive_message_length", RECEIVE_LIMIT_BYTES)],
    )


def _replica_hooks(
    ctx: HostContext, settings: Settings, live_log_settings: LiveLogSettings
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    """Start and stop hooks of runtime presence and command wake-ups (SCALE-2).

    The single node (``TUTTI_BUS`` unset) gets hooks that do nothing: no presence rows, no
    signals, no sweep; the registry alone routes, as before.
    """
    if live_log_settings.bus != "nats":

        async def nothing() -> None:
            return None

        return nothing, nothing
    presence = ReplicaPresence(ctx, lease_seconds=settings.runtime_presence_lease_seconds)
    ctx.presence = presence  # before any link can attach

    async def orphaned(identity: RuntimeIdentity) -> None:
        start_loss_grace(ctx, identity)

    async def start() -> None:
        # Imported here: nats-py is the ``scale`` extra, not needed by a single node.
        from livelog.signals import NatsSignals

        try:
            signals = await NatsSignals.connect(live_log_settings, name="tutti-host-signals")
        except LiveLogUnavailable as error:
            raise StartupError(f"command wake-ups: {error}") from error
        wakeups = CommandWakeups(
            ctx, signals, sweep_interval_seconds=settings.command_sweep_interval_seconds
        )
        await wakeups.start()
        ctx.command_wakeups = wakeups
        presence.start(orphaned)

    async def stop() -> None:
        await presence.stop()
        if ctx.command_wakeups is not None:
            await ctx.command_wakeups.stop()
            ctx.command_wakeups = None

    return start, stop
