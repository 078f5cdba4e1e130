"""Durable idempotent Host operations (``host_operations``): session activations (HOST-SES-9).

The table keys an operation by (workspace, Session, ``kind``, the caller's ``client_op_id``);
a replay finds the committed row and does nothing again.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from services.host.repository.row_views import HostOperationRow
from store.models import HostOperation


class HostOperationRepository:
    """Reads and writes ``host_operations`` rows."""

    def __init__(self, session: AsyncSession) -> None:
        self._db = session

    async def find(
        self, workspace_id: str, session_id: str, kind: str, client_op_id: str
    ) -> HostOperationRow | None:
        """The operation of this kind with this idempotency key in this Session."""
        query = select(HostOperation).where(
            HostOperation.workspace_id == workspace_id,
            HostOperation.session_id == session_id,
            HostOperation.kind == kind,
            HostOperation.client_op_id == client_op_id,
        )
        return (await self._db.execute(query)).scalar_one_or_none()

    def add(self, **values: Any) -> HostOperationRow:
        """Stage a new operation row from its column values."""
        operation = HostOperation(**values)
        self._db.add(operation)
        return operation
