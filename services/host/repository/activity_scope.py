"""SQL of the Host activity lifecycle: one repository per table family.

Repositories take the ``AsyncSession`` of the transaction they run in (built by
:class:`ActivityRepositories` as the scope of a ``store.transactions.TransactionRunner``)
and return ORM rows; the domain modules of ``services.host`` hold the rules.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from services.host.repository.command_rows import RuntimeCommandRepository
from services.host.repository.interaction_rows import InteractionRepository
from services.host.repository.message_rows import MessageRepository
from services.host.repository.operation_rows import ResponseOperationRepository
from services.host.repository.session_rows import SessionRowRepository
from services.host.repository.turn_rows import TurnRepository
from store.transactions import TransactionRunner, UnitOfWork

__all__ = ["ActivityRepositories", "activity_runner"]


class ActivityRepositories:
    """The scope of one activity transaction: every repository bound to one session."""

    def __init__(self, session: AsyncSession, uow: UnitOfWork) -> None:
        self.uow = uow
        self.sessions = SessionRowRepository(session)
        self.turns = TurnRepository(session)
        self.messages = MessageRepository(session)
        self.interactions = InteractionRepository(session)
        self.operations = ResponseOperationRepository(session)
        self.commands = RuntimeCommandRepository(session)
        self.dispatching: set[tuple[str, str]] = set()
        """Sessions whose commands this transaction already dispatches (``runtime_commands``)."""


def activity_runner(engine: AsyncEngine) -> TransactionRunner[ActivityRepositories]:
    """A transaction runner whose commands receive :class:`ActivityRepositories`."""
    return TransactionRunner(engine, scope=ActivityRepositories)
