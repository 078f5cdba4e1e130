"""Deleted-session listing and restore (HOST-DEL-7, HOST-DEL-8).

``ListDeletedSessions`` pages a workspace's *topmost* tombstones — a root tombstone, or a child
tombstone whose parent is live — ordered ``updated_at DESC, session_id ASC`` with the value
cursor of ``services.host.model.listing_cursors`` (listing ``deleted``), filtered by title and the
persisted ``rail_section_key`` only. Each item carries the restorable verdict of its tree. The
page and its trees are one direct read (``repository.listing_reads``, ADR 0039).

``RestoreDeletedSession`` clears the tombstone of exactly one complete component in one
transaction and writes one ``session_restored`` event row per member. It never starts or
resumes a runtime: a restored Session resumes only on a later user action (its next
``start_turn`` carries the stored provider resume identity). The same transaction withdraws
the members' ``release_session`` commands no runtime has acknowledged yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from domainerrors import FailedPrecondition, InvalidArgument
from services.host.context import HostContext
from services.host.deletion.delete import Forest
from services.host.model.listing_cursors import CursorPosition, decode_cursor, encode_cursor
from services.host.model.records import SessionRecord
from services.host.model.session_rules import session_not_found, validate_session_id
from services.host.repository import listing_reads
from services.host.repository.deletion import DeletedListingQuery
from services.host.repository.unit_of_work import HostTransaction
from services.host.sessions.listing import MAX_SEARCH_LENGTH
from services.host.sessions.projects import validate_section_key

__all__ = [
    "DeletedItem",
    "DeletedPage",
    "list_deleted_sessions",
    "not_topmost",
    "restore_deleted_session",
]

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
LISTING = "deleted"


@dataclass(frozen=True)
class DeletedItem:
    """One topmost tombstone with its HOST-DEL-8 verdict."""

    session: SessionRecord
    restorable: bool
    not_restorable_reason: str | None
    tree_size: int


@dataclass(frozen=True)
class DeletedPage:
    """One page of topmost tombstones."""

    items: list[DeletedItem]
    next_cursor: str
    total_count: int


async def list_deleted_sessions(
    ctx: HostContext,
    workspace_id: str,
    *,
    title_filter: str | None,
    section_key: str | None,
    cursor: str,
    limit: int,
    include_total_count: bool = False,
) -> DeletedPage:
    """Page the workspace's topmost tombstones (HOST-DEL-7).

    ``total_count`` is counted only with ``include_total_count`` (0 otherwise, ADR 0024).

    Raises:
        InvalidArgument: a negative limit, a ``title_filter`` longer than the search bound
            of ``SearchSessions`` (SEC-2), a malformed section key, or ``INVALID_CURSOR``.
    """
    if limit < 0:
        raise InvalidArgument.for_field("limit", "must not be negative")
    if title_filter is not None and len(title_filter) > MAX_SEARCH_LENGTH:
        raise InvalidArgument.for_field(
            "title_filter", f"must be at most {MAX_SEARCH_LENGTH} characters"
        )
    if section_key is not None and (violation := validate_section_key(section_key, "section_key")):
        raise InvalidArgument(violation.description, field_violations=[violation])
    size = min(limit or DEFAULT_LIMIT, MAX_LIMIT)
    after = None
    if cursor:
        position = decode_cursor(cursor, workspace_id, LISTING)
        after = (position.updated_at_unix_ms, position.session_id)
    query = DeletedListingQuery(workspace_id, title_filter or None, section_key)

    found = await ctx.read(
        lambda conn: listing_reads.deleted_page(
            conn, query, after=after, limit=size + 1, count=include_total_count
        ),
        one_statement=True,
    )
    more = len(found.sessions) > size
    records = found.sessions[:size]
    forest = Forest(found.trees)
    items = []
    for record in records:
        verdict = forest.verdict(record.session_id)
        items.append(DeletedItem(record, verdict.restorable, verdict.reason, len(verdict.members)))
    next_cursor = ""
    if more and records:
        last = records[-1]
        next_cursor = encode_cursor(
            workspace_id, LISTING, CursorPosition(last.updated_at_unix_ms, last.session_id)
        )
    return DeletedPage(items, next_cursor, found.total_count or 0)


def not_topmost(session_id: str) -> FailedPrecondition:
    """FAILED_PRECONDITION ``NOT_TOPMOST_TOMBSTONE``: the parent is tombstoned too."""
    return FailedPrecondition(
        f"Session {session_id!r} is inside a deleted tree; address its topmost tombstone",
        reason="NOT_TOPMOST_TOMBSTONE",
        metadata={"session_id": session_id},
    )


def not_deleted(session_id: str) -> FailedPrecondition:
    """FAILED_PRECONDITION ``SESSION_NOT_DELETED``."""
    return FailedPrecondition(
        f"Session {session_id!r} is not deleted",
        reason="SESSION_NOT_DELETED",
        metadata={"session_id": session_id},
    )


async def restore_deleted_session(
    ctx: HostContext, workspace_id: str, session_id: str
) -> list[SessionRecord]:
    """Clear the tombstone of the exact complete component topped by ``session_id``.

    Returns:
        Every restored Session, topmost first, parents before children.

    Raises:
        NotFound: ``SESSION_NOT_FOUND``.
        FailedPrecondition: ``SESSION_NOT_DELETED``, ``NOT_TOPMOST_TOMBSTONE`` or
            ``COMPONENT_NOT_RESTORABLE`` (metadata ``not_restorable_reason``).
    """
    validate_session_id(session_id)

    async def run(scope: HostTransaction) -> list[SessionRecord]:
        roots = await scope.deletion.roots_of(workspace_id, [session_id])
        if session_id not in roots:
            raise session_not_found(workspace_id, session_id)
        forest = Forest(
            await scope.deletion.tree_rows(workspace_id, [roots[session_id]], lock=True)
        )
        row = forest.rows[session_id]
        if row.is_live:
            raise not_deleted(session_id)
        if not forest.is_topmost_tombstone(session_id):
            raise not_topmost(session_id)
        verdict = forest.verdict(session_id)
        if not verdict.restorable:
            raise FailedPrecondition(
                f"the deleted tree of {session_id!r} is not one complete component",
                reason="COMPONENT_NOT_RESTORABLE",
                metadata={
                    "session_id": session_id,
                    "not_restorable_reason": verdict.reason or "",
                },
            )
        generation = row.deletion_generation or ""
        members = list(verdict.members)
        await scope.deletion.clear_tombstones(workspace_id, members)
        # A release the delete wrote but no runtime acknowledged yet must not drop the provider
        # session of a Session that is live again (ADR 0016 §14).
        await scope.deletion.withdraw_releases(workspace_id, members)
        for member in members:
            scope.deletion.note_restored(workspace_id, member, generation)
        return await scope.deletion.records(workspace_id, members)

    return await ctx.transact(run)
