"""A balanced channel spreads calls over real servers and skips a draining one (SCALE-7).

Two real gRPC servers on 127.0.0.1, each answering one raw method with its own name and
serving ``grpc.health.v1``. The channel comes from :mod:`grpcserver.channels` with an
``ipv4:`` list target: the same resolver path as ``dns:///`` for a headless Service, whose
name resolves to every ready pod (a name with two loopback addresses needs a DNS server).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from grpcserver.app import ServiceDefinition, start_server
from grpcserver.channels import aio_channel, sync_channel
from grpcserver.settings import ServerSettings

pytestmark = pytest.mark.spec("SCALE-7")

METHOD = "/tutti.test.Replica/Name"
CALLS = 40


@dataclass
class Replica:
    """One server: its name, port and health servicer."""

    name: str
    port: int
    server: grpc.Server
    health: health.HealthServicer


def _start(name: str) -> Replica:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)

    def answer(_request: bytes, _context: grpc.ServicerContext) -> bytes:
        return name.encode()

    handler = grpc.method_handlers_generic_handler(
        "tutti.test.Replica", {"Name": grpc.unary_unary_rpc_method_handler(answer)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return Replica(name, port, server, servicer)


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    """Two running replicas, stopped after the test."""
    started = [_start("a"), _start("b")]
    yield started
    for replica in started:
        replica.server.stop(grace=None)


def _target(replicas: list[Replica]) -> str:
    return "ipv4:" + ",".join(f"127.0.0.1:{replica.port}" for replica in replicas)


def _names(channel: grpc.Channel, calls: int) -> Counter[str]:
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(METHOD)
    return Counter(call(b"", timeout=10, wait_for_ready=True).decode() for _ in range(calls))


def _until(channel: grpc.Channel, names: set[str]) -> None:
    """Call until exactly ``names`` answer (subchannels connect and report health async)."""
    for _ in range(200):
        if set(_names(channel, 4)) == names:
            return
    raise AssertionError(f"the channel never settled on {sorted(names)}")


def test_calls_are_spread_over_every_replica(replicas: list[Replica]) -> None:
    """Round robin: with two healthy replicas each one gets half of the calls."""
    with sync_channel(_target(replicas), ServerSettings()) as channel:
        _until(channel, {"a", "b"})
        counts = _names(channel, CALLS)
    assert counts == {"a": CALLS // 2, "b": CALLS // 2}


def test_a_draining_replica_gets_no_new_calls(replicas: list[Replica]) -> None:
    """A replica whose health turns NOT_SERVING (the start of a drain) is skipped at once."""
    first, second = replicas
    with sync_channel(_target(replicas), ServerSettings()) as channel:
        _until(channel, {"a", "b"})
        first.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        # The health watch delivers the change asynchronously; a few calls may precede it.
        _until(channel, {second.name})
        assert _names(channel, CALLS) == {second.name: CALLS}
        first.health.set("", health_pb2.HealthCheckResponse.SERVING)
        _until(channel, {"a", "b"})
        assert _names(channel, CALLS) == {first.name: CALLS // 2, second.name: CALLS // 2}


def test_the_aio_channel_is_balanced_too(replicas: list[Replica]) -> None:
    """The channel services open to each other (``aio_channel``) uses the same choice."""

    async def run() -> Counter[str]:
        async with aio_channel(_target(replicas), ServerSettings()) as channel:
            call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(METHOD)
            for _ in range(200):
                seen = {await call(b"", timeout=10, wait_for_ready=True) for _ in range(4)}
                if seen == {b"a", b"b"}:
                    break
            names: Counter[str] = Counter()
            for _ in range(CALLS):
                answer: bytes = await call(b"", timeout=10)
                names[answer.decode()] += 1
            return names

    assert asyncio.run(run()) == {"a": CALLS // 2, "b": CALLS // 2}


def test_a_drain_of_the_suites_server_loses_no_call(tmp_path: Path) -> None:
    """Two servers of the suite's own bootstrap: one drains, every call still succeeds.

    The servers here are the real bootstrap (interceptor, authentication, drain), so this
    shows that the balanced channel's health watch passes the interceptor without a token (a
    refused watch would leave no healthy replica and fail the calls) and that calls made
    without ``wait_for_ready`` keep succeeding while one replica drains and stops. Which
    replica answers is shown by ``test_a_draining_replica_gets_no_new_calls``.
    """

    async def run() -> tuple[int, int]:
        settings = ServerSettings(
            listen_address="127.0.0.1:0",
            data_dir=tmp_path,
            grace_period_seconds=2.0,
            drain_delay_seconds=0.5,
            reflection=False,
        )
        definition = ServiceDefinition(name="probe", service_names=[], register=lambda _: None)
        servers = [await start_server(definition, settings) for _ in range(2)]
        target = "ipv4:" + ",".join(f"127.0.0.1:{server.port}" for server in servers)
        failures = successes = 0
        try:
            async with aio_channel(target, settings) as channel:
                # The generated stub is typed for sync channels.
                stub: Any = health_pb2_grpc.HealthStub(channel)
                request = health_pb2.HealthCheckRequest()
                await stub.Check(request, timeout=10, wait_for_ready=True)
                draining = asyncio.create_task(servers[0].stop())
                while not draining.done() or successes < 50:
                    try:
                        await stub.Check(request, timeout=10)
                        successes += 1
                    except grpc.aio.AioRpcError:
                        failures += 1
                    await asyncio.sleep(0.005)
                await draining
        finally:
            for server in servers:
                await server.stop(grace=0)
        return successes, failures

    successes, failures = asyncio.run(run())
    assert successes >= 50
    assert failures == 0
