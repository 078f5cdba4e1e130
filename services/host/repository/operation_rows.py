"""Durable interaction-response operations (HOST-INT-3)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from services.host.repository.changes import apply_fields
from services.host.repository.row_views import OperationRow
from store.models import InteractionResponseOperation


class ResponseOperationRepository:
    """Reads and writes response operations."""

    def __init__(self, session: AsyncSession) -> None:
        self._db = session

    async def get(self, workspace_id: str, operation_id: str) -> OperationRow | None:
        """The operation by id."""
        return await self._db.get(InteractionResponseOperation, (workspace_id, operation_id))

    async def by_key(self, workspace_id: str, idempotency_key: str) -> OperationRow | None:
        """The operation created with this idempotency key."""
        query = select(InteractionResponseOperation).where(
            InteractionResponseOperation.workspace_id == workspace_id,
            InteractionResponseOperation.idempotency_key == idempotency_key,
        )
        return (await self._db.execute(query)).scalar_one_or_none()

    async def open_for_interaction(
        self, workspace_id: str, session_id: str, turn_id: str, request_id: str
    ) -> list[OperationRow]:
        """Operations of one Interaction that have not completed."""
        query = select(InteractionResponseOperation).where(
            InteractionResponseOperation.workspace_id == workspace_id,
            InteractionResponseOperation.session_id == session_id,
            InteractionResponseOperation.turn_id == turn_id,
            InteractionResponseOperation.request_id == request_id,
            InteractionResponseOperation.state != "completed",
        )
        return list((await self._db.execute(query)).scalars().all())

    async def first_for_interaction(
        self, workspace_id: str, session_id: str, turn_id: str, request_id: str
    ) -> OperationRow | None:
        """The Interaction's earliest operation (its claimant: followers come later)."""
        query = (
            select(InteractionResponseOperation)
            .where(
                InteractionResponseOperation.workspace_id == workspace_id,
                InteractionResponseOperation.session_id == session_id,
                InteractionResponseOperation.turn_id == turn_id,
                InteractionResponseOperation.request_id == request_id,
            )
            .order_by(
                InteractionResponseOperation.created_at_unix_ms,
                InteractionResponseOperation.operation_id,
            )
            .limit(1)
        )
        return (await self._db.execute(query)).scalars().first()

    async def query_due(self, now: int, limit: int) -> list[OperationRow]:
        """Dispatched operations whose disposition query is due (HOST-INT-6), oldest first.

        Only a dispatched claimant has ``next_attempt_at_unix_ms`` while ``resolving`` (set
        when its delivery is sent); served by ``ix_interaction_response_operations_due``.
        """
        query = (
            select(InteractionResponseOperation)
            .where(
                InteractionResponseOperation.state == "resolving",
                InteractionResponseOperation.next_attempt_at_unix_ms <= now,
            )
            .order_by(InteractionResponseOperation.next_attempt_at_unix_ms)
            .limit(limit)
        )
        return list((await self._db.execute(query)).scalars().all())

    async def resolving_dispatched(self, limit: int) -> list[OperationRow]:
        """Dispatched claimants still ``resolving``, any workspace (HOST-INT-6).

        A claimant has ``next_attempt_at_unix_ms`` from its first dispatch on; followers and
        never-dispatched operations have none.
        """
        query = (
            select(InteractionResponseOperation)
            .where(
                InteractionResponseOperation.state == "resolving",
                InteractionResponseOperation.next_attempt_at_unix_ms.is_not(None),
            )
            .order_by(InteractionResponseOperation.next_attempt_at_unix_ms)
            .limit(limit)
        )
        return list((await self._db.execute(query)).scalars().all())

    @staticmethod
    def update(operation: OperationRow, **values: object) -> None:
        """Change columns of an operation (written at the next flush)."""
        apply_fields(operation, values)

    @staticmethod
    def complete(
        operation: OperationRow, disposition: str, now: int, *, detail: str | None = None
    ) -> None:
        """Complete an operation with its disposition (``detail`` replaces ``last_error``)."""
        values: dict[str, object] = {
            "state": "completed",
            "disposition": disposition,
            "completed_at_unix_ms": now,
            "updated_at_unix_ms": now,
        }
        if detail is not None:
            values["last_error"] = detail
        apply_fields(operation, values)

    def add(self, **values: Any) -> OperationRow:
        """Stage a new operation from its column values."""
        operation = InteractionResponseOperation(**values)
        self._db.add(operation)
        return operation
