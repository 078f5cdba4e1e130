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

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

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
    call = channel.unary_unary(METHOD)
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
            call = channel.unary_unary(METHOD)
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

