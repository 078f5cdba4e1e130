"""SQLite statements through aiosqlite take one thread hop each and behave as before.

``store.aiosqlite_one_hop`` replaces SQLAlchemy's four round trips to aiosqlite's thread per
statement (cursor, execute, fetch, close) with one. These scenarios check what callers see is
unchanged (rows, ``RETURNING``, row counts, executemany, typed errors, rollback, streamed
results) and count the hops. The adapter is SQLite's, so the scenarios skip on Postgres.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import aiosqlite
import pytest
from sqlalchemy import Table, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from store.aiosqlite_one_hop import OneHopConnection
from store.engine import backend_name, create_async_engine_for
from store.models import Session
from tests.migrations.rows import session_row

T = TypeVar("T")


def _run(url: str, scenario: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    if backend_name(url) != "sqlite":
        pytest.skip("the one-hop adapter is SQLite's (aiosqlite)")

    async def main() -> T:
        engine = create_async_engine_for(url)
        try:
            return await scenario(engine)
        finally:
            await engine.dispose()

    return asyncio.run(main())


@pytest.mark.spec("STORE-3")
def test_statements_return_what_they_did_and_a_rollback_undoes_them(
    migrated_db_url: str,
) -> None:
    sessions = cast(Table, Session.__table__)

    async def scenario(engine: AsyncEngine) -> None:
        async with engine.begin() as conn:
            adapted = (await conn.get_raw_connection()).dbapi_connection
            assert isinstance(cast(object, adapted), OneHopConnection)
            returned = await conn.execute(
                insert(sessions).values(**session_row("s1")).returning(sessions.c.session_id)
            )
            assert returned.scalars().all() == ["s1"]
            many = await conn.execute(insert(sessions), [session_row("s2"), session_row("s3")])
            assert many.rowcount == 2
            changed = await conn.execute(
                update(sessions).where(sessions.c.session_id != "s1").values(title="renamed")
            )
            assert changed.rowcount == 2
            titles = await conn.execute(
                select(sessions.c.session_id, sessions.c.title).order_by(sessions.c.session_id)
            )
            assert [row.title == "renamed" for row in titles] == [False, True, True]
            with pytest.raises(IntegrityError):
                await conn.execute(insert(sessions).values(**session_row("s1")))

        async def failing() -> None:
            async with engine.begin() as conn:
                await conn.execute(insert(sessions).values(**session_row("s4")))
                raise RuntimeError("abort")

        # Statements of a transaction that fails commit nothing.
        with pytest.raises(RuntimeError, match="abort"):
            await failing()
        async with engine.connect() as conn:
            count = await conn.scalar(select(func.count()).select_from(sessions))
            streamed = await conn.stream(select(sessions.c.session_id).order_by("session_id"))
            ids = [row.session_id async for row in streamed]
        assert count == 3
        assert ids == ["s1", "s2", "s3"]

    _run(migrated_db_url, scenario)


def test_a_statement_is_one_hop_to_the_connection_thread(
    migrated_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops: list[str] = []
    original = aiosqlite.Connection._execute

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(fn, "__name__", repr(fn)))
        return await original(self, fn, *args, **kwargs)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)

    async def scenario(engine: AsyncEngine) -> None:
        async with engine.connect() as conn:
            await conn.scalar(select(func.count()).select_from(Session))  # connect, begin
            hops.clear()
            await conn.scalar(select(func.count()).select_from(Session))
            assert len(hops) == 1, hops
            hops.clear()
            await conn.execute(insert(Session).values(**session_row("s1")))
            assert len(hops) == 1, hops
            await conn.rollback()

    _run(migrated_db_url, scenario)
