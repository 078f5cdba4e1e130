"""The demo runtime's disposition registry and its answers to queries and re-sent answers
(HOST-INT-6)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import runtime_pb2
from services.demoruntime.agent import DemoAgent
from services.demoruntime.dispositions import DispositionRegistry, Terminal

WS = "ws-1"
REQUEST = "t1:permission"


@pytest.mark.spec("HOST-INT-6")
def test_the_registry_keeps_the_first_terminal_disposition_and_evicts_the_oldest() -> None:
    registry = DispositionRegistry(capacity=2)
    first = (WS, "s1", "t1", "q1")
    second = (WS, "s1", "t2", "q1")  # the same request id in another Turn is another request
    third = (WS, "s2", "t3", "q1")
    answered = Terminal("answered", "allow", None, '{"a":1}')
    assert registry.record(first, answered) == answered
    # A later terminal report never replaces the first one.
    assert registry.record(first, Terminal("superseded")) == answered
    registry.record(second, Terminal("superseded"))
    assert len(registry) == 2
    registry.record(third, Terminal("interrupted"))
    assert len(registry) == 2  # size-capped
    assert registry.get(first) is None  # the oldest was evicted: unknown again
    assert registry.get(second) == Terminal("superseded")
    registry.forget_session(WS, "s2")
    assert registry.get(third) is None
    assert registry.get(second) is not None
    assert answered.same_answer("allow", None, '{"a":1}')
    assert not answered.same_answer("allow", "once", '{"a":1}')
    with pytest.raises(ValueError, match="capacity"):
        DispositionRegistry(capacity=0)


def _command(command_id: str, kind: str, **fields: Any) -> runtime_pb2.RuntimeCommand:
    command = runtime_pb2.RuntimeCommand(command_id=command_id, workspace_id=WS, session_id="d1")
    body = getattr(command, kind)
    body.SetInParent()
    body.MergeFrom(type(body)(**fields))
    return command


def _deliver(command_id: str, action: str = "allow", turn_id: str = "t1") -> Any:
    return _command(
        command_id,
        "deliver_interaction_response",
        operation_id="op-1",
        turn_id=turn_id,
        request_id=f"{turn_id}:permission",
        action=action,
    )


def _query(command_id: str, turn_id: str = "t1") -> Any:
    return _command(
        command_id,
        "query_interaction_disposition",
        operation_id="op-1",
        turn_id=turn_id,
        request_id=f"{turn_id}:permission",
    )


class _Link:
    """Collects the agent's frames; ``asked`` is set once it asks for permission."""

    def __init__(self) -> None:
        self.frames: list[runtime_pb2.RuntimeLinkRequest] = []
        self.asked = asyncio.Event()

    def send(self, frame: runtime_pb2.RuntimeLinkRequest) -> None:
        self.frames.append(frame)
        if frame.HasField("report") and any(
            item.HasField("interaction_transition") for item in frame.report.items
        ):
            self.asked.set()

    def ack(self, command_id: str) -> runtime_pb2.CommandAck:
        acks = [f.command_ack for f in self.frames if f.command_ack.command_id == command_id]
        assert len(acks) == 1, acks
        return acks[0]

    def dispositions(self, command_id: str) -> list[runtime_pb2.InteractionResponseDisposition]:
        return [
            item.interaction_disposition
            for frame in self.frames
            if frame.HasField("report")
            for item in frame.report.items
            if item.HasField("interaction_disposition")
            and item.interaction_disposition.command_id == command_id
        ]


async def _asking(link: _Link, agent: DemoAgent, turn_id: str = "t1") -> None:
    agent.handle(
        _command(
            f"start-{turn_id}",
            "start_turn",
            turn_id=turn_id,
            prompt="User request:\nplease ask permission",
        )
    )
    await asyncio.wait_for(link.asked.wait(), timeout=10)


async def _settled(agent: DemoAgent) -> None:
    """Wait (at most 10 s) for the agent's Turns to end."""
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    if others:
        await asyncio.wait(others, timeout=10)
    assert not agent.holds(WS, "d1")


@pytest.mark.spec("HOST-INT-6", "HOST-RT-5")
def test_the_demo_agent_accepts_an_identical_resent_answer_once_and_rejects_a_changed_one() -> None:
    async def scenario() -> None:
        link = _Link()
        agent = DemoAgent(link.send, step_delay_seconds=0.0)
        await _asking(link, agent)

        # Live and waiting: "pending".
        agent.handle(_query("q-live"))
        assert [d.disposition for d in link.dispositions("q-live")] == [
            canonical_pb2.INTERACTION_STATUS_PENDING
        ]

        agent.handle(_deliver("d-1"))
        assert link.ack("d-1").status == runtime_pb2.COMMAND_ACK_STATUS_ACCEPTED
        await _settled(agent)  # the Turn ran on with the answer and settled
        assert [d.disposition for d in link.dispositions("d-1")] == [
            canonical_pb2.INTERACTION_STATUS_ANSWERED
        ]
        settled_reports = sum(frame.HasField("report") for frame in link.frames)

        # The request is gone; the registry still knows it was answered, and how.
        agent.handle(_query("q-after"))
        (after,) = link.dispositions("q-after")
        assert (after.disposition, after.operation_id, after.request_id) == (
            canonical_pb2.INTERACTION_STATUS_ANSWERED,
            "op-1",
            REQUEST,
        )
        # An identical re-sent answer is accepted and reported answered, without running the
        # Turn again; a changed one is rejected and reports nothing.
        agent.handle(_deliver("d-again"))
        assert link.ack("d-again").status == runtime_pb2.COMMAND_ACK_STATUS_ACCEPTED
        assert [d.disposition for d in link.dispositions("d-again")] == [
            canonical_pb2.INTERACTION_STATUS_ANSWERED
        ]
        agent.handle(_deliver("d-changed", action="deny"))
        changed = link.ack("d-changed")
        assert (changed.status, changed.reason) == (
            runtime_pb2.COMMAND_ACK_STATUS_REJECTED,
            "ANSWER_CONFLICT",
        )
        assert not link.dispositions("d-changed")
        reports = sum(frame.HasField("report") for frame in link.frames)
        assert reports == settled_reports + 2  # the query's and the identical re-send's only

    asyncio.run(scenario())


@pytest.mark.spec("HOST-INT-6")
def test_the_demo_agent_never_reports_answered_for_a_request_it_does_not_know() -> None:
    async def scenario() -> None:
        link = _Link()
        agent = DemoAgent(
            link.send, step_delay_seconds=0.0, dispositions=DispositionRegistry(capacity=1)
        )
        # Never seen: no disposition at all, and an answer to it is rejected.
        agent.handle(_query("q-unknown", turn_id="t9"))
        (unknown,) = link.dispositions("q-unknown")
        assert unknown.disposition == canonical_pb2.INTERACTION_STATUS_UNSPECIFIED
        agent.handle(_deliver("d-unknown", turn_id="t9"))
        assert link.ack("d-unknown").status == runtime_pb2.COMMAND_ACK_STATUS_REJECTED
        assert not link.dispositions("d-unknown")

        # A request stopped unanswered is superseded, not answered.
        await _asking(link, agent)
        agent.handle(_command("stop", "stop_turn", turn_id="t1"))
        await _settled(agent)
        agent.handle(_query("q-stopped"))
        (stopped,) = link.dispositions("q-stopped")
        assert stopped.disposition == canonical_pb2.INTERACTION_STATUS_SUPERSEDED
        agent.handle(_deliver("d-stopped"))
        assert link.ack("d-stopped").status == runtime_pb2.COMMAND_ACK_STATUS_REJECTED
        assert [d.disposition for d in link.dispositions("d-stopped")] == [
            canonical_pb2.INTERACTION_STATUS_SUPERSEDED
        ]

        # Evicted from the (one-entry) registry by a later request: unknown again.
        link.asked.clear()
        await _asking(link, agent, turn_id="t2")
        agent.handle(_deliver("d-t2", turn_id="t2"))
        await _settled(agent)
        agent.handle(_query("q-evicted"))
        (evicted,) = link.dispositions("q-evicted")
        assert evicted.disposition == canonical_pb2.INTERACTION_STATUS_UNSPECIFIED

    asyncio.run(scenario())
