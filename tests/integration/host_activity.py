"""Shared helpers of the Host activity integration tests (Turns, runtime link, interactions)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from sqlalchemy import func, select

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from store.engine import create_sync_engine_for
from store.models import Message, Turn
from tests.support.rpc_errors import error_details
from tests.support.runtime_client import ScriptedRuntime, interaction, turn_patch
from tests.support.servers import LiveServer, auth_metadata

WS = "ws-1"
DEVICE = auth_metadata("ws1-device")


@dataclass
class HostUnderTest:
    """A live host with a seeded target and Session ``s1``."""

    server: LiveServer
    url: str

    @property
    def stub(self) -> host_pb2_grpc.HostServiceStub:
        return host_pb2_grpc.HostServiceStub(self.server.channel)

    def runtime(self, **kwargs: Any) -> ScriptedRuntime:
        return ScriptedRuntime(self.server.channel, **kwargs)

    def pending_interaction(self) -> tuple[ScriptedRuntime, str]:
        """A runtime and a Turn of ``s1`` whose Interaction ``q1`` is pending."""
        runtime = self.runtime()
        turn = self.send("hello", "c1").turn
        runtime.ack(runtime.next_command().command_id)
        runtime.report(
            WS,
            "s1",
            "r1",
            turn_patch(turn.turn_id, canonical_pb2.TURN_PHASE_AWAITING_INTERACTION),
            interaction(turn.turn_id, "q1"),
        )
        return runtime, turn.turn_id

    def send(
        self,
        content: str,
        submit_id: str,
        *,
        session_id: str = "s1",
        delivery: int = canonical_pb2.DELIVERY_MODE_NEW_TURN,
        target_turn_id: str | None = None,
        mode: int = canonical_pb2.COMPOSER_MODE_AGENT,
    ) -> host_pb2.SendInputResponse:
        request = host_pb2.SendInputRequest(
            workspace_id=WS,
            session_id=session_id,
            client_submit_id=submit_id,
            delivery=delivery,  # type: ignore[arg-type]
            mode=mode,  # type: ignore[arg-type]
            content=content,
        )
        if target_turn_id is not None:
            request.target_turn_id = target_turn_id
        response: host_pb2.SendInputResponse = self.stub.SendInput(request, metadata=DEVICE)
        return response

    def counts(self) -> tuple[int, int]:
        """(Turns, Messages) in the store."""
        engine = create_sync_engine_for(self.url)
        try:
            with engine.connect() as connection:
                turns = connection.execute(select(func.count()).select_from(Turn)).scalar_one()
                messages = connection.execute(
                    select(func.count()).select_from(Message)
                ).scalar_one()
        finally:
            engine.dispose()
        return int(turns), int(messages)


TARGET_ID = "demo-target"
PROVIDER = "demo"


def start_host(live_server: Callable[..., LiveServer], url: str, **overrides: Any) -> HostUnderTest:
    """A live host with target ``demo-target`` and Session ``s1``, made through the API.

    The target is registered with ``RegisterAgentTarget`` and ``s1`` is created with
    ``CreateSession``, so these tests run on exactly what the real create persists.
    """
    host = HostUnderTest(live_server("host", database_url=url, **overrides), url)
    host.stub.RegisterAgentTarget(
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
                subagents=[host_pb2.SubagentDescriptor(name="explorer")],
            )
        ),
        metadata=auth_metadata("admin"),
    )
    host.stub.CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id=WS,
            agent_target_id=TARGET_ID,
            session_id="s1",
            title="title of s1",
            cwd="/nonexistent/workspace",
        ),
        metadata=DEVICE,
    )
    return host


def error_reason(error: grpc.RpcError) -> str:
    """The ErrorInfo reason of a failed call."""
    return error_details(error)[1]
