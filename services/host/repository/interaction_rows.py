"""Interaction rows, always addressed by the full tuple (HOST-INT-1)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from services.host.model.records import InteractionRecord, SessionRecord
from services.host.repository.changes import ActivityChanges, apply_fields
from services.host.repository.row_records import interaction_record, session_record
from services.host.repository.row_views import InteractionRow
from store.models import Interaction, Session, Turn

OPEN_STATUSES = ("pending", "resolving")


class InteractionRepository:
    """Reads and writes Interaction rows."""

    def __init__(self, session: AsyncSession, changes: ActivityChanges) -> None:
        self._db = session
        self._changes = changes

    async def get(
        self, workspace_id: str, session_id: str, turn_id: str, request_id: str
    ) -> InteractionRow | None:
        """The Interaction with this exact tuple."""
        return await self._db.get(Interaction, (workspace_id, session_id, turn_id, request_id))

    def add(self, **values: Any) -> InteractionRow:
        """Stage a new Interaction row from its column values (recorded for the outbox)."""
        interaction = Interaction(**values)
        self._db.add(interaction)
        self._changes.interaction(interaction)
        return interaction

    def update(self, interaction: InteractionRow, **values: object) -> None:
        """Change columns of an Interaction (recorded for the activity outbox when any changed)."""
        if apply_fields(interaction, values):
            self._changes.interaction(interaction)

    async def open_for_session(self, workspace_id: str, session_id: str) -> list[InteractionRow]:
        """Pending and resolving Interactions of a Session."""
        query = select(Interaction).where(
            Interaction.workspace_id == workspace_id,
            Interaction.session_id == session_id,
            Interaction.status.in_(OPEN_STATUSES),
        )
        return list((await self._db.execute(query)).scalars().all())

    async def open_for_turn(
        self, workspace_id: str, session_id: str, turn_id: str
    ) -> list[InteractionRow]:
        """Pending and resolving Interactions of one Turn."""
        query = select(Interaction).where(
            Interaction.workspace_id == workspace_id,
            Interaction.session_id == session_id,
            Interaction.turn_id == turn_id,
            Interaction.status.in_(OPEN_STATUSES),
        )
        return list((await self._db.execute(query)).scalars().all())

    async def attention(self, workspace_id: str) -> list[tuple[InteractionRecord, SessionRecord]]:
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
        return [
            (interaction_record(row[0]), session_record(row[1]))
            for row in (await self._db.execute(query)).all()
        ]
