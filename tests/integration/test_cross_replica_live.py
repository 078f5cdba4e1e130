"""A Turn streamed through Host replica 1 reaches a device on livestream replica 2 and a
``WatchActivity`` on Host replica 2, every delta and committed event in order (issue 17).

Two ``tutti serve host`` and two ``tutti serve livestream`` processes run on one Postgres
database and a nats-server of the test's own (JetStream). Livestream replica 2 reads Host
replica 2 only, so nothing the device receives can come from replica 1's process: the
deltas cross on the live log, the committed events through the shared database.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, runtime_pb2
from services.livestream.subscriber import Delivered, Reconcile, ResumeRejected
from tests.support.activity_watch import Watcher, kind
from tests.support.live_gap_check import (
    Canonical,
    WatchDelta,
    WatchEvent,
    WatchLog,
    WatchSubscribed,
    check_device,
    check_watcher,
    delta_indices,
    delta_text,
)
from tests.support.nats_server import NatsServer
from tests.support.polling import eventually
from tests.support.replica_clients import (
    Device,
    committed,
    read_feed,
    read_sessions,
    running_devices,
)
from tests.support.replica_cluster import WS, ReplicaCluster, replica_cluster
from tests.support.runtime_client import ScriptedRuntime, text_message, turn_patch
from tests.support.servers import auth_metadata

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize(
        "backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
    ),
]

RUNNING = canonical_pb2.TURN_PHASE_RUNNING
SETTLED = canonical_pb2.TURN_PHASE_SETTLED
WAIT_SECONDS = 60.0
"""Upper bound of a wait for something that must happen; only a failing test reaches it."""
DELTAS = 60


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server of this test's own: no other test's workspace ``ws-1`` on its subjects."""
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cluster(migrated_db_url: str, tmp_path: Path, bus: NatsServer) -> Iterator[ReplicaCluster]:
    """Host 1 and 2; livestream 1 on Host 1, livestream 2 on Host 2."""
    with replica_cluster(
        tmp_path,
        database_url=migrated_db_url,
        nats_url=bus.url,
        livestream_upstreams=[[1], [2]],
    ) as started:
        yield started


@pytest.mark.spec("SCALE-1", "SCALE-3", "SCALE-4", "HOST-RT-2")
def test_a_turn_on_host_1_reaches_a_device_on_livestream_2_and_a_watch_on_host_2(
    cluster: ReplicaCluster,
) -> None:
    first, second = cluster.host_stub(1), cluster.host_stub(2)
    device_metadata = auth_metadata("ws1-device")
    first.CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id=WS, agent_target_id="demo-target", session_id="s1", cwd="/nonexistent"
        ),
        metadata=device_metadata,
        timeout=30,
    )
    runtime = ScriptedRuntime(cluster.host_channel(1))
    device = Device("phone", cluster.livestreams[1].address, ["s1"], second)
    watcher = Watcher(cluster.host_channel(2), WS)
    ready = watcher.wait_ready()
    with running_devices([device]):
        assert eventually(lambda: device.ready, WAIT_SECONDS), "the device never became ready"
        # Attached before the Turn exists: everything about it arrives live, none in a baseline.
        assert eventually(lambda: device.caught_up, WAIT_SECONDS), "no attachment barrier"
        turn_id = first.SendInput(
            host_pb2.SendInputRequest(
                workspace_id=WS,
                session_id="s1",
                client_submit_id="c1",
                delivery=canonical_pb2.DELIVERY_MODE_NEW_TURN,
                mode=canonical_pb2.COMPOSER_MODE_AGENT,
                content="hello",
            ),
            metadata=device_metadata,
            timeout=30,
        ).turn.turn_id
        runtime.ack(runtime.next_command().command_id)
        runtime.report(WS, "s1", "run", turn_patch(turn_id, RUNNING, occurred_at_unix_ms=1))
        for start in range(1, DELTAS + 1, 6):  # ten frames, as a runtime streams them
            deltas = [
                canonical_pb2.MessageDelta(
                    workspace_id=WS,
                    session_id="s1",
                    turn_id=turn_id,
                    message_id="m1",
                    target=canonical_pb2.DELTA_TARGET_TEXT,
                    operation=canonical_pb2.DELTA_OPERATION_SET
                    if index == 1
                    else canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
                    text=delta_text("m1", index),
                )
                for index in range(start, start + 6)
            ]
            runtime.send(
                runtime_pb2.RuntimeLinkRequest(deltas=runtime_pb2.MessageDeltaBatch(deltas=deltas))
            )
        streamed = "".join(delta_text("m1", i) for i in range(1, DELTAS + 1))
        # Sent right behind the deltas: nothing waits for the other replicas before the commit.
        result = runtime.report(
            WS,
            "s1",
            "end",
            text_message("m1", turn_id, streamed),
            turn_patch(
                turn_id,
                SETTLED,
                outcome=canonical_pb2.TURN_OUTCOME_COMPLETED,
                occurred_at_unix_ms=2,
            ),
        )
        assert result.outcome == runtime_pb2.REPORT_OUTCOME_APPLIED
        assert eventually(lambda: turn_id in device.settled, WAIT_SECONDS), device.log[-5:]
        watcher.wait_for(
            lambda es: any(
                kind(e) == "turn_update" and e.turn_update.turn.phase == SETTLED for e in es
            ),
            timeout=WAIT_SECONDS,
        )
    watched = list(watcher.events)
    watcher.cancel()
    runtime.close()
    assert device.failure is None, device.failure

    # The device: every delta once and in order, then the committed events, in one epoch.
    deliveries = [e for e in device.log if isinstance(e, Delivered)]
    assert not [e for e in device.log if isinstance(e, ResumeRejected)]
    assert len({d.epoch for d in deliveries}) == 1
    sequences = [d.sequence for d in deliveries]
    assert sequences == sorted(set(sequences)), "a delivery sequence repeated or went back"
    numbers = [
        n
        for d in deliveries
        if d.kind == "message_delta"
        for n in delta_indices("m1", d.delivery.message_delta.text) or [-1]
    ]
    assert numbers == list(range(1, DELTAS + 1))
    # The report's commits (the snapshot's message_update, then the settle) come after every
    # delta (HOST-RT-2). Earlier commits (the input, the running Turn) may be overtaken by
    # the later deltas: they reach replica 2 on another path (ADR 0041 §6).
    last_delta = max(d.sequence for d in deliveries if d.kind == "message_delta")
    snapshot = next(
        d
        for d in deliveries
        if d.kind == "discontinuity" and d.delivery.discontinuity.keys.message_id == "m1"
    )
    turn_updates = [d for d in deliveries if d.kind == "turn_update"]
    assert snapshot.sequence > last_delta
    assert turn_updates[-1].delivery.turn_update.turn.phase == SETTLED
    assert turn_updates[-1].sequence > snapshot.sequence
    versions = [d.delivery.turn_update.turn.version for d in turn_updates]
    assert versions == sorted(set(versions)), versions
    reconciles = [e.reason for e in device.log if isinstance(e, Reconcile)]
    # The input's and the snapshot's message updates, and nothing announced as lost.
    assert set(reconciles) == {"MESSAGE_UPDATE"}, reconciles

    # The watcher on Host 2: the same committed sequence, no gap.
    durable = [e for e in watched if kind(e) != "message_delta"]
    assert [e.workspace_sequence for e in durable] == list(
        range(ready.head_workspace_sequence + 1, ready.head_workspace_sequence + 1 + len(durable))
    )
    feed, head = read_feed(cluster.host_channel(1))
    assert durable[-1].workspace_sequence == head
    device_versions = [
        d.delivery.turn_update.turn.version for d in deliveries if d.kind == "turn_update"
    ]
    watched_versions = [e.turn_update.turn.version for e in durable if kind(e) == "turn_update"]
    assert device_versions[-len(watched_versions) :] == watched_versions

    # And the checker agrees (it is the torture's oracle).
    turns, messages = read_sessions(first, ["s1"])
    assert turns[turn_id] == (watched_versions[-1], SETTLED)
    canonical = Canonical(feed, head, turns, messages, {"m1": DELTAS})
    log = WatchLog("watch-host-2", [WatchSubscribed(ready.head_workspace_sequence, None)])
    for event in watched:
        if kind(event) == "message_delta":
            delta = event.message_delta.delta
            log.entries.append(WatchDelta(delta.session_id, delta.message_id, delta.text))
        else:
            seen = committed(event)
            log.entries.append(
                WatchEvent(
                    seen.sequence, seen.event_id, seen.kind, seen.session_id, seen.message_ids
                )
            )
    assert check_watcher(log, canonical) == []
    assert check_device("phone", device.log, canonical) == []
