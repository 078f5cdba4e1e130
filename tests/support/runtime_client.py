"""A scripted runtime: drives ``RuntimeLink`` over a real gRPC stream from a test.

The runtime sends frames from the test thread; a reader thread collects Host's frames,
so a test can wait for the welcome, for commands and for report results.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import runtime_pb2, runtime_pb2_grpc
from services.host.runtime.registry import PROTOCOL_REVISION
from tests.support.servers import auth_metadata

_END = object()


class ScriptedRuntime:
    """One runtime link, opened with a hello on construction."""

    def __init__(
        self,
        channel: grpc.Channel,
        *,
        runtime_id: str = "rt-1",
        instance_id: str = "instance-1",
        providers: tuple[str, ...] = ("demo",),
        principal: str = "service",
        guidance: bool = True,
        interrupt: bool = True,
        hello: bool = True,
    ) -> None:
        self._requests: queue.Queue[Any] = queue.Queue()
        self._frames: queue.Queue[Any] = queue.Queue()
        self.commands: queue.Queue[runtime_pb2.RuntimeCommand] = queue.Queue()
        self._results: dict[str, runtime_pb2.ReportResult] = {}
        self._results_ready = threading.Condition()
        self.error: grpc.RpcError | None = None
        stub = runtime_pb2_grpc.RuntimeLinkServiceStub(channel)
        self._call = stub.RuntimeLink(self._iterate(), metadata=auth_metadata(principal))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.welcome: runtime_pb2.RuntimeWelcome | None = None
        if hello:
            self.send(
                runtime_pb2.RuntimeLinkRequest(
                    hello=runtime_pb2.RuntimeHello(
                        runtime_id=runtime_id,
                        runtime_instance_id=instance_id,
                        protocol_revision=PROTOCOL_REVISION,
                        providers=list(providers),
                        capabilities=canonical_pb2.RuntimeCapabilities(
                            guidance=guidance, interrupt=interrupt, live_settings=True
                        ),
                    )
                )
            )
            frame = self._frames.get(timeout=10)
            assert frame.WhichOneof("frame") == "welcome", frame
            self.welcome = frame.welcome

    def _iterate(self) -> Iterator[runtime_pb2.RuntimeLinkRequest]:
        while True:
            item = self._requests.get()
            if item is _END:
                return
            yield item

    def _read(self) -> None:
        try:
            for frame in self._call:
                kind = frame.WhichOneof("frame")
                if kind == "command":
                    self.commands.put(frame.command)
                elif kind == "report_result":
                    with self._results_ready:
                        self._results[frame.report_result.report_id] = frame.report_result
                        self._results_ready.notify_all()
                else:
                    self._frames.put(frame)
        except grpc.RpcError as error:
            self.error = error
            self._frames.put(error)

    def send(self, request: runtime_pb2.RuntimeLinkRequest) -> None:
        """Send one frame."""
        self._requests.put(request)

    def report(
        self, workspace_id: str, session_id: str, report_id: str, *items: runtime_pb2.ReportItem
    ) -> runtime_pb2.ReportResult:
        """Send a report and wait for Host's verdict."""
        self.send_report(workspace_id, session_id, report_id, *items)
        return self.result(report_id)

    def send_report(
        self, workspace_id: str, session_id: str, report_id: str, *items: runtime_pb2.ReportItem
    ) -> None:
        """Send a report without waiting for Host's verdict (:meth:`result` reads it)."""
        self.send(
            runtime_pb2.RuntimeLinkRequest(
                report=runtime_pb2.RuntimeReport(
                    report_id=report_id,
                    workspace_id=workspace_id,
                    session_id=session_id,
                    items=list(items),
                )
            )
        )

    def result(self, report_id: str) -> runtime_pb2.ReportResult:
        """Wait (up to 10 s) for Host's verdict on the report ``report_id``."""
        with self._results_ready:
            done = self._results_ready.wait_for(lambda: report_id in self._results, timeout=10)
        assert done, f"no ReportResult for {report_id} (error: {self.error})"
        return self._results.pop(report_id)

    def next_command(self, timeout: float = 10) -> runtime_pb2.RuntimeCommand:
        """The next command Host sent."""
        return self.commands.get(timeout=timeout)

    def ack(
        self,
        command_id: str,
        status: runtime_pb2.CommandAckStatus.ValueType = runtime_pb2.COMMAND_ACK_STATUS_ACCEPTED,
    ) -> None:
        """Acknowledge a command."""
        self.send(
            runtime_pb2.RuntimeLinkRequest(
                command_ack=runtime_pb2.CommandAck(command_id=command_id, status=status)
            )
        )

    def next_frame(self, timeout: float = 10) -> Any:
        """The next non-command, non-result frame (or the stream's error)."""
        return self._frames.get(timeout=timeout)

    def close(self) -> None:
        """Half-close the stream and wait for Host to finish it."""
        self._requests.put(_END)
        self._reader.join(timeout=10)

    def cancel(self) -> None:
        """Drop the connection abruptly (a crashed runtime)."""
        self._call.cancel()
        self._reader.join(timeout=10)


def turn_patch(turn_id: str, phase: int, **fields: Any) -> runtime_pb2.ReportItem:
    """A ``turn_patch`` report item."""
    return runtime_pb2.ReportItem(
        turn_patch=runtime_pb2.TurnPatch(turn_id=turn_id, phase=phase, **fields)  # type: ignore[arg-type]
    )


def text_message(
    message_id: str,
    turn_id: str,
    text: str,
    role: int = canonical_pb2.MESSAGE_ROLE_ASSISTANT,
    *,
    visible: bool = True,
) -> runtime_pb2.ReportItem:
    """An assistant text ``message_snapshot`` item of Turn ``turn_id``.

    ``visible`` is the runtime's classification (HOST-MSG-1): assistant text is
    user-facing unless a test says otherwise.
    """
    return runtime_pb2.ReportItem(
        message_snapshot=runtime_pb2.MessageSnapshot(
            message_id=message_id,
            turn_id=turn_id,
            role=role,  # type: ignore[arg-type]
            kind=canonical_pb2.MESSAGE_KIND_TEXT,
            payload_json=f'{{"text": "{text}"}}',
            user_visible_assistant_response=visible,
        )
    )


def interaction(
    turn_id: str,
    request_id: str,
    status: int = canonical_pb2.INTERACTION_STATUS_PENDING,
    *,
    input_json: str = '{"command": "ls"}',
    kind: int = canonical_pb2.INTERACTION_KIND_PERMISSION,
) -> runtime_pb2.ReportItem:
    """An ``interaction_transition`` item."""
    return runtime_pb2.ReportItem(
        interaction_transition=runtime_pb2.InteractionTransition(
            turn_id=turn_id,
            request_id=request_id,
            status=status,  # type: ignore[arg-type]
            kind=kind,  # type: ignore[arg-type]
            tool_name="Bash",
            input_json=input_json,
            metadata_json="{}",
            title="Run ls?",
            summary="The agent wants to run ls",
        )
    )


def interaction_disposition(
    turn_id: str,
    request_id: str,
    disposition: int,
    *,
    operation_id: str,
    command_id: str,
) -> runtime_pb2.ReportItem:
    """An ``interaction_disposition`` item: what became of a delivered response.

    ``command_id`` is the ``deliver_interaction_response`` command of operation
    ``operation_id``; ``disposition`` is the Interaction status the runtime reports.
    """
    return runtime_pb2.ReportItem(
        interaction_disposition=runtime_pb2.InteractionResponseDisposition(
            operation_id=operation_id,
            command_id=command_id,
            turn_id=turn_id,
            request_id=request_id,
            disposition=disposition,  # type: ignore[arg-type]
        )
    )
