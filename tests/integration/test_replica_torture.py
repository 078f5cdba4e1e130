"""Seeded torture of the replicated suite: random replica kills find no silent gap or duplicate.

Two ``tutti serve host`` and two ``tutti serve livestream`` processes run on one Postgres
database and a nats-server (JetStream) of the test's own. A scripted runtime attached to Host
replica 1 produces Turns on several Sessions: interleaved messages streamed as numbered text
deltas, a durable snapshot of each, a settle. Meanwhile devices (the real
:class:`~services.livestream.subscriber.Subscriber`, each on one livestream replica and
failing over to the other) and ``WatchActivity`` watchers (resuming from their cursor on
the other Host replica) record everything, and a seeded schedule kills (SIGKILL) or drains
(SIGTERM) a replica of the *victim set* and starts it again on its port. Host replica 1 holds
the runtime and is not a victim by default: a runtime can move to another replica only once
cross-replica runtime attach lands; widen the set with
``TUTTI_REPLICA_TORTURE_VICTIMS=host-1,host-2,...``.

After the schedule every replica runs again and a *sentinel* Turn is settled until every
device has it delivered and every watcher has reached Host's head; then
:mod:`tests.support.live_gap_check` checks each client against Host's canonical state: every
committed event exactly once and in order, or the gap announced typed (``resume_rejected``, a
discontinuity, a reconcile notice) and the client converged to Host; never a silent gap or a
duplicate. A crash makes a device's resume on the other livestream replica a typed
``resume_rejected`` (SCALE-4) until the publisher hand-over lands; both are correct.

Budget: ``TUTTI_REPLICA_TORTURE_ITERATIONS`` iterations (CI default 3, 12-20 s each on a
loaded 2-core machine), the first seeded ``TUTTI_REPLICA_TORTURE_SEED`` (default 1700), each
with ``TUTTI_REPLICA_TORTURE_KILLS`` scheduled kills or drains (default 3);
``TUTTI_REPLICA_TORTURE_MODES`` (default ``kill,kill,drain``) picks how they strike, and
``TUTTI_REPLICA_TORTURE_EXACT_RESUME=1`` makes any ``resume_rejected`` a violation (with
``MODES=drain``, once the drain hand-over lands). A failure names
the seed; rerun it alone with ``TUTTI_REPLICA_TORTURE_SEED=<seed>
TUTTI_REPLICA_TORTURE_ITERATIONS=1``. A soak run: ``TUTTI_REPLICA_TORTURE_ITERATIONS=40``.
"""

from __future__ import annotations

import functools
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc, runtime_pb2
from services.livestream.subscriber import Reconcile, Reconnecting, ResumeRejected
from tests.support.live_gap_check import Canonical, check_device, check_watcher, delta_text
from tests.support.nats_server import NatsServer
from tests.support.polling import eventually
from tests.support.replica_clients import (
    Device,
    ResumingWatcher,
    read_feed,
    read_sessions,
    running_devices,
)
from tests.support.replica_cluster import TARGET_ID, WS, ReplicaCluster, replica_cluster
from tests.support.runtime_client import ScriptedRuntime, text_message, turn_patch
from tests.support.servers import auth_metadata

pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize(
        "backend", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
    ),
]

ITERATIONS = int(os.environ.get("TUTTI_REPLICA_TORTURE_ITERATIONS", "3"))
FIRST_SEED = int(os.environ.get("TUTTI_REPLICA_TORTURE_SEED", "1700"))
KILLS = int(os.environ.get("TUTTI_REPLICA_TORTURE_KILLS", "3"))
VICTIMS = tuple(
    os.environ.get("TUTTI_REPLICA_TORTURE_VICTIMS", "host-2,livestream-1,livestream-2").split(",")
)
"""Replicas the schedule may kill; Host 1 holds the runtime (see the module docstring)."""
MODES = tuple(os.environ.get("TUTTI_REPLICA_TORTURE_MODES", "kill,kill,drain").split(","))
"""How a blow strikes, drawn uniformly from this list (``kill`` twice as often by default)."""
EXACT_RESUME = os.environ.get("TUTTI_REPLICA_TORTURE_EXACT_RESUME") == "1"
"""Every device resume must be exact: no ``resume_rejected`` at all. Meant with
``TUTTI_REPLICA_TORTURE_MODES=drain`` once the drain hand-over of livestream lands (SCALE-4)."""
SECONDS_PER_ITERATION = 60
SETTLE_SECONDS = 60.0
"""Upper bound of the wait for clients to converge; only a failing run reaches it."""
SENTINEL_ATTEMPTS = 5

DEVICE = auth_metadata("ws1-device")
RUNNING = canonical_pb2.TURN_PHASE_RUNNING
SETTLED = canonical_pb2.TURN_PHASE_SETTLED
APPLIED = runtime_pb2.REPORT_OUTCOME_APPLIED


# ---- the schedule of kills ----------------------------------------------------------------


@dataclass(frozen=True)
class Blow:
    """One scheduled fault: after ``wait`` s, ``victim`` is killed or drained, then restarted
    ``down`` s later."""

    wait: float
    victim: str
    mode: str
    """``"kill"`` (SIGKILL, a crash) or ``"drain"`` (SIGTERM, graceful)."""
    down: float


def schedule(
    rng: random.Random, victims: tuple[str, ...], count: int, modes: tuple[str, ...] = MODES
) -> list[Blow]:
    """``count`` seeded blows on ``victims`` (the seed alone decides them)."""
    return [
        Blow(
            wait=rng.uniform(0.3, 1.5),
            victim=rng.choice(victims),
            mode=rng.choice(modes),
            down=rng.uniform(0.2, 1.5),
        )
        for _ in range(count)
    ]


def strike(
    cluster: ReplicaCluster, blows: list[Blow], done: threading.Event, log: list[str]
) -> None:
    """Carry out ``blows`` one after another (each replica runs again at the end)."""
    try:
        for blow in blows:
            time.sleep(blow.wait)
            slot = cluster.slot(blow.victim)
            started = time.monotonic()
            if blow.mode == "kill":
                slot.kill()
            else:
                slot.drain()
            time.sleep(blow.down)
            slot.start()
            log.append(f"{blow.mode} {blow.victim} (down {time.monotonic() - started:.1f} s)")
    finally:
        done.set()


# ---- the producer ---------------------------------------------------------------------------


@dataclass
class _Message:
    message_id: str
    total: int
    sent: int = 0


@dataclass
class Producer:
    """The scripted runtime on Host replica 1 and its seeded production."""

    stub: host_pb2_grpc.HostServiceStub
    runtime: ScriptedRuntime
    rng: random.Random
    sessions: list[str]
    deltas_sent: dict[str, int] = field(default_factory=dict)
    turns: list[str] = field(default_factory=list)
    _turn_number: int = 0

    def _report(self, session_id: str, *items: runtime_pb2.ReportItem) -> None:
        result = self.runtime.report(WS, session_id, f"torture-{uuid.uuid4().hex}", *items)
        assert result.outcome == APPLIED, result

    def start_turn(self, session_id: str) -> str:
        """Submit a Turn on Host 1, take its command, report it running."""
        turn_id: str = self.stub.SendInput(
            host_pb2.SendInputRequest(
                workspace_id=WS,
                session_id=session_id,
                client_submit_id=uuid.uuid4().hex,
                delivery=canonical_pb2.DELIVERY_MODE_NEW_TURN,
                mode=canonical_pb2.COMPOSER_MODE_AGENT,
                content="torture",
            ),
            metadata=DEVICE,
            timeout=30,
        ).turn.turn_id
        while True:
            command = self.runtime.next_command(timeout=30)
            self.runtime.ack(command.command_id)
            kind = command.WhichOneof("command")
            if kind == "start_turn" and command.start_turn.turn_id == turn_id:
                break
        now = int(time.time() * 1000)
        self._report(session_id, turn_patch(turn_id, RUNNING, occurred_at_unix_ms=now))
        self.turns.append(turn_id)
        return turn_id

    def settle(self, session_id: str, turn_id: str) -> None:
        """Settle the Turn (completed)."""
        self._report(
            session_id,
            turn_patch(
                turn_id,
                SETTLED,
                outcome=canonical_pb2.TURN_OUTCOME_COMPLETED,
                occurred_at_unix_ms=int(time.time() * 1000),
            ),
        )

    def round(self) -> None:
        """One Turn per Session, their messages streamed interleaved, snapshotted, settled."""
        self._turn_number += 1
        open_turns: dict[str, tuple[str, list[_Message]]] = {}
        for session_id in self.sessions:
            turn_id = self.start_turn(session_id)
            prefix = f"{session_id}t{self._turn_number}"
            messages = [
                _Message(f"{prefix}m{j}", self.rng.randint(1, 30))
                for j in range(1, self.rng.randint(1, 3) + 1)
            ]
            open_turns[session_id] = (turn_id, messages)
        while open_turns:
            session_id = self.rng.choice(sorted(open_turns))
            turn_id, messages = open_turns[session_id]
            if not messages:
                self.settle(session_id, turn_id)
                del open_turns[session_id]
                continue
            message = self.rng.choice(messages)
            count = min(self.rng.randint(1, 4), message.total - message.sent)
            deltas = []
            for _ in range(count):
                message.sent += 1
                deltas.append(
                    canonical_pb2.MessageDelta(
                        workspace_id=WS,
                        session_id=session_id,
                        turn_id=turn_id,
                        message_id=message.message_id,
                        target=canonical_pb2.DELTA_TARGET_TEXT,
                        operation=canonical_pb2.DELTA_OPERATION_SET
                        if message.sent == 1
                        else canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
                        text=delta_text(message.message_id, message.sent),
                    )
                )
            self.deltas_sent[message.message_id] = message.sent
            self.runtime.send(
                runtime_pb2.RuntimeLinkRequest(deltas=runtime_pb2.MessageDeltaBatch(deltas=deltas))
            )
            if message.sent == message.total:
                messages.remove(message)
                streamed = "".join(
                    delta_text(message.message_id, i) for i in range(1, message.total + 1)
                )
                # Differs from the streamed text: only a Host read yields it.
                final = text_message(message.message_id, turn_id, streamed + "|final")
                self._report(session_id, final)
            time.sleep(self.rng.uniform(0, 0.03))


# ---- one iteration ----------------------------------------------------------------------------


@dataclass
class IterationReport:
    seed: int
    violations: list[str]
    summary: str


def run_iteration(cluster: ReplicaCluster, runtime: ScriptedRuntime, seed: int) -> IterationReport:
    """Iteration ``seed``: production under seeded kills, then the checks."""
    rng = random.Random(seed)
    first = cluster.host_stub(1)
    sessions = [f"r{seed}-s{k}" for k in range(1, rng.randint(2, 3) + 1)]
    sentinel = f"r{seed}-sentinel"
    for session_id in [*sessions, sentinel]:
        first.CreateSession(
            host_pb2.CreateSessionRequest(
                workspace_id=WS,
                agent_target_id=TARGET_ID,
                session_id=session_id,
                title=f"torture {session_id}",
                cwd="/nonexistent/workspace",
            ),
            metadata=DEVICE,
            timeout=30,
        )
    everything = [*sessions, sentinel]
    producer = Producer(first, runtime, random.Random(rng.random()), sessions)
    # Watchers start on Host 2 or Host 1 and move to the other one at each broken call.
    hosts = [cluster.host_channel(2), cluster.host_channel(1)]
    watchers = [
        ResumingWatcher(f"watcher{k}", hosts[k % 2 :] + hosts[: k % 2])
        for k in range(rng.randint(2, 3))
    ]
    devices = [
        Device(
            f"device{k}",
            cluster.livestream_target(first=k % len(cluster.livestreams)),
            everything,
            host_pb2_grpc.HostServiceStub(cluster.balanced_hosts()),
        )
        for k in range(rng.randint(1, 3))
    ]
    # Each device's id is the publisher's identity: keep it unique across iterations.
    for device in devices:
        device.name = f"{device.name}-{seed}"
    blows = schedule(random.Random(rng.random()), VICTIMS, KILLS)
    problems: list[str] = []
    struck: list[str] = []
    try:
        for watcher in watchers:
            watcher.wait_ready()
        with running_devices(devices):
            if not eventually(lambda: all(d.ready for d in devices), SETTLE_SECONDS):
                problems.append("a device never became ready")
            done = threading.Event()
            chaos = threading.Thread(target=strike, args=(cluster, blows, done, struck))
            chaos.start()
            rounds = 0
            while not done.is_set() or rounds == 0:
                producer.round()
                rounds += 1
            chaos.join(60)
            problems += _sentinel(cluster, producer, sentinel, devices, watchers)
    finally:
        for watcher in watchers:
            watcher.stop()
    feed, head = read_feed(cluster.host_channel(1))
    turns, messages = read_sessions(first, everything)
    canonical = Canonical(feed, head, turns, messages, dict(producer.deltas_sent))
    violations = [f"seed {seed}: {p}" for p in problems]
    for device in devices:
        if device.failure is not None:
            violations.append(f"seed {seed}: {device.name} failed: {device.failure!r}")
        violations += [
            f"seed {seed}: {v}" for v in check_device(device.name, device.log, canonical)
        ]
        if EXACT_RESUME:
            violations += [
                f"seed {seed}: {device.name}: resume_rejected {e.reason} where the resume must "
                "be exact (TUTTI_REPLICA_TORTURE_EXACT_RESUME)"
                for e in device.log
                if isinstance(e, ResumeRejected)
            ]
    for watcher in watchers:
        if watcher.failure is not None:
            violations.append(f"seed {seed}: {watcher.log.name} failed: {watcher.failure!r}")
        violations += [f"seed {seed}: {v}" for v in check_watcher(watcher.log, canonical)]
    return IterationReport(
        seed, violations, _summary(seed, rounds, struck, producer, devices, watchers)
    )


def _sentinel(
    cluster: ReplicaCluster,
    producer: Producer,
    sentinel: str,
    devices: list[Device],
    watchers: list[ResumingWatcher],
) -> list[str]:
    """Settle sentinel Turns until every client has everything; what did not converge."""
    for slot in cluster.slots:
        if not slot.alive:
            slot.start()
    for _ in range(SENTINEL_ATTEMPTS):
        turn_id = producer.start_turn(sentinel)
        producer.settle(sentinel, turn_id)
        if eventually(functools.partial(_all_settled, devices, turn_id), 10):
            break
    else:
        return [f"devices never had a sentinel settle delivered: {[d.name for d in devices]}"]
    _, head = read_feed(cluster.host_channel(1))
    behind = [w.log.name for w in watchers if not w.wait_position(head, SETTLE_SECONDS)]
    return [f"watchers never reached Host's head {head}: {behind}"] if behind else []


def _all_settled(devices: list[Device], turn_id: str) -> bool:
    return all(turn_id in d.settled for d in devices)


def _summary(
    seed: int,
    rounds: int,
    struck: list[str],
    producer: Producer,
    devices: list[Device],
    watchers: list[ResumingWatcher],
) -> str:
    deltas = sum(producer.deltas_sent.values())
    lines = [
        f"seed {seed}: {rounds} rounds, {len(producer.turns)} turns, "
        f"{len(producer.deltas_sent)} messages, {deltas} deltas; {', '.join(struck)}"
    ]
    for device in devices:
        kinds: Counter[str] = Counter()
        for event in device.log:
            if isinstance(event, ResumeRejected):
                kinds[f"resume_rejected:{event.reason}"] += 1
            elif isinstance(event, Reconcile):
                kinds[f"reconcile:{event.reason}"] += 1
            elif isinstance(event, Reconnecting):
                kinds["reconnect"] += 1
        lines.append(f"  {device.name}: {dict(sorted(kinds.items()))}")
    for watcher in watchers:
        ends = Counter(
            getattr(e, "code", "") for e in watcher.log.entries if type(e).__name__ == "WatchEnded"
        )
        lines.append(f"  {watcher.log.name}: stream ends {dict(ends)}")
    return "\n".join(lines)


# ---- the test ---------------------------------------------------------------------------------


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server of this test's own: no other test's workspace ``ws-1`` on its subjects."""
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.spec("SCALE-1", "SCALE-3", "SCALE-4")
@pytest.mark.timeout(max(180, 30 + ITERATIONS * SECONDS_PER_ITERATION))
def test_random_replica_kills_cause_no_silent_gap_or_duplicate(
    migrated_db_url: str, tmp_path: Path, bus: NatsServer
) -> None:
    # Livestream 1 reads Host 2 only (a Host kill drops its feed); livestream 2 reads both.
    with replica_cluster(
        tmp_path,
        database_url=migrated_db_url,
        nats_url=bus.url,
        livestream_upstreams=[[2], [1, 2]],
    ) as cluster:
        runtime = ScriptedRuntime(cluster.host_channel(1))
        reports = [run_iteration(cluster, runtime, FIRST_SEED + k) for k in range(ITERATIONS)]
        runtime.close()
    for report in reports:
        print(report.summary)
    failed = [r for r in reports if r.violations]
    if failed:
        lines = [v for r in failed for v in r.violations[:20]]
        seeds = ", ".join(str(r.seed) for r in failed)
        pytest.fail(
            f"{len(failed)} of {len(reports)} iterations violated the replicas' guarantee "
            f"(seeds {seeds}; rerun one with TUTTI_REPLICA_TORTURE_SEED=<seed> "
            "TUTTI_REPLICA_TORTURE_ITERATIONS=1):\n" + "\n".join(lines),
            pytrace=False,
        )
