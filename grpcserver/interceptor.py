"""The one server interceptor: authentication, workspace scope, errors and metrics.

For every RPC except the public health and reflection services it

1. authenticates the bearer token into a :class:`~grpcserver.auth.Principal`
   (``UNAUTHENTICATED`` otherwise) and binds it for the handler;
2. checks a unary request's top-level ``workspace_id`` field, when the message has
   one, against the principal (``INVALID_ARGUMENT`` when empty, ``PERMISSION_DENIED``
   with reason ``WORKSPACE_SCOPE_MISMATCH`` when outside the principal's scope), so no
   handler can forget it;
3. maps :class:`~domainerrors.DomainError` to ``google.rpc.Status`` with details, a
   ``NotImplementedError`` (the generated servicer default) to ``UNIMPLEMENTED``, and
   anything else to a bare ``INTERNAL`` that is logged, never sent;
4. records the RPC count and latency.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from domainerrors import DomainError
from grpcserver.auth import TokenRegistry, bind_principal, unbind_principal
from grpcserver.errors import internal_error, to_grpc_status
from grpcserver.telemetry import Telemetry

log = logging.getLogger(__name__)

PUBLIC_METHOD_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
"""Methods answered without a token, so probes and grpcurl-style tools work."""


class NotImplementedYet(DomainError):
    """An RPC of the contract that this build does not implement yet."""

    status = "UNIMPLEMENTED"
    default_reason = "NOT_IMPLEMENTED"


class ServiceInterceptor(grpc.aio.ServerInterceptor):
    """See the module docstring."""

    def __init__(
        self,
        *,
        domain: str,
        tokens: TokenRegistry,
        telemetry: Telemetry,
        public_prefixes: tuple[str, ...] = PUBLIC_METHOD_PREFIXES,
    ) -> None:
        self._domain = domain
        self._tokens = tokens
        self._telemetry = telemetry
        self._public = public_prefixes

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Wrap the resolved handler (public methods pass through untouched)."""
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method.startswith(self._public):
            return handler
        metadata = handler_call_details.invocation_metadata
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, metadata, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._wrap_unary(method, metadata, handler.stream_unary, streaming_request=True),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, metadata, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return grpc.stream_stream_rpc_method_handler(
            self._wrap_stream(method, metadata, handler.stream_stream, streaming_request=True),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _admit(self, metadata: Any, request: Any, streaming_request: bool) -> Any:
        principal = self._tokens.authenticate(metadata)
        if not streaming_request and isinstance(request, Message):
            field = request.DESCRIPTOR.fields_by_name.get("workspace_id")
            # An `optional` workspace_id left unset means "every workspace the caller may
            # see"; the handler then checks the role it needs for that.
            if (
                field is not None
                and field.type == field.TYPE_STRING
                and not (field.has_presence and not request.HasField("workspace_id"))
            ):
                principal.require_workspace(getattr(request, "workspace_id"))  # noqa: B009 - typed as Message
        return bind_principal(principal)

    async def _fail(
        self, context: grpc.aio.ServicerContext[Any, Any], error: BaseException
    ) -> None:
        if isinstance(error, NotImplementedError):
            error = NotImplementedYet(f"{error or 'this RPC'} is not implemented in this build")
        if not isinstance(error, DomainError):
            log.error("unhandled error in handler", exc_info=error)
            error = internal_error()
        await context.abort_with_status(to_grpc_status(error, domain=self._domain))

    def _record(
        self, method: str, started: float, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        code: object = context.code()
        if isinstance(code, grpc.StatusCode):
            name = code.name
        else:
            name = "OK" if not code else str(code)
        attributes = {"rpc.method": method, "rpc.grpc.status_code": name}
        self._telemetry.rpc_count.add(1, attributes)
        self._telemetry.rpc_duration.record((time.perf_counter() - started) * 1000, attributes)

    def _wrap_unary(
        self, method: str, metadata: Any, inner: Any, *, streaming_request: bool = False
    ) -> Callable[..., Awaitable[Any]]:
        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.perf_counter()
            token = None
            try:
                token = self._admit(metadata, request, streaming_request)
                result = inner(request, context)
                if inspect.isawaitable(result):
                    result = await result
                return result
            except grpc.aio.AbortError:
                raise
            except Exception as error:  # noqa: BLE001 - mapped, never leaked
                await self._fail(context, error)
            finally:
                if token is not None:
                    unbind_principal(token)
                self._record(method, started, context)

        return handle

    def _wrap_stream(
        self, method: str, metadata: Any, inner: Any, *, streaming_request: bool = False
    ) -> Callable[..., AsyncIterator[Any]]:
        async def handle(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            started = time.perf_counter()
            token = None
            try:
                token = self._admit(metadata, request, streaming_request)
                result = inner(request, context)
                if inspect.isawaitable(result):
                    await result
                elif result is not None:
                    async for item in result:
                        yield item
            except grpc.aio.AbortError:
                raise
            except Exception as error:  # noqa: BLE001 - mapped, never leaked
                await self._fail(context, error)
            finally:
                if token is not None:
                    unbind_principal(token)
                self._record(method, started, context)

        return handle
