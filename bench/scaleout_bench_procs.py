"""Processes of ``bench.scaleout_bench``: the SendInput client and the runtimes.

Each runs in its own spawned process as a command handler of
:class:`bench.live_bench_procs.Worker` (the parent calls ``cmd_*`` coroutines over a pipe):

* :class:`SubmitClient` issues ``SendInput`` ``new_turn`` calls (``bench.host_bench``'s
  request, one fresh idle Session per call) over one ``grpc.aio`` channel per target. A
  target ``ipv4:a,b`` is balanced by gRPC's ``round_robin`` with health checks
  (``grpcserver.channels``, ADR 0038); one replica is ``ipv4:a``, the same policy over one
  address, so both configurations take the same client path.
* :class:`RuntimeFleet` holds one runtime link per Host replica, each with its own
  ``runtime_id`` (a runtime is reachable only from the replica it is attached to until
  commands are routed across replicas). Every link acknowledges every command, as
  ``bench.host_bench``'s runtime does; on top it opens running Turns, sends text deltas
  (the live producer: one op per delta, ``bench.live_bench_common``) and measures the
  runtime's report path (a few deltas, then the report that confirms them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from typing import Any

import grpc

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc, runtime_pb2
from bench.host_bench import (
    PROVIDER,
    TARGET_ID,
    BenchRuntime,
    create_sessions,
    drive,
    metadata,
    register_target,
    submit_request,
)
from bench.live_bench_common import MESSAGE, op_text
from grpcserver.channels import channel_options
from services.host.runtime.registry import PROTOCOL_REVISION

__all__ = ["ReplicaRuntime", "RuntimeFleet", "SubmitClient"]

COMMAND_WAIT_SECONDS = 30.0
REPORT_TEXT = "A representative assistant reply of a few sentences. " * 4


class SubmitClient:
    """Command handler of the client process (see the module docstring)."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _stub(self, target: str) -> Any:
        channel = self._channels.get(target)
        if channel is None:
            channel = grpc.aio.insecure_channel(target, options=channel_options(target))
            self._channels[target] = channel
        return host_pb2_grpc.HostServiceStub(channel)

    async def cmd_setup(self, target: str, session_ids: list[str]) -> float:
        """Register the bench target and create idle Sessions; returns the seconds taken."""
        stub = self._stub(target)
        started = time.perf_counter()
        await register_target(stub)
        await create_sessions(stub, session_ids)
        return time.perf_counter() - started

    async def cmd_submit(
        self, target: str, session_ids: list[str], concurrency: int
    ) -> dict[str, Any]:
        """One ``SendInput`` ``new_turn`` per Session, ``concurrency`` tasks back to back.

        Returns the latencies (ms) of the calls that succeeded, the wall time of the series
        and the failed calls by status code.
        """
        stub = self._stub(target)
        device = metadata("device")

        async def call(index: int) -> object:
            response = await stub.SendInput(submit_request(session_ids[index]), metadata=device)
            if response.replayed:
                raise RuntimeError(f"{session_ids[index]}: a fresh submit was replayed")
            return response

        series = await drive(call, len(session_ids), concurrency)
        return {
            "latencies_ms": series.latencies_ms,
            "elapsed_s": series.elapsed_s,
            "errors": series.errors,
        }

    async def close(self) -> None:
        """Close every channel."""
        for channel in self._channels.values():
            await channel.close()


class ReplicaRuntime(BenchRuntime):
    """``bench.host_bench``'s runtime with an id of its own, deltas and any workspace."""

    async def hello_as(self, runtime_id: str) -> None:
        """Open the link as ``runtime_id`` for the benchmark's provider."""
        self._outbox.put_nowait(
            runtime_pb2.RuntimeLinkRequest(
                hello=runtime_pb2.RuntimeHello(
                    runtime_id=runtime_id,
                    runtime_instance_id=f"{runtime_id}-{uuid.uuid4()}",
                    protocol_revision=PROTOCOL_REVISION,
                    providers=[PROVIDER],
                    capabilities=canonical_pb2.RuntimeCapabilities(
                        guidance=True, interrupt=True, live_settings=True
                    ),
                )
            )
        )
        await asyncio.wait_for(self._welcome, timeout=COMMAND_WAIT_SECONDS)

    def send_deltas(self, deltas: list[canonical_pb2.MessageDelta]) -> None:
        """Queue one ``RuntimeLink`` frame carrying ``deltas`` (written in queue order)."""
        self._outbox.put_nowait(
            runtime_pb2.RuntimeLinkRequest(deltas=runtime_pb2.MessageDeltaBatch(deltas=deltas))
        )

    async def report_in(
        self, workspace: str, session_id: str, items: list[runtime_pb2.ReportItem]
    ) -> runtime_pb2.ReportResult:
        """Send one report of ``workspace``'s Session and wait for Host's verdict."""
        report_id = f"report-{uuid.uuid4()}"
        future = self._results[report_id] = asyncio.get_running_loop().create_future()
        self._outbox.put_nowait(
            runtime_pb2.RuntimeLinkRequest(
                report=runtime_pb2.RuntimeReport(
                    report_id=report_id,
                    workspace_id=workspace,
                    session_id=session_id,
                    items=items,
                )
            )
        )
        return await asyncio.wait_for(future, timeout=COMMAND_WAIT_SECONDS)


def text_delta(
    workspace: str, session_id: str, turn_id: str, message_id: str, text: str
) -> canonical_pb2.MessageDelta:
    """One append-text delta of a message of a running Turn."""
    return canonical_pb2.MessageDelta(
        workspace_id=workspace,
        session_id=session_id,
        turn_id=turn_id,
        message_id=message_id,
        target=canonical_pb2.DELTA_TARGET_TEXT,
        operation=canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
        text=text,
    )


def snapshot_item(turn_id: str, message_id: str, text: str) -> runtime_pb2.ReportItem:
    """A report item holding an assistant message's final text."""
    return runtime_pb2.ReportItem(
        message_snapshot=runtime_pb2.MessageSnapshot(
            message_id=message_id,
            turn_id=turn_id,
            role=canonical_pb2.MESSAGE_ROLE_ASSISTANT,
            kind=canonical_pb2.MESSAGE_KIND_TEXT,
            user_visible_assistant_response=True,
            occurred_at_unix_ms=int(time.time() * 1000),
            payload_json=json.dumps({"text": text}),
        )
    )


class RuntimeFleet:
    """Command handler of the runtime process (see the module docstring)."""

    def __init__(self) -> None:
        self._channels: list[grpc.aio.Channel] = []
        self._runtimes: dict[str, ReplicaRuntime] = {}
        self._hosts: dict[str, Any] = {}
        self._turns: dict[str, tuple[str, str, str, str]] = {}
        """key -> (runtime name, workspace, Session, Turn)."""

    async def cmd_attach(self, name: str, address: str, runtime_id: str) -> None:
        """Open a runtime link named ``name`` to the Host at ``address`` as ``runtime_id``."""
        channel = grpc.aio.insecure_channel(address)
        self._channels.append(channel)
        runtime = ReplicaRuntime(channel)
        await runtime.hello_as(runtime_id)
        self._runtimes[name] = runtime
        self._hosts[name] = host_pb2_grpc.HostServiceStub(channel)

    async def cmd_commands(self) -> dict[str, int]:
        """Commands each link has received (and acknowledged) so far."""
        return {name: runtime.commands for name, runtime in self._runtimes.items()}

    async def cmd_await_commands(self, baseline: dict[str, int], total: int) -> dict[str, int]:
        """Wait until the links named in ``baseline`` received ``total`` more commands in all.

        A command reaches its runtime after the commit that answers ``SendInput``, so the
        count read right after the last reply can be one short. Gives up after
        ``COMMAND_WAIT_SECONDS`` and returns what arrived (the caller records the shortfall).

        Returns:
            Commands each named link has received so far.
        """
        deadline = time.monotonic() + COMMAND_WAIT_SECONDS
        while True:
            counts = {name: self._runtimes[name].commands for name in baseline}
            arrived = sum(counts[name] - baseline[name] for name in baseline)
            if arrived >= total or time.monotonic() > deadline:
                return counts
            await asyncio.sleep(0.01)

    async def cmd_open_turn(self, key: str, name: str, workspace: str, session_id: str) -> str:
        """A running Turn of a new Session of ``workspace`` on link ``name``'s Host.

        Registers the bench target, creates the Session, submits a Turn, waits for its start
        command on this link (acknowledged by the reader) and reports the Turn running.

        Returns:
            The Turn id.
        """
        runtime, host = self._runtimes[name], self._hosts[name]
        admin = metadata("admin")
        await register_target(host)
        await host.CreateSession(
            host_pb2.CreateSessionRequest(
                workspace_id=workspace,
                agent_target_id=TARGET_ID,
                session_id=session_id,
                cwd="/nonexistent/bench",
            ),
            metadata=admin,
        )
        seen = runtime.commands
        sent = await host.SendInput(
            host_pb2.SendInputRequest(
                workspace_id=workspace,
                session_id=session_id,
                client_submit_id=f"start-{session_id}",
                delivery=canonical_pb2.DELIVERY_MODE_NEW_TURN,
                mode=canonical_pb2.COMPOSER_MODE_AGENT,
                content="go",
            ),
            metadata=admin,
        )
        turn_id: str = sent.turn.turn_id
        deadline = time.monotonic() + COMMAND_WAIT_SECONDS
        while runtime.commands == seen:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: no start command for {session_id}")
            await asyncio.sleep(0.01)
        running = runtime_pb2.ReportItem(
            turn_patch=runtime_pb2.TurnPatch(
                turn_id=turn_id,
                phase=canonical_pb2.TURN_PHASE_RUNNING,
                occurred_at_unix_ms=int(time.time() * 1000),
            )
        )
        result = await runtime.report_in(workspace, session_id, [running])
        if result.outcome != runtime_pb2.REPORT_OUTCOME_APPLIED:
            raise RuntimeError(f"the running-Turn report was not applied: {result}")
        self._turns[key] = (name, workspace, session_id, turn_id)
        return turn_id

    async def cmd_reports(
        self, key: str, first: int, count: int, deltas: int, delta_bytes: int
    ) -> dict[str, Any]:
        """The report path, ``count`` times in sequence on Turn ``key``.

        Each time: ``deltas`` text deltas of a new assistant message (one frame), then the
        report with that message's snapshot, which Host applies only once the deltas before
        it are settled (with the shared lane: acknowledged by JetStream). The latency runs
        from queueing the deltas to Host's verdict on the report.
        """
        name, workspace, session_id, turn_id = self._turns[key]
        runtime = self._runtimes[name]
        latencies: list[float] = []
        outcomes: dict[str, int] = {}
        started = time.perf_counter()
        for index in range(first, first + count):
            message_id = f"reply-{index}"
            begun = time.perf_counter()
            runtime.send_deltas(
                [
                    text_delta(workspace, session_id, turn_id, message_id, "x" * delta_bytes)
                    for _ in range(deltas)
                ]
            )
            result = await runtime.report_in(
                workspace, session_id, [snapshot_item(turn_id, message_id, REPORT_TEXT)]
            )
            outcome = runtime_pb2.ReportOutcome.Name(result.outcome)
            if result.outcome == runtime_pb2.REPORT_OUTCOME_APPLIED:
                latencies.append((time.perf_counter() - begun) * 1000)
            else:
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
        return {
            "latencies_ms": latencies,
            "elapsed_s": time.perf_counter() - started,
            "errors": outcomes,
        }

    async def cmd_send(
        self,
        key: str,
        first_index: int,
        count: int,
        width: int,
        batch: int = 1,
        rate: float | None = None,
    ) -> dict[str, int]:
        """Send ``count`` op deltas (indexes from ``first_index``) on Turn ``key``.

        ``batch`` deltas per ``RuntimeLink`` frame, paced at ``rate`` deltas/s or as fast as
        the link takes them (``None``).
        """
        name, workspace, session_id, turn_id = self._turns[key]
        runtime = self._runtimes[name]
        started = time.perf_counter_ns()
        sent = 0
        while sent < count:
            size = min(batch, count - sent)
            if rate is not None:
                delay = (started + int(sent / rate * 1e9) - time.perf_counter_ns()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
            runtime.send_deltas(
                [
                    text_delta(
                        workspace,
                        session_id,
                        turn_id,
                        MESSAGE,
                        op_text(first_index + sent + k, width),
                    )
                    for k in range(size)
                ]
            )
            sent += size
            if rate is None and sent % (batch * 16) == 0:
                await asyncio.sleep(0)  # let the link write what is queued
        return {"start_ns": started, "end_ns": time.perf_counter_ns()}

    async def close(self) -> None:
        """Half-close every link and close the channels."""
        for runtime in self._runtimes.values():
            with contextlib.suppress(Exception):
                await runtime.close()
        for channel in self._channels:
            await channel.close()
