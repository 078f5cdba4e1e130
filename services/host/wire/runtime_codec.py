"""Translation between ``RuntimeLink`` frames and the runtime-link domain (HOST-RT-1).

Reports decode into :mod:`services.host.runtime.reports` items with canonical lowercase
strings (an unspecified enum becomes ``None``, which the domain rejects where the field is
required; an enum number the contract does not define, or a NUL character, is listed in
``invalid_fields`` and rejects the whole report, SEC-2);
outbox commands, stored in their proto3-JSON form, encode back into ``RuntimeCommand``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from google.protobuf import json_format

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import runtime_pb2
from grpcserver.request_checks import request_violations
from services.host.model.file_changes import FileChange
from services.host.runtime.registry import CommandAck, OutboundCommand, RuntimeIdentity
from services.host.runtime.reports import (
    InvalidField,
    ItemResult,
    MessageSnapshotItem,
    ReportItem,
    ReportVerdict,
    RuntimeReportInput,
    SessionLostItem,
    SessionPatchItem,
    TurnPatchItem,
)
from services.host.turns.interactions import DispositionInput, TransitionInput
from services.host.turns.tool_payload import ToolCallPhase, ToolCallSnapshot
from services.host.wire.messages import MESSAGE_KINDS, MESSAGE_ROLES
from services.host.wire.projection import (
    FILE_CHANGE_KINDS,
    INTERACTION_KINDS,
    INTERACTION_STATUSES,
    TURN_ORIGINS,
    TURN_OUTCOMES,
    TURN_PHASES,
)

K = TypeVar("K")


def _reverse(mapping: Mapping[str, K]) -> dict[K, str]:
    return {value: key for key, value in mapping.items()}


_PHASES = _reverse(TURN_PHASES)
_OUTCOMES = _reverse(TURN_OUTCOMES)
_ORIGINS = _reverse(TURN_ORIGINS)
_KINDS = _reverse(INTERACTION_KINDS)
_STATUSES = _reverse(INTERACTION_STATUSES)
_ROLES = _reverse(MESSAGE_ROLES)
_MESSAGE_KINDS = _reverse(MESSAGE_KINDS)
_FILE_CHANGE_KINDS = _reverse(FILE_CHANGE_KINDS)
_ACKS = {
    runtime_pb2.COMMAND_ACK_STATUS_ACCEPTED: "accepted",
    runtime_pb2.COMMAND_ACK_STATUS_REJECTED: "rejected",
    runtime_pb2.COMMAND_ACK_STATUS_FAILED: "failed",
}
_OUTCOME_ENUMS = {
    "applied": runtime_pb2.REPORT_OUTCOME_APPLIED,
    "already_applied": runtime_pb2.REPORT_OUTCOME_ALREADY_APPLIED,
    "conflict": runtime_pb2.REPORT_OUTCOME_CONFLICT,
    "rejected": runtime_pb2.REPORT_OUTCOME_REJECTED,
}


def identity_from_hello(
    hello: runtime_pb2.RuntimeHello, workspaces: frozenset[str]
) -> RuntimeIdentity:
    """The runtime's identity from its hello and the workspaces of its token."""
    caps = hello.capabilities
    return RuntimeIdentity(
        runtime_id=hello.runtime_id,
        instance_id=hello.runtime_instance_id,
        providers=frozenset(hello.providers),
        target_ids=frozenset(hello.agent_target_ids),
        capabilities={
            "guidance": caps.guidance,
            "interrupt": caps.interrupt,
            "live_settings": caps.live_settings,
            "subagents": caps.subagents,
        },
        workspaces=workspaces,
    )


def _opt(message: Any, name: str) -> Any:
    return getattr(message, name) if message.HasField(name) else None


def _item(item: runtime_pb2.ReportItem) -> ReportItem | None:
    kind = item.WhichOneof("item")
    if kind == "session_patch":
        patch = item.session_patch
        usage = None
        if patch.HasField("usage"):
            usage = json_format.MessageToJson(
                patch.usage, preserving_proto_field_name=True, indent=None
            )
        return SessionPatchItem(
            agent_target_id=_opt(patch, "agent_target_id"),
            parent_session_id=_opt(patch, "parent_session_id"),
            parent_turn_id=_opt(patch, "parent_turn_id"),
            title=_opt(patch, "title"),
            cwd=_opt(patch, "cwd"),
            usage_json=usage,
            provider_session_ref=_opt(patch, "provider_session_ref"),
            runtime_context_json=_opt(patch, "runtime_context_json"),
        )
    if kind == "turn_patch":
        turn = item.turn_patch
        return TurnPatchItem(
            turn_id=turn.turn_id,
            phase=_PHASES.get(turn.phase),
            outcome=_OUTCOMES.get(turn.outcome),
            origin=_ORIGINS.get(turn.origin),
            root_turn_id=_opt(turn, "root_turn_id"),
            failure_message=_opt(turn, "failure_message"),
            result_anchor_message_id=_opt(turn, "result_anchor_message_id"),
            occurred_at_unix_ms=turn.occurred_at_unix_ms,
            file_changes=(
                _file_changes(turn.file_changes) if turn.HasField("file_changes") else None
            ),
        )
    if kind == "interaction_transition":
        tr = item.interaction_transition
        options = [{"option_id": o.option_id, "label": o.label} for o in tr.options]
        return TransitionInput(
            turn_id=tr.turn_id,
            request_id=tr.request_id,
            status=_STATUSES.get(tr.status, ""),
            kind=_KINDS.get(tr.kind, ""),
            tool_name=_opt(tr, "tool_name"),
            input_json=tr.input_json,
            metadata_json=tr.metadata_json,
            title=tr.title,
            summary=tr.summary,
            options_json=json.dumps(options) if options else None,
            occurred_at_unix_ms=tr.occurred_at_unix_ms,
        )
    if kind == "message_snapshot":
        snap = item.message_snapshot
        tool_call = None
        if snap.WhichOneof("body") == "tool_call":
            tool_call = tool_call_from_proto(snap.tool_call)
        return MessageSnapshotItem(
            message_id=snap.message_id,
            turn_id=_opt(snap, "turn_id"),
            role=_ROLES.get(snap.role),
            kind=_MESSAGE_KINDS.get(snap.kind),
            occurred_at_unix_ms=snap.occurred_at_unix_ms,
            payload_json=snap.payload_json if snap.WhichOneof("body") == "payload_json" else None,
            tool_call=tool_call,
            user_visible_assistant_response=_opt(snap, "user_visible_assistant_response"),
        )
    if kind == "interaction_disposition":
        disp = item.interaction_disposition
        return DispositionInput(
            operation_id=disp.operation_id,
            command_id=disp.command_id,
            turn_id=disp.turn_id,
            request_id=disp.request_id,
            disposition=_STATUSES.get(disp.disposition, ""),
            detail=_opt(disp, "detail"),
        )
    if kind == "session_lost":
        return SessionLostItem(item.session_lost.reason)
    return None


def _file_changes(snapshot: canonical_pb2.FileChangeSet) -> tuple[FileChange, ...]:
    """A reported snapshot; an unspecified kind decodes as ``None`` (the domain rejects it)."""
    return tuple(
        FileChange(
            path=entry.path,
            change=_FILE_CHANGE_KINDS.get(entry.change),
            previous_path=_opt(entry, "previous_path"),
        )
        for entry in snapshot.changes
    )


_TOOL_PHASES = {
    runtime_pb2.TOOL_CALL_PHASE_RUNNING: ToolCallPhase.RUNNING,
    runtime_pb2.TOOL_CALL_PHASE_COMPLETED: ToolCallPhase.COMPLETED,
    runtime_pb2.TOOL_CALL_PHASE_FAILED: ToolCallPhase.FAILED,
}


def tool_call_from_proto(call: runtime_pb2.ToolCallSnapshot) -> ToolCallSnapshot:
    """The projection input of a tool-call message (an unspecified phase reads as running)."""
    return ToolCallSnapshot(
        call_id=call.call_id,
        tool_name=call.tool_name,
        tool_kind=call.tool_kind,
        phase=_TOOL_PHASES.get(call.phase, ToolCallPhase.RUNNING),
        input_json=call.input_json,
        provider_status=_opt(call, "provider_status"),
        exit_code=_opt(call, "exit_code"),
        title=_opt(call, "title"),
        output_text=_opt(call, "output_text"),
        error_text=_opt(call, "error_text"),
        stdout=_opt(call, "stdout"),
        stderr=_opt(call, "stderr"),
        matches_json=_opt(call, "matches_json"),
        saved_paths=tuple(call.saved_paths),
        file_changes_json=_opt(call, "file_changes_json"),
        structured_content_json=_opt(call, "structured_content_json"),
        provider_result_json=_opt(call, "provider_result_json"),
        steps=tuple(tool_call_from_proto(step) for step in call.steps),
    )


_ITEM_PATH = re.compile(r"items\[(\d+)\]")


def _invalid_fields(report: runtime_pb2.RuntimeReport) -> tuple[InvalidField, ...]:
    """Unknown enum numbers and NUL characters anywhere in the report (SEC-2)."""
    found = []
    for violation in request_violations(report):
        at = _ITEM_PATH.match(violation.field)
        index = int(at.group(1)) if at is not None else 0
        found.append(InvalidField(index, violation.field, violation.description))
    return tuple(found)


def report_from_proto(report: runtime_pb2.RuntimeReport) -> RuntimeReportInput:
    """Decode a report (items keep their order); invalid values are listed, not mapped."""
    return RuntimeReportInput(
        report_id=report.report_id,
        workspace_id=report.workspace_id,
        session_id=report.session_id,
        items=tuple(_item(item) for item in report.items),
        invalid_fields=_invalid_fields(report),
    )


def verdict_to_proto(verdict: ReportVerdict) -> runtime_pb2.ReportResult:
    """Host's verdict as a ``ReportResult``."""
    result = runtime_pb2.ReportResult(
        report_id=verdict.report_id,
        outcome=_OUTCOME_ENUMS[verdict.outcome],
        item_results=[_item_result(r) for r in verdict.item_results],
    )
    if verdict.reason is not None:
        result.reason = verdict.reason
    return result


def _item_result(result: ItemResult) -> runtime_pb2.ReportItemResult:
    message = runtime_pb2.ReportItemResult(
        index=result.index, outcome=_OUTCOME_ENUMS[result.outcome], stale=result.stale
    )
    if result.message is not None:
        message.message = result.message
    return message


def ack_from_proto(ack: runtime_pb2.CommandAck) -> CommandAck:
    """A command acknowledgement; an unspecified status counts as a failed delivery."""
    return CommandAck(
        command_id=ack.command_id,
        status=_ACKS.get(ack.status, "failed"),
        reason=_opt(ack, "reason"),
        message=_opt(ack, "message"),
    )


def command_to_proto(command: OutboundCommand) -> runtime_pb2.RuntimeCommand:
    """An outbox command as the ``RuntimeCommand`` frame (unknown payload keys ignored)."""
    message = runtime_pb2.RuntimeCommand(
        command_id=command.command_id,
        workspace_id=command.workspace_id,
        session_id=command.session_id,
        issued_at_unix_ms=command.issued_at_unix_ms,
    )
    body = getattr(message, command.kind)
    body.SetInParent()
    json_format.ParseDict(dict(command.payload), body, ignore_unknown_fields=True)
    return message


__all__ = [
    "ack_from_proto",
    "command_to_proto",
    "identity_from_hello",
    "report_from_proto",
    "verdict_to_proto",
]
