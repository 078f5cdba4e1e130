"""``RemoveProject``: delete the project's live unpinned roots, then finalize (HOST-PROJ-1).

1. The project's live unpinned root Sessions — exactly what a "clear section" shows — go
   through the canonical ``DeleteSessions`` command (plan, quiesce, tombstone; HOST-DEL-1).
2. One compare-and-finalize transaction locks the project row (so no Session can be placed
   in it concurrently, HOST-SES-2), re-checks that no live unpinned root remains — one
   created between the two steps is ``ABORTED STALE_DELETE_PLAN`` and a retry re-plans —
   moves every remaining member of the section (retained pinned trees and tombstones,
   including the ones just made, so no row keeps a key that no longer exists) to
   ``conversations`` and deletes the project row.
"""

from __future__ import annotations

from dataclasses import dataclass

from domainerrors import InvalidArgument
from services.host.context import HostContext
from services.host.deletion import delete as deletion
from services.host.model.session_rules import CONVERSATIONS_SECTION_KEY
from services.host.repository.unit_of_work import HostTransaction
from services.host.sessions.projects import project_not_found, validate_section_key

__all__ = ["ProjectRemoval", "remove_project"]


@dataclass(frozen=True)
class ProjectRemoval:
    """What ``RemoveProject`` did: the delete result and the Sessions rehomed."""

    deletion: deletion.DeletionResult
    rehomed_session_ids: tuple[str, ...]


async def remove_project(ctx: HostContext, workspace_id: str, section_key: str) -> ProjectRemoval:
    """Delete the live unpinned roots, then rehome the rest and remove the project.

    Raises:
        InvalidArgument: a malformed key.
        NotFound: reason ``PROJECT_NOT_FOUND``.
        Aborted: ``STALE_DELETE_PLAN`` (RetryInfo) when the section gained a live unpinned
            root between the delete and the finalize, or the delete plan went stale.
    """
    if (violation := validate_section_key(section_key, "section_key")) is not None:
        raise InvalidArgument(violation.description, field_violations=[violation])

    async def live_roots(repos: HostTransaction) -> list[str]:
        if await repos.projects.get(workspace_id, section_key) is None:
            raise project_not_found(workspace_id, section_key)
        return await repos.projects.live_unpinned_root_ids(workspace_id, section_key)

    roots = await ctx.transact(live_roots, write=False)
    result = deletion.DeletionResult()
    for start in range(0, len(roots), deletion.MAX_DELETE_IDS):
        batch = await deletion.delete_sessions(
            ctx, workspace_id, roots[start : start + deletion.MAX_DELETE_IDS]
        )
        result = deletion.DeletionResult(
            deleted=result.deleted + batch.deleted,
            absorbed=result.absorbed + batch.absorbed,
            already_deleted_session_ids=result.already_deleted_session_ids
            + batch.already_deleted_session_ids,
            interrupted_turn_ids=result.interrupted_turn_ids + batch.interrupted_turn_ids,
            superseded_interaction_count=result.superseded_interaction_count
            + batch.superseded_interaction_count,
        )

    async def finalize(repos: HostTransaction) -> tuple[str, ...]:
        if await repos.projects.get(workspace_id, section_key, lock="update") is None:
            raise project_not_found(workspace_id, section_key)
        if await repos.projects.live_unpinned_root_ids(workspace_id, section_key):
            raise deletion.stale_plan(workspace_id)
        rehomed = await repos.projects.rehome_section(
            workspace_id, section_key, CONVERSATIONS_SECTION_KEY
        )
        await repos.projects.delete(workspace_id, section_key)
        return tuple(rehomed)

    rehomed = await ctx.transact(finalize)
    return ProjectRemoval(result, rehomed)
