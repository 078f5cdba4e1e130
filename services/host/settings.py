"""Settings of the host service process (environment variables `TUTTI_*`, OPS-1)."""

from __future__ import annotations

from pydantic import Field

from grpcserver.settings import DEFAULT_PORTS, ServerSettings


class Settings(ServerSettings):
    """Settings of the host service; see :class:`~grpcserver.settings.ServerSettings`."""

    listen_address: str = f"127.0.0.1:{DEFAULT_PORTS['host']}"
    """``host:port`` to listen on (``TUTTI_LISTEN_ADDRESS``)."""

    runtime_loss_grace_seconds: float = 30.0
    """How long a runtime may stay disconnected before Host confirms its provider sessions
    dead: their active Turns settle ``interrupted`` and their pending and resolving
    Interactions become ``superseded`` (``TUTTI_RUNTIME_LOSS_GRACE_SECONDS``, HOST-RT-1)."""

    runtime_command_timeout_seconds: float = 10.0
    """How long Host waits for a runtime to acknowledge a command it awaits (live settings,
    an activation's ``resume_session``); after it the command is withdrawn from the outbox
    (never sent again) and reported failed (``TUTTI_RUNTIME_COMMAND_TIMEOUT_SECONDS``, ADR 0013
    §11, ADR 0029)."""

    interaction_disposition_query_seconds: float = Field(default=30.0, gt=0)
    """How long a delivered Interaction response may go without the runtime's disposition
    (or outlive its link) before Host asks the runtime for it with
    ``query_interaction_disposition``; later queries follow with backoff (doubling, up to
    10 minutes) until an authoritative answer or confirmed session loss
    (``TUTTI_INTERACTION_DISPOSITION_QUERY_SECONDS``, HOST-INT-6)."""

    activity_event_retention_seconds: float = 7 * 24 * 3600.0
    """Age bound of the activity event log, per workspace (default 7 days): the pruner removes
    a workspace's events up to its newest one created before now minus this, except the
    workspace's newest event, which always stays (HOST-OBS-2, ADR 0015 §10,
    ``TUTTI_ACTIVITY_EVENT_RETENTION_SECONDS``). Cursors of removed events fail
    ``OUT_OF_RANGE`` ``EVENT_CURSOR_EXPIRED``."""

    activity_event_max_rows: int = 1_000_000
    """Size bound of the activity event log, per workspace: each workspace keeps at most its
    newest this many events (at least 1), whatever other workspaces write
    (``TUTTI_ACTIVITY_EVENT_MAX_ROWS``)."""

    activity_event_prune_interval_seconds: float = 300.0
    """How often Host applies the two bounds above to every workspace
    (``TUTTI_ACTIVITY_EVENT_PRUNE_INTERVAL_SECONDS``)."""

    watch_queue_max_items: int = 10_000
    """Live items (deltas and commit batches) buffered per ``WatchActivity`` consumer; a
    consumer that falls further behind gets ``RESOURCE_EXHAUSTED``
    (``WATCH_CONSUMER_TOO_SLOW``) and resumes from its cursor
    (``TUTTI_WATCH_QUEUE_MAX_ITEMS``)."""

    activity_follow_interval_seconds: float = Field(default=1.0, gt=0)
    """How late, at most, a ``WatchActivity`` stream sees an event another Host replica
    committed when no bus wake-up arrives: each process reads the head rows of the
    workspaces it streams this often, one statement for all of them, and then only the new
    events (``TUTTI_ACTIVITY_FOLLOW_INTERVAL_SECONDS``, SCALE-1, ADR 0037). Events this
    process commits are streamed at once, whatever this is."""

    project_removal_max_rounds: int = Field(default=5, ge=1)
    """How many rounds ``RemoveProject`` makes before it gives up with ``ABORTED``
    ``STALE_DELETE_PLAN`` (RetryInfo): each round deletes the project's live unpinned roots,
    then tries the compare-and-finalize, which rolls back when a live unpinned root appeared
    meanwhile (``TUTTI_PROJECT_REMOVAL_MAX_ROUNDS``, HOST-PROJ-1)."""

    runtime_presence_lease_seconds: float = Field(default=10.0, gt=0)
    """With the shared bus (several replicas, SCALE-2): how long a replica's record of a
    runtime link counts without a renewal (renewed every third of it). A replica that died
    without detaching its runtimes stops counting as their holder this long after its last
    renewal; a live replica then runs the loss grace for them
    (``TUTTI_RUNTIME_PRESENCE_LEASE_SECONDS``, ADR 0042)."""

    command_sweep_interval_seconds: float = Field(default=2.0, gt=0)
    """With the shared bus: how often a replica holding runtime links dispatches commands of
    the Sessions they serve that were never dispatched (their wake-up was lost): the upper
    bound of a command's delay when the bus drops a wake-up
    (``TUTTI_COMMAND_SWEEP_INTERVAL_SECONDS``, SCALE-2, ADR 0042)."""
