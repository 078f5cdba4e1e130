"""The transaction scope of delete, restore and purge commands.

Delete terminalizes Turns and Interactions with the activity lifecycle's own rules (and
repositories) and writes tombstones with :class:`DeletionRepository`, all in one transaction.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from services.host.repository.activity_scope import ActivityRepositories
from services.host.repository.deletion import DeletionRepository
from services.host.repository.purge import PurgeRepository
from services.host.repository.sessions import SessionRepository
from store.transactions import TransactionRunner, UnitOfWork

__all__ = ["DeletionScope", "deletion_runner"]


class DeletionScope:
    """Repositories sharing one transaction.

    Attributes:
        deletion: tree reads, tombstones, purge deletes, outbox and event rows.
        purge: the retention purge's set-based reads and fenced deletes, by component.
        activity: the activity lifecycle repositories (Turns, Interactions, commands).
        sessions: Session records as the wire shows them.
        uow: the unit of work (post-commit hooks).
    """

    def __init__(self, session: AsyncSession, uow: UnitOfWork) -> None:
        self.deletion = DeletionRepository(session)
        self.purge = PurgeRepository(session)
        self.activity = ActivityRepositories(session, uow)
        self.sessions = SessionRepository(session)
        self.uow = uow


def deletion_runner(engine: AsyncEngine) -> TransactionRunner[DeletionScope]:
    """A transaction runner whose commands receive :class:`DeletionScope`."""
    return TransactionRunner(engine, scope=DeletionScope)
