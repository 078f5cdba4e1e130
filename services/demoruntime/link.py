"""The demo runtime's ``RuntimeLink`` client: hello, commands in, frames out, reconnect.

This is the same port every provider adapter uses (docs/runtime-adapters.md): one long-lived
bidirectional stream authenticated with a ``service`` token. Frames are sent in order from one
queue, so a delta queued before a report reaches Host before it (HOST-RT-2).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator

import grpc

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc, runtime_pb2, runtime_pb2_grpc
from grpcserver.channels import aio_channel
from services.demoruntime.agent import DemoAgent
from services.demoruntime.dispositions import DispositionRegistry
from services.demoruntime.settings import Settings
from session_resources import ResourceLayout

__all__ = ["DemoRuntime"]

_log = logging.getLogger(__name__)

RUNTIME_LINK_REVISION = 2
"""The runtime-link revision the demo speaks: classified, Turn-scoped messages, file-change
snapshots and disposition queries (ADR 0031)."""
_STOP = object()


class DemoRuntime:
    """Keeps one runtime link to Host open (reconnecting) and runs the demo agent on it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.instance_id = f"demo-{uuid.uuid4()}"
        self.welcomed = asyncio.Event()
        # Outlives each link, so a query after a reconnect finds earlier requests (HOST-INT-6).
        self.dispositions = DispositionRegistry()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def _metadata(self) -> list[tuple[str, str]]:
        token = self.settings.service_token
        if token is None:
            raise RuntimeError("TUTTI_SERVICE_TOKEN is required to connect to Host")
        return [("authorization", f"Bearer {token.get_secret_value()}")]

    async def register_target(self) -> None:
        """Register the demo target deployment-wide (idempotent, RegisterAgentTarget)."""
        settings = self.settings
        async with aio_channel(settings.host_address, settings) as channel:
            await host_pb2_grpc.HostServiceStub(channel).RegisterAgentTarget(
                host_pb2.RegisterAgentTargetRequest(
                    target=host_pb2.AgentTarget(
                        agent_target_id=settings.demo_target_id,
                        provider=settings.demo_provider,
                        display_name="Demo agent (offline)",
                        enabled=True,
                        launch_ref=host_pb2.AgentLaunchRef(
                            runtime_target_ref=f"{settings.demo_provider}:default"
                        ),
                        capabilities=canonical_pb2.RuntimeCapabilities(
                            guidance=False, interrupt=True, live_settings=True, subagents=True
                        ),
                        subagents=[
                            host_pb2.SubagentDescriptor(name="explorer"),
                            host_pb2.SubagentDescriptor(name="reviewer"),
                        ],
                    )
                ),
                metadata=self._metadata(),
                timeout=10,
            )

    async def start(self) -> None:
        """Register the target, connect, and wait for Host's welcome (a start hook)."""
        if self.settings.demo_register_target:
            await self.register_target()
        self._task = asyncio.create_task(self._run_forever())
        await asyncio.wait_for(
            self.welcomed.wait(), timeout=self.settings.demo_connect_timeout_seconds
        )

    async def stop(self) -> None:
        """Close the link (a stop hook)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run_forever(self) -> None:
        while not self._stopping:
            try:
                await self._run_once()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as error:
                _log.warning("runtime link ended: %s %s", error.code(), error.details())
            except Exception:  # noqa: BLE001 - keep the runtime alive; reconnect
                _log.exception("runtime link failed")
            await asyncio.sleep(1.0)

    async def _run_once(self) -> None:
        settings = self.settings
        outgoing: asyncio.Queue[object] = asyncio.Queue()
        outgoing.put_nowait(
            runtime_pb2.RuntimeLinkRequest(
                hello=runtime_pb2.RuntimeHello(
                    runtime_id=settings.demo_runtime_id,
                    runtime_instance_id=self.instance_id,
                    protocol_revision=RUNTIME_LINK_REVISION,
                    providers=[settings.demo_provider],
                    agent_target_ids=[settings.demo_target_id],
                    capabilities=canonical_pb2.RuntimeCapabilities(
                        guidance=False, interrupt=True, live_settings=True, subagents=True
                    ),
                    runtime_version="demo-1",
                )
            )
        )

        async def requests() -> AsyncIterator[runtime_pb2.RuntimeLinkRequest]:
            while True:
                item = await outgoing.get()
                if item is _STOP:
                    return
                assert isinstance(item, runtime_pb2.RuntimeLinkRequest)
                yield item

        agent = DemoAgent(
            outgoing.put_nowait,
            settings.demo_step_delay_seconds,
            resources=ResourceLayout(settings.resolved_resources_dir()),
            dispositions=self.dispositions,
        )
        async with aio_channel(settings.host_address, settings) as channel:
            call = runtime_pb2_grpc.RuntimeLinkServiceStub(channel).RuntimeLink(
                requests(), metadata=self._metadata()
            )
            try:
                async for frame in call:
                    kind = frame.WhichOneof("frame")
                    if kind == "welcome":
                        _log.info("runtime link up: %s", frame.welcome.link_id)
                        self.welcomed.set()
                    elif kind == "command":
                        agent.handle(frame.command)
                    elif kind == "report_result":
                        result = frame.report_result
                        if result.outcome not in (
                            runtime_pb2.REPORT_OUTCOME_APPLIED,
                            runtime_pb2.REPORT_OUTCOME_ALREADY_APPLIED,
                        ):
                            _log.warning("report %s: %s", result.report_id, result)
            finally:
                agent.close()
                outgoing.put_nowait(_STOP)
