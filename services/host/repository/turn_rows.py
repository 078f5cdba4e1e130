"""Turn rows (HOST-TURN-*)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import Turn

ACTIVE_PHASES = ("queued", "running", "awaiting_interaction")
"""Turn phases before ``settled``: the one definition of an active Turn (HOST-TURN-5)."""


class TurnRepository:
    """Reads and writes Turn rows."""

    def __init__(self, session: AsyncSession) -> None:
        self._db = session

    async def get(self, workspace_id: str, session_id: str, turn_id: str) -> Turn | None:
        """The Turn with this exact identity."""
        return await self._db.get(Turn, (workspace_id, session_id, turn_id))

    async def by_client_submit_id(
        self, workspace_id: str, session_id: str, client_submit_id: str
    ) -> Turn | None:
        """The Turn created by a submission, read back by its idempotency key."""
        query = select(Turn).where(
            Turn.workspace_id == workspace_id,
            Turn.session_id == session_id,
            Turn.client_submit_id == client_submit_id,
        )
        return (await self._db.execute(query)).scalar_one_or_none()

    def add(self, turn: Turn) -> None:
        """Stage a new Turn row."""
        self._db.add(turn)

    async def flush(self) -> None:
        """Write staged rows now (so later statements may reference them)."""
        await self._db.flush()

    async def page(
        self,
        workspace_id: str,
        session_id: str,
        *,
        after: tuple[int, str] | None,
        limit: int,
        include_retracted: bool,
    ) -> list[Turn]:
        """Turns in creation order ``(created_at, turn_id)`` after a value cursor."""
        query = select(Turn).where(Turn.workspace_id == workspace_id, Turn.session_id == session_id)
        if not include_retracted:
            query = query.where(Turn.retracted_at_unix_ms.is_(None))
        if after is not None:
            created, turn_id = after
            query = query.where(
                (Turn.created_at_unix_ms > created)
                | ((Turn.created_at_unix_ms == created) & (Turn.turn_id > turn_id))
            )
        query = query.order_by(Turn.created_at_unix_ms, Turn.turn_id).limit(limit)
        return list((await self._db.execute(query)).scalars().all())

    async def active_children(self, workspace_id: str, root_turn_id: str) -> list[Turn]:
        """Active Turns (of child Sessions) that work for ``root_turn_id``."""
        query = select(Turn).where(
            Turn.workspace_id == workspace_id,
            Turn.root_turn_id == root_turn_id,
            Turn.turn_id != root_turn_id,
            Turn.phase.in_(ACTIVE_PHASES),
        )
        return list((await self._db.execute(query)).scalars().all())
