"""Direct read transactions (``store.direct_reads``, ADR 0023) on both backends.

A direct read decodes rows exactly as the ORM does (booleans as ``bool``), sees one committed
state across its statements, survives a lost connection with a typed refusal and a reconnect,
and refuses statements it cannot run as compiled.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from typing import Any, cast

import pytest
from sqlalchemy import Engine, Table, bindparam, insert, select, text, update
from sqlalchemy.engine import make_url

from domainerrors import Unavailable
from services.host.repository import hot_reads
from services.host.repository.row_records import session_record
from store.direct_reads import DirectReads, ReadConnection, ReadQuery
from store.models import Session

_S = cast(Table, Session.__table__)
_BY_ID = ReadQuery(
    select(_S).where(_S.c.workspace_id == bindparam("ws"), _S.c.session_id == bindparam("sid"))
)
_TITLES = ReadQuery(select(_S.c.title).where(_S.c.workspace_id == "ws-1").order_by(_S.c.title))


def _add_session(engine: Engine, session_id: str, **values: Any) -> None:
    row: dict[str, Any] = {
        "workspace_id": "ws-1",
        "session_id": session_id,
        "root_session_id": session_id,
        "agent_target_id": "demo",
        "provider": "demo",
        "title": f"title {session_id}",
        "cwd": "/work",
        "rail_section_key": "conversations",
        "settings_json": "{}",
        "capabilities_json": "{}",
        "message_version": 0,
        "next_message_sequence": 1,
        "created_at_unix_ms": 1,
        "updated_at_unix_ms": 1,
        "tombstone_legacy": False,
        **values,
    }
    with engine.begin() as connection:
        connection.execute(insert(_S).values(**row))


def _orm_record(engine: Engine, session_id: str) -> Any:
    from sqlalchemy.orm import Session as OrmSession

    with OrmSession(engine) as orm:
        row = orm.get(Session, ("ws-1", session_id))
        assert row is not None
        return session_record(row)


@pytest.mark.spec("HOST-SES-3")
def test_a_direct_read_builds_the_same_record_as_the_orm(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    _add_session(
        sync_engine,
        "s-1",
        tombstone_legacy=True,
        deleted_at_unix_ms=5,
        deletion_generation="g-1",
        component_size=1,
        pinned_at_unix_ms=3,
    )

    async def read() -> Any:
        reads = DirectReads(migrated_db_url)
        try:
            return await reads.run(lambda conn: conn.first(_BY_ID, {"ws": "ws-1", "sid": "s-1"}))
        finally:
            await reads.close()

    row = asyncio.run(read())
    assert row.tombstone_legacy is True  # a Boolean column reads as bool, not 0/1
    assert session_record(row) == _orm_record(sync_engine, "s-1")


@pytest.mark.spec("STORE-3", "HOST-SES-3")
def test_every_statement_of_a_read_sees_the_state_its_first_statement_saw(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    _add_session(sync_engine, "s-a")

    def read(conn: ReadConnection) -> tuple[list[Any], list[Any]]:
        first = conn.all(_TITLES)
        # Another connection commits between the two statements of this read.
        _add_session(sync_engine, "s-b")
        with sync_engine.begin() as connection:
            connection.execute(update(_S).values(title="renamed"))
        return first, conn.all(_TITLES)

    async def run() -> tuple[tuple[list[Any], list[Any]], list[Any]]:
        reads = DirectReads(migrated_db_url, connections=1)
        try:
            during = await reads.run(read)
            after = await reads.run(lambda conn: conn.all(_TITLES))
            return during, after
        finally:
            await reads.close()

    (first, second), after = asyncio.run(run())
    assert [r.title for r in first] == ["title s-a"]
    assert [r.title for r in second] == ["title s-a"]
    assert [r.title for r in after] == ["renamed", "renamed"]


def _lock_out_readers(url: str) -> sqlite3.Connection:
    """A connection holding SQLite's exclusive lock (``locking_mode=EXCLUSIVE``)."""
    blocker = sqlite3.connect(make_url(url).database or "", isolation_level=None)
    blocker.execute("PRAGMA locking_mode=EXCLUSIVE")
    blocker.execute("BEGIN EXCLUSIVE")
    blocker.execute("UPDATE sessions SET title = title")
    blocker.execute("COMMIT")
    return blocker


def _terminate_other_backends(engine: Engine) -> None:
    with engine.connect() as admin:
        admin.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND datname = current_database()"
            )
        )


def test_an_unavailable_store_is_refused_typed_and_a_dropped_connection_replaced(
    migrated_db_url: str, sync_engine: Engine, backend: str
) -> None:
    """SQLite: a file another connection locks exclusively refuses the read ``UNAVAILABLE``
    and the next read, once the lock is gone, succeeds. Postgres: a connection the server
    dropped (a restart, an idle timeout) is replaced and the read succeeds at once."""
    _add_session(sync_engine, "s-1")
    sync_engine.dispose()
    key = {"ws": "ws-1", "sid": "s-1"}

    async def sqlite_run() -> tuple[BaseException | None, Any]:
        reads = DirectReads(migrated_db_url, connections=1, sqlite_busy_timeout_ms=50)
        try:
            blocker = _lock_out_readers(migrated_db_url)  # before the first connect
            refused: BaseException | None = None
            try:
                await reads.run(lambda conn: conn.first(_BY_ID, key))
            except Exception as exc:  # noqa: BLE001 - the test inspects what was raised
                refused = exc
            blocker.close()
            return refused, await reads.run(lambda conn: conn.first(_BY_ID, key))
        finally:
            await reads.close()

    async def postgres_run() -> tuple[Any, Any]:
        reads = DirectReads(migrated_db_url, connections=1)
        try:
            before = await reads.run(lambda conn: conn.first(_BY_ID, key))
            _terminate_other_backends(sync_engine)
            return before, await reads.run(lambda conn: conn.first(_BY_ID, key))
        finally:
            await reads.close()

    if backend == "sqlite":
        refused, again = asyncio.run(sqlite_run())
        assert isinstance(refused, Unavailable), refused
        assert refused.reason == "STORE_BUSY"
        assert again.session_id == "s-1"
    else:
        before, after = asyncio.run(postgres_run())
        assert before.session_id == after.session_id == "s-1"


def test_a_cancelled_read_keeps_its_connection_until_it_ends(migrated_db_url: str) -> None:
    started = threading.Event()
    release = threading.Event()

    def slow(conn: ReadConnection) -> str:
        started.set()
        release.wait(10)
        return "slow"

    async def run() -> list[str]:
        reads = DirectReads(migrated_db_url, connections=2)
        try:
            caller = asyncio.create_task(reads.run(slow))
            await asyncio.to_thread(started.wait, 10)
            caller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await caller
            # The cancelled read still runs on its connection: the next two reads take the
            # other connection, one after the other, instead of queueing behind it.
            order: list[str] = []

            async def quick(name: str) -> None:
                order.append(await reads.run(lambda conn: name))

            await asyncio.wait_for(asyncio.gather(quick("a"), quick("b")), 5)
            release.set()
            order.append(await reads.run(lambda conn: "after"))
            return order
        finally:
            release.set()
            await reads.close()

    assert asyncio.run(run()) == ["a", "b", "after"]


def test_statements_that_expand_parameters_and_closed_reads_are_refused(
    migrated_db_url: str,
) -> None:
    expanding = ReadQuery(select(_S).where(_S.c.session_id.in_(bindparam("ids", expanding=True))))
    with pytest.raises(ValueError, match="expand"):
        expanding.compiled("sqlite")

    async def run() -> None:
        reads = DirectReads(migrated_db_url)
        await reads.close()
        await reads.run(lambda conn: conn.all(_TITLES))

    with pytest.raises(Unavailable, match="closing"):
        asyncio.run(run())
    with pytest.raises(ValueError, match="in-memory"):
        DirectReads("sqlite://")


@pytest.mark.spec("HOST-SES-3")
def test_get_sessions_read_set_orders_descendants_parents_first(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    _add_session(sync_engine, "root", created_at_unix_ms=1)
    _add_session(
        sync_engine,
        "child",
        root_session_id="root",
        parent_session_id="root",
        created_at_unix_ms=3,
    )
    _add_session(
        sync_engine,
        "grandchild",
        root_session_id="root",
        parent_session_id="child",
        created_at_unix_ms=2,
    )
    _add_session(
        sync_engine,
        "gone",
        root_session_id="root",
        parent_session_id="root",
        created_at_unix_ms=4,
        deleted_at_unix_ms=9,
        deletion_generation="g",
        component_size=1,
    )

    async def run() -> hot_reads.SessionReadSet | None:
        reads = DirectReads(migrated_db_url)
        try:
            return await reads.run(lambda conn: hot_reads.session_read_set(conn, "ws-1", "root"))
        finally:
            await reads.close()

    found = asyncio.run(run())
    assert found is not None
    assert [c.session_id for c in found.children] == ["child", "grandchild"]
    assert found.active_turn is None
    assert found.latest_turn is None
