"""RPCs of delete, restore, purge and the cleanup outbox (HOST-DEL-1..11, HOST-CLEAN-1)."""

from __future__ import annotations

from typing import Any

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2
from domainerrors import PermissionDenied
from grpcserver.authorization import current_scope
from grpcserver.errors import clip
from services.host.context import HostContext
from services.host.deletion import cleanup_outbox, delete, purge, restore
from services.host.wire.projection import session_to_proto

NOT_RESTORABLE_REASONS = {
    None: host_pb2.NOT_RESTORABLE_REASON_UNSPECIFIED,
    "legacy": host_pb2.NOT_RESTORABLE_REASON_LEGACY,
    "generation_mismatch": host_pb2.NOT_RESTORABLE_REASON_GENERATION_MISMATCH,
    "size_mismatch": host_pb2.NOT_RESTORABLE_REASON_SIZE_MISMATCH,
}


def _member_to_proto(member: delete.DeletedMember) -> host_pb2.DeletedSession:
    wire = host_pb2.DeletedSession(
        session_id=member.session_id,
        requested=member.requested,
        tombstone=canonical_pb2.Tombstone(
            deleted_at_unix_ms=member.deleted_at_unix_ms,
            generation=member.generation,
            component_size=member.component_size,
        ),
    )
    if member.parent_session_id is not None:
        wire.parent_session_id = member.parent_session_id
    return wire


def deletion_result_to_proto(result: delete.DeletionResult) -> host_pb2.SessionDeletionResult:
    """The complete typed delete result (HOST-DEL-1)."""
    return host_pb2.SessionDeletionResult(
        deleted=[_member_to_proto(m) for m in result.deleted],
        absorbed=[_member_to_proto(m) for m in result.absorbed],
        already_deleted_session_ids=list(result.already_deleted_session_ids),
        interrupted_turn_ids=list(result.interrupted_turn_ids),
        superseded_interaction_count=result.superseded_interaction_count,
    )


class DeletionRpcs:
    """Serves delete, restore, purge and cleanup-outbox RPCs.

    The interceptor enforces the declared roles and workspace (``services/host/authorization.py``);
    an RPC whose ``workspace_id`` is optional acts on the scope it bound: that workspace, or
    the principal's workspaces when unset (every workspace only for a deployment-wide one).
    """

    ctx: HostContext

    async def DeleteSessions(
        self, request: host_pb2.DeleteSessionsRequest, context: Any
    ) -> host_pb2.DeleteSessionsResponse:
        """Plan, quiesce and tombstone the closure of the ids (HOST-DEL-1..6)."""
        result = await delete.delete_sessions(
            self.ctx,
            request.workspace_id,
            list(request.session_ids),
        )
        return host_pb2.DeleteSessionsResponse(result=deletion_result_to_proto(result))

    async def ListDeletedSessions(
        self, request: host_pb2.ListDeletedSessionsRequest, context: Any
    ) -> host_pb2.ListDeletedSessionsResponse:
        """Page topmost tombstones with their restorable verdict (HOST-DEL-7)."""
        page = await restore.list_deleted_sessions(
            self.ctx,
            request.workspace_id,
            title_filter=request.title_filter if request.HasField("title_filter") else None,
            section_key=request.section_key if request.HasField("section_key") else None,
            cursor=request.cursor,
            limit=request.limit,
            include_total_count=request.include_total_count,
        )
        return host_pb2.ListDeletedSessionsResponse(
            items=[
                host_pb2.DeletedSessionItem(
                    session=session_to_proto(item.session),
                    restorable=item.restorable,
                    not_restorable_reason=NOT_RESTORABLE_REASONS[item.not_restorable_reason],
                    tree_size=item.tree_size,
                )
                for item in page.items
            ],
            next_cursor=page.next_cursor,
            total_count=page.total_count,
        )

    async def RestoreDeletedSession(
        self, request: host_pb2.RestoreDeletedSessionRequest, context: Any
    ) -> host_pb2.RestoreDeletedSessionResponse:
        """Restore exactly one complete component; no runtime starts (HOST-DEL-8)."""
        restored = await restore.restore_deleted_session(
            self.ctx,
            request.workspace_id,
            request.session_id,
        )
        return host_pb2.RestoreDeletedSessionResponse(
            restored=[session_to_proto(record) for record in restored]
        )

    async def PurgeDeletedSessions(
        self, request: host_pb2.PurgeDeletedSessionsRequest, context: Any
    ) -> host_pb2.PurgeDeletedSessionsResponse:
        """Remove whole restorable trees past the cutoff, within the bounds (HOST-DEL-9)."""
        bounds = purge.PurgeBounds.from_request(
            request.max_trees, request.max_rows, request.max_bytes
        )
        report = await purge.purge_deleted_sessions(
            self.ctx,
            current_scope().workspaces,
            request.cutoff_unix_ms,
            bounds,
            dry_run=request.dry_run,
        )
        return host_pb2.PurgeDeletedSessionsResponse(
            purged=[
                host_pb2.PurgedSession(workspace_id=ws, session_id=sid) for ws, sid in report.purged
            ],
            purged_tree_count=report.purged_tree_count,
            blocked_tree_count=report.blocked_tree_count,
            more_remaining=report.more_remaining,
            purged_row_count=report.purged_row_count,
            purged_bytes=report.purged_bytes,
        )

    async def PurgeWorkspaceTombstones(
        self, request: host_pb2.PurgeWorkspaceTombstonesRequest, context: Any
    ) -> host_pb2.PurgeWorkspaceTombstonesResponse:
        """Manual purge by physical boundary, leaf-first (HOST-DEL-10)."""
        report = await purge.purge_workspace_tombstones(
            self.ctx,
            request.workspace_id,
            request.session_id if request.HasField("session_id") else None,
            request.max_components,
            dry_run=request.dry_run,
        )
        return host_pb2.PurgeWorkspaceTombstonesResponse(
            purged_session_ids=report.purged_session_ids,
            purged_component_count=report.purged_component_count,
            blocked_component_count=report.blocked_component_count,
            more_remaining=report.more_remaining,
        )

    async def ListPendingResourceCleanups(
        self, request: host_pb2.ListPendingResourceCleanupsRequest, context: Any
    ) -> host_pb2.ListPendingResourceCleanupsResponse:
        """Pending cleanup rows with their ownership facts (HOST-CLEAN-1)."""
        page = await cleanup_outbox.list_pending_cleanups(
            self.ctx, current_scope().workspaces, request.cursor, request.limit
        )
        return host_pb2.ListPendingResourceCleanupsResponse(
            cleanups=[
                host_pb2.ResourceCleanup(
                    workspace_id=row.workspace_id,
                    session_id=row.session_id,
                    purged_at_unix_ms=row.purged_at_unix_ms,
                    id_owned_anywhere=row.id_owned_anywhere,
                    live_owner_in_other_workspace=row.live_owner_in_other_workspace,
                )
                for row in page.rows
            ],
            next_cursor=page.next_cursor,
        )

    async def CompleteResourceCleanup(
        self, request: host_pb2.CompleteResourceCleanupRequest, context: Any
    ) -> host_pb2.CompleteResourceCleanupResponse:
        """Delete one cleanup row and report whether the id's fence is lifted (HOST-CLEAN-1)."""
        done = await cleanup_outbox.complete_resource_cleanup(
            self.ctx, request.workspace_id, request.session_id
        )
        return host_pb2.CompleteResourceCleanupResponse(
            completed=done.completed, fence_lifted=done.fence_lifted
        )

    async def CompleteResourceCleanups(
        self, request: host_pb2.CompleteResourceCleanupsRequest, context: Any
    ) -> host_pb2.CompleteResourceCleanupsResponse:
        """Complete up to 1000 cleanup rows in one transaction (HOST-CLEAN-1).

        Every row must be in the call's workspaces, else nothing changes.
        """
        allowed = current_scope().workspaces
        rows = [(row.workspace_id, row.session_id) for row in request.cleanups]
        for index, (workspace_id, _) in enumerate(rows):
            if allowed is not None and workspace_id and workspace_id not in allowed:
                raise PermissionDenied(
                    f"cleanups[{index}] is in a workspace this call may not act in",
                    reason="WORKSPACE_SCOPE_MISMATCH",
                    metadata={"workspace_id": clip(workspace_id, 256)},
                )
        done = await cleanup_outbox.complete_resource_cleanups(self.ctx, rows)
        return host_pb2.CompleteResourceCleanupsResponse(
            results=[
                host_pb2.CompleteResourceCleanupResponse(
                    completed=d.completed, fence_lifted=d.fence_lifted
                )
                for d in done
            ]
        )
