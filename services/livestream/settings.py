"""Settings of the livestream service process (environment variables `TUTTI_*`, OPS-1)."""

from __future__ import annotations

from pydantic import Field

from grpcserver.settings import DEFAULT_PORTS, ServerSettings

MIB = 1024 * 1024


class Settings(ServerSettings):
    """Settings of the livestream service; see :class:`~grpcserver.settings.ServerSettings`.

    The ``live_*`` bounds are announced to every device in ``StreamReady.limits``.
    """

    listen_address: str = f"127.0.0.1:{DEFAULT_PORTS['livestream']}"
    """``host:port`` to listen on (``TUTTI_LISTEN_ADDRESS``)."""

    live_safe_delivery_bytes: int = Field(default=1 * MIB, ge=4096)
    """Largest encoded delivery (LIVE-FRAME-1, ``TUTTI_LIVE_SAFE_DELIVERY_BYTES``)."""

    live_max_frame_bytes: int = Field(default=2 * MIB, ge=8192)
    """Encoded-frame ceiling; at least twice the safe delivery size so one delivery
    always fits with its framing (``TUTTI_LIVE_MAX_FRAME_BYTES``)."""

    live_replay_budget_bytes: int = Field(default=8 * MIB, ge=8192)
    """Replay bytes kept per publisher (LIVE-RESUME-1, ``TUTTI_LIVE_REPLAY_BUDGET_BYTES``)."""

    live_replay_memory_bytes: int = Field(default=512 * MIB, ge=MIB)
    """Replay bytes kept across every publisher of the process; over it the largest buffer
    gives up its oldest deliveries (LIVE-FLOW-1, ``TUTTI_LIVE_REPLAY_MEMORY_BYTES``)."""

    live_link_queue_bytes: int = Field(default=4 * MIB, ge=8192)
    """How far (in delivery bytes) a call may fall behind its publisher before it is
    closed ``RESOURCE_EXHAUSTED`` ``SLOW_CONSUMER`` (``TUTTI_LIVE_LINK_QUEUE_BYTES``)."""

    live_batch_linger_seconds: float = Field(default=0.0, ge=0)
    """Under sustained traffic a call sends at most one frame per this interval, so more
    deliveries share a frame at the cost of up to this much latency; an idle call sends at
    once. Off by default: deliveries mapped together already share frames
    (``TUTTI_LIVE_BATCH_LINGER_SECONDS``)."""

    live_heartbeat_interval_seconds: float = Field(default=15.0, gt=0)
    """Application heartbeat interval in both directions
    (``TUTTI_LIVE_HEARTBEAT_INTERVAL_SECONDS``)."""

    live_publisher_retention_seconds: float = Field(default=600.0, ge=0)
    """How long a publisher outlives its last call (LIVE-PUB-1, ADR 0007,
    ``TUTTI_LIVE_PUBLISHER_RETENTION_SECONDS``)."""

    live_max_publishers_per_principal: int = Field(default=16, ge=1)
    """Retained publishers per principal (``TUTTI_LIVE_MAX_PUBLISHERS_PER_PRINCIPAL``)."""

    live_max_publishers: int = Field(default=10_000, ge=1)
    """Retained publishers per process (``TUTTI_LIVE_MAX_PUBLISHERS``)."""

    live_settled_turn_fence: int = Field(default=1024, ge=1)
    """Settled Turn ids remembered per workspace to fence late deltas (LIVE-FENCE-1,
    ``TUTTI_LIVE_SETTLED_TURN_FENCE``)."""

    live_upstream_retry_seconds: float = Field(default=1.0, gt=0)
    """First delay before resubscribing to Host after the feed dropped; doubles up to 30 s
    (LIVE-UP-1, ``TUTTI_LIVE_UPSTREAM_RETRY_SECONDS``)."""

    live_handover_timeout_seconds: float = Field(default=5.0, gt=0)
    """How long a replica waits for each message of another replica's answer to a
    publisher hand-over before the device's resume is rejected (``TUTTI_BUS=nats`` only,
    SCALE-4, ``TUTTI_LIVE_HANDOVER_TIMEOUT_SECONDS``)."""
