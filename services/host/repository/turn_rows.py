"""Turn rows (HOST-TURN-*)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, literal_column, select
from sqlalchemy.ext.asyncio import AsyncSession

from services.host.model.records import TurnRecord
from services.host.repository.changes import ActivityChanges, apply_fields
from services.host.repository.row_records import turn_record
from services.host.repository.row_views import TurnRow
from store.models import Session, Turn

ACTIVE_PHASES = ("queued", "running", "awaiting_interaction")
"""Turn phases before ``settled``: the one definition of an active Turn (HOST-TURN-5)."""


@dataclass(frozen=True)
class SettledSnapshot:
    """A settled Turn's frozen file-change snapshot (HOST-TURN-8), as the search reads it."""

    session_id: str
    turn_id: str
    settled_at_unix_ms: int
    file_changes_json: str


# The predicate of ``ix_turns_settled_file_changes``, as literal SQL so both planners match the
# partial index (a bound parameter for ``'settled'`` would hide the implication from SQLite).
_SETTLED = literal_column("turns.phase") == literal_column("'settled'")


class TurnRepository:
    """Reads and writes Turn rows."""

    def __init__(self, session: AsyncSession, changes: ActivityChanges) -> None:
        self._db = session
        self._changes = changes

    async def get(self, workspace_id: str, session_id: str, turn_id: str) -> TurnRow | None:
        """The Turn with this exact identity."""
        return await self._db.get(Turn, (workspace_id, session_id, turn_id))

    async def phase_of(self, workspace_id: str, session_id: str, turn_id: str) -> str | None:
        """The Turn's phase (``None`` when it does not exist)."""
        turn = await self._db.get(Turn, (workspace_id, session_id, turn_id))
        return None if turn is None else turn.phase

    async def by_client_submit_id(
        self, workspace_id: str, session_id: str, client_submit_id: str
    ) -> TurnRow | None:
        """The Turn created by a submission, read back by its idempotency key."""
        query = select(Turn).where(
            Turn.workspace_id == workspace_id,
            Turn.session_id == session_id,
            Turn.client_submit_id == client_submit_id,
        )
        return (await self._db.execute(query)).scalar_one_or_none()

    def add(self, **values: Any) -> TurnRow:
        """Stage a new Turn row from its column values (recorded for the activity outbox)."""
        turn = Turn(**values)
        self._db.add(turn)
        self._changes.turn(turn)
        return turn

    def update(self, turn: TurnRow, **values: object) -> None:
        """Change columns of a Turn row (recorded for the activity outbox when any changed)."""
        if apply_fields(turn, values):
            self._changes.turn(turn)

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
    ) -> list[TurnRecord]:
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
        return [turn_record(row) for row in (await self._db.execute(query)).scalars()]

    async def active_children(self, workspace_id: str, root_turn_id: str) -> list[TurnRow]:
        """Active Turns (of child Sessions) that work for ``root_turn_id``."""
        query = select(Turn).where(
            Turn.workspace_id == workspace_id,
            Turn.root_turn_id == root_turn_id,
            Turn.turn_id != root_turn_id,
            Turn.phase.in_(ACTIVE_PHASES),
        )
        return list((await self._db.execute(query)).scalars().all())

    async def active_counts(self, workspaces: frozenset[str] | None) -> dict[str, int]:
        """Active Turns per workspace (only workspaces with some), in ``workspaces`` or all."""
        query = (
            select(Turn.workspace_id, func.count())
            .where(Turn.phase.in_(ACTIVE_PHASES))
            .group_by(Turn.workspace_id)
            .order_by(Turn.workspace_id)
        )
        if workspaces is not None:
            query = query.where(Turn.workspace_id.in_(sorted(workspaces)))
        return {row[0]: int(row[1]) for row in (await self._db.execute(query)).all()}

    async def settled_snapshots_of_section(
        self, workspace_id: str, section_key: str, window: int
    ) -> list[SettledSnapshot]:
        """The ``window`` most recently settled Turns with a snapshot of a section's live Sessions.

        Newest first (``settled_at DESC, turn_id DESC``). The live Sessions whose
        ``rail_section_key`` equals ``section_key`` come from ``ix_sessions_live_section``, each
        one's snapshot Turns from ``ix_turns_settled_file_changes``; messages are never read.
        """
        query = (
            select(Turn.session_id, Turn.turn_id, Turn.settled_at_unix_ms, Turn.file_changes_json)
            .join(
                Session,
                (Session.workspace_id == Turn.workspace_id)
                & (Session.session_id == Turn.session_id),
            )
            .where(
                Session.workspace_id == workspace_id,
                Session.rail_section_key == section_key,
                Session.deleted_at_unix_ms.is_(None),
                Turn.workspace_id == workspace_id,
                _SETTLED,
                Turn.file_changes_json.is_not(None),
            )
            .order_by(Turn.settled_at_unix_ms.desc(), Turn.turn_id.desc())
            .limit(window)
        )
        return [
            SettledSnapshot(row[0], row[1], int(row[2] or 0), row[3] or "")
            for row in (await self._db.execute(query)).all()
        ]
