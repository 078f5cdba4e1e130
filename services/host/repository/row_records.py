"""Row -> record mapping of the canonical entities (Sessions, Turns, Messages, Interactions).

The wire projections (``services.host.wire.projection``) take the plain records of
``services.host.model.records``; this module is the one place that builds them from ORM rows,
for the activity repositories and for ``repository.sessions`` alike, and adds
:class:`MessageRecord`, the read model of a transcript row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.host.model.file_changes import decode_file_changes
from services.host.model.records import (
    Capabilities,
    InteractionOptionRecord,
    InteractionRecord,
    SessionRecord,
    SessionSettingsValue,
    TombstoneRecord,
    TurnRecord,
    UsageRecord,
    json_object,
)
from services.host.repository.row_views import (
    InteractionRow,
    MessageRow,
    OperationRow,
    SessionRow,
    TurnRow,
)


@dataclass(frozen=True)
class MessageRecord:
    """One ``messages`` row (HOST-MSG-1); JSON columns stay text as stored."""

    workspace_id: str
    session_id: str
    message_id: str
    sequence: int
    version: int
    turn_id: str | None
    occurred_at_unix_ms: int
    role: str
    kind: str
    payload_json: str
    user_visible_assistant_response: bool | None
    command: str | None
    skill_mentions_json: str | None
    agent_mentions_json: str | None
    references_json: str | None


def message_record(row: MessageRow) -> MessageRecord:
    """The read model of a message row."""
    return MessageRecord(
        workspace_id=row.workspace_id,
        session_id=row.session_id,
        message_id=row.message_id,
        sequence=row.sequence,
        version=row.version,
        turn_id=row.turn_id,
        occurred_at_unix_ms=row.occurred_at_unix_ms,
        role=row.role,
        kind=row.kind,
        payload_json=row.payload_json,
        user_visible_assistant_response=row.user_visible_assistant_response,
        command=row.command,
        skill_mentions_json=row.skill_mentions_json,
        agent_mentions_json=row.agent_mentions_json,
        references_json=row.references_json,
    )


def turn_record(row: TurnRow) -> TurnRecord:
    """The read model of a Turn row."""
    return TurnRecord(
        workspace_id=row.workspace_id,
        session_id=row.session_id,
        turn_id=row.turn_id,
        client_submit_id=row.client_submit_id,
        phase=row.phase,
        outcome=row.outcome,
        origin=row.origin,
        version=row.version,
        created_at_unix_ms=row.created_at_unix_ms,
        started_at_unix_ms=row.started_at_unix_ms,
        settled_at_unix_ms=row.settled_at_unix_ms,
        result_message_id=row.result_message_id,
        result_resolved_empty=row.result_resolved_empty,
        root_turn_id=row.root_turn_id,
        failure_message=row.failure_message,
        retracted_at_unix_ms=row.retracted_at_unix_ms,
        file_changes=decode_file_changes(row.file_changes_json),
    )


def _options(text: str | None) -> tuple[InteractionOptionRecord, ...]:
    try:
        value: Any = json.loads(text) if text else []
    except ValueError:
        return ()
    if not isinstance(value, list):
        return ()
    return tuple(
        InteractionOptionRecord(
            # Stored by Host as option_id; rows written from proto3 JSON use optionId.
            str(item.get("option_id", item.get("optionId", ""))),
            str(item.get("label", "")),
        )
        for item in value
        if isinstance(item, dict)
    )


def interaction_record(row: InteractionRow) -> InteractionRecord:
    """The read model of an Interaction row."""
    return InteractionRecord(
        workspace_id=row.workspace_id,
        session_id=row.session_id,
        turn_id=row.turn_id,
        request_id=row.request_id,
        kind=row.kind,
        status=row.status,
        tool_name=row.tool_name,
        input_json=row.input_json or "",
        metadata_json=row.metadata_json or "",
        title=row.title or "",
        summary=row.summary or "",
        options=_options(row.options_json),
        answer=json_object(row.answer_json) or None,
        version=row.version,
        created_at_unix_ms=row.created_at_unix_ms,
        updated_at_unix_ms=row.updated_at_unix_ms,
        occurred_at_unix_ms=row.occurred_at_unix_ms,
    )


@dataclass(frozen=True)
class OperationRecord:
    """One durable Interaction response operation (HOST-INT-3)."""

    workspace_id: str
    operation_id: str
    idempotency_key: str
    session_id: str
    turn_id: str
    request_id: str
    action: str
    option_id: str | None
    answer_json: str | None
    state: str
    disposition: str | None
    attempts: int
    last_error: str | None
    created_at_unix_ms: int
    updated_at_unix_ms: int
    completed_at_unix_ms: int | None


def operation_record(row: OperationRow) -> OperationRecord:
    """The read model of a response operation row."""
    return OperationRecord(
        workspace_id=row.workspace_id,
        operation_id=row.operation_id,
        idempotency_key=row.idempotency_key,
        session_id=row.session_id,
        turn_id=row.turn_id,
        request_id=row.request_id,
        action=row.action,
        option_id=row.option_id,
        answer_json=row.answer_json,
        state=row.state,
        disposition=row.disposition,
        attempts=row.attempts,
        last_error=row.last_error,
        created_at_unix_ms=row.created_at_unix_ms,
        updated_at_unix_ms=row.updated_at_unix_ms,
        completed_at_unix_ms=row.completed_at_unix_ms,
    )


def session_record(row: SessionRow) -> SessionRecord:
    """The read model of a Session row (never its provider-private context)."""
    tombstone = None
    if row.deleted_at_unix_ms is not None:
        tombstone = TombstoneRecord(
            deleted_at_unix_ms=row.deleted_at_unix_ms,
            generation=row.deletion_generation,
            component_size=row.component_size,
            legacy=row.tombstone_legacy,
        )
    return SessionRecord(
        workspace_id=row.workspace_id,
        session_id=row.session_id,
        parent_session_id=row.parent_session_id,
        root_session_id=row.root_session_id,
        parent_turn_id=row.parent_turn_id,
        agent_target_id=row.agent_target_id,
        provider=row.provider,
        title=row.title,
        cwd=row.cwd,
        rail_section_key=row.rail_section_key,
        rail_project_path=row.rail_project_path,
        settings=SessionSettingsValue.from_json(row.settings_json),
        capabilities=Capabilities.from_json(row.capabilities_json),
        usage=UsageRecord.from_json(row.usage_json),
        message_version=row.message_version,
        pinned_at_unix_ms=row.pinned_at_unix_ms,
        created_at_unix_ms=row.created_at_unix_ms,
        updated_at_unix_ms=row.updated_at_unix_ms,
        active_turn_id=row.active_turn_id,
        tombstone=tombstone,
        isolation=json_object(row.isolation_json) or None,
        import_info=json_object(row.import_json) or None,
    )
