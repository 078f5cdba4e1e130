"""Whether agent work is in progress: the maintenance idle gate's input (HOST-ACT-1)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select

from services.host.repository.turn_rows import ACTIVE_PHASES
from store.database import Database
from store.models import Turn


@dataclass(frozen=True)
class ActivityState:
    """Active Turn counts, overall and per workspace (only workspaces with work)."""

    active_turn_count: int
    per_workspace: dict[str, int]

    @property
    def any_turn_active(self) -> bool:
        """Whether any Turn in scope is active."""
        return self.active_turn_count > 0


async def read_activity_state(
    database: Database, workspaces: frozenset[str] | None
) -> ActivityState:
    """Count active Turns in ``workspaces``, or in every workspace when ``None``."""
    query = (
        select(Turn.workspace_id, func.count())
        .where(Turn.phase.in_(ACTIVE_PHASES))
        .group_by(Turn.workspace_id)
        .order_by(Turn.workspace_id)
    )
    if workspaces is not None:
        query = query.where(Turn.workspace_id.in_(sorted(workspaces)))
    async with database.engine.connect() as connection:
        rows = (await connection.execute(query)).all()
    per_workspace = {row[0]: int(row[1]) for row in rows}
    return ActivityState(sum(per_workspace.values()), per_workspace)
