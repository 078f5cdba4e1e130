"""Settings of the live log (``TUTTI_BUS`` and the stream's name and bounds; ADR 0036)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["LiveLogSettings"]


class LiveLogSettings(BaseSettings):
    """Which live log a process uses and how it is bounded; every field is ``TUTTI_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="TUTTI_", extra="ignore", frozen=True)

    bus: Literal["inprocess", "nats"] = "inprocess"
    """``inprocess`` (the single-node default, no server) or ``nats`` (JetStream, for several
    replicas) (``TUTTI_BUS``)."""

    nats_url: str = "nats://127.0.0.1:4222"
    """NATS server URL(s), comma-separated (``TUTTI_NATS_URL``); used with ``bus=nats``."""

    nats_connect_timeout_seconds: float = Field(default=10.0, gt=0)
    """How long the first connection to NATS (and the stream check) may take
    (``TUTTI_NATS_CONNECT_TIMEOUT_SECONDS``); past it the live log is unavailable and a
    service that needs it fails to start, so its orchestrator restarts it with backoff. Once
    connected, a later outage is retried without end."""

    live_log_stream: str = Field(default="TUTTI_LIVE", pattern=r"^[A-Za-z0-9_-]+$")
    """JetStream stream holding every workspace's subject (``TUTTI_LIVE_LOG_STREAM``)."""

    live_log_subject_prefix: str = Field(
        default="tutti.live", pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"
    )
    """Subject prefix; a workspace's subject is ``<prefix>.<workspace token>``
    (``TUTTI_LIVE_LOG_SUBJECT_PREFIX``)."""

    signal_subject_prefix: str = Field(
        default="tutti.signals", pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"
    )
    """Subject prefix of the fire-and-forget wake-up signals (core NATS, not the stream):
    ``<prefix>.<name>`` (``TUTTI_SIGNAL_SUBJECT_PREFIX``, ``livelog.signals``)."""

    live_log_max_msgs: int = Field(default=1_000_000, ge=1)
    """Items the log keeps across all workspaces; the oldest go first
    (``TUTTI_LIVE_LOG_MAX_MSGS``)."""

    live_log_max_bytes: int = Field(default=1 << 30, ge=1024)
    """Bytes the log keeps across all workspaces (``TUTTI_LIVE_LOG_MAX_BYTES``)."""

    live_log_max_age_seconds: float = Field(default=900.0, gt=0)
    """Age after which an item is evicted (``TUTTI_LIVE_LOG_MAX_AGE_SECONDS``): the window in
    which a subscriber can resume exactly."""

    live_log_duplicate_window_seconds: float = Field(default=120.0, gt=0)
    """How long a message id is remembered for deduplication
    (``TUTTI_LIVE_LOG_DUPLICATE_WINDOW_SECONDS``); at most the max age."""

    live_log_storage: Literal["file", "memory"] = "file"
    """JetStream storage (``TUTTI_LIVE_LOG_STORAGE``): ``file`` keeps the window across a
    server restart; with ``memory`` a restart recreates the stream (a new epoch)."""

    live_log_replicas: int = Field(default=1, ge=1, le=5)
    """JetStream stream replicas (``TUTTI_LIVE_LOG_REPLICAS``); 3 in a production cluster."""

    live_log_publish_timeout_seconds: float = Field(default=2.0, gt=0)
    """How long a publication waits for JetStream's acknowledgement
    (``TUTTI_LIVE_LOG_PUBLISH_TIMEOUT_SECONDS``)."""

    live_log_heartbeat_seconds: float = Field(default=1.0, gt=0)
    """Idle heartbeat of a subscription's consumer; two missed heartbeats re-establish it
    from its cursor (``TUTTI_LIVE_LOG_HEARTBEAT_SECONDS``)."""
