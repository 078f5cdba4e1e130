"""Atomic multi-row facts (STORE-3) and the transaction participant seam (STORE-4)."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from store.engine import create_async_engine_for
from store.models import Message, ResourceCleanupOutbox, RuntimeCommandOutbox, Session, Turn
from store.transactions import (
    TransactionRunner,
    UnitOfWork,
    UnitOfWorkClosedError,
    finish_abandoned,
)
from tests.migrations.rows import NOW_MS, WORKSPACE, message_row, session_row, turn_row

T = TypeVar("T")


class Boom(Exception):
    """Raised on purpose to abort a transaction."""


@dataclass
class Repositories:
    """A stand-in for the store repositories a domain command receives: no session in sight."""

    _session: AsyncSession
    uow: UnitOfWork

    async def create_session_with_turn(self, session_id: str, messages: int = 2) -> None:
        await self._session.execute(insert(Session).values(**session_row(session_id)))
        await self._session.execute(insert(Turn).values(**turn_row(session_id, "t-1")))
        await self._session.execute(
            insert(Message),
            [
                message_row(session_id, f"m-{n}", sequence=n, turn_id="t-1")
                for n in range(1, messages + 1)
            ],
        )

    async def add_message(self, session_id: str, message_id: str, sequence: int) -> None:
        await self._session.execute(
            insert(Message).values(**message_row(session_id, message_id, sequence=sequence))
        )


def _runner(engine: AsyncEngine, **kwargs: Any) -> TransactionRunner[Repositories]:
    return TransactionRunner(engine, scope=Repositories, **kwargs)


def _run(url: str, scenario: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    async def main() -> T:
        engine = create_async_engine_for(url)
        try:
            return await scenario(engine)
        finally:
            await engine.dispose()

    return asyncio.run(main())


def _counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as connection:
        return {
            model.__tablename__: int(
                connection.scalar(select(func.count()).select_from(model)) or 0
            )
            for model in (Session, Turn, Message, RuntimeCommandOutbox, ResourceCleanupOutbox)
        }


NOTHING = {
    "sessions": 0,
    "turns": 0,
    "messages": 0,
    "runtime_command_outbox": 0,
    "resource_cleanup_outbox": 0,
}


def _outbox_participant(command_id: str) -> Callable[[AsyncSession], Awaitable[None]]:
    async def append(session: AsyncSession) -> None:
        await session.execute(
            insert(RuntimeCommandOutbox).values(
                workspace_id=WORKSPACE,
                session_id="s-1",
                command_id=command_id,
                command_kind="start_turn",
                payload_json="{}",
                state="pending",
                next_attempt_at_unix_ms=NOW_MS,
                created_at_unix_ms=NOW_MS,
                updated_at_unix_ms=NOW_MS,
            )
        )

    return append


async def _cleanup_row(session: AsyncSession) -> None:
    await session.execute(
        insert(ResourceCleanupOutbox).values(
            workspace_id=WORKSPACE, session_id="gone", purged_at_unix_ms=NOW_MS, reason="purge"
        )
    )


# --------------------------------------------------------------------------------------------
# STORE-3
# --------------------------------------------------------------------------------------------


@pytest.mark.spec("STORE-3")
def test_multi_row_write_failing_midway_leaves_nothing(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    async def command(repos: Repositories) -> None:
        await repos.create_session_with_turn("s-1", messages=3)
        await repos.add_message("s-1", "m-dup", sequence=2)  # violates unique sequence

    async def scenario(engine: AsyncEngine) -> None:
        with pytest.raises(IntegrityError):
            await _runner(engine).run(command)

    _run(migrated_db_url, scenario)
    assert _counts(sync_engine) == NOTHING


@pytest.mark.spec("STORE-3")
def test_exception_in_command_rolls_back_every_row(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    async def command(repos: Repositories) -> None:
        await repos.create_session_with_turn("s-1")
        raise Boom

    async def scenario(engine: AsyncEngine) -> None:
        with pytest.raises(Boom):
            await _runner(engine).run(command)

    _run(migrated_db_url, scenario)
    assert _counts(sync_engine) == NOTHING


@pytest.mark.spec("STORE-3")
def test_sync_transaction_failing_midway_leaves_nothing(sync_engine: Engine) -> None:
    def write() -> None:
        with sync_engine.begin() as connection:
            connection.execute(insert(Session).values(**session_row("s-1")))
            connection.execute(insert(Turn).values(**turn_row("s-1", "t-1")))
            connection.execute(insert(Turn).values(**turn_row("s-missing", "t-1")))

    with pytest.raises(IntegrityError):
        write()
    assert _counts(sync_engine) == NOTHING


@pytest.mark.spec("STORE-3")
def test_sqlite_write_transactions_take_the_write_lock_at_begin(
    sqlite_template: Path, tmp_path: Path
) -> None:
    """A read-then-write cannot fail on a stale snapshot: the lock is taken at BEGIN.

    SQLite only (Postgres writers lock rows, not the database), so not parametrized by backend.
    """
    path = tmp_path / "store.sqlite3"
    shutil.copyfile(sqlite_template, path)
    url = f"sqlite:///{path}"
    observed: list[str] = []

    async def command(repos: Repositories) -> None:
        # Nothing written yet, but another writer must already be locked out.
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            observed.append(str(error))
        finally:
            other.close()
        await repos.create_session_with_turn("s-1")

    _run(url, lambda engine: _runner(engine).run(command))
    assert observed == ["database is locked"]


# --------------------------------------------------------------------------------------------
# STORE-4
# --------------------------------------------------------------------------------------------


@pytest.mark.spec("STORE-4")
def test_participant_rows_commit_with_the_command(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    async def command(repos: Repositories) -> str:
        await repos.create_session_with_turn("s-1")
        return "done"

    result = _run(
        migrated_db_url,
        lambda engine: _runner(engine).run(command, participants=[_outbox_participant("c-1")]),
    )

    assert result == "done"
    expected = {**NOTHING, "sessions": 1, "turns": 1, "messages": 2, "runtime_command_outbox": 1}
    assert _counts(sync_engine) == expected


@pytest.mark.spec("STORE-4")
def test_participant_failure_rolls_back_the_command(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    async def failing(_session: AsyncSession) -> None:
        raise Boom

    async def command(repos: Repositories) -> None:
        await repos.create_session_with_turn("s-1")

    async def scenario(engine: AsyncEngine) -> None:
        with pytest.raises(Boom):
            await _runner(engine).run(
                command, participants=[_outbox_participant("c-1"), _cleanup_row, failing]
            )

    _run(migrated_db_url, scenario)
    assert _counts(sync_engine) == NOTHING


@pytest.mark.spec("STORE-4")
def test_participant_integrity_error_rolls_back_the_command(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    async def command(repos: Repositories) -> None:
        await repos.create_session_with_turn("s-1")

    async def scenario(engine: AsyncEngine) -> None:
        with pytest.raises(IntegrityError):
            # The same command id twice violates the outbox's uniqueness.
            await _runner(engine).run(
                command, participants=[_outbox_participant("c-1"), _outbox_participant("c-1")]
            )

    _run(migrated_db_url, scenario)
    assert _counts(sync_engine) == NOTHING


@pytest.mark.spec("STORE-4")
def test_command_failure_rolls_back_participant_rows(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    async def command(repos: Repositories) -> None:
        repos.uow.enlist(_cleanup_row)
        await repos.create_session_with_turn("s-1")
        raise Boom

    async def scenario(engine: AsyncEngine) -> None:
        with pytest.raises(Boom):
            await _runner(engine, participants=[_cleanup_row]).run(command)

    _run(migrated_db_url, scenario)
    assert _counts(sync_engine) == NOTHING


@pytest.mark.spec("STORE-4")
def test_participants_enlisted_by_the_command_and_standing_ones_all_commit(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    order: list[str] = []

    def tracked(name: str, inner: Callable[[AsyncSession], Awaitable[None]]) -> Any:
        async def participant(session: AsyncSession) -> None:
            order.append(name)
            await inner(session)

        return participant

    async def command(repos: Repositories) -> None:
        order.append("command")
        await repos.create_session_with_turn("s-1")
        repos.uow.enlist(tracked("enlisted", _outbox_participant("c-2")))

    async def scenario(engine: AsyncEngine) -> None:
        runner = _runner(engine, participants=[tracked("standing", _cleanup_row)])
        await runner.run(command, participants=[tracked("per-call", _outbox_participant("c-1"))])

    _run(migrated_db_url, scenario)

    assert order == ["command", "standing", "per-call", "enlisted"]
    counts = _counts(sync_engine)
    assert counts["runtime_command_outbox"] == 2
    assert counts["resource_cleanup_outbox"] == 1


@dataclass
class HookLog:
    events: list[str] = field(default_factory=list)


@pytest.mark.spec("STORE-4")
def test_after_commit_hooks_run_only_after_commit(
    migrated_db_url: str, sync_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    log = HookLog()

    def hook(name: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            # The committed rows are visible to a fresh connection when the hook runs.
            log.events.append(f"{name}:sessions={_counts(sync_engine)['sessions']}")
            if name == "failing":
                raise Boom

        return run

    async def ok(repos: Repositories) -> None:
        repos.uow.after_commit(hook("failing"))
        repos.uow.after_commit(hook("second"))
        await repos.create_session_with_turn("s-1")

    async def rolled_back(repos: Repositories) -> None:
        repos.uow.after_commit(hook("never"))
        raise Boom

    async def scenario(engine: AsyncEngine) -> None:
        runner = _runner(engine)
        await runner.run(ok)  # a failing hook does not undo the commit or raise
        with pytest.raises(Boom):
            await runner.run(rolled_back)

    _run(migrated_db_url, scenario)

    assert log.events == ["failing:sessions=1", "second:sessions=1"]
    assert _counts(sync_engine)["sessions"] == 1
    assert "post-commit hook" in caplog.text


def test_a_finished_unit_of_work_refuses_new_participants(migrated_db_url: str) -> None:
    captured: list[UnitOfWork] = []

    async def command(repos: Repositories) -> None:
        captured.append(repos.uow)

    _run(migrated_db_url, lambda engine: _runner(engine).run(command, write=False))

    with pytest.raises(UnitOfWorkClosedError):
        captured[0].enlist(_cleanup_row)
    with pytest.raises(UnitOfWorkClosedError):
        captured[0].after_commit(lambda: asyncio.sleep(0))


@pytest.mark.spec("STORE-3")
def test_a_cancelled_reader_leaves_its_read_to_end_with_its_hooks(migrated_db_url: str) -> None:
    """A read transaction runs to its end and its post-commit hooks even when its caller is
    cancelled mid-read (a client cancelling its call); the caller sees the cancellation."""
    hooks: list[str] = []

    async def scenario(engine: AsyncEngine) -> None:
        inside = asyncio.Event()
        release = asyncio.Event()

        async def command(repos: Repositories) -> None:
            inside.set()
            await release.wait()

            async def hook() -> None:
                hooks.append("ran")

            repos.uow.after_commit(hook)

        caller = asyncio.ensure_future(_runner(engine).run(command, write=False))
        await inside.wait()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        release.set()
        await finish_abandoned(engine)

    _run(migrated_db_url, scenario)
    assert hooks == ["ran"]


@pytest.mark.spec("STORE-3")
def test_a_cancelled_writer_rolls_back(migrated_db_url: str, sync_engine: Engine) -> None:
    """A write transaction is cancelled with its caller and leaves nothing (its caller may hold
    the Session's lane, so the write must not outlive it)."""

    async def scenario(engine: AsyncEngine) -> None:
        inside = asyncio.Event()

        async def command(repos: Repositories) -> None:
            await repos.create_session_with_turn("s-cancelled")
            inside.set()
            await asyncio.Event().wait()

        caller = asyncio.ensure_future(_runner(engine).run(command))
        await inside.wait()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller

    _run(migrated_db_url, scenario)
    assert _counts(sync_engine)["sessions"] == 0


@pytest.mark.spec("STORE-3")
def test_a_caller_cancelled_while_queued_for_the_write_slot_writes_nothing(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    """A writer still waiting for this process's SQLite write slot is cancelled with its
    caller and writes nothing (Postgres has no slot: a command begins at once)."""
    if not migrated_db_url.startswith("sqlite"):
        pytest.skip("the write slot is SQLite's; on Postgres every command begins at once")

    async def scenario(engine: AsyncEngine) -> None:
        holding = asyncio.Event()
        release = asyncio.Event()

        async def first(repos: Repositories) -> None:
            holding.set()
            await release.wait()

        async def second(repos: Repositories) -> None:
            await repos.create_session_with_turn("s-queued")

        holder = asyncio.ensure_future(_runner(engine).run(first))
        await holding.wait()
        queued = asyncio.ensure_future(_runner(engine).run(second))
        await asyncio.sleep(0.05)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        release.set()
        await holder
        await finish_abandoned(engine)

    _run(migrated_db_url, scenario)
    assert _counts(sync_engine)["sessions"] == 0
