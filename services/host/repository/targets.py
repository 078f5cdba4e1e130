"""SQL of agent targets.

Deployment-wide targets live under the reserved workspace key
``store.models.DEPLOYMENT_WORKSPACE_KEY`` (ADR 0012).
"""

from __future__ import annotations

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from services.host.model.records import (
    AgentTargetRecord,
    Capabilities,
    LaunchRef,
    SettingsCatalog,
    subagents_from_json,
    subagents_to_json,
)
from store.models import DEPLOYMENT_WORKSPACE_KEY, AgentTarget

__all__ = ["TargetRepository"]


def _record(row: AgentTarget) -> AgentTargetRecord:
    return AgentTargetRecord(
        agent_target_id=row.agent_target_id,
        provider=row.provider,
        display_name=row.display_name,
        enabled=row.enabled,
        launch_ref=LaunchRef.from_json(row.launch_ref_json),
        capabilities=Capabilities.from_json(row.capabilities_json),
        subagents=subagents_from_json(row.subagent_catalog_json),
        settings_catalog=SettingsCatalog.from_json(row.settings_catalog_json),
        locality=row.locality,
        created_at_unix_ms=row.created_at_unix_ms,
        updated_at_unix_ms=row.updated_at_unix_ms,
    )


def _values(target: AgentTargetRecord) -> dict[str, object]:
    return {
        "provider": target.provider,
        "display_name": target.display_name,
        "enabled": target.enabled,
        "launch_ref_json": target.launch_ref.to_json(),
        "capabilities_json": target.capabilities.to_json(),
        "subagent_catalog_json": subagents_to_json(target.subagents),
        "settings_catalog_json": target.settings_catalog.to_json(),
        "locality": target.locality,
        "updated_at_unix_ms": target.updated_at_unix_ms,
    }


class TargetRepository:
    """Reads and writes ``agent_targets`` rows of the deployment scope."""

    def __init__(self, session: AsyncSession) -> None:
        self._session = session

    async def get(
        self, agent_target_id: str, *, for_update: bool = False
    ) -> AgentTargetRecord | None:
        """One target, optionally row-locked until the transaction ends (Postgres)."""
        query = select(AgentTarget).where(
            AgentTarget.workspace_id == DEPLOYMENT_WORKSPACE_KEY,
            AgentTarget.agent_target_id == agent_target_id,
        )
        if for_update:
            query = query.with_for_update()
        row = (await self._session.execute(query)).scalar_one_or_none()
        return None if row is None else _record(row)

    async def subagent_catalog_json(self, agent_target_id: str) -> str | None:
        """The target's subagent catalog exactly as stored; ``None`` for an unknown target."""
        result = await self._session.execute(
            select(AgentTarget.subagent_catalog_json).where(
                AgentTarget.workspace_id == DEPLOYMENT_WORKSPACE_KEY,
                AgentTarget.agent_target_id == agent_target_id,
            )
        )
        return result.scalar_one_or_none()

    async def matching(
        self, *, include_disabled: bool, provider: str | None
    ) -> list[AgentTargetRecord]:
        """Targets ordered by id."""
        query = select(AgentTarget).where(AgentTarget.workspace_id == DEPLOYMENT_WORKSPACE_KEY)
        if not include_disabled:
            query = query.where(AgentTarget.enabled.is_(True))
        if provider is not None:
            query = query.where(AgentTarget.provider == provider)
        rows = (await self._session.execute(query.order_by(AgentTarget.agent_target_id))).scalars()
        return [_record(row) for row in rows]

    async def insert(self, target: AgentTargetRecord) -> bool:
        """Insert a new target; ``False`` when a concurrent writer inserted the id first."""
        try:
            async with self._session.begin_nested():
                await self._session.execute(
                    insert(AgentTarget).values(
                        workspace_id=DEPLOYMENT_WORKSPACE_KEY,
                        agent_target_id=target.agent_target_id,
                        created_at_unix_ms=target.created_at_unix_ms,
                        **_values(target),
                    )
                )
        except IntegrityError:
            return False
        return True

    async def update(self, target: AgentTargetRecord) -> None:
        """Replace every mutable column of an existing target."""
        await self._session.execute(
            update(AgentTarget)
            .where(
                AgentTarget.workspace_id == DEPLOYMENT_WORKSPACE_KEY,
                AgentTarget.agent_target_id == target.agent_target_id,
            )
            .values(**_values(target))
        )
