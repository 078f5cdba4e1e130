"""Which replica is the maintenance worker (SCALE-5, ADR 0035).

Every run — automatic, manual, and the cleanup-retry pass — happens only on the replica that
holds the worker lease. Two implementations behind one interface:

* :class:`SingleNodeLease` (SQLite): one process owns the database file, so the lease is
  always held and behaviour is exactly the single-replica one.
* :class:`PostgresLease`: a session-level ``pg_try_advisory_lock`` on
  :data:`WORKER_LEASE_KEY`, taken on a dedicated connection (its own engine without a pool, so
  a lock-holding session is never handed to other code) and kept for as long as this replica
  is the worker. When the holder dies its connection closes and Postgres drops the lock; a
  standby takes it at its next attempt, which comes at most
  ``TUTTI_MAINTENANCE_LEASE_POLL_SECONDS`` later (jittered downwards so standbys do not poll in
  step). The holder probes its connection at the same interval and before every purge batch
  (:meth:`WorkerLease.confirm`); a probe that fails or times out gives the lease up, so a run
  stops before its next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from typing import Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from services.maintenance.metrics import MaintenanceMetrics
from store.engine import async_url

__all__ = [
    "LEASE_POLL_JITTER",
    "WORKER_LEASE_KEY",
    "PostgresLease",
    "SingleNodeLease",
    "WorkerLease",
    "lease_application_name",
]

_log = logging.getLogger(__name__)

WORKER_LEASE_KEY = int.from_bytes(b"tuttmant", "big")
"""The advisory-lock key of the maintenance worker lease: the ASCII bytes ``tuttmant`` as one
signed 64-bit key, 8391741524074917492. In ``pg_locks`` it shows as ``classid`` 1953854580
(:data:`WORKER_LEASE_CLASSID`), ``objid`` 1835101812 (:data:`WORKER_LEASE_OBJID`), ``objsubid`` 1.
Advisory locks are per database, so deployments on separate databases never contend."""

WORKER_LEASE_CLASSID = WORKER_LEASE_KEY >> 32
"""High 32 bits of the key (``pg_locks.classid``)."""

WORKER_LEASE_OBJID = WORKER_LEASE_KEY & 0xFFFF_FFFF
"""Low 32 bits of the key (``pg_locks.objid``)."""

LEASE_POLL_JITTER = 0.2
"""Each wait between attempts is the poll interval shortened by up to this fraction, so the
interval stays an upper bound and standbys started together spread their attempts."""


def lease_application_name() -> str:
    """``application_name`` of this process's lease connection: names the process id."""
    return f"tutti-maintenance-lease-{os.getpid()}"


class WorkerLease(Protocol):
    """Whether this replica is the maintenance worker."""

    @property
    def held(self) -> bool:
        """Whether this replica held the lease at its last attempt or probe."""
        ...

    @property
    def retry_after_seconds(self) -> float:
        """How long a caller refused on a standby should wait (``RetryInfo``)."""
        ...

    async def start(self) -> None:
        """First attempt (before readiness) and the polling loop."""
        ...

    async def confirm(self) -> bool:
        """Probe now: ``True`` only if this replica still holds the lease."""
        ...

    async def release(self) -> None:
        """Give the lease up and stop polling (drain); idempotent."""
        ...


class SingleNodeLease:
    """The lease of a single-node store (SQLite): always held by the one process."""

    @property
    def held(self) -> bool:
        """Always ``True``."""
        return True

    @property
    def retry_after_seconds(self) -> float:
        """Never used: a single node is never a standby."""
        return 0.0

    async def start(self) -> None:
        """Nothing to take."""

    async def confirm(self) -> bool:
        """Always ``True``."""
        return True

    async def release(self) -> None:
        """Nothing to give up."""


class PostgresLease:
    """A session-level advisory lock held on a dedicated Postgres connection."""

    def __init__(
        self,
        database_url: str,
        *,
        poll_seconds: float,
        probe_timeout_seconds: float,
        metrics: MaintenanceMetrics,
        key: int = WORKER_LEASE_KEY,
    ) -> None:
        self._url = database_url
        self._poll_seconds = poll_seconds
        self._probe_timeout = probe_timeout_seconds
        self._metrics = metrics
        self._key = key
        self._engine: AsyncEngine | None = None
        self._connection: AsyncConnection | None = None
        # One statement at a time on the lease connection (the loop's probe and a run's
        # confirm may coincide).
        self._use = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._released = False
        self._standby_logged = False
        self._random = random.Random()

    @property
    def held(self) -> bool:
        """Whether the lease connection holds the lock (as of the last attempt or probe)."""
        return self._connection is not None

    @property
    def retry_after_seconds(self) -> float:
        """One poll interval: by then a dead holder has been replaced."""
        return self._poll_seconds

    async def start(self) -> None:
        """Try once now (so a lone replica is the worker when it turns ready), then poll."""
        self._engine = create_async_engine(
            async_url(self._url),
            poolclass=NullPool,
            isolation_level="AUTOCOMMIT",
            connect_args={
                # A hung server must not hold an attempt longer than a probe may take.
                "connect_timeout": max(1, int(self._probe_timeout)),
                # Operators (and tests) find the holder's process in pg_stat_activity.
                "application_name": lease_application_name(),
            },
        )
        async with self._use:
            await self._attempt()
        self._task = asyncio.create_task(self._loop(), name="maintenance-worker-lease")

    async def confirm(self) -> bool:
        """Probe the lease connection now; a failed or slow probe gives the lease up."""
        async with self._use:
            if self._connection is None:
                return False
            return await self._probe()

    async def release(self) -> None:
        """Stop polling, unlock and close the connection (the lock dies with it anyway)."""
        self._released = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        async with self._use:
            if self._connection is not None:
                connection, self._connection = self._connection, None
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(
                        connection.execute(
                            text("SELECT pg_advisory_unlock(:key)"), {"key": self._key}
                        ),
                        self._probe_timeout,
                    )
                await self._close(connection)
                self._metrics.lease_released += 1
                _log.info("maintenance worker lease released", extra={"lease_key": self._key})
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    def _delay(self) -> float:
        return self._poll_seconds * (1.0 - LEASE_POLL_JITTER * self._random.random())

    async def _loop(self) -> None:
        while not self._released:
            await asyncio.sleep(self._delay())
            async with self._use:
                if self._connection is not None:
                    await self._probe()
                else:
                    await self._attempt()

    async def _attempt(self) -> None:
        """One ``pg_try_advisory_lock`` on a fresh connection; kept only when it won."""
        assert self._engine is not None
        connection: AsyncConnection | None = None
        try:
            connection = await asyncio.wait_for(self._engine.connect(), self._probe_timeout)
            won = (
                await asyncio.wait_for(
                    connection.execute(
                        text("SELECT pg_try_advisory_lock(:key)"), {"key": self._key}
                    ),
                    self._probe_timeout,
                )
            ).scalar_one()
        except Exception as error:  # noqa: BLE001 - the store is down: stay standby, retry
            if connection is not None:
                await self._close(connection)
            _log.warning(
                "maintenance worker lease attempt failed; standby",
                extra={"lease_key": self._key, "error": type(error).__name__},
            )
            return
        if not won:
            await self._close(connection)
            # Logged once per standby period; every attempt would flood the log.
            level = logging.DEBUG if self._standby_logged else logging.INFO
            _log.log(
                level,
                "maintenance standby: another replica holds the worker lease",
                extra={"lease_key": self._key, "poll_seconds": self._poll_seconds},
            )
            self._standby_logged = True
            return
        self._connection = connection
        self._standby_logged = False
        self._metrics.lease_acquired += 1
        _log.info("maintenance worker lease acquired", extra={"lease_key": self._key})

    async def _probe(self) -> bool:
        """One round trip on the lease connection; on failure the lease is gone."""
        assert self._connection is not None
        try:
            await asyncio.wait_for(self._connection.execute(text("SELECT 1")), self._probe_timeout)
        except Exception as error:  # noqa: BLE001 - any failure means the session may be gone
            connection, self._connection = self._connection, None
            await self._close(connection)
            self._metrics.lease_lost += 1
            _log.warning(
                "maintenance worker lease lost",
                extra={"lease_key": self._key, "error": type(error).__name__},
            )
            return False
        return True

    async def _close(self, connection: AsyncConnection) -> None:
        # Invalidate rather than close politely: a broken or hung connection must not wait,
        # and closing the socket is what ends the server session and its lock.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.invalidate(), self._probe_timeout)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.close(), self._probe_timeout)
