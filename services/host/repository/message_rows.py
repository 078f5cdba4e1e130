"""Message rows (HOST-MSG-1/2)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from services.host.repository.changes import ActivityChanges, apply_fields
from services.host.repository.row_views import MessageRow
from store.models import Message


class MessageRepository:
    """Reads and writes Message rows."""

    def __init__(self, session: AsyncSession, changes: ActivityChanges) -> None:
        self._db = session
        self._changes = changes

    async def get(self, workspace_id: str, session_id: str, message_id: str) -> MessageRow | None:
        """The message with this id in this Session."""
        return await self._db.get(Message, (workspace_id, session_id, message_id))

    def add(self, **values: Any) -> MessageRow:
        """Stage a new message row from its column values (recorded for the activity outbox)."""
        message = Message(**values)
        self._db.add(message)
        self._changes.message(message)
        return message

    def update(self, message: MessageRow, **values: object) -> None:
        """Change columns of a message row (recorded for the activity outbox when any changed)."""
        if apply_fields(message, values):
            self._changes.message(message)

    async def latest_assistant_text_within(
        self, workspace_id: str, session_id: str, turn_id: str, window: int
    ) -> MessageRow | None:
        """The latest assistant text among the Turn's newest ``window`` messages (HOST-TURN-7).

        The legacy fallback of a Turn settled without resolution metadata: the scan is bounded
        by ``window`` whatever the Turn holds.
        """
        newest = (
            select(Message.sequence, Message.role, Message.kind)
            .where(
                Message.workspace_id == workspace_id,
                Message.session_id == session_id,
                Message.turn_id == turn_id,
            )
            .order_by(Message.sequence.desc())
            .limit(window)
            .subquery()
        )
        sequence = (
            select(newest.c.sequence)
            .where(newest.c.role == "assistant", newest.c.kind == "text")
            .order_by(newest.c.sequence.desc())
            .limit(1)
            .scalar_subquery()
        )
        query = select(Message).where(
            Message.workspace_id == workspace_id,
            Message.session_id == session_id,
            Message.sequence == sequence,
        )
        return (await self._db.execute(query)).scalar_one_or_none()

    async def latest_assistant_text(
        self, workspace_id: str, session_id: str, turn_id: str
    ) -> MessageRow | None:
        """The Turn's latest persisted assistant text (the frozen result, HOST-TURN-6)."""
        query = (
            select(Message)
            .where(
                Message.workspace_id == workspace_id,
                Message.session_id == session_id,
                Message.turn_id == turn_id,
                Message.role == "assistant",
                Message.kind == "text",
            )
            .order_by(Message.sequence.desc())
            .limit(1)
        )
        return (await self._db.execute(query)).scalar_one_or_none()
