"""The demo agent's deterministic behaviour, expressed as runtime-link frames (an adapter).

For each started Turn it:

1. creates or refreshes the Session's resources (sidecar state, copied attachments, workspace
   scratch directory, agent lease; :mod:`services.demoruntime.resources`), when it was given a
   resource layout, and reports the Turn ``running``;
2. when the Turn was delegated with ``@agent`` (Host rewrote the prompt to ask for ``Task``
   calls, HOST-MENT-2), reports the ``Task`` tool call it would make for each subagent;
3. when the user's text mentions "permission", asks a permission Interaction, moves the Turn to
   ``awaiting_interaction`` and waits for the answer (``DeliverInteractionResponseCommand``),
   then reports the disposition; the first terminal disposition of every request goes to a
   bounded registry (:mod:`services.demoruntime.dispositions`), which answers
   ``query_interaction_disposition`` and re-sent answers once the request is gone (HOST-INT-6);
4. runs a pretend tool (``demo.echo``) whose output streams in chunks as tool-output deltas
   anchored on the tool-call message;
5. streams its reply as text deltas and settles the Turn with the full reply and its
   file-change snapshot (HOST-TURN-8): the pretend tool's ``demo-echo.txt``, when it ran.

``stop_turn`` and ``interrupt_turn`` cancel the Turn; ``release_session`` (Host deleted the
Session) drops everything held in memory for the Session but leaves its resources on disk: a
deleted Session can be restored, and the maintenance service releases them after the purge
(MAINT-OUT-1). ``resume_session`` (HOST-SES-9) needs nothing: the demo keeps no provider
process to re-attach. Every command is acknowledged ``ACCEPTED``, except an answer the request
cannot take: one for an unknown request, or one that differs from the answer already applied,
is ``REJECTED`` (HOST-RT-5).

Deltas come from :class:`delta_normalizer.DeltaNormalizer` fed with cumulative snapshots, the
way a real provider adapter would use it; the transport never diffs anything.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import runtime_pb2
from delta_normalizer import DeltaNormalizer, DeltaOp
from services.demoruntime.dispositions import DispositionRegistry, Terminal
from services.demoruntime.resources import write_turn_resources
from session_resources import ResourceLayout

__all__ = ["DemoAgent"]

_log = logging.getLogger(__name__)

_TARGETS = {
    "text": canonical_pb2.DELTA_TARGET_TEXT,
    "reasoning": canonical_pb2.DELTA_TARGET_REASONING,
    "tool_output": canonical_pb2.DELTA_TARGET_TOOL_OUTPUT,
}
_OPERATIONS = {
    "set": canonical_pb2.DELTA_OPERATION_SET,
    "append_text": canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
}
_DELEGATION = re.compile(r"call Task for each of these subagents: (.*?)\. ")
_AGENT = re.compile(r"`@([^`]+)`")
_ALLOW = frozenset({"allow", "approve", "accept", "yes", "allow_once"})
_DISPOSITIONS = {
    "pending": canonical_pb2.INTERACTION_STATUS_PENDING,
    "answered": canonical_pb2.INTERACTION_STATUS_ANSWERED,
    "superseded": canonical_pb2.INTERACTION_STATUS_SUPERSEDED,
    "interrupted": canonical_pb2.INTERACTION_STATUS_INTERRUPTED,
}

Send = Callable[[runtime_pb2.RuntimeLinkRequest], None]


@dataclass(frozen=True)
class _Answer:
    action: str
    option_id: str | None
    payload_json: str | None
    operation_id: str
    command_id: str


def _user_text(prompt: str) -> str:
    return prompt.split("User request:\n", 1)[-1].strip()


def delegated_agents(prompt: str) -> list[str]:
    """The subagents a rewritten prompt asks the model to call ``Task`` for."""
    found = _DELEGATION.search(prompt)
    return _AGENT.findall(found.group(1)) if found else []


class DemoAgent:
    """Runs demo Turns and answers Host commands on one runtime link.

    Args:
        send: Queues a frame on the link (in order).
        step_delay_seconds: Pause between streamed chunks.
        resources: Where each started Turn creates the Session's resources; ``None`` creates
            none.
    """

    def __init__(
        self,
        send: Send,
        step_delay_seconds: float,
        resources: ResourceLayout | None = None,
        dispositions: DispositionRegistry | None = None,
    ) -> None:
        self._send = send
        self._delay = step_delay_seconds
        self._resources = resources
        # Outlives the link when the runtime passes its own: a query after a reconnect
        # still finds what became of a request.
        self.dispositions = DispositionRegistry() if dispositions is None else dispositions
        self._turns: dict[str, asyncio.Task[None]] = {}
        self._turn_sessions: dict[str, tuple[str, str]] = {}
        self._answers: dict[tuple[str, str], asyncio.Future[_Answer]] = {}

    # ------------------------------------------------------------------ commands

    def handle(self, command: runtime_pb2.RuntimeCommand) -> None:
        """Acknowledge a command (``ACCEPTED``) and act on it.

        ``release_session`` drops the Session's state; a release of a Session it holds nothing
        for (already settled, or a runtime restarted since) is accepted all the same.
        """
        kind = command.WhichOneof("command")
        if kind == "deliver_interaction_response":
            self._deliver(command)
            return
        if kind == "query_interaction_disposition":
            self._query(command)
            return
        self._ack(command.command_id)
        if kind == "start_turn":
            turn_id = command.start_turn.turn_id
            if turn_id not in self._turns:
                task = asyncio.create_task(self._run_turn(command))
                self._turns[turn_id] = task
                self._turn_sessions[turn_id] = (command.workspace_id, command.session_id)
                task.add_done_callback(self._forget_turn(turn_id))
        elif kind in ("stop_turn", "interrupt_turn"):
            turn_id = getattr(command, kind).turn_id
            running = self._turns.get(turn_id)
            if running is not None:
                running.cancel()  # Host already settled it: report nothing more
        elif kind == "release_session":
            self.release(command.workspace_id, command.session_id)

    def release(self, workspace_id: str, session_id: str) -> None:
        """Drop everything held in memory for one Session (``ReleaseSessionCommand``).

        Its running Turns are cancelled and the answers they wait for dropped, so nothing more
        is reported for it. Its resources on disk stay (the Session may be restored; the
        maintenance service releases them after the purge).
        """
        key = (workspace_id, session_id)
        for turn_id, owner in list(self._turn_sessions.items()):
            if owner != key:
                continue
            running = self._turns.get(turn_id)
            if running is not None:
                running.cancel()
            for answer_key in [k for k in self._answers if k[0] == turn_id]:
                self._answers.pop(answer_key).cancel()
        self.dispositions.forget_session(workspace_id, session_id)

    def holds(self, workspace_id: str, session_id: str) -> bool:
        """Whether any state of the Session is held (a running Turn or an awaited answer)."""
        return any(owner == (workspace_id, session_id) for owner in self._turn_sessions.values())

    def _forget_turn(self, turn_id: str) -> Callable[[asyncio.Task[None]], None]:
        def forget(_task: asyncio.Task[None]) -> None:
            self._turns.pop(turn_id, None)
            self._turn_sessions.pop(turn_id, None)

        return forget

    def close(self) -> None:
        """Cancel every running Turn (the link is going away)."""
        for task in list(self._turns.values()):
            task.cancel()

    def _ack(
        self,
        command_id: str,
        status: runtime_pb2.CommandAckStatus.ValueType = runtime_pb2.COMMAND_ACK_STATUS_ACCEPTED,
        reason: str | None = None,
    ) -> None:
        ack = runtime_pb2.CommandAck(command_id=command_id, status=status)
        if reason is not None:
            ack.reason = reason
        self._send(runtime_pb2.RuntimeLinkRequest(command_ack=ack))

    # --------------------------------------------------------------- dispositions

    def _deliver(self, command: runtime_pb2.RuntimeCommand) -> None:
        """Apply an answer to its live request, or judge a re-sent one by the registry.

        A live request takes the answer (its first terminal disposition, ``answered``, is
        recorded at once). Once the request is gone, an identical re-sent answer is accepted
        and its ``answered`` reported again without applying it twice; a changed one is
        rejected; a request that ended unanswered reports its disposition; an unknown one is
        rejected: its absence is no evidence that it was answered.
        """
        answer = command.deliver_interaction_response
        option_id = answer.option_id if answer.HasField("option_id") else None
        payload = answer.payload_json if answer.HasField("payload_json") else None
        key = (command.workspace_id, command.session_id, answer.turn_id, answer.request_id)
        terminal = self.dispositions.get(key)
        future = self._answers.get((answer.turn_id, answer.request_id))
        if terminal is None and future is not None and not future.done():
            self.dispositions.record(key, Terminal("answered", answer.action, option_id, payload))
            self._ack(command.command_id)
            future.set_result(
                _Answer(
                    answer.action,
                    option_id,
                    payload,
                    answer.operation_id,
                    command.command_id,
                )
            )
            return
        if terminal is None:
            self._ack(
                command.command_id, runtime_pb2.COMMAND_ACK_STATUS_REJECTED, "UNKNOWN_REQUEST"
            )
            return
        if terminal.disposition == "answered":
            if not terminal.same_answer(answer.action, option_id, payload):
                self._ack(
                    command.command_id, runtime_pb2.COMMAND_ACK_STATUS_REJECTED, "ANSWER_CONFLICT"
                )
                return
            self._ack(command.command_id)
        else:
            self._ack(command.command_id, runtime_pb2.COMMAND_ACK_STATUS_REJECTED, "REQUEST_ENDED")
        self._report_disposition(command, answer.operation_id, terminal.disposition)

    def _query(self, command: runtime_pb2.RuntimeCommand) -> None:
        """Answer a disposition query from the registry, else from the live request.

        ``pending`` when the request still waits for an answer; no disposition (unknown) when
        nothing is known of it.
        """
        query = command.query_interaction_disposition
        key = (command.workspace_id, command.session_id, query.turn_id, query.request_id)
        terminal = self.dispositions.get(key)
        future = self._answers.get((query.turn_id, query.request_id))
        self._ack(command.command_id)
        if terminal is not None:
            self._report_disposition(command, query.operation_id, terminal.disposition)
        elif future is not None and not future.done():
            self._report_disposition(command, query.operation_id, "pending")
        else:
            self._report_disposition(
                command, query.operation_id, None, detail="no live or recorded request"
            )

    def _report_disposition(
        self,
        command: runtime_pb2.RuntimeCommand,
        operation_id: str,
        disposition: str | None,
        *,
        detail: str | None = None,
    ) -> None:
        target = (
            command.query_interaction_disposition
            if command.HasField("query_interaction_disposition")
            else command.deliver_interaction_response
        )
        item = runtime_pb2.InteractionResponseDisposition(
            operation_id=operation_id,
            command_id=command.command_id,
            turn_id=target.turn_id,
            request_id=target.request_id,
            disposition=_DISPOSITIONS.get(
                disposition or "", canonical_pb2.INTERACTION_STATUS_UNSPECIFIED
            ),
        )
        if detail is not None:
            item.detail = detail
        self._report(
            command.workspace_id,
            command.session_id,
            runtime_pb2.ReportItem(interaction_disposition=item),
        )

    # --------------------------------------------------------------------- frames

    def _report(self, ws: str, sid: str, *items: runtime_pb2.ReportItem) -> None:
        self._send(
            runtime_pb2.RuntimeLinkRequest(
                report=runtime_pb2.RuntimeReport(
                    report_id=f"demo-{uuid.uuid4()}",
                    workspace_id=ws,
                    session_id=sid,
                    items=list(items),
                )
            )
        )

    def _deltas(self, ws: str, sid: str, turn_id: str, ops: list[DeltaOp]) -> None:
        if not ops:
            return
        deltas = []
        for op in ops:
            delta = canonical_pb2.MessageDelta(
                workspace_id=ws,
                session_id=sid,
                turn_id=turn_id,
                message_id=op.message_id,
                target=_TARGETS[op.target],
                operation=_OPERATIONS[op.operation],
                text=op.text,
            )
            if op.offset_bytes is not None:
                delta.offset_bytes = op.offset_bytes
            deltas.append(delta)
        self._send(
            runtime_pb2.RuntimeLinkRequest(deltas=runtime_pb2.MessageDeltaBatch(deltas=deltas))
        )

    # ---------------------------------------------------------------------- turns

    async def _run_turn(self, command: runtime_pb2.RuntimeCommand) -> None:
        try:
            await self._script(command)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a broken demo turn settles failed, never hangs
            _log.exception("demo turn failed")
            self._report(
                command.workspace_id,
                command.session_id,
                _turn(command.start_turn.turn_id, canonical_pb2.TURN_PHASE_SETTLED, failed=True),
            )

    async def _script(self, command: runtime_pb2.RuntimeCommand) -> None:
        ws, sid = command.workspace_id, command.session_id
        start = command.start_turn
        turn_id = start.turn_id
        text = _user_text(start.prompt)
        normalizer = DeltaNormalizer()
        if self._resources is not None:
            # A few small files, written off the event loop that carries every Session's link.
            await asyncio.to_thread(write_turn_resources, self._resources, command)
        self._report(ws, sid, _turn(turn_id, canonical_pb2.TURN_PHASE_RUNNING))
        for name in delegated_agents(start.prompt):
            self._report(ws, sid, _task_call(turn_id, name, text))
        allowed = True
        if "permission" in text.lower():
            allowed = await self._ask_permission(ws, sid, turn_id)
        if allowed:
            await self._pretend_tool(ws, sid, turn_id, text, normalizer)
        reply = (
            f'Demo agent here. You said: "{text}". '
            + (
                "I ran a pretend tool; its output is above."
                if allowed
                else "Permission was denied, so I skipped the tool."
            )
            + " Nothing left the machine."
        )
        reply_id = f"{turn_id}:reply"
        words = reply.split(" ")
        for count in range(1, len(words) + 1):
            self._deltas(ws, sid, turn_id, normalizer.text(reply_id, " ".join(words[:count])))
            await asyncio.sleep(self._delay)
        self._report(
            ws,
            sid,
            _text(reply_id, turn_id, reply),
            _turn(turn_id, canonical_pb2.TURN_PHASE_SETTLED, touched=allowed),
        )

    async def _ask_permission(self, ws: str, sid: str, turn_id: str) -> bool:
        request_id = f"{turn_id}:permission"
        future: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        self._answers[(turn_id, request_id)] = future
        try:
            self._report(
                ws,
                sid,
                runtime_pb2.ReportItem(
                    interaction_transition=runtime_pb2.InteractionTransition(
                        turn_id=turn_id,
                        request_id=request_id,
                        status=canonical_pb2.INTERACTION_STATUS_PENDING,
                        kind=canonical_pb2.INTERACTION_KIND_PERMISSION,
                        tool_name="demo.echo",
                        input_json=json.dumps({"command": "echo demo"}),
                        metadata_json="{}",
                        title="Run demo.echo?",
                        summary="The demo agent wants to run its pretend tool.",
                        options=[
                            canonical_pb2.InteractionOption(option_id="allow", label="Allow"),
                            canonical_pb2.InteractionOption(option_id="deny", label="Deny"),
                        ],
                    )
                ),
                _turn(turn_id, canonical_pb2.TURN_PHASE_AWAITING_INTERACTION),
            )
            answer = await future
        except asyncio.CancelledError:
            if self._answers.get((turn_id, request_id)) is future:
                # Stopped or interrupted unanswered (a release drops the request instead).
                self.dispositions.record((ws, sid, turn_id, request_id), Terminal("superseded"))
            raise
        finally:
            self._answers.pop((turn_id, request_id), None)
        self._report(
            ws,
            sid,
            runtime_pb2.ReportItem(
                interaction_disposition=runtime_pb2.InteractionResponseDisposition(
                    operation_id=answer.operation_id,
                    command_id=answer.command_id,
                    turn_id=turn_id,
                    request_id=request_id,
                    disposition=canonical_pb2.INTERACTION_STATUS_ANSWERED,
                )
            ),
            _turn(turn_id, canonical_pb2.TURN_PHASE_RUNNING),
        )
        return answer.action.lower() in _ALLOW or answer.option_id == "allow"

    async def _pretend_tool(
        self, ws: str, sid: str, turn_id: str, text: str, normalizer: DeltaNormalizer
    ) -> None:
        call_id = f"{turn_id}:tool"
        self._report(ws, sid, _tool(call_id, turn_id, runtime_pb2.TOOL_CALL_PHASE_RUNNING))
        # The anchor's report went first; held output (none here) would follow as one set.
        self._deltas(ws, sid, turn_id, normalizer.anchor(call_id))
        output = ""
        for index, chunk in enumerate(_chunks(text), start=1):
            line = f"[{index}] {chunk}\n"
            output += line
            self._deltas(ws, sid, turn_id, normalizer.tool_output_chunk(call_id, line))
            await asyncio.sleep(self._delay)
        self._report(
            ws, sid, _tool(call_id, turn_id, runtime_pb2.TOOL_CALL_PHASE_COMPLETED, output)
        )
        normalizer.forget(call_id)


def _chunks(text: str) -> list[str]:
    words = text.split() or ["(empty)"]
    return [" ".join(words[i : i + 3]) for i in range(0, min(len(words), 12), 3)] + ["done"]


def _turn(
    turn_id: str,
    phase: canonical_pb2.TurnPhase.ValueType,
    *,
    failed: bool = False,
    touched: bool = False,
) -> runtime_pb2.ReportItem:
    patch = runtime_pb2.TurnPatch(turn_id=turn_id, phase=phase)
    if phase == canonical_pb2.TURN_PHASE_SETTLED:
        patch.outcome = (
            canonical_pb2.TURN_OUTCOME_FAILED if failed else canonical_pb2.TURN_OUTCOME_COMPLETED
        )
        patch.result_anchor_message_id = f"{turn_id}:reply"
        # The Turn's file-change snapshot (HOST-TURN-8): what the pretend tool wrote.
        patch.file_changes.SetInParent()
        if touched:
            patch.file_changes.changes.add(
                path="demo-echo.txt", change=canonical_pb2.FILE_CHANGE_KIND_MODIFIED
            )
    return runtime_pb2.ReportItem(turn_patch=patch)


def _text(message_id: str, turn_id: str, text: str) -> runtime_pb2.ReportItem:
    return runtime_pb2.ReportItem(
        message_snapshot=runtime_pb2.MessageSnapshot(
            message_id=message_id,
            turn_id=turn_id,
            role=canonical_pb2.MESSAGE_ROLE_ASSISTANT,
            kind=canonical_pb2.MESSAGE_KIND_TEXT,
            payload_json=json.dumps({"text": text}),
            user_visible_assistant_response=True,  # the producer classifies (HOST-MSG-1)
        )
    )


def _tool(
    call_id: str, turn_id: str, phase: runtime_pb2.ToolCallPhase.ValueType, output: str = ""
) -> runtime_pb2.ReportItem:
    snapshot = runtime_pb2.ToolCallSnapshot(
        call_id=call_id,
        tool_name="demo.echo",
        tool_kind="demo",
        phase=phase,
        title="demo.echo",
        input_json=json.dumps({"command": "echo demo"}),
    )
    if output:
        snapshot.output_text = output
    return runtime_pb2.ReportItem(
        message_snapshot=runtime_pb2.MessageSnapshot(
            message_id=call_id,
            turn_id=turn_id,
            role=canonical_pb2.MESSAGE_ROLE_ASSISTANT,
            kind=canonical_pb2.MESSAGE_KIND_TOOL_CALL,
            tool_call=snapshot,
            user_visible_assistant_response=False,
        )
    )


def _task_call(turn_id: str, name: str, brief: str) -> runtime_pb2.ReportItem:
    return runtime_pb2.ReportItem(
        message_snapshot=runtime_pb2.MessageSnapshot(
            message_id=f"{turn_id}:task:{name}",
            turn_id=turn_id,
            role=canonical_pb2.MESSAGE_ROLE_ASSISTANT,
            kind=canonical_pb2.MESSAGE_KIND_TOOL_CALL,
            tool_call=runtime_pb2.ToolCallSnapshot(
                call_id=f"{turn_id}:task:{name}",
                tool_name="Task",
                tool_kind="agent",
                phase=runtime_pb2.TOOL_CALL_PHASE_COMPLETED,
                provider_status="success",
                title=f"Task @{name}",
                input_json=json.dumps({"subagent_type": name, "prompt": brief}),
                output_text=f"(demo) would delegate to @{name}",
            ),
            user_visible_assistant_response=False,
        )
    )
