"""This process's line of SQLite write transactions, with group commit (STORE-3, issue #15).

SQLite admits one writer at a time. Without a line, concurrent ``BEGIN IMMEDIATE`` calls wait
in SQLite's busy handler, which sleeps and polls: latency grows with the number of writers and a
writer can starve past the busy timeout. Writers of this process therefore wait in one line per
engine (first come, first served) and only its head talks to SQLite; other processes on the same
file still meet the busy timeout.

**Group commit.** A write transaction that may share a commit (:meth:`WriteQueue.member`, used
by ``store.transactions.TransactionRunner``) does not get a transaction of its own: it runs as a
``SAVEPOINT`` inside one ``BEGIN IMMEDIATE`` transaction that it shares with the members queued
behind it, and the group commits once. Members run one at a time, in arrival order, each in its
caller's task. Semantics per member are those of its own transaction:

- a member that fails rolls back to its savepoint and its caller sees its own error at once;
  the other members are untouched;
- a member returns only after the group's commit, and its outcome is the commit's outcome: if
  the commit fails, every member of the group fails with it and nothing of the group is stored;
- a member sees what the members before it in the same group wrote — exactly what it would
  have seen had they committed before it began, which they would have, in line;
- the commit hooks a member registers (:meth:`GroupMember.on_commit`, the activity
  publication) run in commit order, before any member returns, so observers see commits in the
  order they happened;
- if a savepoint cannot be rolled back (the connection is in an unknown state) the whole group
  rolls back and every member fails with :class:`GroupRolledBack`, a retryable conflict.

**How long a group stays open.** Sharing a commit only pays when the commit is dear: an early
member's commit waits for the bodies of the members behind it, so grouping trades its latency
for fewer commits. A group therefore admits further members only while it has been open for
less than the commit costs (a moving average of this line's commits, times
:data:`GROUP_WINDOW_COMMITS`), never longer than :data:`MAX_GROUP_SECONDS` and never more than
:data:`MAX_GROUP_MEMBERS` members. With ``synchronous=FULL`` a commit waits for an ``fsync``
(hundreds of microseconds to milliseconds), and the writers that queued meanwhile share the
next one; with ``synchronous=NORMAL`` in WAL mode a commit is a few microseconds of memory
work and groups stay small, so nobody waits for nothing.

Exclusive holders (:meth:`WriteQueue.exclusive`: maintenance, the reference stores,
compaction) get the writer alone, as before, in the same line.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Final

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = [
    "MAX_GROUP_MEMBERS",
    "MAX_GROUP_SECONDS",
    "GroupMember",
    "GroupRolledBack",
    "SqliteWriteSlotTimeout",
    "WriteQueue",
]

_log = logging.getLogger(__name__)

MAX_GROUP_MEMBERS: Final = 64
"""Most write transactions one commit carries."""

MAX_GROUP_SECONDS: Final = 0.02
"""Longest a group stays open for further members after its first began (its first member's
commit waits at most this long, plus the last member's own work, for the others)."""

GROUP_WINDOW_COMMITS: Final = 2.0
"""A group stays open for further members this many average commit durations."""

_COMMIT_AVERAGE_WEIGHT: Final = 0.2
"""Weight of the newest commit in the moving average of commit durations."""

CommitHook = Callable[[], Awaitable[None]]


class SqliteWriteSlotTimeout(TimeoutError):
    """This process's write line did not admit the transaction (waited too long, or full)."""


class GroupRolledBack(RuntimeError):
    """A group commit rolled back as a whole; nothing of this member was stored (retryable)."""


@dataclass(eq=False)
class _Waiter:
    line: _Line
    engine: AsyncEngine | None
    turn: asyncio.Future[AsyncConnection | None]
    # Grouped: the member's body ended (True: its savepoint was released, False: rolled back).
    finished: asyncio.Future[bool]
    # Grouped: the group's commit outcome. Exclusive: the holder released the writer.
    outcome: asyncio.Future[None]
    hooks: list[CommitHook] = field(default_factory=list)
    poisoned: BaseException | None = None
    queued: bool = True
    alone: bool = True
    cancelled_meanwhile: bool = False
    """The first member of its transaction: nothing before it needs a savepoint's protection."""

    @property
    def grouped(self) -> bool:
        return self.engine is not None


class GroupMember:
    """A write transaction's place in a group commit."""

    def __init__(self, waiter: _Waiter, connection: AsyncConnection) -> None:
        self._waiter = waiter
        self.connection = connection
        """The group's connection, inside its open transaction."""

    @property
    def first(self) -> bool:
        """Nothing precedes this member in its transaction.

        It then runs in the transaction itself (its rollback rolls the transaction back)
        instead of in a savepoint.
        """
        return self._waiter.alone

    @property
    def cancelled_meanwhile(self) -> bool:
        """The caller was cancelled while its committed work waited for the group's commit.

        The block returned normally (the write is stored); the caller re-delivers the
        cancellation after its own post-commit work.
        """
        return self._waiter.cancelled_meanwhile

    def on_commit(self, hook: CommitHook) -> None:
        """Run ``hook`` right after the group commits, in commit order, before members return.

        Its failure is logged and never undoes the commit. It runs while the process's write
        line waits for it: it must not await the store (a hook that writes would wait in the
        line it blocks) nor anything slow; the activity publication is an in-memory hand-off.
        """
        self._waiter.hooks.append(hook)

    def poison(self, error: BaseException) -> None:
        """The savepoint could not be rolled back: the whole group must roll back."""
        self._waiter.poisoned = error


class _Line:
    """The waiters of one event loop and the task that admits them."""

    def __init__(self) -> None:
        self.waiters: deque[_Waiter] = deque()
        self.driver: asyncio.Task[None] | None = None


class WriteQueue:
    """The line of one SQLite engine's write transactions in this process.

    Args:
        timeout_seconds: how long a writer may wait in line before it is refused.
        max_waiting: writers that may wait at once; the next is refused at once.
        group_commit: members share commits (``member``); off, every write transaction takes
            the writer alone (``exclusive``) and commits alone, the baseline the group
            commit is measured against.
    """

    def __init__(self, timeout_seconds: float, max_waiting: int, *, group_commit: bool) -> None:
        self.timeout_seconds = timeout_seconds
        self.max_waiting = max_waiting
        self.group_commit = group_commit
        self.waiting = 0
        """Writers waiting for their turn (not yet admitted, not gone)."""
        self.groups_committed = 0
        self.commit_seconds = 0.0
        """Moving average of this line's commit durations (sets how long groups stay open)."""
        self.members_committed = 0
        # One line per event loop: futures belong to the loop that made them.
        self._lines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Line] = (
            weakref.WeakKeyDictionary()
        )

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Hold the writer alone for the block (the caller begins its own transaction).

        Raises:
            SqliteWriteSlotTimeout: not admitted within the timeout, or the line is full.
        """
        waiter = await self._wait_turn(None)
        try:
            yield
        finally:
            if not waiter.outcome.done():
                waiter.outcome.set_result(None)

    @asynccontextmanager
    async def member(self, engine: AsyncEngine) -> AsyncIterator[GroupMember]:
        """Run the block as one member of a group commit on ``engine``.

        The block runs its work on ``GroupMember.connection``: in the transaction itself when
        ``GroupMember.first`` (rolling it back on failure), else in a savepoint it releases
        (normal exit) or rolls back (raising; call ``poison`` if the rollback failed). Normal
        exit returns once the group committed.

        Raises:
            SqliteWriteSlotTimeout: not admitted within the timeout, or the line is full.
            GroupRolledBack: the group rolled back as a whole; nothing of this member stored.
            Exception: the group's ``BEGIN`` or ``COMMIT`` failed (a driver error).
        """
        if not self.group_commit:
            raise RuntimeError("group commit is off for this engine: use exclusive()")
        waiter = await self._wait_turn(engine)
        connection = waiter.turn.result()
        assert connection is not None
        try:
            yield GroupMember(waiter, connection)
        except BaseException:
            waiter.finished.set_result(False)
            raise
        waiter.finished.set_result(True)
        # The member's work is in the group now: its caller learns the commit's outcome even
        # when cancelled meanwhile (it may hold the Session's lane, which must outlast it).
        # A cancellation that arrives meanwhile is kept for the caller to re-deliver once it
        # has run its own post-commit work (``cancelled_meanwhile``): its write is stored.
        while not waiter.outcome.done():
            try:
                await asyncio.shield(waiter.outcome)
            except asyncio.CancelledError:
                waiter.cancelled_meanwhile = True
            except BaseException:  # noqa: BLE001, S110 - the outcome is read below
                pass
        waiter.outcome.result()

    async def _wait_turn(self, engine: AsyncEngine | None) -> _Waiter:
        if self.waiting >= self.max_waiting:
            raise SqliteWriteSlotTimeout(
                f"the SQLite write queue is full ({self.waiting} writers waiting)"
            )
        loop = asyncio.get_running_loop()
        line = self._lines.get(loop)
        if line is None:
            line = self._lines[loop] = _Line()
        waiter = _Waiter(
            line, engine, loop.create_future(), loop.create_future(), loop.create_future()
        )
        line.waiters.append(waiter)
        self.waiting += 1
        if line.driver is None:
            line.driver = loop.create_task(self._drive(line))
        try:
            async with asyncio.timeout(self.timeout_seconds):
                await asyncio.shield(waiter.turn)
        except TimeoutError as exc:
            self._give_back(waiter)
            raise SqliteWriteSlotTimeout(
                f"no SQLite write slot within {self.timeout_seconds:g} s"
            ) from exc
        except BaseException:
            self._give_back(waiter)
            raise
        return waiter

    def _give_back(self, waiter: _Waiter) -> None:
        """A waiter left before it used its turn (timeout, cancellation, failed BEGIN)."""
        if not waiter.turn.done():
            waiter.turn.cancel()  # an admitted one is skipped by the driver
            if waiter.queued:
                waiter.queued = False
                waiter.line.waiters.remove(waiter)
                self.waiting -= 1
        elif waiter.grouped:
            if not waiter.finished.done():
                waiter.finished.set_result(False)
        elif not waiter.outcome.done():
            waiter.outcome.set_result(None)

    def _admit(self, line: _Line, *, grouped_only: bool = False) -> _Waiter | None:
        """Remove and return the head waiter (only a grouped one if ``grouped_only``)."""
        if not line.waiters or (grouped_only and not line.waiters[0].grouped):
            return None
        self.waiting -= 1
        waiter = line.waiters.popleft()
        waiter.queued = False
        return waiter

    async def _drive(self, line: _Line) -> None:
        """Admit the line's waiters in order until it is empty."""
        try:
            while (waiter := self._admit(line)) is not None:
                if waiter.turn.cancelled():
                    continue
                try:
                    if waiter.grouped:
                        await self._run_group(line, waiter)
                    else:
                        waiter.turn.set_result(None)
                        await asyncio.shield(waiter.outcome)
                except Exception:  # noqa: BLE001 - the line must go on for the others
                    _log.exception("the SQLite write line failed a writer")
        finally:
            line.driver = None

    async def _run_group(self, line: _Line, first: _Waiter) -> None:
        """One shared transaction: ``first``, then the grouped waiters behind it, one commit."""
        from store.engine import SQLITE_BEGIN_OPTION  # store.engine imports this module

        assert first.engine is not None
        admitted: list[_Waiter] = []
        members: list[_Waiter] = []
        try:
            async with first.engine.connect() as connection:
                connection = await connection.execution_options(
                    **{SQLITE_BEGIN_OPTION: "IMMEDIATE"}
                )
                try:
                    await self._run_members(line, connection, first, admitted, members)
                except BaseException:
                    # A failed COMMIT may leave SQLite's transaction open, and a poisoned
                    # savepoint leaves it unknown: close the connection, which rolls back.
                    await connection.invalidate()
                    raise
        except BaseException as exc:
            failure = exc if isinstance(exc, Exception) else GroupRolledBack(repr(exc))
            for waiter in dict.fromkeys((first, *admitted)):
                if not waiter.turn.done():
                    waiter.turn.set_exception(failure)  # its BEGIN failed: its own error
                    continue
                if waiter.turn.cancelled() or waiter.turn.exception() is not None:
                    continue
                rolled_back = waiter.finished.done() and not waiter.finished.result()
                if not rolled_back and not waiter.outcome.done():
                    waiter.outcome.set_exception(failure)
            if not isinstance(exc, Exception):
                raise
            return
        await self._committed(members)

    async def _run_members(
        self,
        line: _Line,
        connection: AsyncConnection,
        first: _Waiter,
        admitted: list[_Waiter],
        members: list[_Waiter],
    ) -> None:
        """Hand the transaction to ``first``, then to each grouped waiter behind it; commit.

        The group's first member runs without a savepoint (nothing before it to protect): if
        it fails it rolls the whole transaction back and the next member begins a new one.
        """
        loop = asyncio.get_running_loop()
        transaction = None
        opened = loop.time()
        waiter: _Waiter | None = first
        while waiter is not None:
            if not connection.in_transaction():  # the first, or a failed first rolled back
                transaction = await connection.begin()
                opened = loop.time()
            if not waiter.turn.done():  # it may have left while we connected or began
                admitted.append(waiter)
                waiter.alone = not members
                waiter.turn.set_result(connection)
                if await waiter.finished:
                    members.append(waiter)
                if waiter.poisoned is not None:
                    raise GroupRolledBack("a member's savepoint could not be rolled back")
            waiter = None
            open_for = loop.time() - opened
            if len(members) < MAX_GROUP_MEMBERS and open_for < self._window():
                waiter = self._admit(line, grouped_only=True)
        if transaction is None or not connection.in_transaction():
            return
        if not members:
            await transaction.rollback()
            return
        started = loop.time()
        await transaction.commit()
        self._commit_took(loop.time() - started)

    def _window(self) -> float:
        """How long a group may stay open for further members."""
        return min(MAX_GROUP_SECONDS, GROUP_WINDOW_COMMITS * self.commit_seconds)

    def _commit_took(self, seconds: float) -> None:
        if self.commit_seconds == 0.0:
            self.commit_seconds = seconds
        else:
            weight = _COMMIT_AVERAGE_WEIGHT
            self.commit_seconds = (1 - weight) * self.commit_seconds + weight * seconds

    async def _committed(self, members: list[_Waiter]) -> None:
        """Run the members' commit hooks in commit order, then let them return.

        The outcomes are set whatever a hook does (even a ``CancelledError``): the commit
        happened, and a member left without its outcome would wait forever.
        """
        try:
            for member in members:
                for hook in member.hooks:
                    try:
                        await hook()
                    except Exception:  # noqa: BLE001 - a commit hook never undoes the commit
                        _log.exception("commit hook %r failed", hook)
                    except asyncio.CancelledError:
                        # The hook's own await was cancelled, not the line: go on.
                        _log.warning("commit hook %r was cancelled", hook)
        finally:
            if members:
                self.groups_committed += 1
                self.members_committed += len(members)
            for member in members:
                if not member.outcome.done():
                    member.outcome.set_result(None)
