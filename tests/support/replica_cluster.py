"""Host and livestream replicas as real ``tutti serve`` processes that a test kills and restarts.

Each replica has a fixed port (picked once), so a restarted replica comes back where its
clients expect it: devices and watchers dial every replica of a service through one balanced
``ipv4:`` target (``round_robin`` over the SERVING ones, as in production, SCALE-7), and a
dead or draining replica simply drops out of their choice. The replicas share one Postgres
database and the project's nats-server (SCALE-1, SCALE-3).
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from grpcserver.channels import channel_options
from tests.support.nats_server import free_port
from tests.support.servers import auth_metadata, token_for
from tests.support.service_process import ServiceProcess, start_service_process

__all__ = ["HOST_SETTINGS", "ReplicaCluster", "ReplicaSlot", "balanced_target", "replica_cluster"]

WS = "ws-1"
TARGET_ID = "demo-target"
PROVIDER = "demo"

HOST_SETTINGS: Mapping[str, str] = {
    "live_log_heartbeat_seconds": "0.25",
    "live_log_publish_timeout_seconds": "1.0",
    "activity_follow_interval_seconds": "1.0",
}
"""Host replicas: a short heartbeat and follow interval, so a test is not slow to converge."""

DRAIN_SETTINGS: Mapping[str, str] = {
    # SIGTERM drains: NOT_SERVING at once, new calls refused after the delay, streams ended
    # (UNAVAILABLE, resumable) within the grace.
    "drain_delay_seconds": "0.5",
    "grace_period_seconds": "5",
}


def balanced_target(addresses: list[str]) -> str:
    """The ``ipv4:`` target over ``addresses`` (``round_robin`` with health checking)."""
    return "ipv4:" + ",".join(addresses)


def balanced_channel(addresses: list[str]) -> grpc.Channel:
    """A sync channel spreading calls over the SERVING replicas among ``addresses``."""
    target = balanced_target(addresses)
    return grpc.insecure_channel(target, options=channel_options(target))


@dataclass
class ReplicaSlot:
    """One replica of a service on a fixed port: started, killed, drained, started again."""

    name: str
    service: str
    workdir: Path
    database_url: str
    settings: dict[str, str]
    port: int = field(default_factory=free_port)
    process: ServiceProcess | None = None
    starts: int = 0

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, the same across restarts."""
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        """The process runs."""
        return self.process is not None and self.process.process.poll() is None

    def start(self) -> None:
        """Start the replica on its port and wait until it listens."""
        assert not self.alive, f"{self.name} already runs"
        self.starts += 1
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = start_service_process(
            self.service,
            self.workdir,
            database_url=self.database_url,
            listen_address=self.address,
            **self.settings,
        )

    def kill(self) -> None:
        """SIGKILL: a crash (no drain, no hand-over)."""
        if self.process is not None:
            self.process.kill()

    def drain(self, timeout: float = 30) -> int:
        """SIGTERM: a graceful drain; the exit code."""
        assert self.process is not None
        self.process.process.send_signal(signal.SIGTERM)
        try:
            return self.process.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"{self.name} did not finish draining in {timeout} s") from None


@dataclass
class ReplicaCluster:
    """Host and livestream replicas on one database and one nats-server."""

    hosts: list[ReplicaSlot]
    livestreams: list[ReplicaSlot]
    channels: list[grpc.Channel] = field(default_factory=list)

    @property
    def slots(self) -> list[ReplicaSlot]:
        """Every replica."""
        return [*self.hosts, *self.livestreams]

    def slot(self, name: str) -> ReplicaSlot:
        """The replica called ``name`` (``host-1``, ``livestream-2``...)."""
        return next(s for s in self.slots if s.name == name)

    def host_stub(self, replica: int) -> host_pb2_grpc.HostServiceStub:
        """A HostService client on Host replica ``replica`` (1-based)."""
        channel = grpc.insecure_channel(self.hosts[replica - 1].address)
        self.channels.append(channel)
        return host_pb2_grpc.HostServiceStub(channel)

    def host_channel(self, replica: int) -> grpc.Channel:
        """A channel to Host replica ``replica`` (closed with the cluster)."""
        channel = grpc.insecure_channel(self.hosts[replica - 1].address)
        self.channels.append(channel)
        return channel

    def balanced_hosts(self) -> grpc.Channel:
        """A channel over every Host replica (closed with the cluster)."""
        channel = balanced_channel([s.address for s in self.hosts])
        self.channels.append(channel)
        return channel

    def livestream_target(self, first: int = 0) -> str:
        """An ``ipv4:`` target of every livestream replica, replica ``first`` (0-based) first:
        with ``pick_first`` a device stays there and fails over in list order."""
        addresses = [s.address for s in self.livestreams]
        return balanced_target(addresses[first:] + addresses[:first])

    def seed(self) -> None:
        """Register the agent target the runtime serves (through Host replica 1)."""
        self.host_stub(1).RegisterAgentTarget(
            host_pb2.RegisterAgentTargetRequest(
                target=host_pb2.AgentTarget(
                    agent_target_id=TARGET_ID,
                    provider=PROVIDER,
                    display_name=TARGET_ID,
                    enabled=True,
                    launch_ref=host_pb2.AgentLaunchRef(runtime_target_ref=f"{PROVIDER}:default"),
                    capabilities=canonical_pb2.RuntimeCapabilities(
                        guidance=True, interrupt=True, live_settings=True
                    ),
                )
            ),
            metadata=auth_metadata("admin"),
            timeout=30,
        )


@contextmanager
def replica_cluster(
    tmp_path: Path,
    *,
    database_url: str,
    nats_url: str,
    replicas: int = 2,
    livestream_upstreams: list[list[int]] | None = None,
    livestream_settings: Mapping[str, str] | None = None,
) -> Iterator[ReplicaCluster]:
    """``replicas`` Host and livestream replicas, started; every process killed at the end.

    Args:
        tmp_path: each replica's directory goes below it.
        database_url: the shared (Postgres) database, migrated.
        nats_url: the nats-server (JetStream) every replica uses as its live log.
        replicas: how many of each.
        livestream_upstreams: per livestream replica, the Host replicas (1-based) it reads
            from; default every Host replica (balanced).
        livestream_settings: more ``TUTTI_*`` settings of the livestream replicas.
    """
    bus = {"bus": "nats", "nats_url": nats_url, **DRAIN_SETTINGS}
    hosts = [
        ReplicaSlot(
            f"host-{k}", "host", tmp_path / f"host-{k}", database_url, {**bus, **HOST_SETTINGS}
        )
        for k in range(1, replicas + 1)
    ]
    upstreams = livestream_upstreams or [list(range(1, replicas + 1))] * replicas
    livestreams = []
    for k, chosen in enumerate(upstreams, start=1):
        addresses = [hosts[i - 1].address for i in chosen]
        upstream = addresses[0] if len(addresses) == 1 else balanced_target(addresses)
        settings = {
            **bus,
            "host_address": upstream,
            "service_token": token_for("service"),
            **(livestream_settings or {}),
        }
        livestreams.append(
            ReplicaSlot(
                f"livestream-{k}",
                "livestream",
                tmp_path / f"livestream-{k}",
                database_url,
                settings,
            )
        )
    cluster = ReplicaCluster(hosts, livestreams)
    try:
        for slot in cluster.slots:
            slot.start()
        cluster.seed()
        yield cluster
    finally:
        for channel in cluster.channels:
            channel.close()
        for slot in cluster.slots:
            slot.kill()
