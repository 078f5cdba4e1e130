"""The resource-cleanup outbox and its creation fence (HOST-DEL-11, HOST-CLEAN-1).

A purge writes one row per removed (workspace, Session) in its own transaction. While any row
for a Session id is pending, ``CreateSession`` refuses that id in every workspace
(``RESOURCE_CLEANUP_PENDING``, checked in ``services.host.sessions.commands``), because
runtime sidecar and copied-attachment paths are keyed by Session id alone. The cleanup worker
(maintenance) lists rows with the ownership facts it needs — is the id still owned by any live
or tombstoned Session anywhere, and by a live Session in another workspace — and completes each
row, which lifts the fence once no row for the id remains.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from domainerrors import FieldViolation, InvalidArgument
from services.host.context import HostContext
from services.host.model.session_rules import validate_session_id
from services.host.repository.deletion import CleanupRow, WorkspaceFilter
from services.host.repository.unit_of_work import HostTransaction
from store import page_tokens

__all__ = [
    "CleanupPage",
    "Completion",
    "complete_resource_cleanup",
    "complete_resource_cleanups",
    "list_pending_cleanups",
]

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_COMPLETIONS = 1000


@dataclass(frozen=True)
class CleanupPage:
    """One page of pending cleanup rows."""

    rows: list[CleanupRow]
    next_cursor: str


@dataclass(frozen=True)
class Completion:
    """What completing one row did."""

    completed: bool
    fence_lifted: bool


def _binding(workspaces: WorkspaceFilter) -> dict[str, str | None]:
    # A cursor continues only the listing of the same workspaces (one keeps its old binding).
    if isinstance(workspaces, frozenset):
        workspaces = (
            next(iter(workspaces)) if len(workspaces) == 1 else json.dumps(sorted(workspaces))
        )
    return {"listing": "resource_cleanups", "workspace_id": workspaces}


async def list_pending_cleanups(
    ctx: HostContext, workspaces: WorkspaceFilter, cursor: str, limit: int
) -> CleanupPage:
    """Pending rows ordered ``purged_at, workspace, session`` with ownership facts.

    ``workspaces`` is one workspace, a set of them (a scoped caller's own), or ``None`` for
    every workspace (a deployment-wide caller only).

    Raises:
        InvalidArgument: a negative limit or ``INVALID_CURSOR``.
    """
    if limit < 0:
        raise InvalidArgument.for_field("limit", "must not be negative")
    size = min(limit or DEFAULT_LIMIT, MAX_LIMIT)
    after: tuple[int, str, str] | None = None
    if cursor:
        try:
            purged_at, ws, sid = page_tokens.decode(cursor, _binding(workspaces))
            after = (int(purged_at), str(ws), str(sid))
        except (page_tokens.MalformedPageToken, ValueError, TypeError):
            raise InvalidArgument(
                "cursor is not a cursor of this listing",
                reason="INVALID_CURSOR",
                field_violations=[FieldViolation("cursor", "is not a cursor of this listing")],
            ) from None

    async def run(scope: HostTransaction) -> CleanupPage:
        rows = await scope.deletion.pending_cleanups(workspaces, after=after, limit=size + 1)
        more = len(rows) > size
        rows = rows[:size]
        next_cursor = ""
        if more:
            last = rows[-1]
            next_cursor = page_tokens.encode(
                _binding(workspaces),
                [last.purged_at_unix_ms, last.workspace_id, last.session_id],
            )
        return CleanupPage(rows, next_cursor)

    return await ctx.transact(run, write=False)


async def complete_resource_cleanup(
    ctx: HostContext, workspace_id: str, session_id: str
) -> Completion:
    """Delete one row (idempotent) and report whether the id's creation fence is lifted."""
    validate_session_id(session_id)

    async def run(scope: HostTransaction) -> Completion:
        completed, lifted = await scope.deletion.complete_cleanup(workspace_id, session_id)
        return Completion(completed, lifted)

    return await ctx.transact(run)


async def complete_resource_cleanups(
    ctx: HostContext, rows: list[tuple[str, str]]
) -> list[Completion]:
    """Complete several rows in one transaction, each as :func:`complete_resource_cleanup`.

    ``rows`` are (workspace, Session) pairs the caller is authorized for.

    Raises:
        InvalidArgument: no rows, more than :data:`MAX_COMPLETIONS`, a repeated row, or a
            malformed id (field ``cleanups[i]...``); nothing changes.
    """
    if not rows:
        raise InvalidArgument.for_field("cleanups", "must name at least one row")
    if len(rows) > MAX_COMPLETIONS:
        raise InvalidArgument.for_field("cleanups", f"must name at most {MAX_COMPLETIONS} rows")
    seen: set[tuple[str, str]] = set()
    for index, (workspace_id, session_id) in enumerate(rows):
        if not workspace_id:
            raise InvalidArgument.for_field(f"cleanups[{index}].workspace_id", "must be set")
        validate_session_id(session_id, f"cleanups[{index}].session_id")
        if (workspace_id, session_id) in seen:
            raise InvalidArgument.for_field(f"cleanups[{index}]", "names a row twice")
        seen.add((workspace_id, session_id))

    async def run(scope: HostTransaction) -> list[Completion]:
        existed = await scope.deletion.complete_cleanups(rows)
        # Fences are judged once every row of the call is gone.
        remaining = await scope.deletion.ids_with_pending_cleanup({sid for _, sid in rows})
        return [Completion(key in existed, key[1] not in remaining) for key in rows]

    return await ctx.transact(run)
