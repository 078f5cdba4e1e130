"""``RemoveProject``: delete the project's live unpinned roots, then finalize (HOST-PROJ-1).

The removal is authoritative: Sessions may be created in the project while it runs, so it
works in rounds until one finalizes. Each round:

1. reads the project's live unpinned root Sessions — exactly what a "clear section" shows —
   and sends them through the canonical ``DeleteSessions`` command (plan, quiesce,
   tombstone; HOST-DEL-1). A plan gone stale (a child or tombstone changed under it) ends
   the round and the next one re-plans.
2. tries one compare-and-finalize transaction. It locks the project row (``SELECT ... FOR
   UPDATE`` on Postgres, the writer lock on SQLite), so no Session can be placed in the
   project until it ends (HOST-SES-2), and reads the live unpinned roots again. If one
   appeared since step 1 the transaction rolls back and another round starts. Otherwise it
   moves every remaining member of the section (retained pinned trees and tombstones,
   including the ones just made, so no row keeps a key that no longer exists) to
   ``conversations`` and deletes the project row.

The finalize's locked read is the read that "finds none left", so an uncontended removal is
one round. After ``HostContext.project_removal_max_rounds`` rounds without a finalize the
call fails ``ABORTED STALE_DELETE_PLAN`` with RetryInfo. What earlier rounds deleted stays
deleted (each delete is its own committed command); the project row and every placement are
then unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from domainerrors import Aborted, InvalidArgument
from services.host.context import HostContext
from services.host.deletion import delete as deletion
from services.host.model.session_rules import CONVERSATIONS_SECTION_KEY
from services.host.repository.unit_of_work import HostTransaction
from services.host.sessions.projects import project_not_found, validate_section_key

__all__ = ["ProjectRemoval", "remove_project"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProjectRemoval:
    """What ``RemoveProject`` did: the delete result and the Sessions rehomed.

    Attributes:
        deletion: every round's deletes together.
        rehomed_session_ids: the Sessions the finalize moved to ``conversations``.
    """

    deletion: deletion.DeletionResult
    rehomed_session_ids: tuple[str, ...]


class _LiveRootAppeared(Exception):
    """Raised inside the finalize to roll it back: the section gained a live unpinned root."""


def _merged(
    total: deletion.DeletionResult, more: deletion.DeletionResult
) -> deletion.DeletionResult:
    return deletion.DeletionResult(
        deleted=total.deleted + more.deleted,
        absorbed=total.absorbed + more.absorbed,
        already_deleted_session_ids=total.already_deleted_session_ids
        + more.already_deleted_session_ids,
        interrupted_turn_ids=total.interrupted_turn_ids + more.interrupted_turn_ids,
        superseded_interaction_count=total.superseded_interaction_count
        + more.superseded_interaction_count,
    )


async def _deleted_batches(
    ctx: HostContext, workspace_id: str, roots: Sequence[str]
) -> AsyncIterator[deletion.DeletionResult]:
    """Send ``roots`` through ``DeleteSessions`` in batches of its size limit.

    Yields each batch's result as soon as it committed, so a later batch's
    ``STALE_DELETE_PLAN`` cannot hide what the earlier (committed) batches deleted.
    """
    for start in range(0, len(roots), deletion.MAX_DELETE_IDS):
        batch = roots[start : start + deletion.MAX_DELETE_IDS]
        yield await deletion.delete_sessions(ctx, workspace_id, batch)


async def remove_project(ctx: HostContext, workspace_id: str, section_key: str) -> ProjectRemoval:
    """Delete the live unpinned roots, then rehome the rest and remove the project.

    Raises:
        InvalidArgument: a malformed key.
        NotFound: reason ``PROJECT_NOT_FOUND`` (also when a concurrent removal won).
        Aborted: ``STALE_DELETE_PLAN`` (RetryInfo) when every one of
            ``ctx.project_removal_max_rounds`` rounds lost a race with a Session creation
            or a tree change.
    """
    if (violation := validate_section_key(section_key, "section_key")) is not None:
        raise InvalidArgument(violation.description, field_violations=[violation])

    async def live_roots(repos: HostTransaction) -> list[str]:
        if await repos.projects.get(workspace_id, section_key) is None:
            raise project_not_found(workspace_id, section_key)
        return await repos.projects.live_unpinned_root_ids(workspace_id, section_key)

    async def finalize(repos: HostTransaction) -> tuple[str, ...]:
        if await repos.projects.get(workspace_id, section_key, lock="update") is None:
            raise project_not_found(workspace_id, section_key)
        if await repos.projects.live_unpinned_root_ids(workspace_id, section_key):
            raise _LiveRootAppeared  # nothing written yet: the rollback undoes nothing
        rehomed = await repos.projects.rehome_section(
            workspace_id, section_key, CONVERSATIONS_SECTION_KEY
        )
        await repos.projects.delete(workspace_id, section_key)
        return tuple(rehomed)

    result = deletion.DeletionResult()
    for _ in range(ctx.project_removal_max_rounds):
        roots = await ctx.transact(live_roots, write=False)
        try:
            async for batch_result in _deleted_batches(ctx, workspace_id, roots):
                result = _merged(result, batch_result)
        except Aborted as error:
            if error.reason != deletion.STALE_DELETE_PLAN:
                raise
            continue  # a tree changed under the plan: the next round re-plans
        try:
            rehomed = await ctx.transact(finalize)
        except _LiveRootAppeared:
            continue
        return ProjectRemoval(result, rehomed)
    _log.info(
        "RemoveProject %s/%s lost %d rounds to concurrent changes; the caller retries",
        workspace_id,
        section_key,
        ctx.project_removal_max_rounds,
    )
    raise deletion.stale_plan(workspace_id)
