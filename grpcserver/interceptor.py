"""The one server interceptor: authentication, workspace scope, errors and metrics.

For every RPC except the public health and reflection services it

1. authenticates the bearer token into a :class:`~grpcserver.auth.Principal`
   (``UNAUTHENTICATED`` otherwise) and binds it for the handler;
2. enforces the method's declared authorization (:mod:`grpcserver.authorization`,
   SEC-3) before the handler runs: the allowed roles (``PERMISSION_DENIED``
   ``ROLE_NOT_ALLOWED``) and the workspace from the declared request field or first
   stream message (``INVALID_ARGUMENT`` when a required one is empty,
   ``PERMISSION_DENIED`` ``WORKSPACE_SCOPE_MISMATCH`` outside the principal's scope),
   and binds the call's scope (an unset optional workspace: the principal's own
   workspaces) for the handler; a method without a declaration fails closed with
   ``PERMISSION_DENIED`` ``METHOD_NOT_DECLARED``;
3. maps :class:`~domainerrors.DomainError` to ``google.rpc.Status`` with details, a
   ``NotImplementedError`` (the generated servicer default) to ``UNIMPLEMENTED``, and
   anything else to a bare ``INTERNAL`` that is logged, never sent;
4. records the RPC count and latency;
5. refuses a request (or stream message) whose bytes do not decode with
   ``INVALID_ARGUMENT`` ``UNDECODABLE_REQUEST`` after authentication, instead of gRPC's
   ``UNKNOWN`` before it (:mod:`grpcserver.decoding`, SEC-4); health and reflection too.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc
from google.protobuf.message import Message

from domainerrors import DomainError
from grpcserver.auth import TokenRegistry
from grpcserver.authorization import (
    MethodPolicy,
    WorkspaceSource,
    bind_call,
    current_scope,
    method_not_declared,
    narrow_call,
    unbind_call,
)
from grpcserver.decoding import UndecodableRequest, tolerant_deserializer, undecodable_error
from grpcserver.errors import internal_error, to_grpc_status
from grpcserver.request_checks import check_request
from grpcserver.telemetry import Telemetry
from store.integrity import store_refusal

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
        authorization: Mapping[str, MethodPolicy] | None = None,
        public_prefixes: tuple[str, ...] = PUBLIC_METHOD_PREFIXES,
    ) -> None:
        self._domain = domain
        self._tokens = tokens
        self._telemetry = telemetry
        # Full method path -> declared policy; a method missing here is refused.
        self._policies = dict(authorization or {})
        self._public = public_prefixes

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Wrap the resolved handler (public methods only refuse undecodable requests)."""
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None:
            return handler
        if method.startswith(self._public):
            return self._public_handler(method, handler)
        metadata = handler_call_details.invocation_metadata
        # SEC-4: undecodable bytes reach the wrappers as an UndecodableRequest, refused
        # there after authentication instead of gRPC's UNKNOWN before it.
        deserializer = tolerant_deserializer(handler.request_deserializer)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, metadata, handler.unary_unary),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._wrap_unary(method, metadata, handler.stream_unary, streaming_request=True),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, metadata, handler.unary_stream),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        return grpc.stream_stream_rpc_method_handler(
            self._wrap_stream(method, metadata, handler.stream_stream, streaming_request=True),
            request_deserializer=deserializer,
            response_serializer=handler.response_serializer,
        )

    def _admit(self, method: str, metadata: Any, request: Any, streaming_request: bool) -> Any:
        principal = self._tokens.authenticate(metadata)
        policy = self._policies.get(method)
        if policy is None:
            raise method_not_declared(method)  # SEC-3: fail closed
        # SEC-1/SEC-3: roles and workspace as declared, before the handler runs; an unset
        # optional workspace binds the principal's own workspaces, never "all".
        scope = policy.admit(principal, None if streaming_request else request)
        if not streaming_request and isinstance(request, Message):
            check_request(request)  # SEC-2: unknown enum values, NUL characters
        return bind_call(scope)

    async def _admit_first_message(self, method: str, requests: Any) -> Any:
        """Check a ``FIRST_MESSAGE`` stream's first message before the handler sees it.

        Returns the stream to hand to the handler (the first message put back in front);
        other streams are returned untouched.
        """
        policy = self._policies[method]
        if policy.workspace is not WorkspaceSource.FIRST_MESSAGE:
            return requests
        iterator = aiter(requests)
        first = await anext(iterator, None)
        if first is None:
            return iterator
        narrow_call(policy.admit_first_message(current_scope().principal, first))

        async def replay() -> AsyncIterator[Any]:
            yield first
            async for request in iterator:
                yield request

        return replay()

    async def _fail(
        self, context: grpc.aio.ServicerContext[Any, Any], error: BaseException
    ) -> None:
        if isinstance(error, NotImplementedError):
            error = NotImplementedYet(f"{error or 'this RPC'} is not implemented in this build")
        refusal = None if isinstance(error, DomainError) else store_refusal(error)
        if refusal is not None:
            # SEC-4: a write the store refused rolled back whole; the caller hears why,
            # never INTERNAL (writers that expect a violation catch it before this).
            log.warning("store refused a write: %s", refusal.message)
            error = refusal
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

    async def _enter(
        self, method: str, metadata: Any, request: Any, streaming_request: bool
    ) -> tuple[Any, Any]:
        """Admit the call; return the call scope's token and the request for the handler.

        Undecodable bytes are refused after the caller is checked. For a stream the request
        handed on is decoded, its first message admitted.
        """
        if isinstance(request, UndecodableRequest):
            raise self._undecodable(method, metadata, request)
        token = self._admit(method, metadata, request, streaming_request)
        if streaming_request:
            try:
                request = self._decoded_stream(method, request)
                request = await self._admit_first_message(method, request)
            except BaseException:
                unbind_call(token)
                raise
        return token, request

    def _wrap_unary(
        self, method: str, metadata: Any, inner: Any, *, streaming_request: bool = False
    ) -> Callable[..., Awaitable[Any]]:
        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.perf_counter()
            token = None
            try:
                token, request = await self._enter(method, metadata, request, streaming_request)
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
                    unbind_call(token)
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
                token, request = await self._enter(method, metadata, request, streaming_request)
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
                    unbind_call(token)
                self._record(method, started, context)

        return handle

    # SEC-4: bytes that do not decode -------------------------------------------------

    def _undecodable(self, method: str, metadata: Any, request: UndecodableRequest) -> DomainError:
        """Authenticate and check the caller first, then refuse the bytes.

        No token stays ``UNAUTHENTICATED`` and an undeclared method or a caller of the wrong
        role stays ``PERMISSION_DENIED``, whatever the body. The body cannot be read, so no
        workspace is checked: any admitted caller gets ``INVALID_ARGUMENT``
        ``UNDECODABLE_REQUEST``.
        """
        principal = self._tokens.authenticate(metadata)
        policy = self._policies.get(method)
        if policy is None:
            return method_not_declared(method)
        policy.admit_caller(principal)
        return self._log_undecodable(method, request, principal.subject)

    def _log_undecodable(
        self, method: str, request: UndecodableRequest, subject: str | None
    ) -> DomainError:
        error = undecodable_error(request)
        log.warning(
            "undecodable request refused: %s %s",
            method,
            error.message,
            extra={
                "rpc.method": method,
                "subject": subject,
                "size_bytes": request.size_bytes,
                "field": request.failure.field,
            },
        )
        return error

    async def _decoded_stream(self, method: str, requests: Any) -> AsyncIterator[Any]:
        """The request stream, ended with ``INVALID_ARGUMENT`` at an undecodable message.

        A message that does not decode carries nothing to answer it by (no report id, no
        sequence number), so the stream ends there; what was read before it stands.
        """
        async for request in requests:
            if isinstance(request, UndecodableRequest):
                raise self._log_undecodable(method, request, None)
            yield request

    def _public_handler(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """Health and reflection: no token, but undecodable bytes are still typed refusals."""
        if handler.unary_unary is not None or handler.unary_stream is not None:
            return self._public_unary_request(method, handler)
        return self._public_streaming_request(method, handler)

    async def _refuse_public(
        self, context: grpc.aio.ServicerContext[Any, Any], error: DomainError
    ) -> None:
        await context.abort_with_status(to_grpc_status(error, domain=self._domain))

    def _public_unary_request(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """A public unary-unary or unary-stream handler that refuses an undecodable request."""
        deserializer = tolerant_deserializer(handler.request_deserializer)
        serializer = handler.response_serializer
        unary_inner: Any = handler.unary_unary or handler.unary_stream

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if isinstance(request, UndecodableRequest):
                await self._refuse_public(context, self._log_undecodable(method, request, None))
            result = unary_inner(request, context)
            return await result if inspect.isawaitable(result) else result

        async def unary_stream(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            if isinstance(request, UndecodableRequest):
                await self._refuse_public(context, self._log_undecodable(method, request, None))
            result = unary_inner(request, context)
            if inspect.isawaitable(result):
                await result
            elif result is not None:
                async for item in result:
                    yield item

        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=deserializer, response_serializer=serializer
            )
        return grpc.unary_stream_rpc_method_handler(
            unary_stream, request_deserializer=deserializer, response_serializer=serializer
        )

    def _public_streaming_request(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """A public stream-unary or stream-stream handler; an undecodable message ends it."""
        deserializer = tolerant_deserializer(handler.request_deserializer)
        serializer = handler.response_serializer
        streaming_inner: Any = handler.stream_unary or handler.stream_stream

        async def streaming(
            requests: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            try:
                result = streaming_inner(self._decoded_stream(method, requests), context)
                if inspect.isawaitable(result):
                    yield await result
                elif result is not None:
                    async for item in result:
                        yield item
            except DomainError as error:
                await self._refuse_public(context, error)

        if handler.stream_unary is not None:

            async def stream_unary(
                requests: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> Any:
                responses = [item async for item in streaming(requests, context)]
                return responses[0] if responses else None

            return grpc.stream_unary_rpc_method_handler(
                stream_unary, request_deserializer=deserializer, response_serializer=serializer
            )
        return grpc.stream_stream_rpc_method_handler(
            streaming, request_deserializer=deserializer, response_serializer=serializer
        )
