"""Record -> proto projections of the canonical entities (HOST-SES-3, CON-4).

One function per entity, each stable and independent so other wire modules can import and
extend this module with targeted additions. Projections never expose provider-private
context (``provider_resume_json``) or any legacy status; they only translate what the
repositories read.
"""

from __future__ import annotations

import json

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2
from services.host.model.cursor_bounds import checked_cursor
from services.host.model.file_changes import FileChange
from services.host.model.records import (
    Capabilities,
    InteractionRecord,
    SessionRecord,
    SessionSettingsValue,
    TurnRecord,
)

TURN_PHASES = {
    "queued": canonical_pb2.TURN_PHASE_QUEUED,
    "running": canonical_pb2.TURN_PHASE_RUNNING,
    "awaiting_interaction": canonical_pb2.TURN_PHASE_AWAITING_INTERACTION,
    "settled": canonical_pb2.TURN_PHASE_SETTLED,
}
TURN_OUTCOMES = {
    "completed": canonical_pb2.TURN_OUTCOME_COMPLETED,
    "failed": canonical_pb2.TURN_OUTCOME_FAILED,
    "canceled": canonical_pb2.TURN_OUTCOME_CANCELED,
    "interrupted": canonical_pb2.TURN_OUTCOME_INTERRUPTED,
}
TURN_ORIGINS = {
    "user": canonical_pb2.TURN_ORIGIN_USER,
    "import": canonical_pb2.TURN_ORIGIN_IMPORT,
    "goal": canonical_pb2.TURN_ORIGIN_GOAL,
    "plan_implementation": canonical_pb2.TURN_ORIGIN_PLAN_IMPLEMENTATION,
    "subagent": canonical_pb2.TURN_ORIGIN_SUBAGENT,
}
FILE_CHANGE_KINDS = {
    "created": canonical_pb2.FILE_CHANGE_KIND_CREATED,
    "modified": canonical_pb2.FILE_CHANGE_KIND_MODIFIED,
    "deleted": canonical_pb2.FILE_CHANGE_KIND_DELETED,
    "renamed": canonical_pb2.FILE_CHANGE_KIND_RENAMED,
}
INTERACTION_KINDS = {
    "permission": canonical_pb2.INTERACTION_KIND_PERMISSION,
    "question": canonical_pb2.INTERACTION_KIND_QUESTION,
    "constraint": canonical_pb2.INTERACTION_KIND_CONSTRAINT,
    "other": canonical_pb2.INTERACTION_KIND_OTHER,
}
INTERACTION_STATUSES = {
    "pending": canonical_pb2.INTERACTION_STATUS_PENDING,
    "resolving": canonical_pb2.INTERACTION_STATUS_RESOLVING,
    "answered": canonical_pb2.INTERACTION_STATUS_ANSWERED,
    "superseded": canonical_pb2.INTERACTION_STATUS_SUPERSEDED,
    "interrupted": canonical_pb2.INTERACTION_STATUS_INTERRUPTED,
}


def settings_to_proto(settings: SessionSettingsValue) -> canonical_pb2.SessionSettings:
    """Typed Session settings; unset values stay unset."""
    message = canonical_pb2.SessionSettings()
    if settings.model is not None:
        message.model = settings.model
    if settings.reasoning_effort is not None:
        message.reasoning_effort = settings.reasoning_effort
    if settings.permission_mode is not None:
        message.permission_mode = settings.permission_mode
    if settings.speed is not None:
        message.speed = settings.speed
    return message


def settings_from_proto(message: canonical_pb2.SessionSettings) -> SessionSettingsValue:
    """The set fields of a request's settings (presence kept)."""
    return SessionSettingsValue(
        model=message.model if message.HasField("model") else None,
        reasoning_effort=message.reasoning_effort if message.HasField("reasoning_effort") else None,
        permission_mode=message.permission_mode if message.HasField("permission_mode") else None,
        speed=message.speed if message.HasField("speed") else None,
    )


def capabilities_to_proto(capabilities: Capabilities) -> canonical_pb2.RuntimeCapabilities:
    """Runtime capabilities of a target or Session."""
    return canonical_pb2.RuntimeCapabilities(
        guidance=capabilities.guidance,
        interrupt=capabilities.interrupt,
        live_settings=capabilities.live_settings,
        subagents=capabilities.subagents,
    )


def session_to_proto(record: SessionRecord) -> canonical_pb2.Session:
    """The canonical Session entity (HOST-SES-3).

    Raises:
        OutOfRange: ``message_version`` is above 2^53-1 (CON-4).
    """
    message = canonical_pb2.Session(
        workspace_id=record.workspace_id,
        session_id=record.session_id,
        root_session_id=record.root_session_id,
        agent_target_id=record.agent_target_id or "",
        provider=record.provider,
        title=record.title,
        cwd=record.cwd or "",
        rail_section_key=record.rail_section_key,
        settings=settings_to_proto(record.settings),
        capabilities=capabilities_to_proto(record.capabilities),
        usage=canonical_pb2.SessionUsage(
            input_tokens=record.usage.input_tokens,
            output_tokens=record.usage.output_tokens,
            cached_input_tokens=record.usage.cached_input_tokens,
        ),
        message_version=checked_cursor(record.message_version, field="message_version"),
        created_at_unix_ms=record.created_at_unix_ms,
        updated_at_unix_ms=record.updated_at_unix_ms,
    )
    if record.parent_session_id is not None:
        message.parent_session_id = record.parent_session_id
    if record.parent_turn_id is not None:
        message.parent_turn_id = record.parent_turn_id
    if record.rail_project_path is not None:
        message.rail_project_path = record.rail_project_path
    if record.pinned_at_unix_ms is not None:
        message.pinned_at_unix_ms = record.pinned_at_unix_ms
    if record.active_turn_id is not None:
        message.active_turn_id = record.active_turn_id
    if record.tombstone is not None:
        message.tombstone.CopyFrom(
            canonical_pb2.Tombstone(
                deleted_at_unix_ms=record.tombstone.deleted_at_unix_ms,
                generation=record.tombstone.generation or "",
                component_size=record.tombstone.component_size or 0,
                legacy=record.tombstone.legacy,
            )
        )
    return message


def turn_to_proto(record: TurnRecord) -> canonical_pb2.Turn:
    """The canonical Turn entity; unknown stored enum strings read as UNSPECIFIED."""
    message = canonical_pb2.Turn(
        workspace_id=record.workspace_id,
        session_id=record.session_id,
        turn_id=record.turn_id,
        phase=TURN_PHASES.get(record.phase, canonical_pb2.TURN_PHASE_UNSPECIFIED),
        outcome=TURN_OUTCOMES.get(record.outcome or "", canonical_pb2.TURN_OUTCOME_UNSPECIFIED),
        origin=TURN_ORIGINS.get(record.origin, canonical_pb2.TURN_ORIGIN_UNSPECIFIED),
        version=record.version,
        created_at_unix_ms=record.created_at_unix_ms,
        result_resolved_empty=record.result_resolved_empty,
    )
    if record.client_submit_id is not None:
        message.client_submit_id = record.client_submit_id
    if record.started_at_unix_ms is not None:
        message.started_at_unix_ms = record.started_at_unix_ms
    if record.settled_at_unix_ms is not None:
        message.settled_at_unix_ms = record.settled_at_unix_ms
    if record.result_message_id is not None:
        message.result_message_id = record.result_message_id
    if record.root_turn_id is not None:
        message.root_turn_id = record.root_turn_id
    if record.failure_message is not None:
        message.failure_message = record.failure_message
    message.file_changes.extend(file_change_to_proto(entry) for entry in record.file_changes)
    return message


def file_change_to_proto(entry: FileChange) -> canonical_pb2.FileChange:
    """One file-change entry (HOST-TURN-8)."""
    unspecified = canonical_pb2.FILE_CHANGE_KIND_UNSPECIFIED
    message = canonical_pb2.FileChange(
        path=entry.path, change=FILE_CHANGE_KINDS.get(entry.change or "", unspecified)
    )
    if entry.previous_path is not None:
        message.previous_path = entry.previous_path
    return message


def pending_interaction_to_proto(record: InteractionRecord) -> canonical_pb2.Interaction:
    """An Interaction as ``GetSession.pending_interactions`` lists it (full tuple, HOST-INT-1)."""
    message = canonical_pb2.Interaction(
        workspace_id=record.workspace_id,
        session_id=record.session_id,
        turn_id=record.turn_id,
        request_id=record.request_id,
        kind=INTERACTION_KINDS.get(record.kind, canonical_pb2.INTERACTION_KIND_UNSPECIFIED),
        status=INTERACTION_STATUSES.get(
            record.status, canonical_pb2.INTERACTION_STATUS_UNSPECIFIED
        ),
        input_json=record.input_json,
        metadata_json=record.metadata_json,
        title=record.title,
        summary=record.summary,
        options=[
            canonical_pb2.InteractionOption(option_id=o.option_id, label=o.label)
            for o in record.options
        ],
        version=record.version,
        created_at_unix_ms=record.created_at_unix_ms,
        updated_at_unix_ms=record.updated_at_unix_ms,
    )
    if record.tool_name is not None:
        message.tool_name = record.tool_name
    if record.answer is not None:
        answer = canonical_pb2.InteractionAnswer(
            action=str(record.answer.get("action", "")),
            answered_at_unix_ms=int(record.answer.get("answered_at_unix_ms") or 0),
        )
        option_id = record.answer.get("option_id")
        if isinstance(option_id, str):
            answer.option_id = option_id
        payload = record.answer.get("payload_json", record.answer.get("payload"))
        if isinstance(payload, str):
            answer.payload_json = payload
        elif payload is not None:
            answer.payload_json = json.dumps(payload)
        message.answer.CopyFrom(answer)
    return message


def session_isolation_to_proto(isolation: dict[str, object]) -> host_pb2.SessionIsolation:
    """Persisted worktree isolation (HOST-SES-7)."""
    mode = (
        host_pb2.ISOLATION_MODE_WORKTREE
        if isolation.get("mode") == "worktree"
        else host_pb2.ISOLATION_MODE_UNSPECIFIED
    )
    return host_pb2.SessionIsolation(
        mode=mode,
        worktree_path=str(isolation.get("worktree_path") or ""),
        branch=str(isolation.get("branch") or ""),
        base_commit=str(isolation.get("base_commit") or ""),
    )


def session_import_to_proto(info: dict[str, object]) -> host_pb2.SessionImport:
    """Import provenance of an imported Session (HOST-IMP-1)."""
    imported_at = info.get("imported_at_unix_ms")
    return host_pb2.SessionImport(
        source_ref=str(info.get("source_ref") or ""),
        imported_at_unix_ms=imported_at if isinstance(imported_at, int) else 0,
    )
