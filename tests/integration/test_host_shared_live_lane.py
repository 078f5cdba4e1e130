"""Host's live lane across two real replicas on the shared live log (SCALE-3, HOST-RT-2).

Two ``tutti serve host`` processes share the database and, with ``TUTTI_BUS=nats``, a real
nats-server (private to each test, so it can be stopped). A runtime attached to replica 1
streams a Turn; a ``WatchActivity`` on replica 2 must receive every delta, then the committed
confirmation, in order, with no gap and no duplicate — and when the bus stops mid-stream, the
deltas lost meanwhile must surface as a typed, scoped signal while committed events still
arrive from the durable log.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import activity_pb2, host_pb2, host_pb2_grpc, runtime_pb2
from livelog.interface import LiveLogUnavailable, LogEntry, LogPosition
from livelog.jetstream import JetStreamLiveLog
from livelog.settings import LiveLogSettings
from services.host.wire.live_lane_codec import LiveLaneCodec
from tests.integration.host_activity import DEVICE, PROVIDER, TARGET_ID, WS
from tests.support.activity_watch import Watcher, kind
from tests.support.nats_server import NatsServer
from tests.support.runtime_client import ScriptedRuntime, text_message, turn_patch
from tests.support.servers import auth_metadata
from tests.support.service_process import ServiceProcess, service_process

RUNNING = canonical_pb2.TURN_PHASE_RUNNING
SETTLED = canonical_pb2.TURN_PHASE_SETTLED
COMPLETED = canonical_pb2.TURN_OUTCOME_COMPLETED
WAIT_SECONDS = 60.0
"""Upper bound of a wait for something that must happen; only a failing test reaches it."""


class Replica:
    """One Host process and a channel to it."""

    def __init__(self, process: ServiceProcess) -> None:
        self.process = process
        self.channel = grpc.insecure_channel(process.address)
        self.stub = host_pb2_grpc.HostServiceStub(self.channel)


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server of this test's own (stoppable and restartable on its port)."""
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def replicas(
    migrated_db_url: str, tmp_path: Path, bus: NatsServer
) -> Iterator[tuple[Replica, Replica]]:
    """Two Host replicas on the test database and the bus, target and Session ``s1`` made."""
    settings = {
        "bus": "nats",
        "nats_url": bus.url,
        "live_log_heartbeat_seconds": "0.25",
        "live_log_publish_timeout_seconds": "1.0",
        "activity_follow_interval_seconds": "1.0",
    }
    (tmp_path / "r1").mkdir()
    (tmp_path / "r2").mkdir()
    with (
        service_process("host", tmp_path / "r1", database_url=migrated_db_url, **settings) as a,
        service_process("host", tmp_path / "r2", database_url=migrated_db_url, **settings) as b,
    ):
        pair = (Replica(a), Replica(b))
        pair[0].stub.RegisterAgentTarget(
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
        )
        pair[0].stub.CreateSession(
            host_pb2.CreateSessionRequest(
                workspace_id=WS, agent_target_id=TARGET_ID, session_id="s1", cwd="/nonexistent"
            ),
            metadata=DEVICE,
        )
        try:
            yield pair
        finally:
            for replica in pair:
                replica.channel.close()


def _running_turn(replica: Replica, runtime: ScriptedRuntime) -> str:
    """A Turn of ``s1`` submitted on ``replica`` and reported running by ``runtime``."""
    response = replica.stub.SendInput(
        host_pb2.SendInputRequest(
            workspace_id=WS,
            session_id="s1",
            client_submit_id="c1",
            delivery=canonical_pb2.DELIVERY_MODE_NEW_TURN,
            mode=canonical_pb2.COMPOSER_MODE_AGENT,
            content="hello",
        ),
        metadata=DEVICE,
    )
    turn_id = str(response.turn.turn_id)
    runtime.ack(runtime.next_command().command_id)
    runtime.report(WS, "s1", "run", turn_patch(turn_id, RUNNING, occurred_at_unix_ms=1))
    return turn_id


def _deltas(runtime: ScriptedRuntime, turn_id: str, *texts: str, first: bool = False) -> None:
    """Stream ``texts`` as deltas of message ``m1`` (the first a ``set`` when ``first``)."""
    deltas = []
    for index, text in enumerate(texts):
        operation = (
            canonical_pb2.DELTA_OPERATION_SET
            if first and index == 0
            else canonical_pb2.DELTA_OPERATION_APPEND_TEXT
        )
        deltas.append(
            canonical_pb2.MessageDelta(
                workspace_id=WS,
                session_id="s1",
                turn_id=turn_id,
                message_id="m1",
                target=canonical_pb2.DELTA_TARGET_TEXT,
                operation=operation,
                text=text,
            )
        )
    runtime.send(
        runtime_pb2.RuntimeLinkRequest(deltas=runtime_pb2.MessageDeltaBatch(deltas=deltas))
    )


async def _hint_ids_in_the_log(url: str, wanted: set[str]) -> set[str]:
    """Message ids on the workspace's subject, read until ``wanted`` are seen (or a timeout)."""
    settings = LiveLogSettings(bus="nats", nats_url=url)
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        with contextlib.suppress(LiveLogUnavailable):
            log = await JetStreamLiveLog.connect(settings, LiveLaneCodec())
            break
        assert time.monotonic() < deadline, "the restarted bus never accepted a connection"
        await asyncio.sleep(0.2)
    seen: set[str] = set()
    try:
        while not wanted <= seen and time.monotonic() < deadline:
            subscription = await log.subscribe(WS, LogPosition(log.epoch, 0))
            try:
                async with asyncio.timeout(2):
                    async for entry in subscription:
                        if isinstance(entry, LogEntry):
                            seen.add(entry.msg_id)
                            if wanted <= seen:
                                break
            except TimeoutError:
                pass  # read all there was: look again (the relay retries every second)
            finally:
                await subscription.close()
    finally:
        await log.close()
    return seen


def _settle(runtime: ScriptedRuntime, turn_id: str, text: str) -> runtime_pb2.ReportResult:
    return runtime.report(
        WS,
        "s1",
        "end",
        text_message("m1", turn_id, text),
        turn_patch(turn_id, SETTLED, outcome=COMPLETED, occurred_at_unix_ms=2),
    )


def _settled(events: list[activity_pb2.ActivityEvent]) -> bool:
    return any(kind(e) == "turn_update" and e.turn_update.turn.phase == SETTLED for e in events)


def _delta_texts(events: list[activity_pb2.ActivityEvent]) -> list[str]:
    return [e.message_delta.delta.text for e in events if kind(e) == "message_delta"]


@pytest.mark.spec("SCALE-3", "HOST-RT-2", "HOST-OBS-2")
def test_a_watch_on_the_other_replica_gets_every_delta_then_the_confirmation(
    replicas: tuple[Replica, Replica],
) -> None:
    first, second = replicas
    runtime = ScriptedRuntime(first.channel)
    turn_id = _running_turn(first, runtime)
    watcher = Watcher(second.channel, WS)
    ready = watcher.wait_ready()
    texts = [f"part {index};" for index in range(60)]
    for start in range(0, len(texts), 6):  # ten frames, as a runtime streams them
        _deltas(runtime, turn_id, *texts[start : start + 6], first=start == 0)
    # Sent right behind the deltas: nothing waits for replica 2 before the commit.
    assert _settle(runtime, turn_id, "".join(texts)).outcome == (runtime_pb2.REPORT_OUTCOME_APPLIED)
    events = watcher.wait_for(_settled, timeout=WAIT_SECONDS)
    time.sleep(1.5)  # a duplicate (a second path) would arrive within a follow round
    events = list(watcher.events)
    watcher.cancel()
    runtime.close()

    kinds = [kind(e) for e in events]
    assert _delta_texts(events) == texts  # every delta, in order, once
    first_durable = next(i for i, k in enumerate(kinds) if k != "message_delta")
    assert kinds[:first_durable] == ["message_delta"] * len(texts)
    durable = events[first_durable:]
    assert "message_delta" not in [kind(e) for e in durable]
    # The confirmation, after the deltas, with no gap and no duplicate in the sequence.
    sequences = [e.workspace_sequence for e in durable]
    assert sequences == list(range(ready.head_workspace_sequence + 1, sequences[-1] + 1))
    assert [kind(e) for e in durable] == ["message_update", "turn_update"]
    assert durable[0].message_update.messages[0].payload_json == (f'{{"text": "{"".join(texts)}"}}')


@pytest.mark.spec("SCALE-3", "HOST-RT-2")
def test_deltas_lost_while_the_bus_is_down_become_a_reconcile_and_events_still_arrive(
    replicas: tuple[Replica, Replica], bus: NatsServer
) -> None:
    first, second = replicas
    runtime = ScriptedRuntime(first.channel)
    turn_id = _running_turn(first, runtime)
    watcher = Watcher(second.channel, WS)
    watcher.wait_ready()
    _deltas(runtime, turn_id, "before;", "the stop;", first=True)
    watcher.wait_for(lambda es: len(_delta_texts(es)) == 2, timeout=WAIT_SECONDS)

    bus.stop()
    _deltas(runtime, turn_id, "lost;", "while down;")
    result = _settle(runtime, turn_id, "before;the stop;lost;while down;")
    assert result.outcome == runtime_pb2.REPORT_OUTCOME_APPLIED  # the report still commits
    events = watcher.wait_for(_settled, timeout=WAIT_SECONDS)
    bus.start()
    watcher.cancel()
    runtime.close()
    # The hints of the commits made while the bus was down are republished once it is back.
    durable_seqs = [e.workspace_sequence for e in events if kind(e) != "message_delta"]
    owed = {f"ev:{WS}:{sequence}" for sequence in durable_seqs}
    assert owed <= asyncio.run(_hint_ids_in_the_log(bus.url, owed))

    kinds = [kind(e) for e in events]
    assert _delta_texts(events) == ["before;", "the stop;"]  # the lost ones never appear
    durable = [e for e in events if kind(e) != "message_delta"]
    # Typed and scoped: the Session must be re-read, before the report's own events.
    assert [kind(e) for e in durable] == [
        "session_reconcile_required",
        "message_update",
        "turn_update",
    ]
    assert durable[0].session_reconcile_required.session_id == "s1"
    assert kinds.index("session_reconcile_required") > kinds.index("message_delta")
    sequences = [e.workspace_sequence for e in durable]
    assert sequences == list(range(sequences[0], sequences[0] + 3))


@pytest.mark.spec("SCALE-3", "HOST-RT-2")
def test_deltas_lost_by_a_runtime_that_leaves_without_a_report_become_a_reconcile(
    replicas: tuple[Replica, Replica], bus: NatsServer
) -> None:
    """No report settles them: the link settles its Sessions when it closes (ADR 0041)."""
    first, second = replicas
    runtime = ScriptedRuntime(first.channel)
    turn_id = _running_turn(first, runtime)
    watcher = Watcher(second.channel, WS)
    watcher.wait_ready()
    bus.stop()
    _deltas(runtime, turn_id, "lost;", "and gone;", first=True)
    runtime.close()  # half-closed after the deltas: Host reads them, then ends the link

    def reconciled(events: list[activity_pb2.ActivityEvent]) -> bool:
        return any(kind(e) == "session_reconcile_required" for e in events)

    events = watcher.wait_for(reconciled, timeout=WAIT_SECONDS)
    watcher.cancel()
    bus.start()
    notice = next(e for e in events if kind(e) == "session_reconcile_required")
    assert notice.session_reconcile_required.session_id == "s1"
    assert _delta_texts(events) == []  # the lost deltas never appear
