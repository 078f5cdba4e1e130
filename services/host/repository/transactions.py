"""One transaction per domain command, with every host repository bound to it (STORE-3/4)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from services.host.repository.projects import ProjectRepository
from services.host.repository.sessions import SessionRepository
from services.host.repository.targets import TargetRepository
from store.database import Database
from store.transactions import TransactionRunner, UnitOfWork

__all__ = ["HostRepositories", "run"]

ResultT = TypeVar("ResultT")


class HostRepositories:
    """What a host domain command receives: repositories sharing one transaction.

    Attributes:
        targets: agent targets (deployment-wide).
        projects: user projects.
        sessions: Sessions and the entity reads GetSession and listings compose.
        uow: the unit of work (participants, post-commit hooks).
    """

    def __init__(self, session: AsyncSession, uow: UnitOfWork) -> None:
        self.targets = TargetRepository(session)
        self.projects = ProjectRepository(session)
        self.sessions = SessionRepository(session)
        self.uow = uow


async def run(
    database: Database,
    command: Callable[[HostRepositories], Awaitable[ResultT]],
    *,
    write: bool = True,
) -> ResultT:
    """Run ``command`` in one transaction (``write`` begins it IMMEDIATE on SQLite)."""
    runner = TransactionRunner(database.engine, scope=HostRepositories)
    return await runner.run(command, write=write)
