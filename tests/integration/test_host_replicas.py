"""Host as two real ``tutti serve host`` processes on one store (SCALE-1).

Both replicas share the database; nothing else connects them. A ``WatchActivity`` stream on
either must deliver every committed event of its workspace exactly once, in the workspace's
gap-free sequence, whichever replica committed it; two workspaces' appends must not wait for
each other; a Session's read-check-write commands must not lose each other's updates.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import Engine, select

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import activity_pb2, host_pb2, host_pb2_grpc
from services.host.activity.events import SessionReconcileRequired
from services.host.repository import unit_of_work
from services.host.repository.activity_events import NewEventRow
from services.host.repository.unit_of_work import HostTransaction
from services.host.wire.activity_codec import ProtoEventCodec
from store.database import Database
from store.models import WorkspaceEventHead
from tests.support.activity_watch import Watcher
from tests.support.host_sessions import ADMIN, demo_target
from tests.support.lock_waits import wait_for_lock_waiter
from tests.support.service_process import ServiceProcess, service_process

FOLLOW = "0.2"
"""The replicas' follow interval: how late, at most, a replica sees the other's events."""


class Replica:
    """One Host process and a channel to it."""

    def __init__(self, process: ServiceProcess) -> None:
        self.process = process
        self.channel = grpc.insecure_channel(process.address)
        self.stub = host_pb2_grpc.HostServiceStub(self.channel)

    def call(self, method: str, request: Any, timeout: float = 20) -> Any:
        """Invoke ``method`` as admin."""
        rpc: Callable[..., Any] = getattr(self.stub, method)
        return rpc(request, metadata=ADMIN, timeout=timeout)

    def create(self, workspace_id: str) -> str:
        """A new Session of target ``demo``; its id."""
        response = self.call(
            "CreateSession",
            host_pb2.CreateSessionRequest(
                workspace_id=workspace_id, agent_target_id="demo", cwd="/work/elsewhere"
            ),
        )
        return str(response.session.session_id)

    def rename(self, workspace_id: str, session_id: str, title: str, timeout: float = 20) -> None:
        """``RenameSession``: one committed ``session_reconcile_required`` event."""
        self.call(
            "RenameSession",
            host_pb2.RenameSessionRequest(
                workspace_id=workspace_id, session_id=session_id, title=title
            ),
            timeout,
        )


@pytest.fixture
def replicas(migrated_db_url: str, tmp_path: Path) -> Iterator[tuple[Replica, Replica]]:
    """Two Host replicas on the test database, the ``demo`` target registered."""
    with (
        service_process(
            "host",
            tmp_path / "r1",
            database_url=migrated_db_url,
            activity_follow_interval_seconds=FOLLOW,
        ) as first,
        service_process(
            "host",
            tmp_path / "r2",
            database_url=migrated_db_url,
            activity_follow_interval_seconds=FOLLOW,
        ) as second,
    ):
        pair = (Replica(first), Replica(second))
        pair[0].call(
            "RegisterAgentTarget", host_pb2.RegisterAgentTargetRequest(target=demo_target())
        )
        try:
            yield pair
        finally:
            for replica in pair:
                replica.channel.close()


@pytest.fixture(autouse=True)
def _dirs(tmp_path: Path) -> None:
    (tmp_path / "r1").mkdir()
    (tmp_path / "r2").mkdir()


def _head(engine: Engine, workspace_id: str) -> int:
    with engine.connect() as connection:
        found = connection.execute(
            select(WorkspaceEventHead.last_seq).where(
                WorkspaceEventHead.workspace_id == workspace_id
            )
        ).scalar_one_or_none()
    return int(found or 0)


def _durable(watcher: Watcher) -> list[activity_pb2.ActivityEvent]:
    return watcher.durable()


def _numbers(events: list[activity_pb2.ActivityEvent]) -> list[tuple[int, int]]:
    return [(event.workspace_sequence, event.event_id) for event in events]


def _watch_through(watcher: Watcher, head: int) -> list[activity_pb2.ActivityEvent]:
    def reached(events: list[activity_pb2.ActivityEvent]) -> bool:
        durable = [e for e in events if e.WhichOneof("event") != "message_delta"]
        return bool(durable) and durable[-1].workspace_sequence >= head

    watcher.wait_for(reached, timeout=60)
    time.sleep(3 * float(FOLLOW))  # a duplicate would arrive within a follow round or two
    return _durable(watcher)


@pytest.mark.spec("SCALE-1", "HOST-OBS-2")
def test_watchers_on_both_replicas_see_one_gap_free_sequence_of_both_replicas_commits(
    replicas: tuple[Replica, Replica], sync_engine: Engine
) -> None:
    first, second = replicas
    sessions = {replica: [replica.create("ws-1") for _ in range(3)] for replica in replicas}
    start = _head(sync_engine, "ws-1")
    watchers = [Watcher(first.channel, "ws-1"), Watcher(second.channel, "ws-1")]
    for watcher in watchers:
        assert watcher.wait_ready().head_workspace_sequence == start

    # Both replicas commit into ws-1 at once, on the same Sessions and on their own.
    def burst(replica: Replica, worker: int) -> None:
        every = sessions[first] + sessions[second]
        for n in range(15):
            replica.rename("ws-1", every[(worker + n) % len(every)], f"t-{worker}-{n}")

    with ThreadPoolExecutor(max_workers=4) as pool:
        done = [
            pool.submit(burst, replica, worker)
            for worker, replica in enumerate((first, second, first, second))
        ]
        for future in done:
            future.result(timeout=120)
    head = _head(sync_engine, "ws-1")
    assert head == start + 60

    seen = [_watch_through(watcher, head) for watcher in watchers]
    for events in seen:
        numbers = _numbers(events)
        # Exactly once and in order: the workspace's numbers after the start, each once.
        assert [seq for seq, _ in numbers] == list(range(start + 1, head + 1))
        ids = [event_id for _, event_id in numbers]
        assert ids == sorted(ids)
        assert len(set(ids)) == len(ids)
    assert _numbers(seen[0]) == _numbers(seen[1])
    assert [e.SerializeToString() for e in seen[0]] == [e.SerializeToString() for e in seen[1]]

    # A consumer that resumes on the other replica continues the same sequence.
    cursor_event = seen[0][9]
    resumed = Watcher(second.channel, "ws-1", after_event_id=cursor_event.event_id)
    resumed.wait_ready()
    replayed = _watch_through(resumed, head)
    assert _numbers(replayed) == _numbers(seen[0])[10:]
    for watcher in (*watchers, resumed):
        watcher.cancel()


async def _append_and_hold(
    url: str, workspace_id: str, holding: threading.Event, release: threading.Event
) -> None:
    """Append one real event for the workspace and keep the transaction open until released."""
    database = Database(url)
    await database.start()
    try:
        codec = ProtoEventCodec()

        async def command(tx: HostTransaction) -> None:
            payload = codec.encode(workspace_id, 1, SessionReconcileRequired("held"))
            await tx.events.append(
                [NewEventRow(workspace_id, "held", "session_reconcile_required", payload, 1)]
            )
            holding.set()
            await asyncio.to_thread(release.wait, 60)

        await unit_of_work.run(database, command)
    finally:
        await database.stop()


@pytest.mark.spec("SCALE-1")
def test_an_open_append_in_one_workspace_does_not_hold_back_another_workspace(
    replicas: tuple[Replica, Replica], sync_engine: Engine, migrated_db_url: str, backend: str
) -> None:
    if backend != "postgres":
        pytest.skip("SQLite admits one writer at a time by design (STORE-2): nothing to show")
    first, second = replicas
    busy, free = first.create("ws-1"), second.create("ws-2")
    watcher = Watcher(second.channel, "ws-1")
    watcher.wait_ready()
    holding, release = threading.Event(), threading.Event()
    holder = threading.Thread(
        target=asyncio.run,
        args=(_append_and_hold(migrated_db_url, "ws-1", holding, release),),
        daemon=True,
    )
    holder.start()
    try:
        assert holding.wait(30)
        # ws-2 commits through both replicas while ws-1's append transaction is open ...
        first.rename("ws-2", free, "while ws-1 is held", timeout=10)
        second.rename("ws-2", free, "still held", timeout=10)
        # ... while a ws-1 write waits for it: the head row lock is real.
        with ThreadPoolExecutor(max_workers=1) as pool:
            blocked: Future[None] = pool.submit(first.rename, "ws-1", busy, "after the hold")
            wait_for_lock_waiter(sync_engine, 30)  # the replica's append waits for the hold
            assert not blocked.done()
            release.set()
            blocked.result(timeout=30)
    finally:
        release.set()
        holder.join(30)
    head = _head(sync_engine, "ws-1")
    events = _watch_through(watcher, head)
    sequence = [e.workspace_sequence for e in events]
    assert sequence == list(range(head - len(sequence) + 1, head + 1))
    assert [e.session_reconcile_required.session_id for e in events[-2:]] == ["held", busy]
    watcher.cancel()


@pytest.mark.spec("SCALE-1", "HOST-LANE-1", "HOST-SES-6")
def test_settings_updates_of_one_session_through_both_replicas_lose_nothing(
    replicas: tuple[Replica, Replica],
) -> None:
    first, second = replicas
    session_id = first.create("ws-1")
    modes = ("default", "accept_edits")

    def update(replica: Replica, settings: canonical_pb2.SessionSettings) -> None:
        replica.call(
            "UpdateSessionSettings",
            host_pb2.UpdateSessionSettingsRequest(
                workspace_id="ws-1", session_id=session_id, settings=settings
            ),
        )

    def one(
        barrier: threading.Barrier, replica: Replica, settings: canonical_pb2.SessionSettings
    ) -> None:
        barrier.wait(10)
        update(replica, settings)

    with ThreadPoolExecutor(max_workers=2) as pool:
        for n in range(25):
            mode, speed = modes[n % 2], n + 1
            barrier = threading.Barrier(2)
            both = [
                pool.submit(
                    one, barrier, first, canonical_pb2.SessionSettings(permission_mode=mode)
                ),
                pool.submit(one, barrier, second, canonical_pb2.SessionSettings(speed=speed)),
            ]
            for future in both:
                future.result(timeout=30)
            got = second.call(
                "GetSession", host_pb2.GetSessionRequest(workspace_id="ws-1", session_id=session_id)
            ).session.settings
            assert (got.permission_mode, got.speed) == (mode, speed), n
