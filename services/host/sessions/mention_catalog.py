"""The ``@`` menu's Agents group: ``GetMentionCatalog`` (HOST-MENT-1, HOST-MENT-4).

With a Session the catalog is the one the Session was launched with (stored at
creation) and the workspace root is its ``cwd``; before a Session exists it is the
target's current catalog and the caller's ``cwd``. Names shadowed by a file or folder in
the workspace root are hidden (``services.host.turns.mentions.mention_menu``); outside agent
mode the group is empty.

Two reads stand behind the group: the stored catalog and the workspace file index
(``HostContext.workspace_index``, ``services.host.turns.workspace_index``). When either
fails only the group is lost (HOST-MENT-4): the call succeeds with no agents, no shadowed
names and ``unavailable_reason`` = ``CATALOG_UNAVAILABLE`` (a stored catalog that cannot be
decoded) or ``WORKSPACE_INDEX_UNAVAILABLE`` (the index could not be read). A failure part
way through the names never yields a partly filtered group. Scope errors (no or a malformed
scope, an unknown or deleted Session, an unknown target) stay errors.
"""

from __future__ import annotations

from domainerrors import InvalidArgument
from services.host.context import HostContext
from services.host.model.records import decode_subagent_catalog
from services.host.model.session_rules import require_live, validate_session_id
from services.host.repository.unit_of_work import HostTransaction
from services.host.sessions.targets import target_not_found
from services.host.turns import mentions
from services.host.turns.workspace_index import INDEX_READ_ERRORS, WORKSPACE_INDEX_UNAVAILABLE

__all__ = ["CATALOG_UNAVAILABLE", "read_mention_catalog"]

CATALOG_UNAVAILABLE = "CATALOG_UNAVAILABLE"
"""``unavailable_reason`` when the stored launch (or target) catalog cannot be read."""


async def read_mention_catalog(
    ctx: HostContext,
    workspace_id: str,
    *,
    session_id: str | None,
    agent_target_id: str | None,
    cwd: str | None,
    mode: mentions.ComposerMode,
) -> mentions.MentionMenu:
    """The Agents group for a Session's launch, or for a target before a Session exists.

    Returns:
        The group; empty with ``unavailable_reason`` set when the catalog or the
        workspace file index could not be read (HOST-MENT-4).

    Raises:
        InvalidArgument: neither or an empty scope.
        NotFound: ``SESSION_NOT_FOUND`` / ``SESSION_DELETED`` / ``AGENT_TARGET_NOT_FOUND``.
    """
    if session_id is None and not agent_target_id:
        raise InvalidArgument.for_field("scope", "set session_id or agent_target_id")
    if session_id is not None:
        validate_session_id(session_id)

    async def query(repos: HostTransaction) -> tuple[str | None, str | None]:
        """``(stored catalog, workspace root)``; the scope checks raise here."""
        if session_id is not None:
            session = require_live(
                await repos.sessions.get(workspace_id, session_id), workspace_id, session_id
            )
            raw = await repos.sessions.launch_subagents_json(workspace_id, session_id)
            return raw, session.cwd
        assert agent_target_id is not None
        raw = await repos.targets.subagent_catalog_json(agent_target_id)
        if raw is None:
            raise target_not_found(agent_target_id)
        return raw, cwd

    raw, root = await ctx.transact(query, write=False)
    if mode is not mentions.ComposerMode.AGENT:
        return mentions.MentionMenu((), ())  # plan and goal cannot delegate: nothing to read
    catalog = decode_subagent_catalog(raw)
    if catalog is None:
        return mentions.MentionMenu((), (), CATALOG_UNAVAILABLE)
    subagents = [mentions.Subagent(s.name, s.description) for s in catalog]
    try:
        return mentions.mention_menu(
            subagents, mode=mode, is_workspace_entry=ctx.workspace_index(root)
        )
    except INDEX_READ_ERRORS:
        # Without the index a file cannot be told from an agent: show none (HOST-MENT-4).
        return mentions.MentionMenu((), (), WORKSPACE_INDEX_UNAVAILABLE)
