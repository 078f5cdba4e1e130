"""A saturated store answers a typed, retryable ``STORE_BUSY``, and a burst waits in line (CON-5).

On SQLite every write transaction of a process waits in one first-come-first-served queue
(``store.engine.sqlite_write_slot``) for up to the queue timeout (30 s by default), which is
longer than SQLite's busy timeout on purpose: a burst of writes from one machine drains in
order instead of failing after 5 s. A queue already holding its maximum of waiters refuses at
once. On Postgres the same typed refusal comes from a connection pool that stayed exhausted.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from domainerrors import Unavailable
from store.engine import _WRITE_GATES, backend_name, create_async_engine_for, sqlite_write_slot
from store.models import Session
from store.transactions import TransactionRunner, UnitOfWork
from tests.migrations.rows import session_row

T = TypeVar("T")


def _scope(session: AsyncSession, _uow: UnitOfWork) -> AsyncSession:
    return session


def _run(url: str, scenario: Callable[[AsyncEngine], Awaitable[T]], **options: object) -> T:
    async def main() -> T:
        engine = create_async_engine_for(url, **options)  # type: ignore[arg-type]
        try:
            return await scenario(engine)
        finally:
            await engine.dispose()

    return asyncio.run(main())


async def _until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until ``condition`` holds (the tasks only need to reach the queue)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


def _insert(session_id: str) -> Callable[[AsyncSession], Awaitable[None]]:
    async def write(session: AsyncSession) -> None:
        await session.execute(insert(Session).values(**session_row(session_id)))

    return write


async def _count(engine: AsyncEngine) -> int:
    async with AsyncSession(engine) as session:
        return int((await session.execute(select(func.count()).select_from(Session))).scalar_one())


@pytest.mark.spec("CON-5", "STORE-3")
def test_a_queued_sqlite_writer_outwaits_the_busy_timeout(
    sqlite_template: Path, tmp_path: Path
) -> None:
    """The line is bounded by the queue timeout, not by SQLite's 100 ms busy timeout here.

    SQLite only: Postgres has no write queue (its bound is the pool, tested below).
    """
    path = tmp_path / "store.sqlite3"
    shutil.copyfile(sqlite_template, path)

    async def scenario(engine: AsyncEngine) -> tuple[float, int]:
        gate = _WRITE_GATES[engine.sync_engine]
        runner = TransactionRunner(engine, scope=_scope)
        async with sqlite_write_slot(engine):  # another writer of this process is inside
            waiter = asyncio.create_task(runner.run(_insert("s-queued")))
            await _until(lambda: gate.waiting == 1)
            started = time.monotonic()
            await asyncio.sleep(0.5)  # hold the slot five busy timeouts long
            assert not waiter.done()
        await waiter
        return time.monotonic() - started, await _count(engine)

    waited, rows = _run(f"sqlite:///{path}", scenario, sqlite_busy_timeout_ms=100)
    assert waited < 10
    assert rows == 1


@pytest.mark.spec("CON-5")
def test_a_saturated_store_refuses_with_store_busy_and_writes_nothing(
    migrated_db_url: str,
) -> None:
    """SQLite: a full write queue refuses at once. Postgres: an exhausted pool times out."""
    sqlite = backend_name(migrated_db_url) == "sqlite"

    async def on_sqlite(engine: AsyncEngine) -> tuple[Unavailable, float, int]:
        gate = _WRITE_GATES[engine.sync_engine]
        runner = TransactionRunner(engine, scope=_scope)
        async with sqlite_write_slot(engine):
            queued = [asyncio.create_task(runner.run(_insert(f"s-{i}"))) for i in range(2)]
            await _until(lambda: gate.waiting == 2)
            started = time.monotonic()
            with pytest.raises(Unavailable) as refused:
                await runner.run(_insert("s-refused"))
            elapsed = time.monotonic() - started
        await asyncio.gather(*queued)
        return refused.value, elapsed, await _count(engine)

    async def on_postgres(engine: AsyncEngine) -> tuple[Unavailable, float, int]:
        runner = TransactionRunner(engine, scope=_scope)
        async with engine.connect() as held:  # the pool's only connection
            await held.execute(select(1))
            started = time.monotonic()
            with pytest.raises(Unavailable) as refused:
                await runner.run(_insert("s-refused"))
            elapsed = time.monotonic() - started
        await runner.run(_insert("s-0"))
        await runner.run(_insert("s-1"))
        return refused.value, elapsed, await _count(engine)

    if sqlite:
        error, elapsed, rows = _run(migrated_db_url, on_sqlite, sqlite_write_queue_depth=2)
    else:
        error, elapsed, rows = _run(
            migrated_db_url, on_postgres, pool_size=1, max_overflow=0, pool_timeout=0.2
        )
    assert error.reason == "STORE_BUSY"
    assert error.retry_after_seconds
    assert elapsed < (1.0 if sqlite else 5.0)  # refused, not queued for the queue timeout
    assert rows == 2, "the refused write left nothing behind"
