"""The one narrow interface through which maintenance reaches Host (ARCH-2).

Maintenance never reads Host's tables: the idle gate, both purges, the preview and the
resource-cleanup outbox all go through Host's gRPC API with this process's service identity
(``TUTTI_SERVICE_TOKEN``, a deployment-wide ``service`` principal). :class:`HostPort` is the
shape the worker needs; :class:`GrpcHost` implements it over the generated client and turns
gRPC failures into two outcomes the worker acts on:

* :class:`HostUnavailable` — Host could not be asked (transport loss, drain, deadline, a
  misconfigured token); the run stops between batches and retries at the next check.
* a :class:`~domainerrors.DomainError` carrying Host's own code and reason — Host refused
  the target of a manual purge (``SESSION_NOT_FOUND``, ``PURGE_BOUNDARY_VIOLATION``...);
  the manual purge RPC passes it through unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from domainerrors import (
    DomainError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from grpcserver.call_errors import call_error
from grpcserver.channels import aio_channel
from grpcserver.settings import ServerSettings

__all__ = [
    "MAX_COMPLETIONS",
    "ActivityState",
    "DeletedPage",
    "DeletedTree",
    "GrpcHost",
    "HostPort",
    "HostUnavailable",
    "PendingCleanup",
    "PendingPage",
    "RetentionPurge",
    "WorkspacePurge",
]

MAX_COMPLETIONS = 1000
"""Rows one ``CompleteResourceCleanups`` call may complete (Host's bound)."""
_PASSED_THROUGH: dict[grpc.StatusCode, type[DomainError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
}
"""Host's answers about the *target* of a manual purge, passed to the caller unchanged;
any other failure means Host cannot serve maintenance now."""


class HostUnavailable(Exception):
    """Host could not be asked now; ``code`` is the gRPC status name it answered."""

    def __init__(self, message: str, code: str = "UNAVAILABLE") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ActivityState:
    """Host's answer to the idle gate (HOST-ACT-1).

    Attributes:
        any_turn_active: A Turn is queued, running or awaiting an Interaction somewhere.
        active_turn_count: How many.
        workspaces: Workspace id -> active Turn count, only workspaces with one.
        observed_at_unix_ms: When Host read it.
    """

    any_turn_active: bool
    active_turn_count: int
    workspaces: dict[str, int]
    observed_at_unix_ms: int


@dataclass(frozen=True)
class RetentionPurge:
    """One ``PurgeDeletedSessions`` batch (HOST-DEL-9)."""

    purged: tuple[tuple[str, str], ...]
    """(workspace, Session) of every removed Session."""
    trees: int
    blocked: int
    more_remaining: bool
    rows: int
    bytes: int


@dataclass(frozen=True)
class WorkspacePurge:
    """One ``PurgeWorkspaceTombstones`` batch (HOST-DEL-10)."""

    purged_session_ids: tuple[str, ...]
    components: int
    blocked: int
    more_remaining: bool


@dataclass(frozen=True)
class PendingCleanup:
    """One pending resource-cleanup outbox row with its ownership facts (HOST-CLEAN-1)."""

    workspace_id: str
    session_id: str
    purged_at_unix_ms: int
    id_owned_anywhere: bool
    live_owner_in_other_workspace: bool


@dataclass(frozen=True)
class PendingPage:
    """A page of pending cleanup rows; ``next_cursor`` empty on the last page."""

    rows: tuple[PendingCleanup, ...]
    next_cursor: str


@dataclass(frozen=True)
class DeletedTree:
    """One topmost tombstone as listed by ``ListDeletedSessions`` (for the preview)."""

    session_id: str
    tree_size: int
    restorable: bool
    deleted_at_unix_ms: int


@dataclass(frozen=True)
class DeletedPage:
    """A page of topmost tombstones; ``next_cursor`` empty on the last page."""

    trees: tuple[DeletedTree, ...]
    next_cursor: str
    total_count: int


class HostPort(Protocol):
    """What maintenance asks of Host."""

    async def activity_state(self) -> ActivityState:
        """Whether any Turn is active in any workspace (the idle gate)."""
        ...

    async def purge_expired(
        self, cutoff_unix_ms: int, max_trees: int, max_rows: int, max_bytes: int
    ) -> RetentionPurge:
        """Remove restorable trees deleted at or before the cutoff, one bounded batch."""
        ...

    async def purge_workspace(
        self, workspace_id: str, session_id: str | None, max_components: int, dry_run: bool = False
    ) -> WorkspacePurge:
        """Remove topmost tombstones of a workspace (or one component), one bounded batch.

        ``dry_run`` only checks the target and counts.
        """
        ...

    async def pending_cleanups(self, cursor: str, limit: int) -> PendingPage:
        """A page of pending cleanup rows across every workspace."""
        ...

    async def complete_cleanups(self, rows: Sequence[tuple[str, str]]) -> None:
        """Delete these (workspace, Session) outbox rows in one Host transaction.

        Idempotent; at most :data:`MAX_COMPLETIONS` rows.
        """
        ...

    async def deleted_sessions(self, workspace_id: str, cursor: str, limit: int) -> DeletedPage:
        """A page of a workspace's topmost tombstones (no filters)."""
        ...


def _passed_through(error: grpc.aio.AioRpcError) -> DomainError | None:
    """Host's typed refusal as the same domain error (code, reason, metadata, fields)."""
    kind = _PASSED_THROUGH.get(error.code())
    if kind is None:
        return None
    said = call_error(error)
    message = said.message or said.code.name
    reason = said.reason or None
    if kind is InvalidArgument:
        return InvalidArgument(
            message,
            field_violations=said.field_violations,
            reason=reason,
            metadata=said.metadata,
        )
    refusal: DomainError = kind(message, reason=reason, metadata=said.metadata)
    return refusal


class GrpcHost:
    """:class:`HostPort` over Host's gRPC API, authenticated with the service token."""

    def __init__(self, settings: ServerSettings, timeout_seconds: float) -> None:
        self._settings = settings
        self._timeout = timeout_seconds
        token = settings.service_token.get_secret_value() if settings.service_token else None
        self._metadata: Sequence[tuple[str, str]] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        self._channel: grpc.aio.Channel | None = None

    async def close(self) -> None:
        """Close the channel (service stop)."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def _call(self, method: str, request: Any, *, pass_through: bool = False) -> Any:
        if self._channel is None:
            self._channel = aio_channel(self._settings.host_address, self._settings)
        stub: Any = host_pb2_grpc.HostServiceStub(self._channel)
        try:
            return await getattr(stub, method)(
                request, metadata=self._metadata, timeout=self._timeout
            )
        except grpc.aio.AioRpcError as error:
            refusal = _passed_through(error) if pass_through else None
            if refusal is not None:
                raise refusal from None
            raise HostUnavailable(
                f"Host {method}: {error.code().name}: {error.details() or ''}".strip(),
                error.code().name,
            ) from None

    async def activity_state(self) -> ActivityState:
        """Host ``GetActivityState`` across every workspace."""
        response = await self._call("GetActivityState", host_pb2.GetActivityStateRequest())
        return ActivityState(
            any_turn_active=response.any_turn_active,
            active_turn_count=response.active_turn_count,
            workspaces={w.workspace_id: w.active_turn_count for w in response.workspaces},
            observed_at_unix_ms=response.observed_at_unix_ms,
        )

    async def purge_expired(
        self, cutoff_unix_ms: int, max_trees: int, max_rows: int, max_bytes: int
    ) -> RetentionPurge:
        """Host ``PurgeDeletedSessions`` across every workspace."""
        response = await self._call(
            "PurgeDeletedSessions",
            host_pb2.PurgeDeletedSessionsRequest(
                cutoff_unix_ms=cutoff_unix_ms,
                max_trees=max_trees,
                max_rows=max_rows,
                max_bytes=max_bytes,
            ),
        )
        return RetentionPurge(
            purged=tuple((p.workspace_id, p.session_id) for p in response.purged),
            trees=response.purged_tree_count,
            blocked=response.blocked_tree_count,
            more_remaining=response.more_remaining,
            rows=response.purged_row_count,
            bytes=response.purged_bytes,
        )

    async def purge_workspace(
        self, workspace_id: str, session_id: str | None, max_components: int, dry_run: bool = False
    ) -> WorkspacePurge:
        """Host ``PurgeWorkspaceTombstones``; Host's refusals of the target pass through."""
        request = host_pb2.PurgeWorkspaceTombstonesRequest(
            workspace_id=workspace_id, max_components=max_components, dry_run=dry_run
        )
        if session_id is not None:
            request.session_id = session_id
        response = await self._call("PurgeWorkspaceTombstones", request, pass_through=True)
        return WorkspacePurge(
            purged_session_ids=tuple(response.purged_session_ids),
            components=response.purged_component_count,
            blocked=response.blocked_component_count,
            more_remaining=response.more_remaining,
        )

    async def pending_cleanups(self, cursor: str, limit: int) -> PendingPage:
        """Host ``ListPendingResourceCleanups`` across every workspace."""
        response = await self._call(
            "ListPendingResourceCleanups",
            host_pb2.ListPendingResourceCleanupsRequest(cursor=cursor, limit=limit),
        )
        return PendingPage(
            rows=tuple(
                PendingCleanup(
                    workspace_id=row.workspace_id,
                    session_id=row.session_id,
                    purged_at_unix_ms=row.purged_at_unix_ms,
                    id_owned_anywhere=row.id_owned_anywhere,
                    live_owner_in_other_workspace=row.live_owner_in_other_workspace,
                )
                for row in response.cleanups
            ),
            next_cursor=response.next_cursor,
        )

    async def complete_cleanups(self, rows: Sequence[tuple[str, str]]) -> None:
        """Host ``CompleteResourceCleanups``: one transaction for the rows."""
        await self._call(
            "CompleteResourceCleanups",
            host_pb2.CompleteResourceCleanupsRequest(
                cleanups=[
                    host_pb2.ResourceCleanupKey(workspace_id=ws, session_id=sid) for ws, sid in rows
                ]
            ),
        )

    async def deleted_sessions(self, workspace_id: str, cursor: str, limit: int) -> DeletedPage:
        """Host ``ListDeletedSessions`` without filters; Host's refusals pass through."""
        response = await self._call(
            "ListDeletedSessions",
            host_pb2.ListDeletedSessionsRequest(
                workspace_id=workspace_id, cursor=cursor, limit=limit
            ),
            pass_through=True,
        )
        return DeletedPage(
            trees=tuple(
                DeletedTree(
                    session_id=item.session.session_id,
                    tree_size=item.tree_size,
                    restorable=item.restorable,
                    deleted_at_unix_ms=item.session.tombstone.deleted_at_unix_ms,
                )
                for item in response.items
            ),
            next_cursor=response.next_cursor,
            total_count=response.total_count,
        )
