"""Concurrent write transactions share commits on SQLite; each caller keeps its own outcome.

``store.write_queue``: a ``TransactionRunner`` write on SQLite runs as a savepoint of a shared
``BEGIN IMMEDIATE`` transaction with the writers queued behind it, and the group commits once.
Every scenario runs on both backends: the outcome each caller sees is the same whether its
transaction committed alone (Postgres, or group commit off) or in a group (SQLite).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import event, func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from domainerrors import Aborted, FailedPrecondition
from store import write_queue
from store.contention import retryable_error
from store.engine import backend_name, create_async_engine_for, sqlite_write_queue
from store.models import Session
from store.transactions import TransactionRunner, UnitOfWork
from store.write_queue import GroupRolledBack, WriteQueue
from tests.migrations.rows import session_row

T = TypeVar("T")


@pytest.fixture(autouse=True)
def _groups_stay_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups admit every queued writer, however cheap a commit is on this machine.

    A group normally stays open for about two commit durations (``store.write_queue``), which
    on a fast disk with ``synchronous=NORMAL`` may admit no second member at all.
    """
    monkeypatch.setattr(WriteQueue, "_window", lambda _self: 60.0)


def _scope(session: AsyncSession, _uow: UnitOfWork) -> AsyncSession:
    return session


def _run(url: str, scenario: Callable[[AsyncEngine], Awaitable[T]], **options: object) -> T:
    options.setdefault("sqlite_group_commit", True)  # the default is on only with FULL

    async def main() -> T:
        engine = create_async_engine_for(url, **options)  # type: ignore[arg-type]
        try:
            return await scenario(engine)
        finally:
            await engine.dispose()

    return asyncio.run(main())


async def _until_waiting(engine: AsyncEngine, count: int) -> None:
    """Yield until ``count`` writers wait in the line (they only need to reach it)."""
    queue = sqlite_write_queue(engine)
    assert queue is not None
    for _ in range(10_000):
        if queue.waiting >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{queue.waiting} writers in line, expected {count}")


async def _ids(engine: AsyncEngine) -> set[str]:
    async with AsyncSession(engine) as session:
        return set((await session.execute(select(Session.session_id))).scalars())


async def _burst(
    engine: AsyncEngine, commands: Sequence[Callable[[AsyncSession], Awaitable[object]]]
) -> list[object]:
    """Start every command while the writer is held, so they queue together, then release."""
    runner = TransactionRunner(engine, scope=_scope)
    queue = sqlite_write_queue(engine)
    if queue is None:
        return list(
            await asyncio.gather(*(runner.run(c) for c in commands), return_exceptions=True)
        )
    async with queue.exclusive():
        tasks = [asyncio.create_task(runner.run(command)) for command in commands]
        await _until_waiting(engine, len(commands))
    return list(await asyncio.gather(*tasks, return_exceptions=True))


def _insert(
    session_id: str, *, then_fail: bool = False
) -> Callable[[AsyncSession], Awaitable[str]]:
    async def write(session: AsyncSession) -> str:
        await session.execute(insert(Session).values(**session_row(session_id)))
        if then_fail:
            raise FailedPrecondition(f"{session_id} refused after writing", reason="TEST_REFUSAL")
        return session_id

    return write


@pytest.mark.spec("STORE-3")
def test_a_burst_of_writers_shares_commits_and_every_caller_gets_its_result(
    migrated_db_url: str,
) -> None:
    """SQLite: 40 queued writers commit in far fewer commits than 40, all of them stored."""

    async def scenario(engine: AsyncEngine) -> tuple[list[object], set[str], tuple[int, int]]:
        results = await _burst(engine, [_insert(f"s-{i}") for i in range(40)])
        queue = sqlite_write_queue(engine)
        counts = (queue.groups_committed, queue.members_committed) if queue else (40, 40)
        return results, await _ids(engine), counts

    results, stored, (groups, members) = _run(migrated_db_url, scenario)
    assert results == [f"s-{i}" for i in range(40)]
    assert stored == {f"s-{i}" for i in range(40)}
    assert members == 40
    if backend_name(migrated_db_url) == "sqlite":
        assert groups < 40, "queued writers did not share a commit"


@pytest.mark.spec("STORE-3")
@pytest.mark.parametrize("failing", [0, 3, 7], ids=["first", "middle", "last"])
def test_a_failing_writer_rolls_back_alone_and_the_others_commit(
    migrated_db_url: str, failing: int
) -> None:
    """The refused writer's row is gone, its caller gets its own error, its neighbours commit.

    The first member of a group runs without a savepoint: its failure rolls the transaction
    back and the next member begins a new one.
    """

    async def scenario(engine: AsyncEngine) -> tuple[list[object], set[str]]:
        commands = [_insert(f"s-{i}", then_fail=(i == failing)) for i in range(8)]
        return await _burst(engine, commands), await _ids(engine)

    results, stored = _run(migrated_db_url, scenario)
    refused = results[failing]
    assert isinstance(refused, FailedPrecondition)
    assert refused.reason == "TEST_REFUSAL"
    others = [f"s-{i}" for i in range(8) if i != failing]
    assert [r for i, r in enumerate(results) if i != failing] == others
    assert stored == set(others)


@pytest.mark.spec("STORE-3")
def test_a_writer_sees_what_the_writers_before_it_wrote(migrated_db_url: str) -> None:
    """A member reads its predecessors' rows, as if each had committed before it began."""
    if backend_name(migrated_db_url) != "sqlite":
        pytest.skip("Postgres writers run side by side: there is no line order to see")

    def counting(session_id: str) -> Callable[[AsyncSession], Awaitable[int]]:
        async def write(session: AsyncSession) -> int:
            before = (await session.execute(select(func.count()).select_from(Session))).scalar()
            await session.execute(insert(Session).values(**session_row(session_id)))
            return int(before or 0)

        return write

    async def scenario(engine: AsyncEngine) -> list[object]:
        return await _burst(engine, [counting(f"s-{i}") for i in range(10)])

    assert _run(migrated_db_url, scenario) == list(range(10))


@pytest.mark.spec("STORE-3")
def test_a_failed_commit_fails_every_member_and_stores_nothing(migrated_db_url: str) -> None:
    """If the shared commit fails, no caller is told its write succeeded."""

    async def scenario(engine: AsyncEngine) -> tuple[list[object], set[str]]:
        failures = {"left": 1}

        def refuse_commit(_connection: object) -> None:
            if failures["left"]:
                failures["left"] -= 1
                raise RuntimeError("disk gone")

        event.listen(engine.sync_engine, "commit", refuse_commit)
        results = await _burst(engine, [_insert(f"s-{i}") for i in range(6)])
        event.remove(engine.sync_engine, "commit", refuse_commit)
        return results, await _ids(engine)

    results, stored = _run(migrated_db_url, scenario)
    failed = [r for r in results if isinstance(r, RuntimeError)]
    succeeded = [r for r in results if isinstance(r, str)]
    assert failed, "the refused commit reached no caller"
    assert all(str(r) == "disk gone" for r in failed)
    # Exactly the callers told of success are stored: on SQLite the whole first group failed.
    assert stored == set(succeeded)
    assert len(failed) + len(succeeded) == 6
    if backend_name(migrated_db_url) == "sqlite":
        assert len(failed) > 1, "the failed commit did not fail its whole group"


@pytest.mark.spec("STORE-3")
def test_commit_hooks_run_in_commit_order_before_any_caller_returns(
    migrated_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The activity publication of a member runs in commit order (HOST-OBS-1's observer)."""
    log: list[str] = []

    async def scenario(engine: AsyncEngine) -> None:
        runner = TransactionRunner(engine, scope=_scope)
        queue = sqlite_write_queue(engine)

        async def one(index: int) -> None:
            def publish_after(_scope: AsyncSession) -> Awaitable[Callable[[], Awaitable[None]]]:
                async def make() -> Callable[[], Awaitable[None]]:
                    async def publish() -> None:
                        log.append(f"published {index}")

                    return publish

                return make()

            await runner.run(_insert(f"s-{index}"), before_commit=publish_after)
            log.append(f"returned {index}")

        if queue is None:
            for index in range(6):
                await one(index)
            return
        async with queue.exclusive():
            tasks = [asyncio.create_task(one(i)) for i in range(6)]
            await _until_waiting(engine, 6)
        await asyncio.gather(*tasks)

    _run(migrated_db_url, scenario)
    published = [entry for entry in log if entry.startswith("published")]
    assert published == [f"published {i}" for i in range(6)]
    for index in range(6):
        assert log.index(f"published {index}") < log.index(f"returned {index}")
    if backend_name(migrated_db_url) == "sqlite":
        # The first group's hooks all ran before its first member returned.
        assert log[:2] == ["published 0", "published 1"]


@pytest.mark.spec("STORE-3")
def test_a_caller_cancelled_in_line_writes_nothing_and_the_line_goes_on(
    migrated_db_url: str,
) -> None:
    async def scenario(engine: AsyncEngine) -> tuple[list[object], set[str]]:
        runner = TransactionRunner(engine, scope=_scope)
        queue = sqlite_write_queue(engine)
        if queue is None:
            pytest.skip("Postgres has no write line")
        async with queue.exclusive():
            tasks = [asyncio.create_task(runner.run(_insert(f"s-{i}"))) for i in range(5)]
            await _until_waiting(engine, 5)
            tasks[2].cancel()
            await asyncio.sleep(0)
            assert queue.waiting == 4
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return list(results), await _ids(engine)

    results, stored = _run(migrated_db_url, scenario)
    assert isinstance(results[2], asyncio.CancelledError)
    assert stored == {"s-0", "s-1", "s-3", "s-4"}


@pytest.mark.spec("STORE-3")
def test_a_caller_cancelled_after_its_work_waits_for_the_commit_it_joined(
    migrated_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its lane must outlast its transaction: it returns (cancelled) only once the group ended,
    and after its post-commit hooks ran (its write is stored: what follows a commit follows)."""
    hooks_ran: list[str] = []

    def scope(session: AsyncSession, uow: UnitOfWork) -> AsyncSession:
        async def after() -> None:
            hooks_ran.append("after_commit")

        uow.after_commit(after)
        return session

    async def scenario(engine: AsyncEngine) -> tuple[bool, set[str]]:
        runner = TransactionRunner(engine, scope=scope)
        queue = sqlite_write_queue(engine)
        if queue is None:
            pytest.skip("Postgres has no shared commit")
        second_inside = asyncio.Event()
        release = asyncio.Event()

        async def slow_second(session: AsyncSession) -> str:
            await session.execute(insert(Session).values(**session_row("s-1")))
            second_inside.set()
            await release.wait()
            return "s-1"

        async with queue.exclusive():
            first = asyncio.create_task(runner.run(_insert("s-0")))
            second = asyncio.create_task(runner.run(slow_second))
            await _until_waiting(engine, 2)
        await second_inside.wait()
        first.cancel()  # its work is done and in the group; the group has not committed
        await asyncio.sleep(0.05)
        waited = not first.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await first
        await second
        return waited, await _ids(engine)

    waited, stored = _run(migrated_db_url, scenario)
    assert waited, "the cancelled caller returned before the commit it joined"
    assert stored == {"s-0", "s-1"}
    assert hooks_ran == ["after_commit", "after_commit"]


@pytest.mark.spec("STORE-3")
def test_a_commit_hook_that_raises_cancelled_still_lets_every_member_return(
    migrated_db_url: str,
) -> None:
    """A hook's BaseException must not leave the group's members without their outcome."""
    if backend_name(migrated_db_url) != "sqlite":
        pytest.skip("commit hooks run in the write line only on SQLite")

    async def scenario(engine: AsyncEngine) -> tuple[list[object], set[str]]:
        runner = TransactionRunner(engine, scope=_scope)
        queue = sqlite_write_queue(engine)
        assert queue is not None

        async def hook_factory(_scope: AsyncSession) -> Callable[[], Awaitable[None]]:
            async def publish() -> None:
                raise asyncio.CancelledError  # e.g. it awaited a task someone cancelled

            return publish

        async with queue.exclusive():
            tasks = [
                asyncio.create_task(runner.run(_insert(f"s-{i}"), before_commit=hook_factory))
                for i in range(3)
            ]
            await _until_waiting(engine, 3)
        _, pending = await asyncio.wait(tasks, timeout=10)
        assert not pending, "members were left waiting for an outcome"
        results = [t.exception() or t.result() for t in tasks]
        assert queue.waiting == 0
        follow = await runner.run(_insert("s-after"))  # the line goes on
        return [*results, follow], await _ids(engine)

    results, stored = _run(migrated_db_url, scenario)
    assert results == ["s-0", "s-1", "s-2", "s-after"]
    assert stored == {"s-0", "s-1", "s-2", "s-after"}


@pytest.mark.spec("STORE-3")
def test_a_group_that_cannot_roll_back_a_member_fails_as_a_retryable_conflict(
    migrated_db_url: str,
) -> None:
    """A savepoint that cannot be rolled back ends the group; its members get STORE_CONFLICT."""

    async def scenario(engine: AsyncEngine) -> tuple[list[object], set[str]]:
        original = AsyncSession.rollback
        broken = {"left": 1}

        async def rollback(self: AsyncSession) -> None:
            if broken["left"]:
                broken["left"] -= 1
                raise RuntimeError("connection lost mid-rollback")
            await original(self)

        AsyncSession.rollback = rollback  # type: ignore[method-assign]
        try:
            results = await _burst(
                engine, [_insert(f"s-{i}", then_fail=(i == 1)) for i in range(4)]
            )
        finally:
            AsyncSession.rollback = original  # type: ignore[method-assign]
        return results, await _ids(engine)

    if backend_name(migrated_db_url) != "sqlite":
        pytest.skip("only a shared commit has members to poison")
    results, stored = _run(migrated_db_url, scenario)
    assert isinstance(results[1], FailedPrecondition)  # its own error, as ever
    # Its neighbour committed nothing and is told so, as a retryable conflict.
    assert isinstance(results[0], Aborted)
    assert results[0].reason == "STORE_CONFLICT"
    assert not {"s-0", "s-1"} & stored
    # Writers behind the broken group were not harmed by it.
    assert results[2:] == ["s-2", "s-3"]
    assert {"s-2", "s-3"} <= stored


def test_a_rolled_back_group_maps_to_a_retryable_conflict() -> None:
    mapped = retryable_error(GroupRolledBack("a member's savepoint could not be rolled back"))
    assert isinstance(mapped, Aborted)
    assert mapped.reason == "STORE_CONFLICT"
    assert mapped.retry_after_seconds


@pytest.mark.spec("STORE-3")
def test_group_commit_off_commits_each_writer_alone(migrated_db_url: str) -> None:
    if backend_name(migrated_db_url) != "sqlite":
        pytest.skip("the switch is SQLite's")

    async def scenario(engine: AsyncEngine) -> tuple[list[object], set[str]]:
        runner = TransactionRunner(engine, scope=_scope)
        results = await asyncio.gather(*(runner.run(_insert(f"s-{i}")) for i in range(10)))
        queue = sqlite_write_queue(engine)
        assert queue is not None
        assert queue.groups_committed == 0
        return list(results), await _ids(engine)

    results, stored = _run(migrated_db_url, scenario, sqlite_group_commit=False)
    assert results == [f"s-{i}" for i in range(10)]
    assert stored == {f"s-{i}" for i in range(10)}


@pytest.mark.spec("STORE-3")
def test_a_group_stays_open_about_as_long_as_a_commit_costs(
    sqlite_template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cheap commits (NORMAL) keep groups small; dear ones (FULL, an fsync) let them grow."""
    monkeypatch.undo()  # the real window
    queue = WriteQueue(30.0, 100, group_commit=True)
    assert queue._window() == 0.0  # nothing measured yet: no waiting for others
    queue._commit_took(0.000_01)
    assert queue._window() == pytest.approx(0.000_02)
    for _ in range(50):
        queue._commit_took(1.0)  # a very slow disk: bounded all the same
    assert queue._window() == write_queue.MAX_GROUP_SECONDS

    path = tmp_path / "store.sqlite3"
    shutil.copyfile(sqlite_template, path)

    async def scenario(engine: AsyncEngine) -> tuple[float, set[str]]:
        results = await _burst(engine, [_insert(f"s-{i}") for i in range(20)])
        assert results == [f"s-{i}" for i in range(20)]
        line = sqlite_write_queue(engine)
        assert line is not None
        assert line.members_committed == 20
        return line.commit_seconds, await _ids(engine)

    commit_seconds, stored = _run(f"sqlite:///{path}", scenario, sqlite_synchronous="FULL")
    assert commit_seconds > 0
    assert len(stored) == 20


def test_an_unknown_synchronous_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="sqlite_synchronous"):
        create_async_engine_for("sqlite:///unused.db", sqlite_synchronous="OFF")


@pytest.mark.parametrize(
    ("synchronous", "grouped"), [("NORMAL", False), ("FULL", True), ("full", True)]
)
def test_group_commit_defaults_to_on_exactly_when_commits_fsync(
    synchronous: str, grouped: bool, tmp_path: Path
) -> None:
    engine = create_async_engine_for(
        f"sqlite:///{tmp_path / 'x.db'}", sqlite_synchronous=synchronous
    )
    queue = sqlite_write_queue(engine)
    assert queue is not None
    assert queue.group_commit is grouped
