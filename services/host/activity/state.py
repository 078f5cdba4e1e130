"""Whether agent work is in progress: the maintenance idle gate's input (HOST-ACT-1)."""

from __future__ import annotations

from dataclasses import dataclass

from services.host.repository import unit_of_work
from services.host.repository.unit_of_work import HostTransaction
from store.database import Database


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

    async def query(tx: HostTransaction) -> dict[str, int]:
        return await tx.turns.active_counts(workspaces)

    per_workspace = await unit_of_work.run(database, query, write=False)
    return ActivityState(sum(per_workspace.values()), per_workspace)
