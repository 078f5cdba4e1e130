"""gRPC adapter of the :class:`~services.refresolve.backends.ReferenceBackends` port.

refresolve reaches AppCenter and IssueManager only over their contracts (STYLE
"Boundaries"), presenting the service bearer token. Every call carries the time left on
the resolution :class:`~services.refresolve.backends.Deadline` as its gRPC timeout, so
the caller's deadline propagates (REF-FAIL-1). Backend statuses become domain errors:

* ``NOT_FOUND`` / ``PERMISSION_DENIED`` keep the backend's ``ErrorInfo`` reason;
* ``DEADLINE_EXCEEDED`` (or a cancelled call once the deadline passed) → ``DeadlineExceeded``;
* anything else (unreachable, ``UNAVAILABLE``, ``INTERNAL``, ``UNAUTHENTICATED`` from a
  misconfigured token ...) → ``Unavailable`` reason ``BACKEND_UNAVAILABLE`` with RetryInfo.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from agentactivity.appcenter.v1 import appcenter_pb2, appcenter_pb2_grpc
from agentactivity.issuemanager.v1 import issuemanager_pb2, issuemanager_pb2_grpc
from domainerrors import DeadlineExceeded, DomainError, NotFound, PermissionDenied, Unavailable
from grpcserver.call_errors import call_error
from grpcserver.channels import aio_channel
from grpcserver.settings import ServerSettings
from services.refresolve.backends import AppPage, Deadline, IssueOutputs, TopicPage
from services.refresolve.references import ReferenceItem

__all__ = ["GrpcReferenceBackends"]

log = logging.getLogger(__name__)

_RETRY_AFTER_SECONDS = 1.0


def _reason(error: grpc.aio.AioRpcError) -> str | None:
    return call_error(error).reason or None


def _domain_error(backend: str, error: grpc.aio.AioRpcError, deadline: Deadline) -> DomainError:
    code = error.code()
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(error.details() or f"{backend}: not found", reason=_reason(error))
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(
            error.details() or f"{backend}: permission denied", reason=_reason(error)
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED or (
        code == grpc.StatusCode.CANCELLED and deadline.expired()
    ):
        return DeadlineExceeded(
            f"{backend} did not answer before the deadline",
            reason="DEADLINE_EXCEEDED",
            metadata={"backend": backend},
        )
    log.warning("reference backend failed", extra={"backend": backend, "code": code.name})
    return Unavailable(
        f"{backend} is unavailable ({code.name})",
        reason="BACKEND_UNAVAILABLE",
        metadata={"backend": backend, "code": code.name},
        retry_after_seconds=_RETRY_AFTER_SECONDS,
    )


def _item(message: appcenter_pb2.Artifact | issuemanager_pb2.IssueOutput) -> ReferenceItem:
    """An app artifact or an issue output as a resolved file (both carry the same fields)."""
    return ReferenceItem(
        path=message.path,
        display_name=message.display_name,
        size_bytes=message.size_bytes,
        media_type=message.media_type,
        created_at_unix_ms=message.created_at_unix_ms,
    )


class GrpcReferenceBackends:
    """Calls AppCenterService and IssueManagerService; open with :meth:`start`."""

    def __init__(
        self,
        *,
        appcenter_address: str,
        issuemanager_address: str,
        service_token: str | None,
        page_size: int,
        channel_settings: ServerSettings,
    ) -> None:
        self._addresses = {"appcenter": appcenter_address, "issuemanager": issuemanager_address}
        # TLS/mTLS of the backend channels (TUTTI_TLS_CA_FILE...; plaintext when unset).
        self._channel_settings = channel_settings
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {service_token}"),) if service_token else ()
        )
        self._page_size = page_size
        self._channels: list[grpc.aio.Channel] = []
        self._appcenter: appcenter_pb2_grpc.AppCenterServiceStub | None = None
        self._issuemanager: issuemanager_pb2_grpc.IssueManagerServiceStub | None = None

    async def start(self) -> None:
        """Open the channels (inside the server's event loop)."""
        appcenter = aio_channel(self._addresses["appcenter"], self._channel_settings)
        issuemanager = aio_channel(self._addresses["issuemanager"], self._channel_settings)
        self._channels = [appcenter, issuemanager]
        self._appcenter = appcenter_pb2_grpc.AppCenterServiceStub(appcenter)
        self._issuemanager = issuemanager_pb2_grpc.IssueManagerServiceStub(issuemanager)

    async def stop(self) -> None:
        """Close the channels."""
        for channel in self._channels:
            await channel.close()
        self._channels = []

    async def _call(
        self,
        backend: str,
        method: Any,
        request: Any,
        deadline: Deadline,
    ) -> Any:
        # The generated stubs are typed for the sync API; on an aio channel the
        # multicallable returns an awaitable call, so it is typed loosely here.
        timeout = deadline.require_time()
        try:
            return await method(request, timeout=timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            raise _domain_error(backend, error, deadline) from None

    def _stubs(
        self,
    ) -> tuple[
        appcenter_pb2_grpc.AppCenterServiceStub, issuemanager_pb2_grpc.IssueManagerServiceStub
    ]:
        if self._appcenter is None or self._issuemanager is None:
            raise RuntimeError("reference backends not started")
        return self._appcenter, self._issuemanager

    async def list_app_page(
        self,
        workspace_id: str,
        app_id: str,
        group_id: str | None,
        page_token: str,
        deadline: Deadline,
    ) -> AppPage:
        """One ``AppCenterService.ListReferences`` page."""
        appcenter, _ = self._stubs()
        request = appcenter_pb2.ListReferencesRequest(
            workspace_id=workspace_id,
            app_id=app_id,
            group_id=group_id,
            page_size=self._page_size,
            page_token=page_token,
        )
        response: appcenter_pb2.ListReferencesResponse = await self._call(
            "appcenter", appcenter.ListReferences, request, deadline
        )
        return AppPage(
            group_ids=tuple(group.group_id for group in response.groups),
            files=tuple(_item(f) for f in response.files),
            next_page_token=response.next_page_token,
        )

    async def issue_outputs(
        self, workspace_id: str, topic_id: str, issue_id: str, deadline: Deadline
    ) -> IssueOutputs:
        """``IssueManagerService.GetIssueDetail`` restricted to the topic."""
        _, issuemanager = self._stubs()
        request = issuemanager_pb2.GetIssueDetailRequest(
            workspace_id=workspace_id, issue_id=issue_id, topic_id=topic_id
        )
        response: issuemanager_pb2.GetIssueDetailResponse = await self._call(
            "issuemanager", issuemanager.GetIssueDetail, request, deadline
        )
        return IssueOutputs(
            items=tuple(_item(o) for o in response.latest_outputs),
            truncated=response.latest_outputs_truncated,
        )

    async def search_topic_page(
        self, workspace_id: str, topic_id: str, page_token: str, deadline: Deadline
    ) -> TopicPage:
        """One ``IssueManagerService.SearchIssueOutputs`` page (no backend-side query)."""
        _, issuemanager = self._stubs()
        request = issuemanager_pb2.SearchIssueOutputsRequest(
            workspace_id=workspace_id,
            topic_id=topic_id,
            page_size=self._page_size,
            page_token=page_token,
        )
        response: issuemanager_pb2.SearchIssueOutputsResponse = await self._call(
            "issuemanager", issuemanager.SearchIssueOutputs, request, deadline
        )
        return TopicPage(
            items=tuple(_item(hit.output) for hit in response.outputs),
            next_page_token=response.next_page_token,
        )
