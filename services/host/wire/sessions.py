"""Session RPCs: create, read, activate, listings, generated files, edits (HOST-SES-1..9)."""

from __future__ import annotations

from typing import Any

from agentactivity.host.v1 import host_pb2
from grpcserver.request_checks import mapped_enum
from services.host.context import HostContext
from services.host.sessions import commands, listing
from services.host.sessions.activation import activate_session
from services.host.sessions.generated_files import (
    GeneratedFile,
    GeneratedFileSearch,
    search_generated_files,
)
from services.host.wire.command_codec import COMPOSER_MODES
from services.host.wire.projection import (
    FILE_CHANGE_KINDS,
    pending_interaction_to_proto,
    session_import_to_proto,
    session_isolation_to_proto,
    session_to_proto,
    settings_from_proto,
    turn_to_proto,
)
from services.host.wire.projects import project_to_proto
from services.host.wire.references_codec import references_from_proto

RUNTIME_STATUS = {
    "not_attached": host_pb2.RUNTIME_SETTINGS_STATUS_NOT_ATTACHED,
    "applied": host_pb2.RUNTIME_SETTINGS_STATUS_APPLIED,
    "failed": host_pb2.RUNTIME_SETTINGS_STATUS_FAILED,
    "deferred": host_pb2.RUNTIME_SETTINGS_STATUS_DEFERRED,
}


def list_filter(message: host_pb2.SessionListFilter) -> listing.ListFilter:
    """``SessionListFilter`` with presence kept (absent id set = no restriction)."""
    return listing.ListFilter(
        agent_target_id=message.agent_target_id if message.HasField("agent_target_id") else None,
        search_query=message.search_query if message.HasField("search_query") else None,
        authorized_session_ids=(
            frozenset(message.authorized_session_ids.session_ids)
            if message.HasField("authorized_session_ids")
            else None
        ),
    )


def page_to_proto(page: listing.SessionPage) -> host_pb2.SessionPage:
    """One listing page."""
    items = []
    for item in page.items:
        wire = host_pb2.SessionListItem(
            session=session_to_proto(item.session),
            pending_interaction_count=item.pending_interaction_count,
        )
        if item.latest_turn is not None:
            wire.latest_turn.CopyFrom(turn_to_proto(item.latest_turn))
        items.append(wire)
    return host_pb2.SessionPage(
        items=items, next_cursor=page.next_cursor, total_count=page.total_count
    )


def detail_to_proto(detail: commands.SessionDetail) -> host_pb2.GetSessionResponse:
    """The complete detail aggregate of one Session (HOST-SES-3), as ``GetSession`` answers."""
    response = host_pb2.GetSessionResponse(
        session=session_to_proto(detail.session),
        pending_interactions=[pending_interaction_to_proto(i) for i in detail.pending_interactions],
        children=[session_to_proto(child) for child in detail.children],
    )
    if detail.active_turn is not None:
        response.active_turn.CopyFrom(turn_to_proto(detail.active_turn))
    if detail.latest_turn is not None:
        response.latest_turn.CopyFrom(turn_to_proto(detail.latest_turn))
    if detail.session.isolation is not None:
        response.isolation.CopyFrom(session_isolation_to_proto(detail.session.isolation))
    if detail.session.import_info is not None:
        response.import_info.CopyFrom(session_import_to_proto(detail.session.import_info))
    return response


def _generated_file(entry: GeneratedFile) -> host_pb2.GeneratedFile:
    message = host_pb2.GeneratedFile(
        path=entry.path,
        change=FILE_CHANGE_KINDS[entry.change],
        session_id=entry.session_id,
        turn_id=entry.turn_id,
        settled_at_unix_ms=entry.settled_at_unix_ms,
    )
    if entry.previous_path is not None:
        message.previous_path = entry.previous_path
    return message


class SessionRpcs:
    """Serves the Session RPCs (the interceptor has checked ``workspace_id``)."""

    ctx: HostContext

    async def CreateSession(
        self, request: host_pb2.CreateSessionRequest, context: Any
    ) -> host_pb2.CreateSessionResponse:
        """Create a root Session and return it as persisted (HOST-SES-1, HOST-SES-2).

        ``provider_target_ref`` is ignored: Host derives the runtime ref from the target.
        ``initial_input`` submits the first Turn in the creating transaction (HOST-TURN-1);
        ``initial_goal`` and ``isolation`` answer UNIMPLEMENTED (second phase).
        """
        initial_input = None
        if request.HasField("initial_input"):
            first = request.initial_input
            initial_input = commands.InitialInput(
                client_submit_id=first.client_submit_id,
                content=first.content,
                mode=mapped_enum(COMPOSER_MODES, first.mode, field="initial_input.mode"),
                references=references_from_proto(first.references),
            )
        command = commands.CreateSessionCommand(
            workspace_id=request.workspace_id,
            agent_target_id=request.agent_target_id,
            cwd=request.cwd,
            session_id=request.session_id if request.HasField("session_id") else None,
            provider=request.provider if request.HasField("provider") else None,
            title=request.title if request.HasField("title") else None,
            rail_section_key=(
                request.rail_section_key if request.HasField("rail_section_key") else None
            ),
            settings=settings_from_proto(request.settings),
            initial_input=initial_input,
            has_initial_goal=request.HasField("initial_goal"),
            has_isolation=request.HasField("isolation"),
        )
        created = await commands.create_session(self.ctx, command)
        response = host_pb2.CreateSessionResponse(session=session_to_proto(created.session))
        if created.first_turn is not None:
            response.turn.CopyFrom(turn_to_proto(created.first_turn.turn))
        return response

    async def GetSession(
        self, request: host_pb2.GetSessionRequest, context: Any
    ) -> host_pb2.GetSessionResponse:
        """Canonical truth for one live Session (HOST-SES-3)."""
        detail = await commands.get_session(self.ctx, request.workspace_id, request.session_id)
        return detail_to_proto(detail)

    async def ActivateSession(
        self, request: host_pb2.ActivateSessionRequest, context: Any
    ) -> host_pb2.ActivateSessionResponse:
        """Resume an existing Session without a Turn; its detail aggregate (HOST-SES-9)."""
        activation = await activate_session(
            self.ctx, request.workspace_id, request.session_id, request.activation_id
        )
        return host_pb2.ActivateSessionResponse(
            detail=detail_to_proto(activation.detail), replayed=activation.replayed
        )

    async def SearchGeneratedFiles(
        self, request: host_pb2.SearchGeneratedFilesRequest, context: Any
    ) -> host_pb2.SearchGeneratedFilesResponse:
        """One rail section's generated files, one entry per path, newest first (HOST-SES-8)."""
        files = await search_generated_files(
            self.ctx,
            GeneratedFileSearch(
                workspace_id=request.workspace_id,
                section_key=request.section_key,
                query=request.query if request.HasField("query") else None,
                limit=request.limit if request.HasField("limit") else None,
            ),
        )
        return host_pb2.SearchGeneratedFilesResponse(files=[_generated_file(f) for f in files])

    async def ListSessionSections(
        self, request: host_pb2.ListSessionSectionsRequest, context: Any
    ) -> host_pb2.ListSessionSectionsResponse:
        """Every section's first page plus the first pinned page (HOST-SES-4)."""
        limit = listing.page_size(request.page_size, "page_size")
        rail = await listing.list_sections(
            self.ctx, request.workspace_id, list_filter(request.filter), limit
        )
        sections = []
        for section in rail.sections:
            wire = host_pb2.SessionSection(
                section_key=section.section_key,
                label=section.label,
                is_conversations=section.project is None,
                first_page=page_to_proto(section.first_page),
            )
            if section.project is not None:
                wire.project.CopyFrom(project_to_proto(section.project))
            sections.append(wire)
        return host_pb2.ListSessionSectionsResponse(
            sections=sections, pinned=page_to_proto(rail.pinned)
        )

    async def ListSessionSectionPage(
        self, request: host_pb2.ListSessionSectionPageRequest, context: Any
    ) -> host_pb2.ListSessionSectionPageResponse:
        """One page of a section's unpinned root Sessions (HOST-SES-4)."""
        limit = listing.page_size(request.limit, "limit")
        page = await listing.list_section_page(
            self.ctx,
            request.workspace_id,
            request.section_key,
            list_filter(request.filter),
            request.cursor,
            limit,
        )
        return host_pb2.ListSessionSectionPageResponse(page=page_to_proto(page))

    async def ListPinnedSessionsPage(
        self, request: host_pb2.ListPinnedSessionsPageRequest, context: Any
    ) -> host_pb2.ListPinnedSessionsPageResponse:
        """One page of pinned root Sessions (HOST-SES-4)."""
        limit = listing.page_size(request.limit, "limit")
        page = await listing.list_pinned_page(
            self.ctx, request.workspace_id, list_filter(request.filter), request.cursor, limit
        )
        return host_pb2.ListPinnedSessionsPageResponse(page=page_to_proto(page))

    async def SearchSessions(
        self, request: host_pb2.SearchSessionsRequest, context: Any
    ) -> host_pb2.SearchSessionsResponse:
        """One page of root Sessions whose title matches, case-insensitively (HOST-SES-4)."""
        limit = listing.page_size(request.limit, "limit")
        page = await listing.search_sessions(
            self.ctx,
            request.workspace_id,
            request.search_query,
            list_filter(request.filter),
            request.cursor,
            limit,
        )
        return host_pb2.SearchSessionsResponse(page=page_to_proto(page))

    async def ListSectionDeletionCandidates(
        self, request: host_pb2.ListSectionDeletionCandidatesRequest, context: Any
    ) -> host_pb2.ListSectionDeletionCandidatesResponse:
        """Every root Session a "clear section" would delete, after the filters (HOST-SES-4)."""
        ids = await listing.deletion_candidates(
            self.ctx, request.workspace_id, request.section_key, list_filter(request.filter)
        )
        return host_pb2.ListSectionDeletionCandidatesResponse(session_ids=ids, total_count=len(ids))

    async def RenameSession(
        self, request: host_pb2.RenameSessionRequest, context: Any
    ) -> host_pb2.RenameSessionResponse:
        """Set the title; returns the authoritative Session (HOST-SES-5)."""
        record = await commands.rename_session(
            self.ctx, request.workspace_id, request.session_id, request.title
        )
        return host_pb2.RenameSessionResponse(session=session_to_proto(record))

    async def SetSessionPinned(
        self, request: host_pb2.SetSessionPinnedRequest, context: Any
    ) -> host_pb2.SetSessionPinnedResponse:
        """Pin or unpin; returns the authoritative Session (HOST-SES-5)."""
        record = await commands.set_session_pinned(
            self.ctx, request.workspace_id, request.session_id, request.pinned
        )
        return host_pb2.SetSessionPinnedResponse(session=session_to_proto(record))

    async def UpdateSessionSettings(
        self, request: host_pb2.UpdateSessionSettingsRequest, context: Any
    ) -> host_pb2.UpdateSessionSettingsResponse:
        """Validate, persist and apply settings in the mutation lane (HOST-SES-6, HOST-LANE-1)."""
        update = await commands.update_session_settings(
            self.ctx,
            request.workspace_id,
            request.session_id,
            settings_from_proto(request.settings),
            self.ctx.runtime_settings,
        )
        application = host_pb2.RuntimeSettingsApplication(
            status=RUNTIME_STATUS[update.runtime.status]
        )
        if update.runtime.failure_message is not None:
            application.failure_message = update.runtime.failure_message
        return host_pb2.UpdateSessionSettingsResponse(
            session=session_to_proto(update.session), runtime_application=application
        )
