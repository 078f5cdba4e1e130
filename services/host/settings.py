"""Settings of the host service process (environment variables `TUTTI_*`, OPS-1)."""

from __future__ import annotations

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
    """How long Host waits for a runtime to acknowledge a command it awaits, for example
    live settings (``TUTTI_RUNTIME_COMMAND_TIMEOUT_SECONDS``)."""

    activity_event_retention_seconds: float = 7 * 24 * 3600.0
    """The activity event log keeps an event at least this long (default 7 days) unless the
    log holds more than ``activity_event_max_rows`` rows (HOST-OBS-1,
    ``TUTTI_ACTIVITY_EVENT_RETENTION_SECONDS``). Older cursors fail ``OUT_OF_RANGE``."""

    activity_event_max_rows: int = 1_000_000
    """Size bound of the activity event log: only the newest this many rows are kept
    (``TUTTI_ACTIVITY_EVENT_MAX_ROWS``)."""

    activity_event_prune_interval_seconds: float = 300.0
    """How often Host applies the two bounds above
    (``TUTTI_ACTIVITY_EVENT_PRUNE_INTERVAL_SECONDS``)."""

    watch_queue_max_items: int = 10_000
    """Live items (deltas and commit batches) buffered per ``WatchActivity`` consumer; a
    consumer that falls further behind gets ``RESOURCE_EXHAUSTED``
    (``WATCH_CONSUMER_TOO_SLOW``) and resumes from its cursor
    (``TUTTI_WATCH_QUEUE_MAX_ITEMS``)."""
