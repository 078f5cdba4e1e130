"""Unit of work with transaction participants: the STORE-4 seam.

A domain command runs inside exactly one database transaction (STORE-3). It receives a *scope*
built by the store (typically its repositories) and never the raw connection. An adapter that
must record its own durable facts in the same commit — an outbox marker for a runtime command,
resource-cleanup rows for a purge, a Goal operation intent — supplies a **participant**: an async
callable that receives the SQLAlchemy ``AsyncSession`` of that transaction and appends its rows.
Participants run after the command body and before the commit, so their rows commit or roll back
together with the command's. Participants are for facts that *must* be atomic with the command;
re-derivable projections are repaired by their consumers instead.

Post-commit hooks (``UnitOfWork.after_commit``) run only after a successful commit, in order. A
failing hook is logged and never undoes the committed command (HOST-OBS-1: publication is a wake
hint, the durable row is the truth).

Example::

    runner = TransactionRunner(engine, scope=lambda session, uow: HostRepositories(session, uow))

    async def purge(repos: HostRepositories) -> list[str]:
        purged = await repos.sessions.purge_tree(...)
        repos.uow.enlist(cleanup_outbox.rows_for(purged))  # adapter-owned participant
        return purged

    purged = await runner.run(purge)
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from domainerrors import DomainError
from store.contention import retryable_error
from store.engine import SQLITE_BEGIN_OPTION, sqlite_write_queue, sqlite_write_slot
from store.write_queue import GroupMember

__all__ = [
    "CommitHook",
    "ScopeFactory",
    "TransactionParticipant",
    "TransactionRunner",
    "UnitOfWork",
    "UnitOfWorkClosedError",
    "finish_abandoned",
    "write_session",
]

_log = logging.getLogger(__name__)

ScopeT = TypeVar("ScopeT")
ResultT = TypeVar("ResultT")

TransactionParticipant = Callable[[AsyncSession], Awaitable[None]]
"""Appends an adapter's durable rows to the open transaction; raising rolls everything back."""

CommitHook = Callable[[], Awaitable[None]]
"""Runs after the transaction committed (a wake hint, a metric); its failure is only logged."""

ScopeFactory = Callable[[AsyncSession, "UnitOfWork"], ScopeT]
"""Builds what the domain command receives (repositories bound to the session) from the open
transaction. The factory is store-side code; the domain only sees its result."""


class UnitOfWorkClosedError(RuntimeError):
    """A participant or hook was registered after its transaction finished."""


class UnitOfWork:
    """The domain-facing handle of one open transaction.

    It lets the command (or code it calls) enlist participants and post-commit hooks. It
    deliberately exposes no connection or session.
    """

    def __init__(self, participants: Sequence[TransactionParticipant] = ()) -> None:
        self._participants: list[TransactionParticipant] = list(participants)
        self._hooks: list[CommitHook] = []
        self._open = True
        self._cancel_after_hooks = False

    def enlist(self, participant: TransactionParticipant) -> None:
        """Add a participant; it runs after the command body, before the commit.

        Raises:
            UnitOfWorkClosedError: the transaction already committed or rolled back.
        """
        self._require_open()
        self._participants.append(participant)

    def after_commit(self, hook: CommitHook) -> None:
        """Add a hook that runs only if and after the transaction commits.

        Raises:
            UnitOfWorkClosedError: the transaction already committed or rolled back.
        """
        self._require_open()
        self._hooks.append(hook)

    def _require_open(self) -> None:
        if not self._open:
            raise UnitOfWorkClosedError("the unit of work has already finished")

    async def _run_participants(self, session: AsyncSession) -> None:
        # Participants may enlist further participants; run until none are left.
        index = 0
        while index < len(self._participants):
            participant = self._participants[index]
            index += 1
            await participant(session)
            await session.flush()

    def _close(self) -> list[CommitHook]:
        self._open = False
        hooks, self._hooks = self._hooks, []
        self._participants = []
        return hooks


@asynccontextmanager
async def write_session(engine: AsyncEngine) -> AsyncIterator[AsyncSession]:
    """One write transaction outside a :class:`TransactionRunner` (maintenance jobs).

    Like ``TransactionRunner.run(..., write=True)``: the transaction waits for this
    process's SQLite write slot, begins ``IMMEDIATE``, commits when the block ends and rolls
    back when it raises; contention surfaces as ``Unavailable``/``Aborted``
    (``store.contention``).
    """
    try:
        async with (
            sqlite_write_slot(engine),
            AsyncSession(engine, expire_on_commit=False) as session,
        ):
            await session.connection(execution_options={SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            try:
                yield session
                await session.commit()
            except BaseException:
                await session.rollback()
                raise
    except Exception as exc:
        mapped = retryable_error(exc)
        if mapped is None:
            raise
        raise mapped from exc


@asynccontextmanager
async def write_connection(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """One Core write transaction, queued and mapped like :func:`write_session`.

    For repositories that write with Core statements on a connection (the reference
    backends, maintenance): waits for this process's SQLite write slot, begins
    ``IMMEDIATE``, commits when the block ends, rolls back when it raises; contention
    surfaces as ``Unavailable``/``Aborted`` instead of an internal error.
    """
    try:
        async with sqlite_write_slot(engine), engine.connect() as connection:
            connection = await connection.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            async with connection.begin():
                yield connection
    except Exception as exc:
        mapped = retryable_error(exc)
        if mapped is None:
            raise
        raise mapped from exc


class TransactionRunner(Generic[ScopeT]):
    """Runs domain commands, each in one transaction with its participants.

    Args:
        engine: the store's async engine (``store.engine.create_async_engine_for``).
        scope: builds the command's scope from the transaction's session and unit of work.
        participants: standing participants enlisted in every transaction of this runner
            (for example an adapter that always records an audit row).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        scope: ScopeFactory[ScopeT],
        *,
        participants: Sequence[TransactionParticipant] = (),
    ) -> None:
        self._engine = engine
        self._scope = scope
        self._standing = tuple(participants)

    async def run(
        self,
        command: Callable[[ScopeT], Awaitable[ResultT]],
        *,
        participants: Sequence[TransactionParticipant] = (),
        write: bool = True,
        before_commit: Callable[[ScopeT], Awaitable[CommitHook | None]] | None = None,
    ) -> ResultT:
        """Run ``command`` and every participant in one transaction, then the commit hooks.

        Args:
            command: the domain command; receives the scope built for this transaction.
            participants: caller-owned participants for this command only.
            before_commit: runs last in the transaction, after every participant (so it sees
                everything the transaction wrote), with the command's scope; the hook it
                returns runs first after the commit (an outbox's publication). With SQLite
                group commit it runs in commit order while the write line waits for it, so it
                must not await the store or anything slow (``GroupMember.on_commit``).
            write: the transaction writes. On SQLite it then waits in this process's write
                line (``store.write_queue``: writers queue instead of polling SQLite's lock)
                and runs inside a ``BEGIN IMMEDIATE`` transaction (the write lock is taken up
                front, so a read-then-write cannot fail on a stale snapshot). With group
                commit (the default) concurrent writes share that transaction, each in its
                own savepoint, and commit once; each caller still gets its own outcome, after
                the shared commit. Post-commit hooks run after the writer is released.

        Returns:
            What ``command`` returned.

        Raises:
            domainerrors.Unavailable: ``STORE_BUSY``, the store did not admit the transaction
                in time (``store.contention``); nothing was committed.
            domainerrors.Aborted: ``STORE_CONFLICT``, the database aborted the transaction
                (serialization failure, deadlock); nothing was committed.
            Exception: whatever the command or a participant raised; nothing was committed.

        A write command must never wait, inside its transaction, for another writer or for
        what another writer's caller does after its own ``run`` returns: the writers of a
        SQLite process run one at a time, and a grouped writer returns only after the
        members behind it ran, so such a wait never ends.

        Cancellation: a write transaction is cancelled with its caller and rolls back (its
        caller may hold the Session's lane); a grouped SQLite writer whose work already
        joined its group's commit waits for that commit, runs its post-commit hooks and only
        then sees the cancellation (its write is stored). A read transaction runs to its end
        in its own task (a cancelled client never leaves a rollback half done or a connection
        the pool must reset from a cancelled task), and the caller still sees the
        cancellation.
        """
        if write:
            # A writer stays cancellable: its caller may hold the Session's lane, which must
            # not be released while the transaction still runs (HOST-LANE-1).
            return await self._run_to_end(command, participants, write, before_commit)
        task = asyncio.ensure_future(self._run_to_end(command, participants, write, before_commit))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            _abandoned.setdefault(self._engine.sync_engine, set()).add(task)
            task.add_done_callback(_log_abandoned)
            raise

    async def _run_to_end(
        self,
        command: Callable[[ScopeT], Awaitable[ResultT]],
        participants: Sequence[TransactionParticipant],
        write: bool,
        before_commit: Callable[[ScopeT], Awaitable[CommitHook | None]] | None,
    ) -> ResultT:
        unit = UnitOfWork((*self._standing, *participants))
        first: list[CommitHook] = []
        try:
            result = await self._run_once(
                command, unit, write=write, finish=before_commit, first=first
            )
        except Exception as exc:
            mapped = retryable_error(exc)
            if mapped is None:
                raise
            raise mapped from exc
        for hook in (*first, *unit._close()):
            try:
                await hook()
            except Exception:  # noqa: BLE001 - a post-commit hook never undoes a commit
                _log.exception("post-commit hook %r failed", hook)
        if unit._cancel_after_hooks:
            raise asyncio.CancelledError
        return result

    async def _run_once(
        self,
        command: Callable[[ScopeT], Awaitable[ResultT]],
        unit: UnitOfWork,
        *,
        write: bool,
        finish: Callable[[ScopeT], Awaitable[CommitHook | None]] | None,
        first: list[CommitHook],
    ) -> ResultT:
        queue = sqlite_write_queue(self._engine) if write else None
        if queue is not None and queue.group_commit:
            async with queue.member(self._engine) as member:
                result = await self._in_group(command, unit, member, finish)
            # Cancelled while its stored work waited for the shared commit: the caller's
            # post-commit hooks still run, then the cancellation (``_run_to_end``).
            unit._cancel_after_hooks = member.cancelled_meanwhile
            return result
        begin = "IMMEDIATE" if write else "DEFERRED"
        async with sqlite_write_slot(self._engine) if write else _no_slot():
            return await self._in_session(command, unit, begin, finish, first)

    async def _body(
        self,
        session: AsyncSession,
        command: Callable[[ScopeT], Awaitable[ResultT]],
        unit: UnitOfWork,
        finish: Callable[[ScopeT], Awaitable[CommitHook | None]] | None,
        keep_hook: Callable[[CommitHook], None],
    ) -> ResultT:
        """The command, its participants and ``finish`` (whose hook goes to ``keep_hook``)."""
        scope = self._scope(session, unit)
        result = await command(scope)
        await session.flush()
        await unit._run_participants(session)
        if finish is not None:
            hook = await finish(scope)
            if hook is not None:
                keep_hook(hook)
            await session.flush()
        return result

    async def _in_group(
        self,
        command: Callable[[ScopeT], Awaitable[ResultT]],
        unit: UnitOfWork,
        member: GroupMember,
        finish: Callable[[ScopeT], Awaitable[CommitHook | None]] | None,
    ) -> ResultT:
        """The command as one member of a SQLite group commit: a savepoint of the group.

        The hook ``finish`` returns (the activity publication) runs in commit order, right
        after the group's commit (``store.write_queue``).
        """
        # The first member owns the transaction's rollback (nothing before it to keep);
        # every later one works in a savepoint, so its failure leaves the others' work.
        async with AsyncSession(
            bind=member.connection,
            expire_on_commit=False,
            join_transaction_mode="rollback_only" if member.first else "create_savepoint",
        ) as session:
            try:
                result = await self._body(session, command, unit, finish, member.on_commit)
                await session.commit()  # flushes (and releases a savepoint); the group commits
            except BaseException:
                unit._close()
                try:
                    await session.rollback()  # to its savepoint, or the whole (first) one
                except BaseException as exc:  # noqa: BLE001 - the group must not go on
                    member.poison(exc)
                raise
        return result

    async def _in_session(
        self,
        command: Callable[[ScopeT], Awaitable[ResultT]],
        unit: UnitOfWork,
        begin: str,
        finish: Callable[[ScopeT], Awaitable[CommitHook | None]] | None,
        first: list[CommitHook],
    ) -> ResultT:
        async with AsyncSession(self._engine, expire_on_commit=False) as session:
            try:
                await session.connection(execution_options={SQLITE_BEGIN_OPTION: begin})
                result = await self._body(session, command, unit, finish, first.append)
                await session.commit()
            except BaseException:
                unit._close()
                await session.rollback()
                raise
        return result


_abandoned: weakref.WeakKeyDictionary[Engine, set[asyncio.Future[Any]]] = (
    weakref.WeakKeyDictionary()
)
"""Commands still running for callers that were cancelled, per engine (see ``run``)."""


_ABANDONED_WAIT_SECONDS = 10.0
"""How long a dispose waits for the commands of cancelled callers."""


async def finish_abandoned(engine: AsyncEngine) -> None:
    """Wait (boundedly) for the commands of cancelled callers to end, before a dispose."""
    tasks = {task for task in _abandoned.pop(engine.sync_engine, set()) if not task.done()}
    if tasks:
        await asyncio.wait(tasks, timeout=_ABANDONED_WAIT_SECONDS)


def _log_abandoned(task: asyncio.Future[Any]) -> None:
    """The outcome of a command whose caller was cancelled after its transaction began."""
    for tasks in _abandoned.values():
        tasks.discard(task)
    if task.cancelled():
        return
    error = task.exception()
    if error is None or isinstance(error, DomainError):
        _log.debug("a cancelled caller's command finished: %r", error)
    else:
        _log.warning("a cancelled caller's command failed", exc_info=error)


@asynccontextmanager
async def _no_slot() -> AsyncIterator[None]:
    yield
