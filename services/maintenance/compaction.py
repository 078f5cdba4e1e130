"""Database compaction of the shared store after a manual sweep (MAINT-VAC-1, MAINT-STAT-1).

This module owns two database-level facts and nothing of Host's tables: how large the store
is and how much of it compaction could give back (:meth:`Compactor.measure`, reported by
``GetMaintenanceStatus``), and the compaction itself (:meth:`Compactor.compact`), which only an
explicit manual sweep with ``compact`` requests, after its final idle batch. The caller
decides *whether* compaction was requested and the idle gate is open; this module decides
whether the database qualifies (small enough, at least a quarter reclaimable) and runs it.

* **SQLite**: size is ``page_count * page_size`` and the reclaimable fraction is
  ``freelist_count / page_count``. Compaction is ``VACUUM``, run outside any transaction on
  a raw driver connection while holding this process's write slot
  (``store.engine.sqlite_write_slot``), then a best-effort ``wal_checkpoint(TRUNCATE)`` so
  the space actually leaves the file system.
* **Postgres**: size is ``pg_database_size(current_database())``; the reclaimable fraction is
  unknown (``None``) and compaction is always ``SKIPPED_UNSUPPORTED_BACKEND`` (ADR 0020).

A failed compaction is a result (``FAILED`` with a short error), never an exception: the
purge it follows has already committed and stands.
"""

from __future__ import annotations

import enum
import logging
import sqlite3
from dataclasses import dataclass
from typing import Final, Literal

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from domainerrors import DomainError
from store.contention import retryable_error
from store.database import Database
from store.engine import SqliteWriteSlotTimeout, backend_name, sqlite_write_slot

__all__ = ["CompactionOutcome", "CompactionResult", "Compactor", "DatabaseMeasurement"]

_log = logging.getLogger(__name__)

_MAX_ERROR_CHARS: Final = 200


@dataclass(frozen=True)
class DatabaseMeasurement:
    """The store's size and what compaction could reclaim, as measured now.

    Attributes:
        backend: the store backend.
        size_bytes: the database size (SQLite: ``page_count * page_size``; Postgres:
            ``pg_database_size``).
        reclaimable_fraction: free pages over all pages (0..1); ``None`` when the backend
            cannot tell (Postgres, ADR 0020).
        page_count: SQLite pages in the database; ``None`` on Postgres.
        freelist_count: SQLite pages on the freelist; ``None`` on Postgres.
    """

    backend: Literal["sqlite", "postgres"]
    size_bytes: int
    reclaimable_fraction: float | None
    page_count: int | None = None
    freelist_count: int | None = None


class CompactionOutcome(enum.Enum):
    """What happened to a compaction request; the proto enum's names without the prefix.

    ``NOT_REQUESTED``, ``SKIPPED_RUN_INCOMPLETE`` and ``SKIPPED_AGENT_ACTIVE`` are decided by
    the worker before it calls :meth:`Compactor.compact`, so they are not members here.
    """

    COMPLETED = "completed"
    SKIPPED_DATABASE_TOO_LARGE = "skipped_database_too_large"
    SKIPPED_TOO_LITTLE_RECLAIMABLE = "skipped_too_little_reclaimable"
    SKIPPED_UNSUPPORTED_BACKEND = "skipped_unsupported_backend"
    FAILED = "failed"


@dataclass(frozen=True)
class CompactionResult:
    """The compaction step of a run (the proto's ``CompactionReport``).

    Attributes:
        outcome: what happened.
        size_before_bytes: the size that decided the request; ``None`` when not measured.
        size_after_bytes: the size after a completed compaction; ``None`` otherwise.
        reclaimable_fraction_before: the fraction that decided the request, when known.
        error: a short, sanitized description when ``outcome`` is ``FAILED`` (no SQL, no
            paths, no URL).
    """

    outcome: CompactionOutcome
    size_before_bytes: int | None
    size_after_bytes: int | None
    reclaimable_fraction_before: float | None
    error: str | None = None


class Compactor:
    """Measures the store and compacts it when it qualifies (MAINT-VAC-1).

    Args:
        database: the started store handle of the maintenance process.
        max_size_bytes: the database is "small" when its size is at most this.
        min_reclaimable_fraction: compaction needs at least this fraction of pages free.
    """

    def __init__(
        self, database: Database, *, max_size_bytes: int, min_reclaimable_fraction: float
    ) -> None:
        self._database = database
        self.max_size_bytes = max_size_bytes
        self.min_reclaimable_fraction = min_reclaimable_fraction
        self._backend: Literal["sqlite", "postgres"] = (
            "sqlite" if backend_name(database.url) == "sqlite" else "postgres"
        )

    async def measure(self) -> DatabaseMeasurement:
        """Measure the database size and reclaimable fraction; changes nothing.

        Raises:
            domainerrors.Unavailable: ``STORE_BUSY``, the store did not answer in time.
            Exception: any other store failure, unchanged.
        """
        try:
            async with self._database.engine.connect() as connection:
                if self._backend == "sqlite":
                    return await _measure_sqlite(connection)
                return await _measure_postgres(connection)
        except Exception as exc:
            mapped = retryable_error(exc)
            if mapped is None:
                raise
            raise mapped from exc

    def eligible(self, measurement: DatabaseMeasurement) -> CompactionOutcome | None:
        """Decide whether ``measurement`` qualifies for compaction.

        Returns:
            ``None`` when compaction would run; otherwise the outcome that skips it.
        """
        if measurement.backend != "sqlite":
            return CompactionOutcome.SKIPPED_UNSUPPORTED_BACKEND
        if measurement.size_bytes > self.max_size_bytes:
            return CompactionOutcome.SKIPPED_DATABASE_TOO_LARGE
        fraction = measurement.reclaimable_fraction
        if fraction is None or fraction < self.min_reclaimable_fraction:
            return CompactionOutcome.SKIPPED_TOO_LITTLE_RECLAIMABLE
        return None

    async def compact(self) -> CompactionResult:
        """Measure, decide, run ``VACUUM`` when eligible and measure again.

        Call it with no write transaction of this process open on the same task: it waits
        for this process's SQLite write slot, which such a transaction would hold.

        Returns:
            The result; a store failure (busy beyond the busy timeout, a full write queue,
            an unreachable database) is ``FAILED`` with a short error, never raised.
        """
        try:
            before = await self.measure()
        except Exception as exc:  # noqa: BLE001 - a failed compaction never fails the run
            _log.warning("compaction: measuring the database failed: %s", _short_error(exc))
            return CompactionResult(CompactionOutcome.FAILED, None, None, None, _short_error(exc))
        skip = self.eligible(before)
        if skip is not None:
            _log.info(
                "compaction skipped (%s): size %d bytes, reclaimable %s",
                skip.name,
                before.size_bytes,
                before.reclaimable_fraction,
            )
            return CompactionResult(skip, before.size_bytes, None, before.reclaimable_fraction)
        try:
            await self._vacuum_sqlite()
        except Exception as exc:  # noqa: BLE001 - a failed compaction never fails the run
            error = _short_error(exc)
            _log.warning("compaction: VACUUM failed: %s", error)
            return CompactionResult(
                CompactionOutcome.FAILED,
                before.size_bytes,
                None,
                before.reclaimable_fraction,
                error,
            )
        try:
            after: int | None = (await self.measure()).size_bytes
        except Exception as exc:  # noqa: BLE001 - VACUUM committed; only the report lacks a size
            _log.warning("compaction: measuring after VACUUM failed: %s", _short_error(exc))
            after = None
        _log.info("compaction completed: %d -> %s bytes", before.size_bytes, after)
        return CompactionResult(
            CompactionOutcome.COMPLETED, before.size_bytes, after, before.reclaimable_fraction
        )

    async def _vacuum_sqlite(self) -> None:
        engine = self._database.engine
        # Holding this process's write slot keeps our own writers out while VACUUM runs, so it
        # never waits on a pooled connection of this very process (whose writer would in turn
        # wait in the queue behind nothing that can finish). Other processes (Host) still meet
        # SQLite's busy timeout, and a write lock they hold past it fails VACUUM with
        # SQLITE_BUSY. Readers never block VACUUM in WAL mode.
        async with sqlite_write_slot(engine), engine.connect() as connection:
            # The raw driver connection, because VACUUM cannot run in a transaction: the
            # store's "begin" listener issues BEGIN on every SQLAlchemy transaction, even
            # under AUTOCOMMIT isolation. The driver's own implicit BEGIN is switched off
            # (isolation_level=None on connect), and a freshly checked-out connection has no
            # transaction or statement open, so the statement runs in autocommit.
            raw = await connection.get_raw_connection()
            driver = raw.driver_connection
            if driver is None:  # pragma: no cover - the pool hands out live connections
                raise RuntimeError("no driver connection")
            cursor = await driver.execute("VACUUM")
            await cursor.close()
            # In WAL mode VACUUM writes the compacted database into the WAL; the main file
            # shrinks only when a checkpoint copies it back, and the WAL file keeps its size
            # until truncated. TRUNCATE does both when no other connection holds an older
            # snapshot; otherwise a later checkpoint finishes the job, so this is best effort.
            try:
                cursor = await driver.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                row = await cursor.fetchone()
                await cursor.close()
            except Exception as exc:  # noqa: BLE001 - VACUUM committed; a checkpoint is optional
                _log.info("compaction: WAL checkpoint failed: %s", _short_error(exc))
                return
            if row is not None and row[0]:
                _log.info("compaction: WAL checkpoint incomplete (another connection is busy)")


async def _measure_sqlite(connection: AsyncConnection) -> DatabaseMeasurement:
    # One read transaction, so the three pragmas describe the same snapshot (WAL included).
    page_size = int((await connection.exec_driver_sql("PRAGMA page_size")).scalar_one())
    page_count = int((await connection.exec_driver_sql("PRAGMA page_count")).scalar_one())
    freelist = int((await connection.exec_driver_sql("PRAGMA freelist_count")).scalar_one())
    return DatabaseMeasurement(
        backend="sqlite",
        size_bytes=page_count * page_size,
        # An empty database has nothing to reclaim (and no pages to divide by).
        reclaimable_fraction=freelist / page_count if page_count else 0.0,
        page_count=page_count,
        freelist_count=freelist,
    )


async def _measure_postgres(connection: AsyncConnection) -> DatabaseMeasurement:
    size = (
        await connection.exec_driver_sql("SELECT pg_database_size(current_database())")
    ).scalar_one()
    # No reclaimable fraction: without pgstattuple Postgres cannot say how much VACUUM FULL
    # would return to the operating system (n_dead_tup counts tuples plain VACUUM makes
    # reusable in place), and this deployment never runs VACUUM FULL anyway (ADR 0020).
    return DatabaseMeasurement(backend="postgres", size_bytes=int(size), reclaimable_fraction=None)


def _short_error(exc: BaseException) -> str:
    """A one-line description of a store failure without SQL, parameters or paths."""
    if isinstance(exc, SqliteWriteSlotTimeout | DomainError):
        # Written by the store for callers (the write queue, STORE_BUSY): safe to show.
        text = str(exc)
    else:
        orig = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
        if isinstance(orig, sqlite3.Error):
            # SQLite's messages name the condition ("database is locked"), never a path.
            name = getattr(orig, "sqlite_errorname", None)
            text = f"{name}: {orig}" if name else str(orig)
        elif sqlstate := getattr(orig, "sqlstate", None):
            # A Postgres message may quote values or identifiers; the state code is enough.
            text = f"{type(orig).__name__} (sqlstate {sqlstate})"
        else:
            text = type(orig).__name__
    lines = text.splitlines()
    return (lines[0] if lines else type(exc).__name__)[:_MAX_ERROR_CHARS]
