"""The ``@`` menu's Agents group: ``GetMentionCatalog`` (HOST-MENT-1).

With a Session the catalog is the one the Session was launched with (stored at
creation) and the workspace root is its ``cwd``; before a Session exists it is the
target's current catalog and the caller's ``cwd``. Names shadowed by a file or folder in
the workspace root are hidden (``services.host.turns.mentions.mention_menu``); outside agent
mode the group is empty. The workspace file index is a port
(:data:`WorkspaceIndexFactory`); the default reads the local file system and a failed read
is ``UNAVAILABLE`` ``WORKSPACE_INDEX_UNAVAILABLE``, never a silently unshadowed menu.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from domainerrors import InvalidArgument, Unavailable
from services.host.context import HostContext
from services.host.model.records import subagents_from_json
from services.host.model.session_rules import require_live, validate_session_id
from services.host.repository.unit_of_work import HostTransaction
from services.host.sessions.targets import target_not_found
from services.host.turns import mentions

__all__ = ["WorkspaceIndexFactory", "local_workspace_index", "read_mention_catalog"]

WorkspaceIndexFactory = Callable[[str | None], mentions.WorkspaceFileIndex]
"""Builds the file-index port for one workspace root (``None``: no root known)."""

INDEX_RETRY_SECONDS = 5.0


def local_workspace_index(root: str | None) -> mentions.WorkspaceFileIndex:
    """Answer from the local file system whether ``root`` holds an entry called ``name``.

    Raises (from the returned callable):
        Unavailable: reason ``WORKSPACE_INDEX_UNAVAILABLE`` when the root cannot be read.
    """

    def is_entry(name: str) -> bool:
        if root is None or not name or "/" in name or "\\" in name or name in {".", ".."}:
            return False
        try:
            return (Path(root) / name).exists()
        except OSError as error:
            raise Unavailable(
                f"cannot read the workspace root: {error.strerror or error}",
                reason="WORKSPACE_INDEX_UNAVAILABLE",
                retry_after_seconds=INDEX_RETRY_SECONDS,
            ) from None

    return is_entry


async def read_mention_catalog(
    ctx: HostContext,
    workspace_id: str,
    *,
    session_id: str | None,
    agent_target_id: str | None,
    cwd: str | None,
    mode: mentions.ComposerMode,
    index: WorkspaceIndexFactory = local_workspace_index,
) -> mentions.MentionMenu:
    """The Agents group for a Session's launch, or for a target before a Session exists.

    Raises:
        InvalidArgument: neither or an empty scope.
        NotFound: ``SESSION_NOT_FOUND`` / ``SESSION_DELETED`` / ``AGENT_TARGET_NOT_FOUND``.
        Unavailable: ``WORKSPACE_INDEX_UNAVAILABLE``.
    """
    if session_id is None and not agent_target_id:
        raise InvalidArgument.for_field("scope", "set session_id or agent_target_id")
    if session_id is not None:
        validate_session_id(session_id)

    async def query(
        repos: HostTransaction,
    ) -> tuple[list[mentions.Subagent], str | None]:
        if session_id is not None:
            session = require_live(
                await repos.sessions.get(workspace_id, session_id), workspace_id, session_id
            )
            raw = await repos.sessions.launch_subagents_json(workspace_id, session_id)
            catalog = subagents_from_json(raw)
            return [mentions.Subagent(s.name, s.description) for s in catalog], session.cwd
        assert agent_target_id is not None
        target = await repos.targets.get(agent_target_id)
        if target is None:
            raise target_not_found(agent_target_id)
        return [mentions.Subagent(s.name, s.description) for s in target.subagents], cwd

    catalog, root = await ctx.transact(query, write=False)
    return mentions.mention_menu(catalog, mode=mode, is_workspace_entry=index(root))
