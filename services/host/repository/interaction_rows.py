"""Interaction rows, always addressed by the full tuple (HOST-INT-1)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import Interaction, Session, Turn

OPEN_STATUSES = ("pending", "resolving")


class InteractionRepository:
    """Reads and writes Interaction rows."""

    def __init__(self, session: AsyncSession) -> None:
        self._db = session

    async def get(
        self, workspace_id: str, session_id: str, turn_id: str, request_id: str
    ) -> Interaction | None:
        """The Interaction with this exact tuple."""
        return await self._db.get(Interaction, (workspace_id, session_id, turn_id, request_id))

    def add(self, interaction: Interaction) -> None:
        """Stage a new Interaction row."""
        self._db.add(interaction)

    async def open_for_session(self, workspace_id: str, session_id: str) -> list[Interaction]:
        """Pending and resolving Interactions of a Session."""
        query = select(Interaction).where(
            Interaction.workspace_id == workspace_id,
            Interaction.session_id == session_id,
            Interaction.status.in_(OPEN_STATUSES),
        )
        return list((await self._db.execute(query)).scalars().all())

    async def open_for_turn(
        self, workspace_id: str, session_id: str, turn_id: str
    ) -> list[Interaction]:
        """Pending and resolving Interactions of one Turn."""
        query = select(Interaction).where(
            Interaction.workspace_id == workspace_id,
            Interaction.session_id == session_id,
            Interaction.turn_id == turn_id,
            Interaction.status.in_(OPEN_STATUSES),
        )
        return list((await self._db.execute(query)).scalars().all())

    async def attention(self, workspace_id: str) -> list[tuple[Interaction, Session]]:
        """Actionable pending Interactions of live Sessions whose Turn has not settled."""
        query = (
            select(Interaction, Session)
            .join(
                Turn,
                (Turn.workspace_id == Interaction.workspace_id)
                & (Turn.session_id == Interaction.session_id)
                & (Turn.turn_id == Interaction.turn_id),
            )
            .join(
                Session,
                (Session.workspace_id == Interaction.workspace_id)
                & (Session.session_id == Interaction.session_id),
            )
            .where(
                Interaction.workspace_id == workspace_id,
                Interaction.status == "pending",
                Interaction.actionable.is_(True),
                Turn.phase != "settled",
                Session.deleted_at_unix_ms.is_(None),
            )
            .order_by(Interaction.occurred_at_unix_ms, Interaction.session_id)
        )
        return [(row[0], row[1]) for row in (await self._db.execute(query)).all()]
