"""Rail listings of root Sessions: sections, pinned, search, deletion candidates (HOST-SES-4).

Every page goes through one listing query, which applies the scope and the filters
(``agent_target_id``, the case-insensitive title query, an optional authorized Session-id set)
to the whole visible set before paging, ``total_count`` and
candidate selection. Order is ``updated_at DESC, session_id ASC``; cursors are value cursors
bound to the workspace and the listing (``services.host.model.listing_cursors``). Membership is the
exact persisted ``rail_section_key``; tombstones and child Sessions never appear.

Pages are direct reads (``repository.listing_reads``, ADR 0039): fixed-arity statements on a
store read thread, one per page on Postgres. A filter by an authorized Session-id set is an
``IN`` list a direct read cannot bind, so such listings run the ORM query
(:meth:`~services.host.repository.sessions.SessionRepository.root_sessions`) in a read
transaction; both return the same pages.
"""

from __future__ import annotations

from dataclasses import dataclass

from domainerrors import FieldViolation, InvalidArgument
from services.host.context import HostContext
from services.host.model.listing_cursors import CursorPosition, decode_cursor, encode_cursor
from services.host.model.records import SessionRecord, TurnRecord
from services.host.model.session_rules import CONVERSATIONS_SECTION_KEY
from services.host.repository import listing_reads
from services.host.repository.listing_reads import ListingPage
from services.host.repository.projects import ProjectRecord
from services.host.repository.sessions import RootSessionQuery
from services.host.repository.unit_of_work import HostTransaction
from services.host.sessions.projects import validate_section_key

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_AUTHORIZED_IDS",
    "MAX_PAGE_SIZE",
    "MAX_SEARCH_LENGTH",
    "ListFilter",
    "ListItem",
    "RailSection",
    "RailSections",
    "SessionPage",
    "deletion_candidates",
    "list_pinned_page",
    "list_section_page",
    "list_sections",
    "page_size",
    "search_sessions",
]

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
MAX_SEARCH_LENGTH = 256
"""Longest free-text filter accepted (``search_query``, ``ListDeletedSessions.title_filter``)."""
MAX_AUTHORIZED_IDS = 5000
PINNED_LISTING = "pinned"
SEARCH_LISTING = "search"


def section_listing(section_key: str) -> str:
    """The listing identity a section page's cursor is bound to."""
    return f"section:{section_key}"


@dataclass(frozen=True)
class ListFilter:
    """``SessionListFilter`` (HOST-SES-4); ``None`` means "no restriction"."""

    agent_target_id: str | None = None
    search_query: str | None = None
    authorized_session_ids: frozenset[str] | None = None

    def validate(self, prefix: str = "filter") -> None:
        """Raise INVALID_ARGUMENT for an unusable filter."""
        violations: list[FieldViolation] = []
        if self.agent_target_id is not None and not self.agent_target_id:
            violations.append(
                FieldViolation(f"{prefix}.agent_target_id", "must not be empty when set")
            )
        if self.search_query is not None and len(self.search_query) > MAX_SEARCH_LENGTH:
            violations.append(
                FieldViolation(
                    f"{prefix}.search_query", f"must be at most {MAX_SEARCH_LENGTH} characters"
                )
            )
        ids = self.authorized_session_ids
        if ids is not None and len(ids) > MAX_AUTHORIZED_IDS:
            violations.append(
                FieldViolation(
                    f"{prefix}.authorized_session_ids.session_ids",
                    f"at most {MAX_AUTHORIZED_IDS} ids",
                )
            )
        if violations:
            raise InvalidArgument("invalid Session list filter", field_violations=violations)

    def query(
        self, workspace_id: str, *, section_key: str | None = None, pinned: bool | None = None
    ) -> RootSessionQuery:
        """The repository query for one scope with this filter."""
        return RootSessionQuery(
            workspace_id=workspace_id,
            section_key=section_key,
            pinned=pinned,
            agent_target_id=self.agent_target_id,
            title_contains=self.search_query or None,
            session_ids=self.authorized_session_ids,
        )


def page_size(value: int, field: str) -> int:
    """0 means the default, larger than the maximum is clamped, negative is invalid."""
    if value < 0:
        raise InvalidArgument.for_field(field, "must not be negative")
    return min(value or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


@dataclass(frozen=True)
class ListItem:
    """One root Session with its latest Turn and its tree's pending Interaction count."""

    session: SessionRecord
    latest_turn: TurnRecord | None
    pending_interaction_count: int


@dataclass(frozen=True)
class SessionPage:
    """One page; ``next_cursor`` is empty on the last page."""

    items: list[ListItem]
    next_cursor: str
    total_count: int


def _next_cursor(
    query: RootSessionQuery, listing: str, sessions: list[SessionRecord], has_more: bool
) -> str:
    if not (has_more and sessions):
        return ""
    last = sessions[-1]
    position = CursorPosition(last.updated_at_unix_ms, last.session_id)
    return encode_cursor(query.workspace_id, listing, position)


def _from_rows(query: RootSessionQuery, listing: str, rows: ListingPage) -> SessionPage:
    """A page from the rows of a direct read."""
    return SessionPage(
        items=[
            ListItem(
                s,
                rows.latest_turns.get(s.session_id),
                rows.pending_counts.get(s.session_id, 0),
            )
            for s in rows.sessions
        ],
        next_cursor=_next_cursor(query, listing, rows.sessions, rows.has_more),
        total_count=rows.total_count,
    )


async def _orm_page(
    repos: HostTransaction,
    query: RootSessionQuery,
    *,
    listing: str,
    after: CursorPosition | None,
    limit: int,
) -> SessionPage:
    """A page through the ORM query (authorized id sets, which direct reads cannot bind)."""
    result = await repos.sessions.root_sessions(
        query,
        after=None if after is None else (after.updated_at_unix_ms, after.session_id),
        limit=limit,
    )
    ids = [s.session_id for s in result.sessions]
    latest = await repos.sessions.latest_turns(query.workspace_id, ids)
    pending = await repos.sessions.pending_interaction_counts(query.workspace_id, ids)
    return SessionPage(
        items=[
            ListItem(s, latest.get(s.session_id), pending.get(s.session_id, 0))
            for s in result.sessions
        ],
        next_cursor=_next_cursor(query, listing, result.sessions, result.has_more),
        total_count=result.total_count,
    )


async def _page(
    ctx: HostContext,
    query: RootSessionQuery,
    *,
    listing: str,
    after: CursorPosition | None,
    limit: int,
) -> SessionPage:
    """One page of ``query``: a direct read, or the ORM query for an authorized id set."""
    if not listing_reads.supports(query):

        async def orm(repos: HostTransaction) -> SessionPage:
            return await _orm_page(repos, query, listing=listing, after=after, limit=limit)

        return await ctx.transact(orm, write=False)
    position = None if after is None else (after.updated_at_unix_ms, after.session_id)
    rows = await ctx.read(
        lambda conn: listing_reads.listing_page(conn, query, after=position, limit=limit),
        one_statement=True,
    )
    return _from_rows(query, listing, rows)


def _after(cursor: str, workspace_id: str, listing: str) -> CursorPosition | None:
    return decode_cursor(cursor, workspace_id, listing) if cursor else None


@dataclass(frozen=True)
class RailSection:
    """One rail section with its first page; ``project`` is ``None`` for conversations."""

    section_key: str
    label: str
    project: ProjectRecord | None
    first_page: SessionPage


@dataclass(frozen=True)
class RailSections:
    """``ListSessionSections``: every section's first page and the first pinned page."""

    sections: list[RailSection]
    pinned: SessionPage


CONVERSATIONS_LABEL = "Conversations"


async def list_sections(
    ctx: HostContext, workspace_id: str, filters: ListFilter, limit: int
) -> RailSections:
    """User-project sections (by label, then key), then conversations, then pinned.

    One read transaction, so every page describes the same committed state.
    """
    filters.validate()
    scope = filters.query(workspace_id)
    if not listing_reads.supports(scope):
        return await _orm_sections(ctx, workspace_id, filters, limit)
    rows = await ctx.read(
        lambda conn: listing_reads.rail(
            conn, scope, conversations_key=CONVERSATIONS_SECTION_KEY, limit=limit
        )
    )
    sections = [
        RailSection(
            project.section_key,
            project.label,
            project,
            _from_rows(scope, section_listing(project.section_key), page),
        )
        for project, page in zip(rows.projects, rows.project_pages, strict=True)
    ]
    conversations = _from_rows(
        scope, section_listing(CONVERSATIONS_SECTION_KEY), rows.conversations
    )
    sections.append(
        RailSection(CONVERSATIONS_SECTION_KEY, CONVERSATIONS_LABEL, None, conversations)
    )
    return RailSections(sections, _from_rows(scope, PINNED_LISTING, rows.pinned))


async def _orm_sections(
    ctx: HostContext, workspace_id: str, filters: ListFilter, limit: int
) -> RailSections:
    """``list_sections`` through the ORM query (an authorized id set)."""

    async def query(repos: HostTransaction) -> RailSections:
        sections: list[RailSection] = []
        for project in await repos.projects.in_workspace(workspace_id):
            page = await _orm_page(
                repos,
                filters.query(workspace_id, section_key=project.section_key, pinned=False),
                listing=section_listing(project.section_key),
                after=None,
                limit=limit,
            )
            sections.append(RailSection(project.section_key, project.label, project, page))
        conversations = await _orm_page(
            repos,
            filters.query(workspace_id, section_key=CONVERSATIONS_SECTION_KEY, pinned=False),
            listing=section_listing(CONVERSATIONS_SECTION_KEY),
            after=None,
            limit=limit,
        )
        sections.append(
            RailSection(CONVERSATIONS_SECTION_KEY, CONVERSATIONS_LABEL, None, conversations)
        )
        pinned = await _orm_page(
            repos,
            filters.query(workspace_id, pinned=True),
            listing=PINNED_LISTING,
            after=None,
            limit=limit,
        )
        return RailSections(sections, pinned)

    return await ctx.transact(query, write=False)


async def list_section_page(
    ctx: HostContext,
    workspace_id: str,
    section_key: str,
    filters: ListFilter,
    cursor: str,
    limit: int,
) -> SessionPage:
    """One page of a section's unpinned root Sessions (exact membership)."""
    if (violation := validate_section_key(section_key, "section_key")) is not None:
        raise InvalidArgument(violation.description, field_violations=[violation])
    filters.validate()
    listing = section_listing(section_key)
    after = _after(cursor, workspace_id, listing)

    return await _page(
        ctx,
        filters.query(workspace_id, section_key=section_key, pinned=False),
        listing=listing,
        after=after,
        limit=limit,
    )


async def list_pinned_page(
    ctx: HostContext, workspace_id: str, filters: ListFilter, cursor: str, limit: int
) -> SessionPage:
    """One page of pinned root Sessions across every section."""
    filters.validate()
    after = _after(cursor, workspace_id, PINNED_LISTING)

    return await _page(
        ctx,
        filters.query(workspace_id, pinned=True),
        listing=PINNED_LISTING,
        after=after,
        limit=limit,
    )


async def search_sessions(
    ctx: HostContext,
    workspace_id: str,
    search_query: str,
    filters: ListFilter,
    cursor: str,
    limit: int,
) -> SessionPage:
    """One page of root Sessions (pinned or not, any section) whose title matches.

    ``search_query`` (required) overrides ``filters.search_query``.
    """
    if not search_query.strip():
        raise InvalidArgument.for_field("search_query", "is required")
    if len(search_query) > MAX_SEARCH_LENGTH:
        raise InvalidArgument.for_field(
            "search_query", f"must be at most {MAX_SEARCH_LENGTH} characters"
        )
    filters.validate()  # the overridden filter.search_query is bounded too (SEC-2)
    effective = ListFilter(filters.agent_target_id, search_query, filters.authorized_session_ids)
    after = _after(cursor, workspace_id, SEARCH_LISTING)

    return await _page(
        ctx, effective.query(workspace_id), listing=SEARCH_LISTING, after=after, limit=limit
    )


async def deletion_candidates(
    ctx: HostContext, workspace_id: str, section_key: str, filters: ListFilter
) -> list[str]:
    """Every live unpinned root Session of a section after the filters (not paged)."""
    if (violation := validate_section_key(section_key, "section_key")) is not None:
        raise InvalidArgument(violation.description, field_violations=[violation])
    filters.validate()

    async def query(repos: HostTransaction) -> list[str]:
        result = await repos.sessions.root_sessions(
            filters.query(workspace_id, section_key=section_key, pinned=False)
        )
        return [s.session_id for s in result.sessions]

    return await ctx.transact(query, write=False)
