"""Direct write transactions (``store.direct_writes``, ADR 0034) on both backends.

A direct write commits everything or nothing, waits in the same line as every other writer
of the process (SQLite's write line; Postgres row locks), turns contention into a typed
retryable refusal, and a cancelled caller waits for its transaction to end. The command
acknowledgement written through it (``repository.command_acks``) follows the outbox's
retention rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import pytest
from sqlalchemy import Engine, Table, bindparam, insert, select, text, update
from sqlalchemy.engine import make_url

from domainerrors import Unavailable
from services.host.repository import command_acks
from store.direct_reads import ReadQuery
from store.direct_writes import (
    DirectWrites,
    TransactionWriteConnection,
    WriteConnection,
    WriteStatement,
)
from store.engine import create_async_engine_for, sqlite_write_queue
from store.models import RuntimeCommandOutbox, Session
from tests.support.lock_waits import wait_for_lock_waiter
from tests.support.polling import eventually

ResultT = TypeVar("ResultT")

_S = cast(Table, Session.__table__)
_C = cast(Table, RuntimeCommandOutbox.__table__)
_RENAME = WriteStatement(
    update(_S).where(_S.c.session_id == bindparam("sid")).values(title=bindparam("new_title"))
)
_LOCK = ReadQuery(select(_S.c.title).where(_S.c.session_id == bindparam("sid")).with_for_update())


def _add_session(engine: Engine, session_id: str) -> None:
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
    }
    with engine.begin() as connection:
        connection.execute(insert(_S).values(**row))


def _titles(engine: Engine) -> dict[str, str]:
    with engine.connect() as connection:
        rows = connection.execute(select(_S.c.session_id, _S.c.title)).all()
    return {str(r[0]): str(r[1]) for r in rows}


def _with_writes(
    url: str, body: Callable[[DirectWrites], Awaitable[ResultT]], **options: Any
) -> ResultT:
    async def run() -> ResultT:
        engine = create_async_engine_for(url)
        writes = DirectWrites(url, engine, **options)
        try:
            return await body(writes)
        finally:
            await writes.close()
            await engine.dispose()

    return asyncio.run(run())


@pytest.mark.spec("STORE-3")
def test_a_direct_write_commits_all_of_its_statements_or_none(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    _add_session(sync_engine, "s-1")
    _add_session(sync_engine, "s-2")

    def failing(conn: WriteConnection) -> None:
        assert conn.execute(_RENAME, {"sid": "s-1", "new_title": "half"}) == 1
        raise LookupError("the command refused after its first statement")

    def both(conn: WriteConnection) -> int:
        changed = conn.execute(_RENAME, {"sid": "s-1", "new_title": "one"})
        return changed + conn.execute(_RENAME, {"sid": "s-2", "new_title": "two"})

    async def body(writes: DirectWrites) -> int:
        with pytest.raises(LookupError):
            await writes.run(failing)
        assert _titles(sync_engine) == {"s-1": "title s-1", "s-2": "title s-2"}
        return await writes.run(both)

    assert _with_writes(migrated_db_url, body) == 2
    assert _titles(sync_engine) == {"s-1": "one", "s-2": "two"}


@pytest.mark.spec("STORE-3", "HOST-RT-5")
def test_a_direct_write_waits_for_the_writer_ahead_of_it(
    migrated_db_url: str, sync_engine: Engine, backend: str
) -> None:
    """SQLite: the process's write line, held exclusively. Postgres: the row's lock, held by
    another transaction. Either way the write runs only after the holder ends and then sees
    what it committed."""
    _add_session(sync_engine, "s-1")
    seen: list[str] = []

    def rename(conn: WriteConnection) -> None:
        row = conn.first(_LOCK, {"sid": "s-1"})
        assert row is not None
        seen.append(row.title)
        conn.execute(_RENAME, {"sid": "s-1", "new_title": f"{row.title} + direct"})

    async def body(writes: DirectWrites) -> None:
        if backend == "sqlite":
            queue = sqlite_write_queue(writes._engine)
            assert queue is not None
            async with queue.exclusive():
                waiting = asyncio.create_task(writes.run(rename))
                # In line behind the holder: the write line itself is what is tested.
                queued = await asyncio.to_thread(eventually, lambda: queue.waiting > 0, 10)
                assert queued
                assert not waiting.done()
                with sync_engine.begin() as connection:
                    connection.execute(update(_S).values(title="holder"))
            await asyncio.wait_for(waiting, 10)
            return
        with sync_engine.connect() as holder:
            transaction = holder.begin()
            holder.execute(text("SELECT 1 FROM sessions WHERE session_id = 's-1' FOR UPDATE"))
            holder.execute(update(_S).values(title="holder"))
            waiting = asyncio.create_task(writes.run(rename))
            # Blocked on the holder's row lock, as the server reports it.
            await asyncio.to_thread(wait_for_lock_waiter, sync_engine, 10)
            assert not waiting.done()
            transaction.commit()
        await asyncio.wait_for(waiting, 10)

    _with_writes(migrated_db_url, body)
    assert seen == ["holder"]
    assert _titles(sync_engine) == {"s-1": "holder + direct"}


@pytest.mark.spec("CON-5")
def test_a_locked_sqlite_file_is_refused_typed_and_nothing_is_written(
    migrated_db_url: str, sync_engine: Engine, backend: str
) -> None:
    if backend != "sqlite":
        pytest.skip("SQLite's file lock; Postgres waits on row locks instead")
    _add_session(sync_engine, "s-1")
    blocker = sqlite3.connect(make_url(migrated_db_url).database or "", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process's writer
    try:

        async def body(writes: DirectWrites) -> BaseException | None:
            try:
                await writes.run(
                    lambda conn: conn.execute(_RENAME, {"sid": "s-1", "new_title": "x"})
                )
            except Exception as exc:  # noqa: BLE001 - the test inspects what was raised
                return exc
            return None

        refused = _with_writes(migrated_db_url, body, sqlite_busy_timeout_ms=50)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert isinstance(refused, Unavailable), refused
    assert refused.reason == "STORE_BUSY"
    assert _titles(sync_engine) == {"s-1": "title s-1"}


@pytest.mark.spec("CON-5")
def test_a_write_the_sqlite_line_does_not_admit_is_refused_typed(
    migrated_db_url: str, sync_engine: Engine, backend: str
) -> None:
    if backend != "sqlite":
        pytest.skip("the write line is SQLite's")
    _add_session(sync_engine, "s-1")

    async def run() -> BaseException | None:
        engine = create_async_engine_for(migrated_db_url, sqlite_write_queue_seconds=0.05)
        writes = DirectWrites(migrated_db_url, engine)
        queue = sqlite_write_queue(engine)
        assert queue is not None
        try:
            async with queue.exclusive():  # a writer that holds the line past the wait
                await writes.run(
                    lambda conn: conn.execute(_RENAME, {"sid": "s-1", "new_title": "x"})
                )
        except Exception as exc:  # noqa: BLE001 - the test inspects what was raised
            return exc
        finally:
            await writes.close()
            await engine.dispose()
        return None

    refused = asyncio.run(run())
    assert isinstance(refused, Unavailable), refused
    assert refused.reason == "STORE_BUSY"
    assert _titles(sync_engine) == {"s-1": "title s-1"}


def test_a_cancelled_caller_waits_for_its_transaction_to_end(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    _add_session(sync_engine, "s-1")
    started = threading.Event()
    release = threading.Event()

    def slow(conn: WriteConnection) -> None:
        conn.execute(_RENAME, {"sid": "s-1", "new_title": "committed"})
        started.set()
        release.wait(10)

    async def body(writes: DirectWrites) -> bool:
        caller = asyncio.create_task(writes.run(slow))
        await asyncio.to_thread(started.wait, 10)
        caller.cancel()
        await asyncio.sleep(0.2)
        ended_early = caller.done()
        release.set()
        with contextlib.suppress(asyncio.CancelledError):
            await caller
        return ended_early or not caller.cancelled()

    assert _with_writes(migrated_db_url, body) is False
    # The transaction ran to its end on its thread: its write is stored.
    assert _titles(sync_engine) == {"s-1": "committed"}


# ------------------------------------------------------------- acknowledgements


def _add_command(engine: Engine, command_id: str, kind: str, state: str = "dispatched") -> None:
    with engine.begin() as connection:
        connection.execute(
            insert(_C).values(
                workspace_id="ws-1",
                session_id="s-1",
                command_id=command_id,
                command_kind=kind,
                operation_id=None,
                payload_json="{}",
                state=state,
                attempts=1,
                next_attempt_at_unix_ms=1,
                last_error=None,
                created_at_unix_ms=1,
                updated_at_unix_ms=1,
            )
        )


def _commands(engine: Engine) -> dict[str, tuple[str, str | None, int]]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(_C.c.command_id, _C.c.state, _C.c.last_error, _C.c.updated_at_unix_ms)
        ).all()
    return {str(r[0]): (str(r[1]), r[2], int(r[3])) for r in rows}


async def _on_orm_transaction(
    writes: DirectWrites, url: str, write: Callable[[WriteConnection], ResultT]
) -> ResultT:
    """``write`` on an ORM transaction's connection instead of the writer thread's."""
    del writes
    engine = create_async_engine_for(url)
    try:
        async with engine.begin() as connection:
            return await connection.run_sync(lambda sync: write(TransactionWriteConnection(sync)))
    finally:
        await engine.dispose()


@pytest.mark.spec("HOST-RT-5", "HOST-SES-6")
@pytest.mark.parametrize("path", ["direct", "orm_transaction", "one_transaction"])
def test_an_acknowledgement_settles_its_row_by_the_outbox_rules(
    migrated_db_url: str, sync_engine: Engine, path: str
) -> None:
    """The same write function gives the same rows on the writer thread and in an ORM
    transaction (``TransactionWriteConnection``): one implementation serves both; and so
    do a link's acknowledgements applied in one transaction (``runtime.ack_batches``)."""
    _add_session(sync_engine, "s-1")
    _add_command(sync_engine, "c-accepted", "start_turn")
    _add_command(sync_engine, "c-failed", "start_turn")
    _add_command(sync_engine, "c-rejected", "start_turn")
    _add_command(sync_engine, "c-awaited", "apply_settings")
    _add_command(sync_engine, "c-done", "start_turn", state="completed")
    acks = [
        ("c-accepted", "accepted", None),
        ("c-failed", "failed", "provider down"),
        ("c-rejected", "rejected", None),
        ("c-awaited", "rejected", "not on this plan"),
        ("c-done", "failed", "late"),
        ("c-unknown", "accepted", None),
    ]

    def acknowledge(
        command_id: str, status: str, detail: str | None
    ) -> Callable[[WriteConnection], command_acks.AckOutcome]:
        return lambda conn: command_acks.record_ack(conn, command_id, status, detail, 50)

    async def body(writes: DirectWrites) -> list[command_acks.AckOutcome]:
        if path == "direct":
            return [await writes.run(acknowledge(*ack)) for ack in acks]
        if path == "one_transaction":  # a link's acknowledgements applied together
            return await writes.run(lambda conn: [acknowledge(*ack)(conn) for ack in acks])
        return [
            await _on_orm_transaction(writes, migrated_db_url, acknowledge(*ack)) for ack in acks
        ]

    outcomes = _with_writes(migrated_db_url, body)
    assert [(o.found, o.applied, o.state, o.error) for o in outcomes] == [
        (True, True, "completed", None),
        (True, True, "pending", "provider down"),
        (True, True, "failed", "rejected"),
        (True, True, "failed", "not on this plan"),
        (True, False, "completed", None),  # already acknowledged: ignored
        (False, False, None, None),
    ]
    assert _commands(sync_engine) == {
        # Back to pending for the next dispatch; a rejected awaited command stays for its
        # waiter; acknowledged rows are gone; the ignored one is untouched.
        "c-failed": ("pending", "provider down", 50),
        "c-awaited": ("failed", "not on this plan", 50),
        "c-done": ("completed", None, 1),
    }


_TITLE = ReadQuery(select(_S.c.title).where(_S.c.session_id == bindparam("sid")))
_RETITLED = WriteStatement(
    update(_S)
    .where(_S.c.session_id == bindparam("sid"))
    .values(title=bindparam("new_title"))
    .returning(_S.c.session_id)
)


@pytest.mark.spec("STORE-3")
def test_deferred_writes_are_seen_by_the_next_read_and_carried_by_a_statement_that_may(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    """A deferred write is done by the next statement: a read sees it; a statement that
    carries it (Postgres: as CTEs of that one statement) runs both, and the commit sends
    whatever is still deferred."""
    for sid in ("s-1", "s-2", "s-3", "s-4"):
        _add_session(sync_engine, sid)

    def write(conn: WriteConnection) -> tuple[str, list[tuple[Any, ...]]]:
        conn.defer(_RENAME, {"sid": "s-1", "new_title": "deferred one"})
        read = conn.first(_TITLE, {"sid": "s-1"})
        conn.defer(_RENAME, {"sid": "s-2", "new_title": "deferred two"})
        conn.defer(_RENAME, {"sid": "s-3", "new_title": "deferred three"})
        carried = conn.returned(
            _RETITLED, {"sid": "s-4", "new_title": "carrier"}, carries_deferred=True
        )
        conn.defer(_RENAME, {"sid": "s-1", "new_title": "at the commit"})
        assert read is not None
        return read.title, carried

    seen, carried = _with_writes(migrated_db_url, lambda writes: writes.run(write))
    assert seen == "deferred one"
    assert carried == [("s-4",)]
    assert _titles(sync_engine) == {
        "s-1": "at the commit",
        "s-2": "deferred two",
        "s-3": "deferred three",
        "s-4": "carrier",
    }


@pytest.mark.spec("STORE-3")
def test_a_deferred_write_that_fails_rolls_the_transaction_back(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    _add_session(sync_engine, "s-1")
    duplicate = WriteStatement(insert(_S).from_select(list(_S.c.keys()), select(_S)))

    def write(conn: WriteConnection) -> None:
        conn.defer(_RENAME, {"sid": "s-1", "new_title": "lost"})
        conn.defer(duplicate)  # the same primary key again
        conn.returned(_RETITLED, {"sid": "nobody", "new_title": "x"}, carries_deferred=True)

    async def body(writes: DirectWrites) -> None:
        with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
            await writes.run(write)

    _with_writes(migrated_db_url, body)
    assert _titles(sync_engine) == {"s-1": "title s-1"}


@pytest.mark.spec("STORE-3", "HOST-TURN-1")
def test_a_read_after_the_commit_sees_the_committed_write(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    """``run_then_read`` reads on the writer's connection once the write has committed."""
    _add_session(sync_engine, "s-1")

    def write(conn: WriteConnection) -> int:
        return conn.execute(_RENAME, {"sid": "s-1", "new_title": "committed"})

    result = _with_writes(
        migrated_db_url,
        lambda writes: writes.run_then_read(write, lambda read: read.first(_TITLE, {"sid": "s-1"})),
    )
    changed, row = result
    assert changed == 1
    assert row is not None
    assert row.title == "committed"


@pytest.mark.spec("STORE-3", "HOST-TURN-1")
def test_a_failed_read_after_the_commit_keeps_the_write_and_reports_no_rows(
    migrated_db_url: str, sync_engine: Engine, backend: str
) -> None:
    """The write has committed when its read fails: the caller gets ``None`` and reads again."""
    _add_session(sync_engine, "s-1")
    bad_sql = "SELECT no_such_column FROM sessions"

    def write(conn: WriteConnection) -> int:
        return conn.execute(_RENAME, {"sid": "s-1", "new_title": "committed"})

    def failing_read(read: Any) -> Any:
        return read._execute(bad_sql if backend == "sqlite" else bad_sql.encode(), [])

    changed, row = _with_writes(
        migrated_db_url, lambda writes: writes.run_then_read(write, failing_read)
    )
    assert (changed, row) == (1, None)
    assert _titles(sync_engine) == {"s-1": "committed"}
