"""Client-side probes of the standard services every server exposes without a token.

Used by ``tutti up`` to wait for readiness and by tests and operators to inspect a
server: ``grpc.health.v1`` Check and the reflection service list.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

ServingStatus = health_pb2.HealthCheckResponse.ServingStatus


def check_health(channel: grpc.Channel, service: str = "", *, timeout: float = 5.0) -> int:
    """Return the serving status of ``service`` ("" is the whole server)."""
    check: grpc.UnaryUnaryMultiCallable[
        health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
    ] = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    return check(health_pb2.HealthCheckRequest(service=service), timeout=timeout).status


def list_services(channel: grpc.Channel, *, timeout: float = 5.0) -> set[str]:
    """Return the full names of the services a server lists through reflection."""
    info: grpc.StreamStreamMultiCallable[
        reflection_pb2.ServerReflectionRequest, reflection_pb2.ServerReflectionResponse
    ] = channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    replies = info(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=timeout
    )
    reply = next(iter(replies))
    return {service.name for service in reply.list_services_response.service}
