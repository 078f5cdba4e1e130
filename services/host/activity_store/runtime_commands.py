"""The runtime command outbox: commands written with the facts that cause them."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import RuntimeCommandOutbox

UNACKNOWLEDGED = ("pending", "dispatched")


class RuntimeCommandRepository:
    """Reads and writes outbox rows."""

    def __init__(self, session: AsyncSession) -> None:
        self._db = session

    def add(self, row: RuntimeCommandOutbox) -> None:
        """Stage a new command row."""
        self._db.add(row)

    async def get(self, workspace_id: str, command_id: str) -> RuntimeCommandOutbox | None:
        """The command by id."""
        query = select(RuntimeCommandOutbox).where(
            RuntimeCommandOutbox.workspace_id == workspace_id,
            RuntimeCommandOutbox.command_id == command_id,
        )
        return (await self._db.execute(query)).scalar_one_or_none()

    async def by_command_id(self, command_id: str) -> RuntimeCommandOutbox | None:
        """The command by id in any workspace (acks carry only the id; ids are unique UUIDs)."""
        query = select(RuntimeCommandOutbox).where(RuntimeCommandOutbox.command_id == command_id)
        return (await self._db.execute(query)).scalars().first()

    async def unacknowledged(
        self, workspace_id: str | None = None, session_id: str | None = None
    ) -> list[RuntimeCommandOutbox]:
        """Pending or dispatched commands, oldest first (optionally of one Session)."""
        query = select(RuntimeCommandOutbox).where(RuntimeCommandOutbox.state.in_(UNACKNOWLEDGED))
        if workspace_id is not None:
            query = query.where(RuntimeCommandOutbox.workspace_id == workspace_id)
        if session_id is not None:
            query = query.where(RuntimeCommandOutbox.session_id == session_id)
        query = query.order_by(RuntimeCommandOutbox.id)
        return list((await self._db.execute(query)).scalars().all())
