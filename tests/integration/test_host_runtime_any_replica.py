"""A runtime attached to any Host replica (SCALE-2, HOST-RT-1, HOST-RT-5).

Two real ``tutti serve host`` processes share the test database and, with ``TUTTI_BUS=nats``,
a nats-server private to each test. A ``ScriptedRuntime`` attaches to one replica while the
client calls the other: every command (a new Turn, guidance, an interrupt, a stop, an
interaction answer, live settings, an activation) must reach the runtime once, in order; when
the runtime's replica is killed (SIGKILL) the runtime reconnects to the other, receives every
unacknowledged command again and its Turn goes on; a runtime that moves between replicas within
the loss grace keeps its Turns, one that is gone from every replica past the grace has them
settled ``interrupted``.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc, runtime_pb2
from tests.integration.host_activity import DEVICE, PROVIDER, TARGET_ID, WS
from tests.support.nats_server import NatsServer
from tests.support.rpc_errors import error_details
from tests.support.runtime_client import ScriptedRuntime, interaction, text_message, turn_patch
from tests.support.servers import auth_metadata
from tests.support.service_process import ServiceProcess, service_process

RUNNING = canonical_pb2.TURN_PHASE_RUNNING
SETTLED = canonical_pb2.TURN_PHASE_SETTLED
COMPLETED = canonical_pb2.TURN_OUTCOME_COMPLETED
INTERRUPTED = canonical_pb2.TURN_OUTCOME_INTERRUPTED
WAIT_SECONDS = 30.0
"""Upper bound of a wait for something that must happen; only a failing test reaches it."""
QUIET_SECONDS = 2.0
"""How long a test watches for a duplicate command (longer than a sweep round)."""


class Replica:
    """One Host process and a channel to it."""

    def __init__(self, process: ServiceProcess) -> None:
        self.process = process
        self.channel = grpc.insecure_channel(process.address)
        self.stub = host_pb2_grpc.HostServiceStub(self.channel)

    def send(self, content: str, delivery: int, turn_id: str | None = None) -> str:
        """``SendInput`` to ``s1``; the Turn it names."""
        response = self.stub.SendInput(
            host_pb2.SendInputRequest(
                workspace_id=WS,
                session_id="s1",
                client_submit_id=f"c-{content}",
                delivery=delivery,  # type: ignore[arg-type]
                mode=canonical_pb2.COMPOSER_MODE_AGENT,
                content=content,
                target_turn_id=turn_id,
            ),
            metadata=DEVICE,
            timeout=WAIT_SECONDS,
        )
        return str(response.turn.turn_id)

    def turn(self, turn_id: str) -> canonical_pb2.Turn:
        """The Turn as this replica reads it."""
        page = self.stub.ListSessionTurns(
            host_pb2.ListSessionTurnsRequest(workspace_id=WS, session_id="s1", limit=50),
            metadata=DEVICE,
        )
        return next(turn for turn in page.turns if turn.turn_id == turn_id)


ReplicaPair = Callable[..., tuple[Replica, Replica]]


@pytest.fixture
def replica_pair(migrated_db_url: str, tmp_path: Path) -> Iterator[ReplicaPair]:
    """Start two Host replicas on the test database and a private bus (settings per test)."""
    with ExitStack() as stack:
        bus = NatsServer(tmp_path / "nats")
        bus.start()
        stack.callback(bus.stop)

        def start(**overrides: str) -> tuple[Replica, Replica]:
            settings = {
                "bus": "nats",
                "nats_url": bus.url,
                "live_log_publish_timeout_seconds": "1.0",
                "runtime_presence_lease_seconds": "3",
                "command_sweep_interval_seconds": "0.5",
                "runtime_loss_grace_seconds": "30",
                **overrides,
            }
            replicas = []
            for name in ("r1", "r2"):
                (tmp_path / name).mkdir()
                process = stack.enter_context(
                    service_process(
                        "host", tmp_path / name, database_url=migrated_db_url, **settings
                    )
                )
                replica = Replica(process)
                stack.callback(replica.channel.close)
                replicas.append(replica)
            _register(replicas[0])
            return replicas[0], replicas[1]

        yield start


def _register(replica: Replica) -> None:
    replica.stub.RegisterAgentTarget(
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
                settings_catalog=host_pb2.AgentSettingsCatalog(
                    models=[host_pb2.ModelOption(model_id="plain", display_name="Plain")],
                    default_model_id="plain",
                    permission_modes=["default"],
                    default_permission_mode="default",
                    speed_configurable=True,
                ),
            )
        ),
        metadata=auth_metadata("admin"),
    )
    replica.stub.CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id=WS, agent_target_id=TARGET_ID, session_id="s1", cwd="/nonexistent"
        ),
        metadata=DEVICE,
    )


def _take(runtime: ScriptedRuntime, *, ack: bool = True) -> runtime_pb2.RuntimeCommand:
    """The runtime's next command (acknowledged unless ``ack`` is false)."""
    command = runtime.next_command(timeout=WAIT_SECONDS)
    if ack:
        runtime.ack(command.command_id)
    return command


def _nothing_more(runtime: ScriptedRuntime) -> None:
    """No further command arrives (a duplicate would, within a sweep round or a wake-up)."""
    try:
        extra = runtime.next_command(timeout=QUIET_SECONDS)
    except queue.Empty:
        return
    pytest.fail(f"unexpected command {extra.WhichOneof('command')} {extra.command_id}")


def _running(runtime: ScriptedRuntime, turn_id: str, report_id: str) -> None:
    result = runtime.report(WS, "s1", report_id, turn_patch(turn_id, RUNNING))
    assert result.outcome == runtime_pb2.REPORT_OUTCOME_APPLIED, result


def _wait_for(check: Callable[[], bool], what: str, timeout: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.spec("SCALE-2", "HOST-RT-1", "HOST-RT-5")
def test_every_command_made_on_the_other_replica_reaches_the_runtime_once_and_in_order(
    replica_pair: ReplicaPair,
) -> None:
    first, second = replica_pair()
    runtime = ScriptedRuntime(first.channel)
    # A new Turn, submitted where the runtime is not attached.
    turn_id = second.send("hello", canonical_pb2.DELIVERY_MODE_NEW_TURN)
    start = _take(runtime)
    assert start.WhichOneof("command") == "start_turn"
    assert start.start_turn.turn_id == turn_id
    _running(runtime, turn_id, "run-1")

    # Guidance, several in a row: they arrive in submission order.
    for index in range(5):
        second.send(f"guide-{index}", canonical_pb2.DELIVERY_MODE_GUIDANCE, turn_id)
    guided = [_take(runtime) for _ in range(5)]
    assert [c.WhichOneof("command") for c in guided] == ["guidance"] * 5
    assert [c.guidance.prompt for c in guided] == [f"guide-{index}" for index in range(5)]

    # An interaction answer.
    pending = runtime.report(WS, "s1", "ask", interaction(turn_id, "q1"))
    assert pending.outcome == runtime_pb2.REPORT_OUTCOME_APPLIED, pending
    answer = second.stub.SubmitInteractionResponse(
        host_pb2.SubmitInteractionResponseRequest(
            workspace_id=WS,
            session_id="s1",
            turn_id=turn_id,
            request_id="q1",
            action="allow",
            idempotency_key="k1",
        ),
        metadata=DEVICE,
    )
    delivered = _take(runtime)
    assert delivered.WhichOneof("command") == "deliver_interaction_response"
    assert delivered.deliver_interaction_response.operation_id == answer.operation.operation_id

    # Live settings: the other replica waits for the runtime's verdict on the durable ack.
    with ThreadPoolExecutor(1) as pool:
        update = pool.submit(
            second.stub.UpdateSessionSettings,
            host_pb2.UpdateSessionSettingsRequest(
                workspace_id=WS,
                session_id="s1",
                settings=canonical_pb2.SessionSettings(speed=30),
            ),
            metadata=DEVICE,
            timeout=WAIT_SECONDS,
        )
        settings = _take(runtime, ack=False)
        assert settings.WhichOneof("command") == "apply_settings"
        time.sleep(0.3)
        assert not update.done()  # it waits for the runtime's verdict
        runtime.ack(settings.command_id)
        applied = update.result(timeout=WAIT_SECONDS)
    assert applied.runtime_application.status == host_pb2.RUNTIME_SETTINGS_STATUS_APPLIED

    # An interrupt delivery: the interrupt of the running Turn, then the new Turn's start.
    new_turn = second.send("instead", canonical_pb2.DELIVERY_MODE_INTERRUPT)
    interrupt, restart = _take(runtime), _take(runtime)
    assert interrupt.WhichOneof("command") == "interrupt_turn"
    assert interrupt.interrupt_turn.turn_id == turn_id
    assert restart.WhichOneof("command") == "start_turn"
    assert restart.start_turn.turn_id == new_turn

    # A stop.
    _running(runtime, new_turn, "run-2")
    stop = second.stub.StopTurn(
        host_pb2.StopTurnRequest(workspace_id=WS, session_id="s1", turn_id=new_turn),
        metadata=DEVICE,
    )
    assert stop.turn.outcome == canonical_pb2.TURN_OUTCOME_CANCELED
    stopped = _take(runtime)
    assert stopped.WhichOneof("command") == "stop_turn"
    assert stopped.stop_turn.turn_id == new_turn

    # An activation, acknowledged through the other replica.
    with ThreadPoolExecutor(1) as pool:
        activation = pool.submit(
            second.stub.ActivateSession,
            host_pb2.ActivateSessionRequest(workspace_id=WS, session_id="s1", activation_id="a1"),
            metadata=DEVICE,
            timeout=WAIT_SECONDS,
        )
        resume = _take(runtime)
        assert resume.WhichOneof("command") == "resume_session"
        activated = activation.result(timeout=WAIT_SECONDS)
        assert activated.detail.session.session_id == "s1"
        assert not activated.replayed
    _nothing_more(runtime)
    runtime.close()


@pytest.mark.spec("SCALE-2", "HOST-SES-6")
def test_a_rejection_on_the_runtimes_replica_is_the_settings_failure_on_the_other(
    replica_pair: ReplicaPair,
) -> None:
    first, second = replica_pair()
    runtime = ScriptedRuntime(first.channel)
    with ThreadPoolExecutor(1) as pool:
        update = pool.submit(
            second.stub.UpdateSessionSettings,
            host_pb2.UpdateSessionSettingsRequest(
                workspace_id=WS,
                session_id="s1",
                settings=canonical_pb2.SessionSettings(speed=40),
            ),
            metadata=DEVICE,
            timeout=WAIT_SECONDS,
        )
        settings = _take(runtime, ack=False)
        runtime.ack(settings.command_id, runtime_pb2.COMMAND_ACK_STATUS_REJECTED)
        failed = update.result(timeout=WAIT_SECONDS)
    assert failed.runtime_application.status == host_pb2.RUNTIME_SETTINGS_STATUS_FAILED
    assert "rejected" in failed.runtime_application.failure_message
    runtime.close()


@pytest.mark.spec("SCALE-2", "HOST-RT-1")
def test_without_a_runtime_on_any_replica_a_submit_is_runtime_unavailable(
    replica_pair: ReplicaPair,
) -> None:
    first, second = replica_pair()
    with pytest.raises(grpc.RpcError) as caught:
        second.send("nobody", canonical_pb2.DELIVERY_MODE_NEW_TURN)
    code, reason, _ = error_details(caught.value)
    assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "RUNTIME_UNAVAILABLE")
    runtime = ScriptedRuntime(first.channel)
    second.send("somebody", canonical_pb2.DELIVERY_MODE_NEW_TURN)  # now served, from replica 1
    assert _take(runtime).WhichOneof("command") == "start_turn"
    runtime.close()


@pytest.mark.spec("SCALE-2", "HOST-RT-5", "HOST-TURN-5")
def test_after_a_kill_of_its_replica_the_runtime_gets_every_unacknowledged_command_again(
    replica_pair: ReplicaPair,
) -> None:
    first, second = replica_pair(runtime_presence_lease_seconds="6")
    runtime = ScriptedRuntime(first.channel)
    turn_id = second.send("hello", canonical_pb2.DELIVERY_MODE_NEW_TURN)
    assert _take(runtime).start_turn.turn_id == turn_id
    _running(runtime, turn_id, "run-1")
    # Received by the runtime but not acknowledged when its replica dies.
    second.send("unacked", canonical_pb2.DELIVERY_MODE_GUIDANCE, turn_id)
    unacked = _take(runtime, ack=False)
    assert unacked.guidance.prompt == "unacked"

    first.process.process.kill()  # SIGKILL mid-Turn: no drain, no detach
    first.process.process.wait(timeout=10)
    # Acknowledged to the client while the runtime is between replicas.
    second.send("meanwhile", canonical_pb2.DELIVERY_MODE_GUIDANCE, turn_id)

    moved = ScriptedRuntime(second.channel)  # same runtime, same instance
    again = [_take(moved) for _ in range(2)]
    assert [c.guidance.prompt for c in again] == ["unacked", "meanwhile"]
    assert again[0].command_id == unacked.command_id  # the same command, re-sent
    # The Turn continues on the other replica: its reports apply.
    settled = moved.report(
        WS,
        "s1",
        "end",
        text_message("m1", turn_id, "done"),
        turn_patch(turn_id, SETTLED, outcome=COMPLETED),
    )
    assert settled.outcome == runtime_pb2.REPORT_OUTCOME_APPLIED, settled
    assert second.turn(turn_id).outcome == COMPLETED
    _nothing_more(moved)
    moved.close()


@pytest.mark.spec("SCALE-2", "HOST-RT-1", "HOST-TURN-5")
def test_a_runtime_gone_with_its_killed_replica_has_its_turn_interrupted_after_the_grace(
    replica_pair: ReplicaPair,
) -> None:
    first, second = replica_pair(
        runtime_presence_lease_seconds="1.5", runtime_loss_grace_seconds="1"
    )
    runtime = ScriptedRuntime(first.channel)
    turn_id = second.send("hello", canonical_pb2.DELIVERY_MODE_NEW_TURN)
    _take(runtime)
    _running(runtime, turn_id, "run-1")
    first.process.process.kill()
    first.process.process.wait(timeout=10)
    # The surviving replica claims the dead replica's runtime once its lease ran out and
    # settles the Turn after the grace: typed, never left running.
    _wait_for(lambda: second.turn(turn_id).outcome == INTERRUPTED, "the Turn interrupted")


@pytest.mark.spec("SCALE-2", "HOST-RT-1")
def test_a_runtime_that_moves_to_the_other_replica_within_the_grace_keeps_its_turn(
    replica_pair: ReplicaPair,
) -> None:
    first, second = replica_pair(runtime_loss_grace_seconds="2")
    runtime = ScriptedRuntime(first.channel)
    turn_id = second.send("hello", canonical_pb2.DELIVERY_MODE_NEW_TURN)
    _take(runtime)
    _running(runtime, turn_id, "run-1")
    runtime.close()  # leaves replica 1: its grace timer starts there
    moved = ScriptedRuntime(second.channel)
    time.sleep(4)  # past replica 1's grace
    assert second.turn(turn_id).phase == RUNNING  # replica 1 saw it attached elsewhere
    # The control: gone from every replica past the grace, the Turn is settled.
    moved.close()
    _wait_for(lambda: first.turn(turn_id).outcome == INTERRUPTED, "the Turn interrupted")


@pytest.mark.spec("SCALE-2", "HOST-RT-1")
def test_a_link_left_open_on_one_replica_is_closed_once_the_runtime_attached_to_the_other(
    replica_pair: ReplicaPair,
) -> None:
    """A half-open old stream must not keep taking commands the runtime never sees."""
    first, second = replica_pair(runtime_presence_lease_seconds="1.5")
    stale = ScriptedRuntime(first.channel)
    fresh = ScriptedRuntime(second.channel)  # the same runtime, reconnected elsewhere
    _wait_for(lambda: stale.error is not None, "the old link on replica 1 closed", 15)
    turn_id = first.send("hello", canonical_pb2.DELIVERY_MODE_NEW_TURN)
    assert _take(fresh).start_turn.turn_id == turn_id
    _nothing_more(fresh)
    fresh.close()
