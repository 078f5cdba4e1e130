"""Durable interaction-response operations (HOST-INT-3)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import InteractionResponseOperation


class ResponseOperationRepository:
    """Reads and writes response operations."""

    def __init__(self, session: AsyncSession) -> None:
        self._db = session

    async def get(
        self, workspace_id: str, operation_id: str
    ) -> InteractionResponseOperation | None:
        """The operation by id."""
        return await self._db.get(InteractionResponseOperation, (workspace_id, operation_id))

    async def by_key(
        self, workspace_id: str, idempotency_key: str
    ) -> InteractionResponseOperation | None:
        """The operation created with this idempotency key."""
        query = select(InteractionResponseOperation).where(
            InteractionResponseOperation.workspace_id == workspace_id,
            InteractionResponseOperation.idempotency_key == idempotency_key,
        )
        return (await self._db.execute(query)).scalar_one_or_none()

    async def open_for_interaction(
        self, workspace_id: str, session_id: str, turn_id: str, request_id: str
    ) -> list[InteractionResponseOperation]:
        """Operations of one Interaction that have not completed."""
        query = select(InteractionResponseOperation).where(
            InteractionResponseOperation.workspace_id == workspace_id,
            InteractionResponseOperation.session_id == session_id,
            InteractionResponseOperation.turn_id == turn_id,
            InteractionResponseOperation.request_id == request_id,
            InteractionResponseOperation.state != "completed",
        )
        return list((await self._db.execute(query)).scalars().all())

    def add(self, operation: InteractionResponseOperation) -> None:
        """Stage a new operation."""
        self._db.add(operation)
