"""Whether a live test server still answers SERVING (for suites that attack it)."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2

from tests.support.servers import LiveServer

__all__ = ["assert_serving"]


def assert_serving(server: LiveServer, what: object, timeout: float) -> None:
    """``server`` answers ``grpc.health.v1`` SERVING (``what`` names the case on failure).

    The check goes through a raw method, so it needs no generated health stub."""
    check: grpc.UnaryUnaryMultiCallable[
        health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
    ] = server.channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    answer = check(health_pb2.HealthCheckRequest(), timeout=timeout)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING, (server.name, what)
