"""The runtime link driven by a scripted runtime over real gRPC (HOST-RT-1/3/4, HOST-INT-2).

The loss-grace tests observe the grace timer itself (:class:`LossTimers`): they wait for the
Host to start it and for it to end, instead of sleeping for about as long as the grace.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, runtime_pb2
from services.host.runtime.registry import PROTOCOL_REVISION, RuntimeRegistry
from tests.integration.host_activity import WS, error_reason, start_host
from tests.support.host_activity_calls import (
    attention_items,
    response_operation,
    session_messages,
    session_turn,
    submit_response,
)
from tests.support.runtime_client import (
    interaction,
    interaction_disposition,
    text_message,
    turn_patch,
)
from tests.support.servers import LiveServer

RUNNING = canonical_pb2.TURN_PHASE_RUNNING
SETTLED = canonical_pb2.TURN_PHASE_SETTLED
APPLIED = runtime_pb2.REPORT_OUTCOME_APPLIED

WAIT_SECONDS = 10.0
"""Upper bound of any wait for something that must happen; only a failing test reaches it."""


@dataclass
class LossTimer:
    """One grace timer the Host started for a disconnected runtime.

    Times are ``time.monotonic()``, the clock of the server's event loop.
    """

    runtime_id: str
    task: asyncio.Task[None]
    scheduled_at: float
    finished_at: float | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    def wait_finished(self, timeout: float = WAIT_SECONDS) -> None:
        """Block until the timer ended: cancelled, or the grace elapsed and it did its work."""
        assert self.finished.wait(timeout), "the grace timer did not end"


class LossTimers:
    """Grace timers started by the Host in this test process (servers run in threads)."""

    def __init__(self) -> None:
        self._timers: list[LossTimer] = []
        self._added = threading.Condition()

    def scheduled(self, runtime_id: str, task: asyncio.Task[None]) -> None:
        # On the server's loop, before the timer's first step: its sleep starts later.
        timer = LossTimer(runtime_id, task, time.monotonic())

        def done(_: asyncio.Task[None]) -> None:
            timer.finished_at = time.monotonic()
            timer.finished.set()

        task.add_done_callback(done)
        with self._added:
            self._timers.append(timer)
            self._added.notify_all()

    def wait(self, count: int = 1) -> LossTimer:
        """The ``count``-th timer started, once the Host has started it."""
        with self._added:
            started = self._added.wait_for(lambda: len(self._timers) >= count, WAIT_SECONDS)
            assert started, "the Host did not start the loss grace"
            return self._timers[count - 1]


@pytest.fixture
def loss_timers(monkeypatch: pytest.MonkeyPatch) -> LossTimers:
    """Record every grace timer the Host schedules (``RuntimeRegistry.schedule_loss``)."""
    timers = LossTimers()
    schedule_loss = RuntimeRegistry.schedule_loss

    def recording(self: RuntimeRegistry, runtime_id: str, timer: asyncio.Task[None]) -> None:
        timers.scheduled(runtime_id, timer)
        schedule_loss(self, runtime_id, timer)

    monkeypatch.setattr(RuntimeRegistry, "schedule_loss", recording)
    return timers


@pytest.mark.spec("HOST-RT-1")
def test_hello_is_required_and_welcome_names_the_served_targets(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    assert runtime.welcome is not None
    assert list(runtime.welcome.agent_target_ids) == ["demo-target"]
    runtime.close()
    bare = host.runtime(hello=False)
    bare.send(runtime_pb2.RuntimeLinkRequest(command_ack=runtime_pb2.CommandAck(command_id="x")))
    failure = bare.next_frame()
    assert isinstance(failure, grpc.RpcError)
    assert failure.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(failure) == "RUNTIME_HELLO_REQUIRED"


@pytest.mark.spec("HOST-RT-1", "HOST-MSG-1", "HOST-MSG-7")
def test_a_runtime_of_the_previous_link_revision_is_refused_at_hello(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    """A revision-1 runtime sends unclassified, possibly Turn-less messages; refusing it at
    hello is one typed error instead of every later report rejected (ADR 0031)."""
    host = start_host(live_server, migrated_db_url)
    old = host.runtime(hello=False)
    old.send(
        runtime_pb2.RuntimeLinkRequest(
            hello=runtime_pb2.RuntimeHello(
                runtime_id="rt-old",
                runtime_instance_id="i-1",
                protocol_revision=PROTOCOL_REVISION - 1,
                providers=["demo"],
            )
        )
    )
    failure = old.next_frame()
    assert isinstance(failure, grpc.RpcError)
    assert failure.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(failure) == "RUNTIME_PROTOCOL_MISMATCH"
    # Nothing was attached: the current revision is welcomed and serves the target.
    current = host.runtime(runtime_id="rt-new")
    assert current.welcome is not None
    current.close()


@pytest.mark.spec("HOST-RT-1", "SEC-1")
def test_a_device_token_cannot_serve_targets(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime(principal="ws1-device", hello=False)
    runtime.send(runtime_pb2.RuntimeLinkRequest(hello=runtime_pb2.RuntimeHello(runtime_id="r")))
    failure = runtime.next_frame()
    assert isinstance(failure, grpc.RpcError)
    assert failure.code() == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.spec("HOST-RT-3", "HOST-TURN-6", "HOST-MSG-1")
def test_messages_in_a_terminal_batch_commit_before_the_settlement(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    turn = host.send("hello", "c1").turn
    runtime.ack(runtime.next_command().command_id)
    # Provider order: the terminal patch precedes the final text in this batch; the
    # barrier still writes the Turn's messages first, so the result is that text.
    result = runtime.report(
        WS,
        "s1",
        "r1",
        turn_patch(turn.turn_id, RUNNING),
        text_message("m1", turn.turn_id, "working"),
        turn_patch(turn.turn_id, SETTLED, outcome=canonical_pb2.TURN_OUTCOME_COMPLETED),
        text_message("m2", turn.turn_id, "done"),
        turn_patch(turn.turn_id, RUNNING),
    )
    assert result.outcome == APPLIED
    assert result.item_results[4].stale  # a later non-terminal patch never reopens the Turn
    settled = session_turn(host.stub, turn.turn_id)
    assert settled.phase == SETTLED
    assert settled.outcome == canonical_pb2.TURN_OUTCOME_COMPLETED
    assert settled.result_message_id == "m2"
    page = session_messages(host.stub)
    assert [m.message_id for m in page.messages] == ["client-submit:user:c1", "m1", "m2"]
    assert page.messages[2].user_visible_assistant_response is True
    # A later message never becomes the frozen result.
    late = runtime.report(WS, "s1", "r2", text_message("m3", turn.turn_id, "late"))
    assert late.outcome == APPLIED
    assert session_turn(host.stub, turn.turn_id).result_message_id == "m2"
    # An exact replay of a report changes nothing.
    replay = runtime.report(WS, "s1", "r2", text_message("m3", turn.turn_id, "late"))
    assert replay.outcome == runtime_pb2.REPORT_OUTCOME_ALREADY_APPLIED
    runtime.close()


@pytest.mark.spec("HOST-INT-2", "HOST-RT-3")
def test_a_conflicting_interaction_commits_nothing_from_the_report(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    turn = host.send("hello", "c1").turn
    first = runtime.report(
        WS, "s1", "r1", turn_patch(turn.turn_id, RUNNING), interaction(turn.turn_id, "q1")
    )
    assert first.outcome == APPLIED
    before = session_messages(host.stub).latest_version
    conflict = runtime.report(
        WS,
        "s1",
        "r2",
        text_message("m1", turn.turn_id, "thinking"),
        interaction(turn.turn_id, "q1", input_json='{"command": "rm -rf /"}'),
    )
    assert conflict.outcome == runtime_pb2.REPORT_OUTCOME_CONFLICT
    assert conflict.reason == "INTERACTION_CONFLICT"
    assert conflict.item_results[0].index == 1
    assert session_messages(host.stub).latest_version == before
    assert "m1" not in [m.message_id for m in session_messages(host.stub).messages]
    replay = runtime.report(WS, "s1", "r3", interaction(turn.turn_id, "q1"))
    assert replay.outcome == runtime_pb2.REPORT_OUTCOME_ALREADY_APPLIED
    answered = runtime.report(
        WS,
        "s1",
        "r4",
        interaction(turn.turn_id, "q1", canonical_pb2.INTERACTION_STATUS_ANSWERED),
    )
    assert answered.outcome == runtime_pb2.REPORT_OUTCOME_REJECTED
    runtime.close()


@pytest.mark.spec("HOST-RT-4", "HOST-INT-3")
def test_tool_calls_never_touch_interactions_and_an_ack_commits_before_settlement(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    turn = host.send("hello", "c1").turn
    runtime.next_command()
    runtime.report(
        WS, "s1", "r1", turn_patch(turn.turn_id, RUNNING), interaction(turn.turn_id, "q1")
    )
    submitted = submit_response(host.stub, turn.turn_id, "k1").operation
    deliver = runtime.next_command()
    assert deliver.deliver_interaction_response.operation_id == submitted.operation_id
    tool_call = runtime_pb2.ReportItem(
        message_snapshot=runtime_pb2.MessageSnapshot(
            message_id="tool-1",
            turn_id=turn.turn_id,
            role=canonical_pb2.MESSAGE_ROLE_ASSISTANT,
            kind=canonical_pb2.MESSAGE_KIND_TOOL_CALL,
            user_visible_assistant_response=False,
            tool_call=runtime_pb2.ToolCallSnapshot(
                call_id="q1",
                tool_name="Bash",
                tool_kind="command",
                phase=runtime_pb2.TOOL_CALL_PHASE_COMPLETED,
                input_json='{"command": "ls"}',
                stdout="a\nb\n",
                exit_code=0,
            ),
        )
    )
    disposition = interaction_disposition(
        turn.turn_id,
        "q1",
        canonical_pb2.INTERACTION_STATUS_ANSWERED,
        operation_id=submitted.operation_id,
        command_id=deliver.command_id,
    )
    result = runtime.report(
        WS,
        "s1",
        "r2",
        disposition,
        tool_call,
        turn_patch(turn.turn_id, SETTLED, outcome=canonical_pb2.TURN_OUTCOME_COMPLETED),
    )
    assert result.outcome == APPLIED
    operation = response_operation(host.stub, submitted.operation_id)
    assert operation.status == host_pb2.INTERACTION_RESPONSE_OPERATION_STATUS_COMPLETED
    # The acknowledgement committed before the settlement, so the settlement did not
    # supersede the Interaction.
    assert operation.disposition == canonical_pb2.INTERACTION_STATUS_ANSWERED
    assert operation.interaction.status == canonical_pb2.INTERACTION_STATUS_ANSWERED
    runtime.close()


@pytest.mark.spec("HOST-RT-1", "HOST-INT-3", "HOST-TURN-5")
def test_a_lost_runtime_interrupts_its_turns_after_the_grace(
    migrated_db_url: str, live_server: Callable[..., LiveServer], loss_timers: LossTimers
) -> None:
    grace = 0.5
    host = start_host(live_server, migrated_db_url, runtime_loss_grace_seconds=grace)
    runtime = host.runtime()
    turn = host.send("hello", "c1").turn
    runtime.report(
        WS, "s1", "r1", turn_patch(turn.turn_id, RUNNING), interaction(turn.turn_id, "q1")
    )
    runtime.cancel()
    timer = loss_timers.wait()  # the Host saw the link end: the grace runs from here
    phase = session_turn(host.stub, turn.turn_id).phase
    if time.monotonic() < timer.scheduled_at + grace:  # this read ended within the grace
        assert phase == RUNNING
    timer.wait_finished()
    assert not timer.task.cancelled()
    assert timer.finished_at is not None
    assert timer.finished_at - timer.scheduled_at >= grace  # never before the grace
    settled = session_turn(host.stub, turn.turn_id)  # the timer committed the loss before it ended
    assert settled.phase == SETTLED
    assert settled.outcome == canonical_pb2.TURN_OUTCOME_INTERRUPTED
    items = attention_items(host.stub)
    assert list(items) == []
    with pytest.raises(grpc.RpcError) as caught:
        submit_response(host.stub, turn.turn_id, "k1")
    assert error_reason(caught.value) == "INTERACTION_NOT_ACTIONABLE"


@pytest.mark.spec("HOST-RT-1")
def test_a_runtime_that_returns_within_the_grace_keeps_its_turns(
    migrated_db_url: str, live_server: Callable[..., LiveServer], loss_timers: LossTimers
) -> None:
    # The runtime is back within milliseconds; a grace of seconds leaves any slow machine
    # ample room, and the test waits it out only if the Host lets the timer run.
    grace = 5.0
    host = start_host(live_server, migrated_db_url, runtime_loss_grace_seconds=grace)
    runtime = host.runtime()
    turn = host.send("hello", "c1").turn
    runtime.cancel()
    timer = loss_timers.wait()  # the Host saw the link end: the grace runs from here
    again = host.runtime()  # same runtime and instance id
    # The unacknowledged start command is re-sent to the new link.
    assert again.next_command().start_turn.turn_id == turn.turn_id
    assert time.monotonic() < timer.scheduled_at + grace, "not back within the grace"
    # Once the timer ended (cancelled by the reconnect, or run out and found the runtime
    # back), nothing can confirm the loss any more.
    timer.wait_finished(grace + WAIT_SECONDS)
    assert session_turn(host.stub, turn.turn_id).phase != SETTLED
    again.close()


@pytest.mark.spec("HOST-INT-2", "HOST-INT-4")
def test_a_settled_turn_cannot_acquire_a_pending_interaction(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    turn = host.send("hello", "c1").turn
    runtime.report(
        WS,
        "s1",
        "r1",
        turn_patch(turn.turn_id, SETTLED, outcome=canonical_pb2.TURN_OUTCOME_COMPLETED),
    )
    late = runtime.report(WS, "s1", "r2", interaction(turn.turn_id, "q1"))
    assert late.outcome == APPLIED
    assert late.item_results[0].stale
    items = attention_items(host.stub)
    assert list(items) == []
    runtime.close()
