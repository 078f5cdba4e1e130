"""livestream as two real ``tutti serve livestream`` replicas on one Host (SCALE-4).

One ``tutti serve host`` on Postgres, two livestream processes with ``TUTTI_BUS=nats`` on a
nats-server of the test's own (the project's), devices as raw DeviceLink clients. Host
commits one ``session_reconcile_required`` per Session rename, so every committed event is
recognisable on the device (its Session id) and an exact resume can be checked: each event
exactly once, sequences without a gap or a duplicate, in the same epoch.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from agentactivity.livestream.v1 import livestream_pb2, livestream_pb2_grpc
from services.livestream.handover.nats_transport import subject_of
from services.livestream.handover.state import CHUNK_HEADER, MAGIC
from tests.integration.livestream.link_client import Link, attach_request, hello
from tests.support.database import PostgresDatabases
from tests.support.host_sessions import ADMIN, demo_target
from tests.support.nats_server import NatsServer
from tests.support.rpc_errors import error_details
from tests.support.servers import auth_metadata, token_for
from tests.support.service_process import ServiceProcess, service_process

WS = "ws-1"
DEVICES = 3
SESSIONS = 24
Delivery = livestream_pb2.Delivery
Reason = livestream_pb2.DiscontinuityReason
Rejected = livestream_pb2.ResumeRejectedReason


class Suite:
    """Host, livestream replicas 1 and 2, and the test's nats-server."""

    def __init__(
        self, host: ServiceProcess, first: ServiceProcess, second: ServiceProcess, nats_url: str
    ) -> None:
        self.host = host
        self.replicas = (first, second)
        self.nats_url = nats_url
        self.host_channel = grpc.insecure_channel(host.address)
        self.host_stub = host_pb2_grpc.HostServiceStub(self.host_channel)
        self.channels = [grpc.insecure_channel(r.address) for r in self.replicas]
        self.sessions: list[str] = []

    def rename(self, session_id: str, title: str) -> None:
        """One committed ``session_reconcile_required`` for ``session_id``."""
        self.host_stub.RenameSession(
            host_pb2.RenameSessionRequest(workspace_id=WS, session_id=session_id, title=title),
            metadata=ADMIN,
            timeout=20,
        )

    def link(self, replica: int, device: str, cursor: tuple[str, int] | None = None) -> Link:
        """A DeviceLink of ``device`` to replica ``replica`` (0 or 1)."""
        return Link(self.channels[replica], hello(device, (WS,), cursor=cursor))

    def publishers(self, replica: int) -> list[livestream_pb2.PublisherInfo]:
        """ListPublishers of a replica, as admin."""
        stub = livestream_pb2_grpc.DeviceLinkServiceStub(self.channels[replica])
        response = stub.ListPublishers(
            livestream_pb2.ListPublishersRequest(), metadata=auth_metadata("admin"), timeout=10
        )
        return list(response.publishers)

    def close(self) -> None:
        for channel in (self.host_channel, *self.channels):
            channel.close()


@pytest.fixture
def suite(
    tmp_path: Path,
    postgres_databases: PostgresDatabases,
    postgres_template: str,
    private_nats: NatsServer,
) -> Iterator[Suite]:
    """A Host on a fresh Postgres database and two livestream replicas on the bus."""
    name = f"tutti_test_{uuid.uuid4().hex[:16]}"
    url = postgres_databases.create(name, template=postgres_template)
    for part in ("host", "l1", "l2"):
        (tmp_path / part).mkdir()
    live = {
        "service_token": token_for("service"),
        "bus": "nats",
        "nats_url": private_nats.url,
        "grace_period_seconds": "15",
        "drain_delay_seconds": "0",
        "live_heartbeat_interval_seconds": "1",
    }
    try:
        with service_process(
            "host", tmp_path / "host", database_url=url, drain_delay_seconds="0"
        ) as host:
            live["host_address"] = host.address
            with (
                service_process("livestream", tmp_path / "l1", database_url=url, **live) as first,
                service_process("livestream", tmp_path / "l2", database_url=url, **live) as second,
            ):
                ready = Suite(host, first, second, private_nats.url)
                ready.host_stub.RegisterAgentTarget(
                    host_pb2.RegisterAgentTargetRequest(target=demo_target()), metadata=ADMIN
                )
                for n in range(SESSIONS):
                    created = ready.host_stub.CreateSession(
                        host_pb2.CreateSessionRequest(
                            workspace_id=WS, agent_target_id="demo", cwd=f"/work/s{n}"
                        ),
                        metadata=ADMIN,
                    )
                    ready.sessions.append(created.session.session_id)
                try:
                    yield ready
                finally:
                    ready.close()
    finally:
        postgres_databases.drop(name)


class Renamer:
    """Renames the suite's Sessions one after another on a thread (events flow meanwhile)."""

    def __init__(self, suite: Suite, sessions: list[str], pause: float = 0.05) -> None:
        self.done = threading.Event()
        self.renamed: list[str] = []
        self.error: BaseException | None = None
        self._suite = suite
        self._sessions = sessions
        self._pause = pause
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for n, session_id in enumerate(self._sessions):
                self._suite.rename(session_id, f"title-{n}")
                self.renamed.append(session_id)
                time.sleep(self._pause)
        except Exception as error:  # noqa: BLE001 - reported by wait()
            self.error = error
        finally:
            self.done.set()

    def wait(self, timeout: float = 120) -> None:
        assert self.done.wait(timeout), "renames did not finish"
        assert self.error is None, self.error


def _reconciled(deliveries: list[Delivery]) -> list[str]:
    return [
        d.discontinuity.keys.session_id
        for d in deliveries
        if d.HasField("discontinuity")
        and d.discontinuity.reason == Reason.DISCONTINUITY_REASON_SESSION_RECONCILE_REQUIRED
    ]


def _wait_reconciled(link: Link, count: int) -> None:
    """Read ``link`` until it saw ``count`` committed renames."""
    link.wait_for(lambda _d: len(_reconciled(link.deliveries)) >= count)


def _discontinuity_after(mark: int) -> Callable[[Delivery], bool]:
    return lambda d: d.sequence > mark and d.HasField("discontinuity")


def _collect(before: Link, after: Link, sessions: list[str]) -> None:
    """Read ``after`` until every Session was reconciled on ``before`` or ``after``."""
    after.wait_for(
        lambda _d: set(sessions) <= set(_reconciled(before.deliveries + after.deliveries)),
        timeout=60,
    )


def _drained(link: Link) -> None:
    error = link.wait_error()
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert error_details(error)[1] == "DRAINING"


@pytest.mark.spec("SCALE-4", "LIVE-RESUME-1", "LIVE-ATT-1")
def test_a_drained_replicas_devices_resume_exactly_on_the_other(suite: Suite) -> None:
    first_half, second_half = suite.sessions[: SESSIONS // 2], suite.sessions[SESSIONS // 2 :]
    links = [suite.link(0, f"phone-{n}") for n in range(DEVICES)]
    for link in links:
        link.wait_ready()
    # One device holds an attachment, caught up from Host.
    links[0].send(attach_request("screen", 1, suite.sessions[0]))
    links[0].wait_for(lambda d: d.HasField("attachment_caught_up"))
    epochs = [link.epoch for link in links]

    renamer = Renamer(suite, first_half + second_half)
    for link in links:
        _wait_reconciled(link, 4)
    suite.replicas[0].process.terminate()  # SIGTERM: drain (ADR 0005)
    for link in links:
        _drained(link)
        # Whatever was still in flight on the old call is left to the replay.
        while not link.frames.empty():
            link.pump(link.frames.get())

    resumed = [
        suite.link(1, f"phone-{n}", cursor=(link.epoch, link.last_sequence))
        for n, link in enumerate(links)
    ]
    for before, after, epoch in zip(links, resumed, epochs, strict=True):
        ready = after.wait_ready()
        assert ready.resumed, "the resume on the other replica was not exact"
        assert ready.epoch == epoch
        assert ready.latest_sequence >= before.last_sequence
    renamer.wait()
    assert suite.replicas[0].process.wait(timeout=30) == 0
    for before, after in zip(links, resumed, strict=True):
        _collect(before, after, suite.sessions)
        every = before.deliveries + after.deliveries
        # No gap and no duplicate in the one epoch ...
        assert [d.sequence for d in every] == list(range(1, len(every) + 1))
        # ... and every committed event exactly once, in Host's order.
        assert _reconciled(every) == first_half + second_half
        # The junction is said, typed and workspace-scoped, once (ADR 0043).
        junction = [
            d
            for d in after.deliveries
            if d.HasField("discontinuity")
            and d.discontinuity.reason == Reason.DISCONTINUITY_REASON_UPSTREAM_RESUBSCRIBED
        ]
        assert len(junction) == 1
        assert junction[0].discontinuity.keys == livestream_pb2.ReconcileKeys(workspace_id=WS)

    # Later events keep arriving on the new owner, which holds the binding too.
    marks = [after.last_sequence for after in resumed]
    suite.rename(suite.sessions[0], "after-the-drain")
    for after, mark in zip(resumed, marks, strict=True):
        later = after.wait_for(_discontinuity_after(mark))
        assert _reconciled([later]) == [suite.sessions[0]]
    (holder,) = [p for p in suite.publishers(1) if p.device_id == "phone-0"]
    assert [(b.binding_id, b.revision, b.session_id) for b in holder.bindings] == [
        ("screen", 1, suite.sessions[0])
    ]
    assert holder.epoch == epochs[0]
    for link in resumed:
        link.cancel()


@pytest.mark.spec("SCALE-4", "LIVE-RESUME-1", "LIVE-ATT-1")
def test_a_killed_replicas_devices_are_rejected_typed_and_converge_to_host(suite: Suite) -> None:
    links = [suite.link(0, f"phone-{n}") for n in range(DEVICES)]
    for link in links:
        link.wait_ready()
    renamer = Renamer(suite, suite.sessions)
    for link in links:
        _wait_reconciled(link, 3)
    suite.replicas[0].process.kill()  # SIGKILL: nothing is handed over
    for link in links:
        assert link.wait_error().code() == grpc.StatusCode.UNAVAILABLE

    started = time.monotonic()
    again = [
        suite.link(1, f"phone-{n}", cursor=(link.epoch, link.last_sequence))
        for n, link in enumerate(links)
    ]
    for before, after in zip(links, again, strict=True):
        ready = after.wait_ready()
        assert not ready.resumed
        assert ready.epoch != before.epoch
        first = after.deliveries[0]
        assert first.sequence == 1
        assert first.resume_rejected.reason == Rejected.RESUME_REJECTED_REASON_EPOCH_UNKNOWN
        assert first.resume_rejected.rejected_cursor == livestream_pb2.ResumeCursor(
            epoch=before.epoch, last_sequence=before.last_sequence
        )
    # "No responders" answers at once: no hand-over timeout was waited for.
    assert time.monotonic() - started < 5

    # The device reconciles from Host: its attachment's baseline is read again.
    renamer.wait()
    session = suite.sessions[-1]
    device = again[0]
    device.send(attach_request("screen", 1, session))
    caught_up = device.wait_for(lambda d: d.HasField("attachment_caught_up"))
    canonical = suite.host_stub.GetSession(
        host_pb2.GetSessionRequest(workspace_id=WS, session_id=session), metadata=ADMIN
    ).session
    assert canonical.title == f"title-{SESSIONS - 1}"
    turns = suite.host_stub.ListSessionTurns(
        host_pb2.ListSessionTurnsRequest(workspace_id=WS, session_id=session, limit=1000),
        metadata=ADMIN,
    ).turns
    assert list(caught_up.attachment_caught_up.canonical_turn_ids) == sorted(
        t.turn_id for t in turns
    )
    # Live events reach the rejected devices' fresh epochs on the surviving replica.
    suite.rename(session, "after-the-kill")
    for after in again:
        after.wait_for(
            lambda d: d.HasField("discontinuity") and d.discontinuity.keys.session_id == session
        )
        assert [d.sequence for d in after.deliveries] == list(range(1, len(after.deliveries) + 1))
        after.cancel()


async def _garbling_owner(url: str, epoch: str, reply: bytes) -> NatsClient:
    client = await nats.connect(url)

    async def answer(msg: Msg) -> None:
        await client.publish(msg.reply, reply)

    await client.subscribe(subject_of(epoch), cb=answer)
    await client.flush()
    return client


@pytest.mark.spec("SCALE-4")
@pytest.mark.parametrize(
    "reply",
    [
        b"garbage",
        CHUNK_HEADER.pack(MAGIC, 99, 1, 0, 1) + b"{}",  # another format version
        CHUNK_HEADER.pack(MAGIC, 1, 1, 0, 1) + MAGIC + b"\x01\x00\x00\x00\x02{}",
        CHUNK_HEADER.pack(MAGIC, 1, 1, 5, 2) + b"x",  # a chunk out of order
        CHUNK_HEADER.pack(MAGIC, 1, 2, 0, 1) + b'{"reason": 7}',  # a malformed refusal
    ],
    ids=["garbage", "version", "bad-header", "out-of-order", "bad-refusal"],
)
def test_a_garbled_hand_over_reply_is_refused_typed_and_nothing_crashes(
    suite: Suite, reply: bytes
) -> None:
    epoch = uuid.uuid4().hex
    loop = asyncio.new_event_loop()
    owner = loop.run_until_complete(_garbling_owner(suite.nats_url, epoch, reply))
    pump = threading.Thread(target=loop.run_forever, daemon=True)
    pump.start()
    try:
        link = suite.link(1, "phone-9", cursor=(epoch, 3))
        ready = link.wait_ready()
        assert not ready.resumed
        rejected = link.deliveries[0].resume_rejected
        assert rejected.reason == Rejected.RESUME_REJECTED_REASON_EPOCH_UNKNOWN
        assert rejected.rejected_cursor.epoch == epoch
        link.cancel()
        # The replica still serves: a fresh device gets a stream.
        fresh = suite.link(1, "phone-10")
        fresh.wait_ready()
        fresh.cancel()
        assert suite.replicas[1].process.poll() is None
    finally:
        asyncio.run_coroutine_threadsafe(owner.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        pump.join(10)
        loop.close()
