"""The demo agent's answer to ``release_session``: accept it and drop the Session (HOST-RT-1)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentactivity.host.v1 import runtime_pb2
from services.demoruntime.agent import DemoAgent

WS = "ws-1"


async def _others_finished() -> bool:
    """Wait (at most 10 s) for every other task of the loop, the agent's Turns, to end."""
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    if not others:
        return True
    _, pending = await asyncio.wait(others, timeout=10)
    return not pending


def _command(kind: str, **fields: Any) -> runtime_pb2.RuntimeCommand:
    command = runtime_pb2.RuntimeCommand(
        command_id=f"cmd-{kind}", workspace_id=WS, session_id="d1", **fields
    )
    getattr(command, kind).SetInParent()
    return command


@pytest.mark.spec("HOST-RT-1")
def test_the_demo_agent_drops_a_released_sessions_state_and_accepts_the_release() -> None:
    async def scenario() -> None:
        frames: list[runtime_pb2.RuntimeLinkRequest] = []
        asking = asyncio.Event()

        def send(frame: runtime_pb2.RuntimeLinkRequest) -> None:
            frames.append(frame)
            if frame.HasField("report") and any(
                item.HasField("interaction_transition") for item in frame.report.items
            ):
                asking.set()

        agent = DemoAgent(send, step_delay_seconds=0.0)
        agent.handle(
            _command(
                "start_turn",
                start_turn=runtime_pb2.StartTurnCommand(
                    turn_id="t1", prompt="User request:\nplease ask permission"
                ),
            )
        )
        await asyncio.wait_for(asking.wait(), timeout=10)
        assert agent.holds(WS, "d1")
        before = len(frames)

        agent.handle(_command("release_session", release_session={"reason": "session_deleted"}))
        ack = frames[before].command_ack
        assert (ack.command_id, ack.status) == (
            "cmd-release_session",
            runtime_pb2.COMMAND_ACK_STATUS_ACCEPTED,
        )
        assert await _others_finished()  # the released Session's Turn was cancelled
        assert not agent.holds(WS, "d1")
        # An answer arriving now finds nothing: no disposition is reported for the Session.
        agent.handle(
            _command(
                "deliver_interaction_response",
                deliver_interaction_response=runtime_pb2.DeliverInteractionResponseCommand(
                    turn_id="t1", request_id="t1:permission", action="allow"
                ),
            )
        )
        # The handler acts synchronously; a Turn still alive would have reported at once.
        assert frames[-1].command_ack.command_id == "cmd-deliver_interaction_response"
        assert not any(frame.HasField("report") for frame in frames[before:])

    asyncio.run(scenario())
