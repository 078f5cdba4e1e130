"""SQL of the store-backed AppCenter: paged container listings and whole-tree loads.

Owns the ``appcenter_*`` tables (ARCH-2). Listing order is the contract's: a
container's child groups ascending by group id, then its files ascending by path, both
in code point order; a page is a keyset slice of that sequence (``store.page_tokens``).
Loads replace whole app trees in one transaction (STORE-3, ADR 0010).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import delete, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from domainerrors import InvalidArgument, NotFound
from services.appcenter.artifacts import (
    AppTree,
    Artifact,
    GroupEntry,
    GroupTree,
    LoadCounts,
    ReferencePage,
    artifact_key,
    group_id_of,
    group_key,
)
from store import page_tokens
from store.codepoint import codepoint
from store.database import Database
from store.models import AppCenterApp, AppCenterArtifact, AppCenterGroup
from store.transactions import write_connection

__all__ = ["DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "AppStore"]

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
_LOAD_LOCK_KEY = 0x41505043  # "APPC": serializes concurrent loads on Postgres


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def effective_page_size(page_size: int) -> int:
    """0 means the default; larger values are clamped; negative is invalid."""
    if page_size < 0:
        raise InvalidArgument.for_field("page_size", "must not be negative")
    return DEFAULT_PAGE_SIZE if page_size == 0 else min(page_size, MAX_PAGE_SIZE)


def _position(token: str, binding: dict[str, str | None]) -> tuple[str, str | None]:
    """Decode a listing token into (phase, last key): phase ``g`` (groups) or ``f`` (files)."""
    if not token:
        return "g", None
    try:
        values = page_tokens.decode(token, binding)
    except page_tokens.MalformedPageToken as error:
        raise InvalidArgument.for_field("page_token", str(error)) from None
    if (
        len(values) != 2
        or values[0] not in ("g", "f")
        or not (values[1] is None or isinstance(values[1], str))
    ):
        raise InvalidArgument.for_field("page_token", "page_token is malformed")
    return values[0], values[1]


def _artifact(row: Any) -> Artifact:
    return Artifact(
        path=row.path,
        display_name=row.display_name,
        size_bytes=row.size_bytes,
        media_type=row.media_type,
        created_at_unix_ms=row.created_at_unix_ms,
    )


class AppStore:
    """Reads and writes apps, groups and artifacts."""

    def __init__(self, database: Database, clock: Callable[[], int] = _now_ms) -> None:
        self._database = database
        self._clock = clock

    async def list_page(
        self,
        workspace_id: str,
        app_id: str,
        group_id: str | None,
        page_size: int,
        page_token: str,
    ) -> ReferencePage:
        """Return one page of the direct children of the app root or one of its groups.

        Raises:
            InvalidArgument: empty ``app_id``, empty ``group_id``, negative size, bad token.
            NotFound: ``APP_NOT_FOUND`` or ``GROUP_NOT_FOUND``.
        """
        if not app_id:
            raise InvalidArgument.for_field("app_id", "must not be empty")
        if group_id is not None and not group_id:
            raise InvalidArgument.for_field("group_id", "must not be empty when set")
        size = effective_page_size(page_size)
        binding = {"workspace_id": workspace_id, "app_id": app_id, "group_id": group_id}
        phase, after = _position(page_token, binding)
        container = None if group_id is None else group_key(app_id, group_id)
        async with self._database.engine.connect() as connection:
            await self._require_container(connection, workspace_id, app_id, container)
            groups: list[GroupEntry] = []
            after_path = after
            if phase == "g":
                after_path = None
                rows = await self._child_groups(
                    connection, workspace_id, app_id, container, after, size + 1
                )
                groups = [GroupEntry(group_id_of(app_id, r.group_id), r.name) for r in rows]
                if len(groups) > size:
                    groups = groups[:size]
                    token = page_tokens.encode(binding, ["g", groups[-1].group_id])
                    return ReferencePage(tuple(groups), (), token)
            remaining = size - len(groups)
            file_rows = await self._child_files(
                connection, workspace_id, app_id, container, after_path, remaining + 1
            )
        files = [_artifact(row) for row in file_rows]
        token = ""
        if len(files) > remaining:
            files = files[:remaining]
            token = page_tokens.encode(binding, ["f", files[-1].path if files else None])
        return ReferencePage(tuple(groups), tuple(files), token)

    async def _require_container(
        self, connection: AsyncConnection, workspace_id: str, app_id: str, container: str | None
    ) -> None:
        app = await connection.scalar(
            select(AppCenterApp.app_id).where(
                AppCenterApp.workspace_id == workspace_id, AppCenterApp.app_id == app_id
            )
        )
        if app is None:
            raise NotFound(
                f"app {app_id!r} does not exist",
                reason="APP_NOT_FOUND",
                metadata={"app_id": app_id},
            )
        if container is None:
            return
        group = await connection.scalar(
            select(AppCenterGroup.group_id).where(
                AppCenterGroup.workspace_id == workspace_id,
                AppCenterGroup.group_id == container,
                AppCenterGroup.app_id == app_id,
            )
        )
        if group is None:
            group_id = group_id_of(app_id, container)
            raise NotFound(
                f"group {group_id!r} is not a group of app {app_id!r}",
                reason="GROUP_NOT_FOUND",
                metadata={"app_id": app_id, "group_id": group_id},
            )

    async def _child_groups(
        self,
        connection: AsyncConnection,
        workspace_id: str,
        app_id: str,
        container: str | None,
        after: str | None,
        limit: int,
    ) -> Sequence[Any]:
        parent = (
            AppCenterGroup.parent_group_id.is_(None)
            if container is None
            else AppCenterGroup.parent_group_id == container
        )
        query = select(AppCenterGroup.group_id, AppCenterGroup.name).where(
            AppCenterGroup.workspace_id == workspace_id, AppCenterGroup.app_id == app_id, parent
        )
        if after is not None:
            query = query.where(codepoint(AppCenterGroup.group_id) > group_key(app_id, after))
        query = query.order_by(codepoint(AppCenterGroup.group_id)).limit(limit)
        return (await connection.execute(query)).all()

    async def _child_files(
        self,
        connection: AsyncConnection,
        workspace_id: str,
        app_id: str,
        container: str | None,
        after: str | None,
        limit: int,
    ) -> Sequence[Any]:
        holder = (
            AppCenterArtifact.group_id.is_(None)
            if container is None
            else AppCenterArtifact.group_id == container
        )
        query = select(
            AppCenterArtifact.path,
            AppCenterArtifact.display_name,
            AppCenterArtifact.size_bytes,
            AppCenterArtifact.media_type,
            AppCenterArtifact.created_at_unix_ms,
        ).where(
            AppCenterArtifact.workspace_id == workspace_id,
            AppCenterArtifact.app_id == app_id,
            holder,
        )
        if after is not None:
            query = query.where(codepoint(AppCenterArtifact.path) > after)
        query = query.order_by(codepoint(AppCenterArtifact.path)).limit(limit)
        return (await connection.execute(query)).all()

    async def load(self, workspace_id: str, apps: Sequence[AppTree]) -> LoadCounts:
        """Create or replace each app tree; all commit in one transaction or none do."""
        now = self._clock()
        group_rows: list[dict[str, Any]] = []
        artifact_rows: list[dict[str, Any]] = []
        for app in apps:
            self._flatten(workspace_id, app, now, group_rows, artifact_rows)
        async with write_connection(self._database.engine) as connection:
            if connection.dialect.name == "postgresql":
                # Two loads of one app would both delete, then collide on insert.
                await connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOAD_LOCK_KEY}
                )
            for app in apps:
                await self._replace_app_row(connection, workspace_id, app, now)
            if group_rows:
                await connection.execute(insert(AppCenterGroup), group_rows)
            if artifact_rows:
                await connection.execute(insert(AppCenterArtifact), artifact_rows)
        return LoadCounts(len(apps), len(group_rows), len(artifact_rows))

    async def _replace_app_row(
        self, connection: AsyncConnection, workspace_id: str, app: AppTree, now: int
    ) -> None:
        where = (AppCenterApp.workspace_id == workspace_id, AppCenterApp.app_id == app.app_id)
        await connection.execute(
            delete(AppCenterArtifact).where(
                AppCenterArtifact.workspace_id == workspace_id,
                AppCenterArtifact.app_id == app.app_id,
            )
        )
        await connection.execute(
            delete(AppCenterGroup).where(
                AppCenterGroup.workspace_id == workspace_id, AppCenterGroup.app_id == app.app_id
            )
        )
        updated = await connection.execute(
            update(AppCenterApp).where(*where).values(name=app.display_name, updated_at_unix_ms=now)
        )
        if updated.rowcount == 0:
            await connection.execute(
                insert(AppCenterApp).values(
                    workspace_id=workspace_id,
                    app_id=app.app_id,
                    name=app.display_name,
                    created_at_unix_ms=now,
                    updated_at_unix_ms=now,
                )
            )

    @staticmethod
    def _flatten(
        workspace_id: str,
        app: AppTree,
        now: int,
        group_rows: list[dict[str, Any]],
        artifact_rows: list[dict[str, Any]],
    ) -> None:
        """Append the rows of one app: groups in pre-order (parents before children)."""

        def add_artifacts(artifacts: Sequence[Artifact], group_id: str | None) -> None:
            for position, artifact in enumerate(artifacts):
                artifact_rows.append(
                    {
                        "workspace_id": workspace_id,
                        "artifact_id": artifact_key(app.app_id, group_id, artifact.path),
                        "app_id": app.app_id,
                        "group_id": None if group_id is None else group_key(app.app_id, group_id),
                        "path": artifact.path,
                        "display_name": artifact.display_name,
                        "size_bytes": artifact.size_bytes,
                        "media_type": artifact.media_type,
                        "created_at_unix_ms": artifact.created_at_unix_ms or now,
                        "position": position,
                    }
                )

        def add_groups(groups: Sequence[GroupTree], parent: str | None) -> None:
            for position, group in enumerate(groups):
                group_rows.append(
                    {
                        "workspace_id": workspace_id,
                        "group_id": group_key(app.app_id, group.group_id),
                        "app_id": app.app_id,
                        "parent_group_id": None
                        if parent is None
                        else group_key(app.app_id, parent),
                        "name": group.display_name,
                        "position": position,
                        "created_at_unix_ms": now,
                    }
                )
                add_artifacts(group.artifacts, group.group_id)
                add_groups(group.groups, group.group_id)

        add_artifacts(app.artifacts, None)
        add_groups(app.groups, None)

    async def delete(self, workspace_id: str, app_id: str, *, allow_missing: bool) -> bool:
        """Remove an app with its groups and artifacts (the database cascades).

        Raises:
            InvalidArgument: empty ``app_id``.
            NotFound: ``APP_NOT_FOUND`` unless ``allow_missing``.
        """
        if not app_id:
            raise InvalidArgument.for_field("app_id", "must not be empty")
        async with write_connection(self._database.engine) as connection:
            result = await connection.execute(
                delete(AppCenterApp).where(
                    AppCenterApp.workspace_id == workspace_id, AppCenterApp.app_id == app_id
                )
            )
        if result.rowcount == 0 and not allow_missing:
            raise NotFound(
                f"app {app_id!r} does not exist",
                reason="APP_NOT_FOUND",
                metadata={"app_id": app_id},
            )
        return result.rowcount > 0
