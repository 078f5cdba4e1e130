"""Settings of the maintenance service process (environment variables `TUTTI_*`, OPS-1)."""

from __future__ import annotations

from pydantic import Field

from grpcserver.settings import DEFAULT_PORTS, ServerSettings

MIB = 1024 * 1024


class Settings(ServerSettings):
    """Settings of the maintenance service; see :class:`~grpcserver.settings.ServerSettings`.

    Maintenance calls Host at ``TUTTI_HOST_ADDRESS`` with ``TUTTI_SERVICE_TOKEN`` (a
    deployment-wide ``service`` principal) and releases Session resources under
    ``TUTTI_RESOURCES_DIR``.
    """

    listen_address: str = f"127.0.0.1:{DEFAULT_PORTS['maintenance']}"
    """``host:port`` to listen on (``TUTTI_LISTEN_ADDRESS``)."""

    maintenance_first_check_delay_seconds: float = Field(default=600.0, ge=0)
    """First automatic check after readiness (MAINT-SCHED-1,
    ``TUTTI_MAINTENANCE_FIRST_CHECK_DELAY_SECONDS``)."""

    maintenance_check_interval_seconds: float = Field(default=1800.0, gt=0)
    """Spacing of later checks (``TUTTI_MAINTENANCE_CHECK_INTERVAL_SECONDS``)."""

    maintenance_completion_spacing_seconds: float = Field(default=86_400.0, gt=0)
    """A completed automatic run is recorded at most once per this interval; the next run is
    due this long after the durable marker (``TUTTI_MAINTENANCE_COMPLETION_SPACING_SECONDS``)."""

    maintenance_scheduler_enabled: bool = True
    """Run automatic maintenance at all (``TUTTI_MAINTENANCE_SCHEDULER_ENABLED``); manual
    purges work either way."""

    maintenance_batch_max_trees: int = Field(default=20, ge=1, le=1000)
    """Tombstone trees per automatic purge batch; the idle gate is checked between batches
    (MAINT-IDLE-1, ``TUTTI_MAINTENANCE_BATCH_MAX_TREES``)."""

    maintenance_batch_max_rows: int = Field(default=5_000, ge=1)
    """Canonical rows per automatic purge batch (the first tree may exceed it)
    (``TUTTI_MAINTENANCE_BATCH_MAX_ROWS``)."""

    maintenance_batch_max_bytes: int = Field(default=16 * MIB, ge=1)
    """Stored payload bytes per automatic purge batch (``TUTTI_MAINTENANCE_BATCH_MAX_BYTES``)."""

    maintenance_manual_batch_components: int = Field(default=10, ge=1, le=1000)
    """Components per manual purge batch (``TUTTI_MAINTENANCE_MANUAL_BATCH_COMPONENTS``)."""

    maintenance_cleanup_backoff_seconds: float = Field(default=60.0, gt=0)
    """Delay before the first retry of a failed resource cleanup; doubled per failure
    (MAINT-OUT-1, ``TUTTI_MAINTENANCE_CLEANUP_BACKOFF_SECONDS``)."""

    maintenance_cleanup_backoff_max_seconds: float = Field(default=6 * 3600.0, gt=0)
    """Longest delay between cleanup retries (``TUTTI_MAINTENANCE_CLEANUP_BACKOFF_MAX_SECONDS``)."""

    maintenance_agent_active_retry_seconds: float = Field(default=30.0, gt=0)
    """``RetryInfo`` of a manual purge refused with ``AGENT_ACTIVE``
    (``TUTTI_MAINTENANCE_AGENT_ACTIVE_RETRY_SECONDS``)."""

    maintenance_lease_poll_seconds: float = Field(default=10.0, gt=0)
    """On Postgres, the longest wait between a standby's attempts to take the worker lease
    and between the holder's probes of its lease connection; a dead holder is replaced
    within it (SCALE-5, ``TUTTI_MAINTENANCE_LEASE_POLL_SECONDS``)."""

    maintenance_lease_probe_timeout_seconds: float = Field(default=5.0, gt=0)
    """A lease attempt or probe slower than this counts as failed: the holder steps down
    (``TUTTI_MAINTENANCE_LEASE_PROBE_TIMEOUT_SECONDS``)."""

    maintenance_run_claim_seconds: float = Field(default=600.0, gt=0)
    """Life of the automatic run's claim in the store, renewed before every batch; a claim
    left by a killed worker frees the day's run after it
    (``TUTTI_MAINTENANCE_RUN_CLAIM_SECONDS``)."""

    maintenance_host_timeout_seconds: float = Field(default=60.0, gt=0)
    """Deadline of each call to Host (``TUTTI_MAINTENANCE_HOST_TIMEOUT_SECONDS``)."""

    compaction_max_size_bytes: int = Field(default=1024 * MIB, ge=0)
    """A manual ``compact`` runs only when the database is at most this large (MAINT-VAC-1,
    ``TUTTI_COMPACTION_MAX_SIZE_BYTES``)."""

    compaction_min_reclaimable_fraction: float = Field(default=0.25, ge=0, le=1)
    """...and at least this fraction of its pages is reclaimable
    (``TUTTI_COMPACTION_MIN_RECLAIMABLE_FRACTION``)."""
