"""Database measurement and compaction of the store after a manual sweep (MAINT-VAC-1/STAT-1).

Free pages are made by filling ``maintenance_preferences`` (a table maintenance owns) with
page-sized values and deleting them again. SQLite-only scenarios pin the ``backend`` fixture
to ``sqlite``; the Postgres scenario pins it to ``postgres``. "Host" is a plain ``sqlite3``
connection in another thread holding a write transaction on the same file.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import pytest
from sqlalchemy import delete, insert
from sqlalchemy.engine import make_url

from services.maintenance.compaction import (
    CompactionOutcome,
    CompactionResult,
    Compactor,
    DatabaseMeasurement,
)
from store import database as store_database
from store.database import Database
from store.engine import create_async_engine_for, create_sync_engine_for
from store.models import MaintenancePreference
from store.transactions import write_connection

T = TypeVar("T")

MIB = 1024 * 1024
SHORT_BUSY_TIMEOUT_MS = 100
PAGE_SIZED_VALUE = "v" * 3000  # one row per 4 KiB page, so deleting rows frees whole pages

sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
postgres_only = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


def _fill(url: str, rows: int, *, delete_rows: int) -> None:
    """Insert ``rows`` page-sized preferences, then delete the first ``delete_rows``."""
    engine = create_sync_engine_for(url)
    try:
        with engine.begin() as connection:
            connection.execute(
                insert(MaintenancePreference),
                [
                    {"key": f"fill-{i:05d}", "value": PAGE_SIZED_VALUE, "updated_at_unix_ms": 1}
                    for i in range(rows)
                ],
            )
        with engine.begin() as connection:
            connection.execute(
                delete(MaintenancePreference).where(
                    MaintenancePreference.key < f"fill-{delete_rows:05d}"
                )
            )
    finally:
        engine.dispose()


def _sqlite_pragmas(url: str) -> tuple[int, int, int]:
    """(page_size, page_count, freelist_count) read by a connection of its own."""
    path = make_url(url).database
    assert path is not None
    connection = sqlite3.connect(path)
    try:
        values = [
            int(connection.execute(f"PRAGMA {name}").fetchone()[0])
            for name in ("page_size", "page_count", "freelist_count")
        ]
    finally:
        connection.close()
    return values[0], values[1], values[2]


def _with_compactor(
    url: str,
    scenario: Callable[[Compactor, Database], Awaitable[T]],
    *,
    max_size_bytes: int = 64 * MIB,
    min_reclaimable_fraction: float = 0.25,
) -> T:
    async def main() -> T:
        database = Database(url)
        await database.start()
        try:
            compactor = Compactor(
                database,
                max_size_bytes=max_size_bytes,
                min_reclaimable_fraction=min_reclaimable_fraction,
            )
            async with asyncio.timeout(30):
                return await scenario(compactor, database)
        finally:
            await database.stop()

    return asyncio.run(main())


async def _compact(compactor: Compactor, _database: Database) -> CompactionResult:
    return await compactor.compact()


async def _measure(compactor: Compactor, _database: Database) -> DatabaseMeasurement:
    return await compactor.measure()


@pytest.fixture
def short_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Databases opened in this test wait only 100 ms for another connection's lock.

    ``Database`` has no busy-timeout parameter, so its engine factory is wrapped.
    """
    monkeypatch.setattr(
        store_database,
        "create_async_engine_for",
        functools.partial(create_async_engine_for, sqlite_busy_timeout_ms=SHORT_BUSY_TIMEOUT_MS),
    )


@contextmanager
def _host_holds_write_lock(url: str) -> Iterator[None]:
    """Another connection (Host) holds a write transaction on the file until the block ends."""
    path = make_url(url).database
    assert path is not None
    holding = threading.Event()
    release = threading.Event()
    failures: list[BaseException] = []

    def host() -> None:
        try:
            connection = sqlite3.connect(path, isolation_level=None)
            try:
                connection.execute("BEGIN IMMEDIATE")
                connection.execute(
                    "INSERT INTO maintenance_preferences (key, value, updated_at_unix_ms) "
                    "VALUES ('host-write', 'x', 1)"
                )
                holding.set()
                release.wait(timeout=30)
                connection.execute("ROLLBACK")
            finally:
                connection.close()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            failures.append(exc)
            holding.set()

    thread = threading.Thread(target=host, name="host-writer")
    thread.start()
    try:
        assert holding.wait(timeout=10)
        assert not failures, failures
        yield
    finally:
        release.set()
        thread.join(timeout=10)
    assert not failures, failures


# --- MAINT-STAT-1: measurement ---------------------------------------------------------------


@pytest.mark.spec("MAINT-STAT-1")
def test_measure_reports_the_size_and_reclaimable_fraction(
    migrated_db_url: str, backend: str
) -> None:
    """SQLite: page_count * page_size and freelist / page_count. Postgres: size, fraction unset."""
    if backend == "sqlite":
        _fill(migrated_db_url, 200, delete_rows=120)
    measured = _with_compactor(migrated_db_url, _measure)
    if backend == "sqlite":
        page_size, page_count, freelist = _sqlite_pragmas(migrated_db_url)
        assert measured == DatabaseMeasurement(
            backend="sqlite",
            size_bytes=page_size * page_count,
            reclaimable_fraction=freelist / page_count,
            page_count=page_count,
            freelist_count=freelist,
        )
        assert measured.reclaimable_fraction is not None
        assert 0.25 < measured.reclaimable_fraction < 1
    else:
        assert measured.backend == "postgres"
        assert measured.size_bytes > 0
        assert measured.reclaimable_fraction is None
        assert measured.page_count is None
        assert measured.freelist_count is None


@sqlite_only
@pytest.mark.spec("MAINT-STAT-1")
def test_measure_changes_nothing(migrated_db_url: str) -> None:
    _fill(migrated_db_url, 200, delete_rows=200)
    before = _sqlite_pragmas(migrated_db_url)
    first = _with_compactor(migrated_db_url, _measure)
    second = _with_compactor(migrated_db_url, _measure)
    assert first == second
    assert _sqlite_pragmas(migrated_db_url) == before


@pytest.mark.spec("MAINT-VAC-1", "MAINT-STAT-1")
def test_eligibility_thresholds() -> None:
    """At most the size threshold, at least the fraction; Postgres never; empty is 0."""
    unstarted = Database("sqlite:///unused.sqlite3")  # eligible() never touches the store
    compactor = Compactor(unstarted, max_size_bytes=1000, min_reclaimable_fraction=0.25)

    def sqlite(size: int, fraction: float) -> DatabaseMeasurement:
        return DatabaseMeasurement("sqlite", size, fraction)

    assert compactor.eligible(sqlite(1000, 0.25)) is None
    assert compactor.eligible(sqlite(1001, 0.9)) is CompactionOutcome.SKIPPED_DATABASE_TOO_LARGE
    assert (
        compactor.eligible(sqlite(1000, 0.2499)) is CompactionOutcome.SKIPPED_TOO_LITTLE_RECLAIMABLE
    )
    assert compactor.eligible(sqlite(0, 0.0)) is CompactionOutcome.SKIPPED_TOO_LITTLE_RECLAIMABLE
    assert (
        compactor.eligible(DatabaseMeasurement("postgres", 10, None))
        is CompactionOutcome.SKIPPED_UNSUPPORTED_BACKEND
    )


# --- MAINT-VAC-1: compaction on SQLite -------------------------------------------------------


@sqlite_only
@pytest.mark.spec("MAINT-VAC-1")
def test_a_small_database_with_a_quarter_free_is_vacuumed(migrated_db_url: str) -> None:
    _fill(migrated_db_url, 300, delete_rows=300)
    page_size, pages_before, free_before = _sqlite_pragmas(migrated_db_url)
    assert free_before / pages_before >= 0.25

    result = _with_compactor(migrated_db_url, _compact)

    page_size, pages_after, free_after = _sqlite_pragmas(migrated_db_url)
    assert result.outcome is CompactionOutcome.COMPLETED
    assert result.error is None
    assert result.size_before_bytes == pages_before * page_size
    assert result.reclaimable_fraction_before == free_before / pages_before
    assert result.size_after_bytes == pages_after * page_size
    assert result.size_after_bytes < result.size_before_bytes
    assert free_after < free_before
    assert free_after == 0


@sqlite_only
@pytest.mark.spec("MAINT-VAC-1")
def test_a_database_with_little_free_space_is_left_unchanged(migrated_db_url: str) -> None:
    _fill(migrated_db_url, 300, delete_rows=10)
    pragmas_before = _sqlite_pragmas(migrated_db_url)
    _, pages_before, free_before = pragmas_before
    assert 0 < free_before / pages_before < 0.25

    result = _with_compactor(migrated_db_url, _compact)

    assert result.outcome is CompactionOutcome.SKIPPED_TOO_LITTLE_RECLAIMABLE
    assert result.size_after_bytes is None
    assert result.reclaimable_fraction_before == free_before / pages_before
    assert _sqlite_pragmas(migrated_db_url) == pragmas_before


@sqlite_only
@pytest.mark.spec("MAINT-VAC-1")
def test_a_database_over_the_size_threshold_is_not_compacted(migrated_db_url: str) -> None:
    _fill(migrated_db_url, 300, delete_rows=300)
    pragmas_before = _sqlite_pragmas(migrated_db_url)
    page_size, pages_before, free_before = pragmas_before
    assert free_before / pages_before > 0.5

    result = _with_compactor(migrated_db_url, _compact, max_size_bytes=page_size * pages_before - 1)

    assert result.outcome is CompactionOutcome.SKIPPED_DATABASE_TOO_LARGE
    assert result.size_before_bytes == page_size * pages_before
    assert result.size_after_bytes is None
    assert _sqlite_pragmas(migrated_db_url) == pragmas_before


@sqlite_only
@pytest.mark.spec("MAINT-VAC-1")
@pytest.mark.usefixtures("short_busy_timeout")
def test_vacuum_blocked_by_another_process_past_the_busy_timeout_fails_without_raising(
    migrated_db_url: str,
) -> None:
    """Host's write lock outlasts the busy timeout: FAILED, nothing changed, slot released."""
    _fill(migrated_db_url, 300, delete_rows=300)
    pragmas_before = _sqlite_pragmas(migrated_db_url)

    async def scenario(
        compactor: Compactor, database: Database
    ) -> tuple[CompactionResult, DatabaseMeasurement, CompactionResult]:
        with _host_holds_write_lock(migrated_db_url):
            blocked = await compactor.compact()
        unchanged = await compactor.measure()
        # The failure released this process's write slot: writers and a retry go through.
        async with write_connection(database.engine) as connection:
            await connection.execute(
                insert(MaintenancePreference).values(key="k", value="v", updated_at_unix_ms=1)
            )
        return blocked, unchanged, await compactor.compact()

    blocked, unchanged, retried = _with_compactor(migrated_db_url, scenario)

    assert blocked.outcome is CompactionOutcome.FAILED
    assert blocked.error is not None
    assert "locked" in blocked.error
    assert len(blocked.error) <= 200
    assert blocked.size_before_bytes is not None
    assert blocked.size_after_bytes is None
    _, pages_before, free_before = pragmas_before
    assert (unchanged.page_count, unchanged.freelist_count) == (pages_before, free_before)
    assert retried.outcome is CompactionOutcome.COMPLETED


@sqlite_only
@pytest.mark.spec("MAINT-VAC-1")
@pytest.mark.usefixtures("short_busy_timeout")
def test_compaction_queues_behind_this_process_writers_instead_of_failing(
    migrated_db_url: str,
) -> None:
    """A writer of this process holds the write lock for many busy timeouts.

    Compaction waits in the process's write queue (not in SQLite's busy handler, which would
    fail after 100 ms), then runs; an open read transaction of this process does not block it,
    and writers that queue behind it all commit.
    """
    _fill(migrated_db_url, 300, delete_rows=300)

    async def scenario(compactor: Compactor, database: Database) -> CompactionResult:
        engine = database.engine
        async with engine.connect() as reader:
            await reader.exec_driver_sql("SELECT count(*) FROM maintenance_preferences")
            assert reader.in_transaction()
            async with write_connection(engine) as writer:
                await writer.execute(
                    insert(MaintenancePreference).values(
                        key="first", value="v", updated_at_unix_ms=1
                    )
                )
                compaction = asyncio.create_task(compactor.compact())
                await asyncio.sleep(5 * SHORT_BUSY_TIMEOUT_MS / 1000)
                assert not compaction.done()

            async def write(index: int) -> None:
                async with write_connection(engine) as connection:
                    await connection.execute(
                        insert(MaintenancePreference).values(
                            key=f"after-{index}", value="v", updated_at_unix_ms=1
                        )
                    )

            writers = [asyncio.create_task(write(index)) for index in range(10)]
            result = await compaction
            await asyncio.gather(*writers)
        return result

    result = _with_compactor(migrated_db_url, scenario)

    assert result.outcome is CompactionOutcome.COMPLETED
    assert result.size_after_bytes is not None
    assert result.size_before_bytes is not None
    assert result.size_after_bytes < result.size_before_bytes
    path = make_url(migrated_db_url).database
    assert path is not None
    connection = sqlite3.connect(path)
    try:
        keys = {row[0] for row in connection.execute("SELECT key FROM maintenance_preferences")}
    finally:
        connection.close()
    assert {"first", *(f"after-{index}" for index in range(10))} <= keys


# --- MAINT-VAC-1: Postgres -------------------------------------------------------------------


@postgres_only
@pytest.mark.spec("MAINT-VAC-1")
def test_postgres_compaction_is_skipped_as_unsupported(migrated_db_url: str) -> None:
    """ADR 0020: Postgres reports its size and never compacts, however large the thresholds."""
    result = _with_compactor(
        migrated_db_url, _compact, max_size_bytes=2**62, min_reclaimable_fraction=0.0
    )
    assert result.outcome is CompactionOutcome.SKIPPED_UNSUPPORTED_BACKEND
    assert result.size_before_bytes is not None
    assert result.size_before_bytes > 0
    assert result.size_after_bytes is None
    assert result.reclaimable_fraction_before is None
    assert result.error is None
