"""A runtime on Host's ``RuntimeLink`` holding a running Turn: the producers' shared setup.

``live_bench``'s and ``activity_bench``'s producers both stream deltas of one running Turn.
:func:`open_running_turn` registers the bench target, creates the Session, opens the runtime
link (hello), submits a Turn, acknowledges its start command and reports it running.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import grpc

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc, runtime_pb2, runtime_pb2_grpc
from services.host.runtime.registry import PROTOCOL_REVISION

__all__ = ["RunningTurn", "open_running_turn"]


@dataclass
class RunningTurn:
    """The open runtime link, the running Turn's id and the task reading the link."""

    link: Any
    turn_id: str
    reader: asyncio.Task[None]


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def open_running_turn(
    channel: grpc.aio.Channel,
    admin_token: str,
    service_token: str,
    *,
    workspace: str,
    session: str,
    target: str,
) -> RunningTurn:
    """Target, Session, runtime link and a running Turn on Host (30 s bound per step).

    Raises:
        RuntimeError: Host did not apply the report that starts the Turn.
    """
    admin = _bearer(admin_token)
    host: Any = host_pb2_grpc.HostServiceStub(channel)
    await host.RegisterAgentTarget(
        host_pb2.RegisterAgentTargetRequest(
            target=host_pb2.AgentTarget(
                agent_target_id=target,
                provider="bench",
                display_name=target,
                enabled=True,
                launch_ref=host_pb2.AgentLaunchRef(runtime_target_ref="bench:default"),
            )
        ),
        metadata=admin,
    )
    await host.CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id=workspace, agent_target_id=target, session_id=session, cwd="/"
        ),
        metadata=admin,
    )
    link = runtime_pb2_grpc.RuntimeLinkServiceStub(channel).RuntimeLink(
        metadata=_bearer(service_token)
    )
    commands: asyncio.Queue[runtime_pb2.RuntimeCommand] = asyncio.Queue()
    results: asyncio.Queue[runtime_pb2.ReportResult] = asyncio.Queue()

    async def read_link() -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for frame in link:
                kind = frame.WhichOneof("frame")
                if kind == "command":
                    commands.put_nowait(frame.command)
                elif kind == "report_result":
                    results.put_nowait(frame.report_result)

    await link.write(
        runtime_pb2.RuntimeLinkRequest(
            hello=runtime_pb2.RuntimeHello(
                runtime_id="bench-runtime",
                runtime_instance_id="i1",
                protocol_revision=PROTOCOL_REVISION,
                providers=["bench"],
            )
        )
    )
    reader = asyncio.create_task(read_link())
    sent = await host.SendInput(
        host_pb2.SendInputRequest(
            workspace_id=workspace,
            session_id=session,
            client_submit_id="c1",
            delivery=canonical_pb2.DELIVERY_MODE_NEW_TURN,
            mode=canonical_pb2.COMPOSER_MODE_AGENT,
            content="go",
        ),
        metadata=admin,
    )
    turn_id = sent.turn.turn_id
    command = await asyncio.wait_for(commands.get(), 30)
    await link.write(
        runtime_pb2.RuntimeLinkRequest(
            command_ack=runtime_pb2.CommandAck(
                command_id=command.command_id, status=runtime_pb2.COMMAND_ACK_STATUS_ACCEPTED
            )
        )
    )
    await link.write(
        runtime_pb2.RuntimeLinkRequest(
            report=runtime_pb2.RuntimeReport(
                workspace_id=workspace,
                session_id=session,
                report_id="r1",
                items=[
                    runtime_pb2.ReportItem(
                        turn_patch=runtime_pb2.TurnPatch(
                            turn_id=turn_id,
                            phase=canonical_pb2.TURN_PHASE_RUNNING,
                            occurred_at_unix_ms=int(time.time() * 1000),
                        )
                    )
                ],
            )
        )
    )
    result = await asyncio.wait_for(results.get(), 30)
    if result.outcome != runtime_pb2.REPORT_OUTCOME_APPLIED:
        raise RuntimeError(f"the running-Turn report was not applied: {result}")
    return RunningTurn(link, turn_id, reader)
