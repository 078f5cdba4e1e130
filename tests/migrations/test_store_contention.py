"""Write transactions under contention: SQLite writers queue, overload is retryable (CON-5).

``store.transactions`` runs every SQLite write transaction of a process through one queue
per engine (``store.engine.sqlite_write_slot``) and turns a store that does not admit a
transaction in time into ``Unavailable``/``Aborted`` with ``RetryInfo`` — never ``INTERNAL``.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import Engine, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from domainerrors import Unavailable
from store.engine import (
    _WRITE_GATES,
    DEFAULT_SQLITE_BUSY_TIMEOUT_MS,
    DEFAULT_SQLITE_WRITE_QUEUE_SECONDS,
    backend_name,
    create_async_engine_for,
    sqlite_write_slot,
)
from store.models import Session
from store.transactions import TransactionRunner, UnitOfWork, write_connection, write_session
from tests.migrations.rows import WORKSPACE, session_row

T = TypeVar("T")


def _scope(session: AsyncSession, _uow: UnitOfWork) -> AsyncSession:
    return session


def _run(
    url: str,
    scenario: Callable[[AsyncEngine], Awaitable[T]],
    sqlite_busy_timeout_ms: int = DEFAULT_SQLITE_BUSY_TIMEOUT_MS,
    sqlite_write_queue_seconds: float = DEFAULT_SQLITE_WRITE_QUEUE_SECONDS,
) -> T:
    async def main() -> T:
        engine = create_async_engine_for(
            url,
            sqlite_busy_timeout_ms=sqlite_busy_timeout_ms,
            sqlite_write_queue_seconds=sqlite_write_queue_seconds,
        )
        try:
            return await scenario(engine)
        finally:
            await engine.dispose()

    return asyncio.run(main())


@pytest.mark.spec("STORE-3")
def test_sqlite_writers_of_a_process_queue_in_arrival_order(
    sqlite_template: Path, tmp_path: Path
) -> None:
    """Without the queue, writers wait in SQLite's busy handler and win in random order.

    Writer 0 holds the write lock (inside its transaction, after its insert) until released;
    each further writer starts only once the one before it is provably waiting in the queue.
    """
    path = tmp_path / "store.sqlite3"
    shutil.copyfile(sqlite_template, path)
    order: list[int] = []
    entered: list[int] = []

    async def scenario(engine: AsyncEngine) -> None:
        runner = TransactionRunner(engine, scope=_scope)
        gate = _WRITE_GATES[engine.sync_engine]
        inside = asyncio.Event()
        release = asyncio.Event()

        async def write(index: int) -> None:
            async def command(session: AsyncSession) -> None:
                await session.execute(insert(Session).values(**session_row(f"s-{index}")))
                entered.append(index)
                if index == 0:
                    inside.set()
                    await release.wait()  # hold the write lock across an await
                order.append(index)

            await runner.run(command)

        async def queued(count: int) -> None:
            # The queue has no event to wait on: yield to the loop until it holds ``count``.
            while gate.waiting != count:  # noqa: ASYNC110
                await asyncio.sleep(0)

        async with asyncio.timeout(30):
            writers = [asyncio.create_task(write(0))]
            await inside.wait()
            for index in range(1, 16):
                writers.append(asyncio.create_task(write(index)))
                await queued(index)  # writer ``index`` waits, behind every earlier one
            assert entered == [0]
            release.set()
            await asyncio.gather(*writers)

    _run(f"sqlite:///{path}", scenario)
    assert order == list(range(16))


@pytest.mark.spec("CON-5", "STORE-3")
def test_the_write_queue_holds_only_sqlite_writers(migrated_db_url: str) -> None:
    """Readers never queue; on Postgres writers do not queue either (rows lock, not files)."""
    sqlite = backend_name(migrated_db_url) == "sqlite"

    async def scenario(engine: AsyncEngine) -> tuple[int, str | None]:
        runner = TransactionRunner(engine, scope=_scope)

        async def count(session: AsyncSession) -> int:
            return len((await session.execute(select(Session.session_id))).all())

        async def write(session: AsyncSession) -> None:
            await session.execute(insert(Session).values(**session_row("s-w")))

        async with sqlite_write_slot(engine):  # another writer of this process is inside
            seen = await runner.run(count, write=False)
            try:
                await runner.run(write)
            except Unavailable as error:
                return seen, error.reason
        return seen, None

    # A short queue timeout: the writer gives up after it, not after the 30 s default.
    seen, failure = _run(
        migrated_db_url, scenario, sqlite_busy_timeout_ms=200, sqlite_write_queue_seconds=0.2
    )
    assert seen == 0
    assert failure == ("STORE_BUSY" if sqlite else None)


@pytest.mark.spec("CON-5")
def test_a_locked_store_is_unavailable_with_retry_info_not_internal(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    """Another process holds the lock past the timeout: the transaction fails retryably."""
    with sync_engine.begin() as connection:
        connection.execute(insert(Session).values(**session_row("s-1")))
    sqlite = backend_name(migrated_db_url) == "sqlite"

    async def blocked(session: AsyncSession) -> None:
        if not sqlite:
            await session.execute(text("SET LOCAL lock_timeout = '100ms'"))
        await session.execute(
            select(Session)
            .where(Session.workspace_id == WORKSPACE, Session.session_id == "s-1")
            .with_for_update()
        )
        await session.execute(insert(Session).values(**session_row("s-2")))

    async def scenario(engine: AsyncEngine) -> list[Unavailable]:
        failures: list[Unavailable] = []
        try:
            await TransactionRunner(engine, scope=_scope).run(blocked)
        except Unavailable as error:
            failures.append(error)
        if sqlite:  # the maintenance-job and Core-connection helpers map the same way
            try:
                async with write_session(engine) as session:
                    await session.execute(insert(Session).values(**session_row("s-3")))
            except Unavailable as error:
                failures.append(error)
            try:
                async with write_connection(engine) as connection:
                    await connection.execute(insert(Session).values(**session_row("s-4")))
            except Unavailable as error:
                failures.append(error)
        return failures

    holder = _hold_lock(migrated_db_url, sync_engine)
    try:
        failures = _run(migrated_db_url, scenario, sqlite_busy_timeout_ms=100)
    finally:
        holder()
    assert [error.reason for error in failures] == ["STORE_BUSY"] * (3 if sqlite else 1)
    assert all(error.retry_after_seconds for error in failures)
    with sync_engine.connect() as connection:
        assert connection.execute(select(Session.session_id)).scalars().all() == ["s-1"]


def _hold_lock(url: str, sync_engine: Engine) -> Callable[[], None]:
    """Lock the store as another process would; returns the release."""
    if backend_name(url) == "sqlite":
        path = url.removeprefix("sqlite:///")
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")

        def release_sqlite() -> None:
            other.execute("ROLLBACK")
            other.close()

        return release_sqlite
    connection = sync_engine.connect()
    transaction = connection.begin()
    connection.execute(
        select(Session)
        .where(Session.workspace_id == WORKSPACE, Session.session_id == "s-1")
        .with_for_update()
    )

    def release_postgres() -> None:
        transaction.rollback()
        connection.close()

    return release_postgres
