"""Wire layer of ``DeviceLinkService`` (LIVE-LINK-1, LIVE-PUB-1).

``DeviceLink`` frames are written as bytes composed from encoded deliveries
(:mod:`services.livestream.encoding`), so the service registers its handlers itself with a
response serializer that passes bytes through (:func:`add_to_server`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator
from typing import Any

import grpc

from agentactivity.livestream.v1 import livestream_pb2, livestream_pb2_grpc
from domainerrors import InvalidArgument
from grpcserver.auth import Role
from grpcserver.authorization import current_scope
from services.livestream.link import DeviceLinkCall
from services.livestream.registry import PublisherRegistry

__all__ = ["DeviceLinkServicer", "add_to_server"]

SERVICE = "agentactivity.livestream.v1.DeviceLinkService"
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100


def _serialize(response: bytes | livestream_pb2.DeviceLinkResponse) -> bytes:
    return response if isinstance(response, bytes) else response.SerializeToString()


class DeviceLinkServicer(livestream_pb2_grpc.DeviceLinkServiceServicer):
    """Serves ``agentactivity.livestream.v1.DeviceLinkService``."""

    def __init__(self, registry: PublisherRegistry) -> None:
        self._registry = registry

    async def DeviceLink(  # type: ignore[override]  # frames are composed bytes
        self,
        request_iterator: AsyncIterator[livestream_pb2.DeviceLinkRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[bytes]:
        """One device's live stream: hello, then frames until the call ends (LIVE-LINK-1).

        Errors: ``FAILED_PRECONDITION`` ``PROTOCOL_REVISION_MISMATCH``; ``INVALID_ARGUMENT``
        ``PROTOCOL_VIOLATION``; ``PERMISSION_DENIED`` ``WORKSPACE_SCOPE_MISMATCH``;
        ``RESOURCE_EXHAUSTED`` ``SLOW_CONSUMER`` / ``PUBLISHER_LIMIT_EXCEEDED``; ``ABORTED``
        ``LINK_SUPERSEDED``; ``UNAVAILABLE`` ``DRAINING``.
        """
        call = DeviceLinkCall(self._registry, current_scope().principal)
        async for frame in call.run(request_iterator):
            yield frame

    async def ListPublishers(
        self,
        request: livestream_pb2.ListPublishersRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> livestream_pb2.ListPublishersResponse:
        """The retained publishers (operators: ``admin`` sees all, ``device`` its own)."""
        scope = current_scope()
        if request.page_size < 0:
            raise InvalidArgument.for_field("page_size", "must not be negative")
        size = min(request.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        offset = _offset(request.page_token)
        publishers = sorted(
            (
                p
                for p in self._registry.publishers.values()
                if (
                    scope.principal.role is Role.ADMIN or p.key.principal == scope.principal.subject
                )
                and (not request.HasField("device_id") or p.key.device_id == request.device_id)
                and (
                    not request.HasField("workspace_id")
                    or request.workspace_id in p.key.workspace_ids
                )
                # What the principal may see, not the call's scope: the interceptor narrows
                # that to the requested workspace, which filters rather than authorizes.
                and (
                    scope.principal.scope is None
                    or set(p.key.workspace_ids) <= scope.principal.scope
                )
            ),
            key=lambda p: (p.key.device_id, p.epoch),
        )
        page = publishers[offset : offset + size]
        response = livestream_pb2.ListPublishersResponse(publishers=[p.info() for p in page])
        if offset + size < len(publishers):
            response.next_page_token = base64.urlsafe_b64encode(
                str(offset + size).encode()
            ).decode()
        return response


def _offset(token: str) -> int:
    if not token:
        return 0
    try:
        value = int(base64.urlsafe_b64decode(token.encode()).decode())
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidArgument.for_field("page_token", "is not a token this server issued") from None
    if value < 0:
        raise InvalidArgument.for_field("page_token", "is not a token this server issued")
    return value


def add_to_server(servicer: DeviceLinkServicer, server: grpc.aio.Server) -> None:
    """Register the service with a byte pass-through serializer for ``DeviceLink`` frames."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "DeviceLink": grpc.stream_stream_rpc_method_handler(
            servicer.DeviceLink,
            request_deserializer=livestream_pb2.DeviceLinkRequest.FromString,
            response_serializer=_serialize,
        ),
        "ListPublishers": grpc.unary_unary_rpc_method_handler(
            servicer.ListPublishers,
            request_deserializer=livestream_pb2.ListPublishersRequest.FromString,
            response_serializer=livestream_pb2.ListPublishersResponse.SerializeToString,
        ),
    }
    # As the generated ``add_*_to_server`` does: the generic handler and the registered one.
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
