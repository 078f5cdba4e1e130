"""Durable interaction-response operations (HOST-INT-3)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import exists, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from services.host.repository.changes import apply_fields
from services.host.repository.row_views import OperationRow
from store.models import InteractionResponseOperation, RuntimeCommandOutbox, Session

_QUERY_KIND = "query_interaction_disposition"
"""Outbox kind of a disposition query (``command_outbox.QUERY``; repositories sit below it)."""


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

    async def make_due_for_link(
        self,
        *,
        workspaces: frozenset[str],
        providers: frozenset[str],
        target_ids: frozenset[str],
        now: int,
    ) -> int:
        """Make the disposition query of every dispatched claimant a link serves due now.

        One ``UPDATE``: ``resolving`` operations with a query schedule (a dispatched claimant;
        followers and never-dispatched operations have none) of Sessions of ``providers`` in
        ``workspaces`` (``"*"`` is all) and, when ``target_ids`` is not empty, of those agent
        targets — the Sessions ``RuntimeIdentity.serves``. An operation whose query is still
        unacknowledged is skipped: the reconnect just re-sent it, and replacing it would send
        the runtime two. Served by the operation's ``(state, next_attempt_at_unix_ms)`` index.

        Returns:
            How many operations were made due.
        """
        op = InteractionResponseOperation
        served = [
            Session.workspace_id == op.workspace_id,
            Session.session_id == op.session_id,
            Session.provider.in_(sorted(providers)),
        ]
        if "*" not in workspaces:
            served.append(Session.workspace_id.in_(sorted(workspaces)))
        if target_ids:
            served.append(func.coalesce(Session.agent_target_id, "").in_(sorted(target_ids)))
        open_query = exists().where(
            RuntimeCommandOutbox.workspace_id == op.workspace_id,
            RuntimeCommandOutbox.session_id == op.session_id,
            RuntimeCommandOutbox.operation_id == op.operation_id,
            RuntimeCommandOutbox.command_kind == _QUERY_KIND,
            RuntimeCommandOutbox.state.in_(("pending", "dispatched")),
        )
        statement = (
            update(op)
            .where(
                op.state == "resolving",
                op.next_attempt_at_unix_ms > now,
                exists().where(*served),
                ~open_query,
            )
            .values(next_attempt_at_unix_ms=now)
            .execution_options(synchronize_session=False)
        )
        result = await self._db.execute(statement)
        return int(getattr(result, "rowcount", 0) or 0)

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
