"""SQL of user projects (HOST-PROJ-1) and the section moves ``RemoveProject`` performs."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from services.host.repository.inserts import insert_if_absent
from store.models import Session, UserProject

__all__ = ["ProjectRecord", "ProjectRepository"]


@dataclass(frozen=True)
class ProjectRecord:
    """A user project: a rail section of one workspace."""

    workspace_id: str
    section_key: str
    label: str
    path: str
    created_at_unix_ms: int


def _record(row: UserProject) -> ProjectRecord:
    return ProjectRecord(
        workspace_id=row.workspace_id,
        section_key=row.project_key,
        label=row.label,
        path=row.path,
        created_at_unix_ms=row.created_at_unix_ms,
    )


class ProjectRepository:
    """Reads and writes ``user_projects`` and moves Sessions between sections."""

    def __init__(self, session: AsyncSession) -> None:
        self._session = session

    async def get(
        self, workspace_id: str, section_key: str, *, lock: str | None = None
    ) -> ProjectRecord | None:
        """One project, optionally row-locked.

        ``lock="share"`` keeps it from being removed until commit (a creating Session's
        placement check); ``lock="update"`` excludes those (the remove finalize). SQLite needs
        neither: its write transactions are serialized (BEGIN IMMEDIATE).
        """
        query = select(UserProject).where(
            UserProject.workspace_id == workspace_id, UserProject.project_key == section_key
        )
        if lock == "share":
            query = query.with_for_update(read=True)
        elif lock == "update":
            query = query.with_for_update()
        row = (await self._session.execute(query)).scalar_one_or_none()
        return None if row is None else _record(row)

    async def in_workspace(self, workspace_id: str) -> list[ProjectRecord]:
        """The workspace's projects ordered by label, then key."""
        rows = (
            await self._session.execute(
                select(UserProject)
                .where(UserProject.workspace_id == workspace_id)
                .order_by(UserProject.label, UserProject.project_key)
            )
        ).scalars()
        return [_record(row) for row in rows]

    async def insert(self, project: ProjectRecord) -> bool:
        """Insert a project; ``False`` when the key is already taken."""
        return await insert_if_absent(
            self._session,
            insert(UserProject).values(
                workspace_id=project.workspace_id,
                project_key=project.section_key,
                label=project.label,
                path=project.path,
                created_at_unix_ms=project.created_at_unix_ms,
                updated_at_unix_ms=project.created_at_unix_ms,
            ),
        )

    async def delete(self, workspace_id: str, section_key: str) -> None:
        """Remove the project row."""
        await self._session.execute(
            delete(UserProject).where(
                UserProject.workspace_id == workspace_id, UserProject.project_key == section_key
            )
        )

    async def live_unpinned_root_ids(self, workspace_id: str, section_key: str) -> list[str]:
        """Live unpinned root Sessions of the section: what a project delete must remove."""
        rows = await self._session.execute(
            select(Session.session_id)
            .where(
                Session.workspace_id == workspace_id,
                Session.rail_section_key == section_key,
                Session.parent_session_id.is_(None),
                Session.deleted_at_unix_ms.is_(None),
                Session.pinned_at_unix_ms.is_(None),
            )
            .order_by(Session.session_id)
        )
        return [row[0] for row in rows]

    async def rehome_section(self, workspace_id: str, section_key: str, to_key: str) -> list[str]:
        """Move every Session still in ``section_key`` (pinned trees, tombstones) to ``to_key``.

        Only the rail membership changes: ``updated_at``, tombstone columns and the
        presentation-only ``rail_project_path`` (restore context) stay as they are (HOST-DEL-3).
        """
        ids = [
            row[0]
            for row in await self._session.execute(
                select(Session.session_id)
                .where(
                    Session.workspace_id == workspace_id,
                    Session.rail_section_key == section_key,
                )
                .order_by(Session.session_id)
            )
        ]
        if ids:
            await self._session.execute(
                update(Session)
                .where(
                    Session.workspace_id == workspace_id,
                    Session.rail_section_key == section_key,
                )
                .values(rail_section_key=to_key)
            )
        return ids
