"""The one transaction scope of Host: every repository bound to one transaction (STORE-3/4).

A Host command runs in exactly one transaction and receives a :class:`HostTransaction`, never a
connection. :func:`run` opens it, runs the command and its participants and then, **last in
the same transaction**, the activity outbox: the event rows describing what the command
changed (``tx.changes``, recorded by the repositories' write methods) are appended by the
outbox the caller passes (``services.host.activity.event_log.ActivityLog``). After the commit
the outbox's publication runs first, then the command's own post-commit hooks
(``tx.uow.after_commit``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from services.host.repository.activity_events import EventLogRepository
from services.host.repository.changes import ActivityChanges
from services.host.repository.command_rows import RuntimeCommandRepository
from services.host.repository.deletion import DeletionRepository
from services.host.repository.host_operation_rows import HostOperationRepository
from services.host.repository.interaction_rows import InteractionRepository
from services.host.repository.message_rows import MessageRepository
from services.host.repository.operation_rows import ResponseOperationRepository
from services.host.repository.projects import ProjectRepository
from services.host.repository.purge import PurgeRepository
from services.host.repository.session_rows import SessionRowRepository
from services.host.repository.sessions import SessionRepository
from services.host.repository.targets import TargetRepository
from services.host.repository.turn_rows import TurnRepository
from store.database import Database
from store.direct_writes import TransactionWriteConnection, WriteConnection
from store.transactions import TransactionRunner, UnitOfWork

__all__ = ["ActivityOutbox", "HostTransaction", "run"]

ResultT = TypeVar("ResultT")


class HostTransaction:
    """What a Host command receives: its repositories, sharing one transaction.

    Attributes:
        targets: agent targets (deployment-wide and workspace-private).
        projects: user projects.
        sessions: Session records as the wire shows them, their listings and the entity
            reads ``GetSession`` composes.
        session_rows: Session rows as the activity lifecycle needs them (locks, counters).
        turns: Turn rows.
        messages: transcript rows.
        interactions: Interaction rows.
        operations: response operations of Interactions.
        host_operations: other durable idempotent operations (Session activations).
        commands: the runtime command outbox rows.
        deletion: tree reads, tombstones, restore and the cleanup outbox.
        purge: the retention purge's set-based reads and fenced deletes.
        events: reads of the durable activity event log.
        changes: what this transaction changed, for the activity outbox.
        uow: the unit of work (participants, post-commit hooks).
        dispatching: Sessions whose runtime commands this transaction already dispatches.
    """

    def __init__(self, session: AsyncSession, uow: UnitOfWork) -> None:
        self.changes = ActivityChanges()
        self.targets = TargetRepository(session)
        self.projects = ProjectRepository(session)
        self.sessions = SessionRepository(session, self.changes)
        self.session_rows = SessionRowRepository(session, self.changes)
        self.turns = TurnRepository(session, self.changes)
        self.messages = MessageRepository(session, self.changes)
        self.interactions = InteractionRepository(session, self.changes)
        self.operations = ResponseOperationRepository(session)
        self.host_operations = HostOperationRepository(session)
        self.commands = RuntimeCommandRepository(session)
        self.deletion = DeletionRepository(session, self.changes)
        self.purge = PurgeRepository(session)
        self.events = EventLogRepository(session)
        self.uow = uow
        self.dispatching: set[tuple[str, str]] = set()
        self._session = session

    async def flush(self) -> None:
        """Write staged rows now (so later statements may reference them)."""
        await self._session.flush()

    async def write(self, write: Callable[[WriteConnection], ResultT]) -> ResultT:
        """Run a write function (``store.direct_writes``) on this transaction's connection.

        Staged rows are flushed first, so its statements see everything the transaction
        wrote; what it writes is not in the ORM's identity map, so it reports its rows to
        :attr:`changes` itself (ADR 0034).
        """
        await self._session.flush()
        connection = await self._session.connection()
        return await connection.run_sync(lambda sync: write(TransactionWriteConnection(sync)))


class ActivityOutbox(Protocol):
    """Appends a transaction's activity events before its commit (HOST-OBS-1)."""

    async def append(self, tx: HostTransaction) -> Callable[[], Awaitable[None]] | None:
        """Append the event rows of ``tx.changes``; return the post-commit publication."""


async def run(
    database: Database,
    command: Callable[[HostTransaction], Awaitable[ResultT]],
    *,
    write: bool = True,
    outbox: ActivityOutbox | None = None,
) -> ResultT:
    """Run ``command`` in one transaction, then ``outbox``'s append, then commit.

    Args:
        database: the canonical store.
        command: the domain command.
        write: the transaction writes (``BEGIN IMMEDIATE`` behind the SQLite write slot).
        outbox: the activity outbox (``ctx.activity.log``); ``None`` records no events.

    Raises:
        domainerrors.Unavailable: ``STORE_BUSY`` (``store.contention``); nothing committed.
        domainerrors.Aborted: ``STORE_CONFLICT``; nothing committed.
        Exception: whatever the command raised; nothing committed.
    """

    async def append_events(tx: HostTransaction) -> Callable[[], Awaitable[None]] | None:
        if outbox is None or tx.changes.empty():
            return None
        return await outbox.append(tx)

    runner = TransactionRunner(database.engine, scope=HostTransaction)
    return await runner.run(command, write=write, before_commit=append_events)
