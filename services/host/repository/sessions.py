"""SQL of Sessions and of the entity reads that compose with them (HOST-SES-1..6).

:meth:`SessionRepository.root_sessions` is the one listing query behind every Session
listing RPC (HOST-SES-4): scope, filters and the value cursor are applied in SQL to the whole
visible set before paging, ``total_count`` and candidate selection. A page reads a page's worth
of entries of ``ix_sessions_unpinned_roots`` / ``ix_sessions_pinned_roots`` (named with
``INDEXED BY`` on SQLite, ``repository.listing_indexes``); ``total_count`` of
a scope filtered at most by agent target is the sum of a few ``session_listing_counts`` rows,
which triggers keep exact (ADR 0024), so neither depends on how many Sessions exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import and_, bindparam, exists, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased
from sqlalchemy.sql.elements import ColumnElement

from services.host.model.records import (
    Capabilities,
    SessionRecord,
    SessionSettingsValue,
    TurnRecord,
)
from services.host.repository.changes import CREATED, ActivityChanges
from services.host.repository.inserts import insert_if_absent
from services.host.repository.listing_indexes import PINNED_ROOTS, UNPINNED_ROOTS
from services.host.repository.row_records import session_record, turn_record
from store.models import (
    Interaction,
    ResourceCleanupOutbox,
    Session,
    SessionListingCount,
    Turn,
)

__all__ = [
    "NewSession",
    "RootSessionPage",
    "RootSessionQuery",
    "SessionRepository",
    "live_roots_clauses",
    "page_source",
    "session_record",
]


@dataclass(frozen=True)
class NewSession:
    """The first persistence of a root Session (HOST-SES-2)."""

    workspace_id: str
    session_id: str
    agent_target_id: str
    provider: str
    provider_target_ref: str
    title: str
    cwd: str
    rail_section_key: str
    rail_project_path: str | None
    settings: SessionSettingsValue
    capabilities: Capabilities
    launch_subagents_json: str
    created_at_unix_ms: int


@dataclass(frozen=True)
class RootSessionQuery:
    """Which live root Sessions a listing covers (HOST-SES-4).

    Attributes:
        workspace_id: the workspace; every listing is scoped to exactly one.
        section_key: exact ``rail_section_key`` membership, or ``None`` for every section.
        pinned: ``True`` pinned only, ``False`` unpinned only, ``None`` both.
        agent_target_id: keep only Sessions launched with this target.
        title_contains: keep only titles containing this text, case-insensitively.
        session_ids: keep only these Sessions (an authorized set); ``None`` = no restriction.
    """

    workspace_id: str
    section_key: str | None = None
    pinned: bool | None = None
    agent_target_id: str | None = None
    title_contains: str | None = None
    session_ids: frozenset[str] | None = None


@dataclass(frozen=True)
class RootSessionPage:
    """One page of a listing plus the size of the whole filtered set."""

    sessions: list[SessionRecord]
    total_count: int
    has_more: bool


def live_roots_clauses(query: RootSessionQuery, entity: Any = Session) -> list[ColumnElement[bool]]:
    """The WHERE clause of a listing: visibility, scope and filters (HOST-SES-4).

    Args:
        query: the listing's scope and filters.
        entity: ``Session`` or one of the ``listing_indexes`` aliases of it.
    """
    clauses: list[ColumnElement[bool]] = [
        entity.workspace_id == query.workspace_id,
        entity.deleted_at_unix_ms.is_(None),
        entity.parent_session_id.is_(None),
    ]
    if query.section_key is not None:
        clauses.append(entity.rail_section_key == query.section_key)
    if query.pinned is True:
        clauses.append(entity.pinned_at_unix_ms.is_not(None))
    elif query.pinned is False:
        clauses.append(entity.pinned_at_unix_ms.is_(None))
    if query.agent_target_id is not None:
        clauses.append(entity.agent_target_id == query.agent_target_id)
    if query.title_contains:
        clauses.append(
            func.lower(entity.title).contains(query.title_contains.lower(), autoescape=True)
        )
    if query.session_ids is not None:
        clauses.append(entity.session_id.in_(sorted(query.session_ids)))
    return clauses


def page_source(query: RootSessionQuery) -> Any:
    """What a listing page reads: a listing index's alias where one serves its order."""
    if query.session_ids is not None:
        # An authorized id set is best served by its primary-key lookups; let the planner.
        return Session
    if query.pinned is True:
        return PINNED_ROOTS
    if query.pinned is False and query.section_key is not None:
        return UNPINNED_ROOTS
    return Session


# Prebuilt: a Session listing and GetSession read the latest Turn on every call, and building
# these statements (the window subquery especially) costs more than executing them.
_LATEST_TURN: Final = (
    select(Turn)
    .where(
        Turn.workspace_id == bindparam("workspace_id"),
        Turn.session_id == bindparam("session_id"),
        Turn.retracted_at_unix_ms.is_(None),
    )
    .order_by(Turn.created_at_unix_ms.desc(), Turn.turn_id.desc())
    .limit(1)
)
_RANKED_TURNS = (
    select(
        Turn,
        func.row_number()
        .over(
            partition_by=Turn.session_id,
            order_by=(Turn.created_at_unix_ms.desc(), Turn.turn_id.desc()),
        )
        .label("rank"),
    )
    .where(
        Turn.workspace_id == bindparam("workspace_id"),
        Turn.session_id.in_(bindparam("session_ids", expanding=True)),
        Turn.retracted_at_unix_ms.is_(None),
    )
    .subquery()
)
_LATEST_TURNS: Final = select(aliased(Turn, _RANKED_TURNS)).where(_RANKED_TURNS.c.rank == 1)


class SessionRepository:
    """Reads and writes ``sessions`` and reads the Turns and Interactions they compose."""

    def __init__(self, session: AsyncSession, changes: ActivityChanges) -> None:
        self._session = session
        self._changes = changes

    async def get(self, workspace_id: str, session_id: str) -> SessionRecord | None:
        """One Session, live or tombstoned."""
        row = (
            await self._session.execute(
                select(Session).where(
                    Session.workspace_id == workspace_id, Session.session_id == session_id
                )
            )
        ).scalar_one_or_none()
        return None if row is None else session_record(row)

    async def insert(self, new: NewSession) -> bool:
        """Insert a root Session; ``False`` when the id is taken in the workspace."""
        if not await insert_if_absent(
            self._session,
            insert(Session).values(
                workspace_id=new.workspace_id,
                session_id=new.session_id,
                root_session_id=new.session_id,
                agent_target_id=new.agent_target_id,
                provider=new.provider,
                provider_target_ref=new.provider_target_ref,
                title=new.title,
                cwd=new.cwd,
                rail_section_key=new.rail_section_key,
                rail_project_path=new.rail_project_path,
                settings_json=new.settings.to_json(),
                capabilities_json=new.capabilities.to_json(),
                launch_subagents_json=new.launch_subagents_json,
                message_version=0,
                next_message_sequence=1,
                created_at_unix_ms=new.created_at_unix_ms,
                updated_at_unix_ms=new.created_at_unix_ms,
                tombstone_legacy=False,
            ),
        ):
            return False
        # HOST-OBS-2: a new Session is announced by identity (session_reconcile_required).
        self._changes.session(new.workspace_id, new.session_id, (CREATED,))
        return True

    async def launch_subagents_json(self, workspace_id: str, session_id: str) -> str | None:
        """The subagent catalog the Session was launched with (HOST-MENT-1), as stored."""
        result = await self._session.execute(
            select(Session.launch_subagents_json).where(
                Session.workspace_id == workspace_id, Session.session_id == session_id
            )
        )
        return result.scalar_one_or_none()

    async def cleanup_pending(self, session_id: str) -> bool:
        """Whether a pending resource-cleanup row fences this id in any workspace (HOST-DEL-11)."""
        result = await self._session.execute(
            select(exists().where(ResourceCleanupOutbox.session_id == session_id))
        )
        return bool(result.scalar_one())

    async def latest_turns(
        self, workspace_id: str, session_ids: Iterable[str]
    ) -> dict[str, TurnRecord]:
        """The most recently created effective (not retracted) Turn of each Session."""
        ids = sorted(set(session_ids))
        if not ids:
            return {}
        if len(ids) == 1:
            # GetSession: a plain ORDER BY ... LIMIT 1 over the Session's Turns; building the
            # window query below costs more than running this one.
            params = {"workspace_id": workspace_id, "session_id": ids[0]}
            row = (await self._session.execute(_LATEST_TURN, params)).scalar_one_or_none()
            return {} if row is None else {ids[0]: turn_record(row)}
        rows = await self._session.execute(
            _LATEST_TURNS, {"workspace_id": workspace_id, "session_ids": ids}
        )
        return {row.session_id: turn_record(row) for row in rows.scalars()}

    async def pending_interaction_counts(
        self, workspace_id: str, root_session_ids: Iterable[str]
    ) -> dict[str, int]:
        """Actionable pending Interactions in each root's live tree."""
        ids = sorted(set(root_session_ids))
        if not ids:
            return {}
        rows = await self._session.execute(
            select(Session.root_session_id, func.count())
            .select_from(Interaction)
            .join(
                Session,
                and_(
                    Session.workspace_id == Interaction.workspace_id,
                    Session.session_id == Interaction.session_id,
                ),
            )
            .where(
                Interaction.workspace_id == workspace_id,
                Session.root_session_id.in_(ids),
                Session.deleted_at_unix_ms.is_(None),
                Interaction.status == "pending",
                Interaction.actionable.is_(True),
            )
            .group_by(Session.root_session_id)
        )
        return {row[0]: int(row[1]) for row in rows}

    async def _set(self, workspace_id: str, session_id: str, **values: object) -> None:
        await self._session.execute(
            update(Session)
            .where(Session.workspace_id == workspace_id, Session.session_id == session_id)
            .values(**values)
        )
        self._changes.session(workspace_id, session_id, values)  # HOST-OBS-2

    async def set_title(self, workspace_id: str, session_id: str, title: str) -> None:
        """Store a new title."""
        await self._set(workspace_id, session_id, title=title)

    async def set_pinned_at(
        self, workspace_id: str, session_id: str, pinned_at_unix_ms: int | None
    ) -> None:
        """Pin (a timestamp) or unpin (``None``)."""
        await self._set(workspace_id, session_id, pinned_at_unix_ms=pinned_at_unix_ms)

    async def set_settings(
        self, workspace_id: str, session_id: str, settings: SessionSettingsValue
    ) -> None:
        """Store normalized settings."""
        await self._set(workspace_id, session_id, settings_json=settings.to_json())

    async def root_sessions(
        self,
        query: RootSessionQuery,
        *,
        after: tuple[int, str] | None = None,
        limit: int | None = None,
    ) -> RootSessionPage:
        """The listing query (HOST-SES-4): filter the whole visible set, count it, page it.

        Args:
            query: scope and filters, applied before paging and counting.
            after: ``(updated_at_unix_ms, session_id)`` of the previous page's last row; the
                page starts strictly after it in ``updated_at DESC, session_id ASC`` order.
            limit: page size, or ``None`` for the complete set (deletion candidates).
        """
        source = page_source(query)
        page = select(source).where(*live_roots_clauses(query, source))
        if after is not None:
            updated, session_id = after
            page = page.where(
                or_(
                    source.updated_at_unix_ms < updated,
                    and_(source.updated_at_unix_ms == updated, source.session_id > session_id),
                )
            )
        page = page.order_by(source.updated_at_unix_ms.desc(), source.session_id.asc())
        if limit is not None:
            page = page.limit(limit + 1)
        rows: Sequence[Session] = (await self._session.execute(page)).scalars().all()
        has_more = limit is not None and len(rows) > limit
        kept = rows if limit is None else rows[:limit]
        # The complete set (deletion candidates) is its own count.
        total = len(rows) if limit is None else await self._total(query)
        return RootSessionPage([session_record(row) for row in kept], total, has_more)

    async def _total(self, query: RootSessionQuery) -> int:
        """``total_count`` of a listing: maintained counts where they answer it (ADR 0024).

        The counts are kept per (workspace, section, agent target, pinned), so any scope
        filtered at most by agent target is a sum of a few rows. A title query or an
        authorized id set is a filter no count can be kept for; those count the filtered set
        (the id set is bounded by ``MAX_AUTHORIZED_IDS`` primary-key lookups, and a title query
        reads its whole scope for the page anyway).
        """
        if query.title_contains or query.session_ids is not None:
            statement = select(func.count()).select_from(Session).where(*live_roots_clauses(query))
            return int((await self._session.execute(statement)).scalar_one())
        counts = select(func.coalesce(func.sum(SessionListingCount.live_roots), 0)).where(
            SessionListingCount.workspace_id == query.workspace_id
        )
        if query.section_key is not None:
            counts = counts.where(SessionListingCount.rail_section_key == query.section_key)
        if query.pinned is not None:
            counts = counts.where(SessionListingCount.pinned.is_(query.pinned))
        if query.agent_target_id is not None:
            counts = counts.where(SessionListingCount.agent_target_id == query.agent_target_id)
        return int((await self._session.execute(counts)).scalar_one())
