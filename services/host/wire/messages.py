"""Message RPCs and the Message projection (HOST-MSG-1, HOST-MSG-2, CON-4)."""

from __future__ import annotations

from typing import Any

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2
from services.host.context import HostContext
from services.host.model.cursor_bounds import checked_cursor
from services.host.repository.row_records import MessageRecord
from services.host.turns import mentions
from services.host.turns.messages import list_messages
from services.host.turns.reference_metadata import decode_references
from services.host.wire.references_codec import references_to_proto

MESSAGE_ROLES = {
    "user": canonical_pb2.MESSAGE_ROLE_USER,
    "assistant": canonical_pb2.MESSAGE_ROLE_ASSISTANT,
    "system": canonical_pb2.MESSAGE_ROLE_SYSTEM,
}
MESSAGE_KINDS = {
    "text": canonical_pb2.MESSAGE_KIND_TEXT,
    "reasoning": canonical_pb2.MESSAGE_KIND_REASONING,
    "tool_call": canonical_pb2.MESSAGE_KIND_TOOL_CALL,
    "plan": canonical_pb2.MESSAGE_KIND_PLAN,
    "notice": canonical_pb2.MESSAGE_KIND_NOTICE,
    "error": canonical_pb2.MESSAGE_KIND_ERROR,
}


def message_to_proto(record: MessageRecord) -> canonical_pb2.Message:
    """The canonical Message; cursor values above 2^53-1 fail the response (CON-4)."""
    message = canonical_pb2.Message(
        workspace_id=record.workspace_id,
        session_id=record.session_id,
        message_id=record.message_id,
        sequence=checked_cursor(record.sequence, field="sequence"),
        version=checked_cursor(record.version, field="version"),
        occurred_at_unix_ms=record.occurred_at_unix_ms,
        role=MESSAGE_ROLES.get(record.role, canonical_pb2.MESSAGE_ROLE_UNSPECIFIED),
        kind=MESSAGE_KINDS.get(record.kind, canonical_pb2.MESSAGE_KIND_UNSPECIFIED),
        payload_json=record.payload_json,
        references=references_to_proto(decode_references(record.references_json)),
    )
    if record.turn_id is not None:
        message.turn_id = record.turn_id
    if record.user_visible_assistant_response is not None:
        message.user_visible_assistant_response = record.user_visible_assistant_response
    if record.command is not None:
        message.command = record.command
        message.agent_mentions.extend(
            canonical_pb2.AgentMention(start=m.start, end=m.end, name=m.name)
            for m in mentions.valid_agent_mentions(
                record.command, mentions.decode_agent_mentions(record.agent_mentions_json)
            )
        )
        message.skill_mentions.extend(
            canonical_pb2.SkillMention(start=m.start, end=m.end, skill_id=m.skill_id)
            for m in mentions.valid_skill_mentions(
                record.command, mentions.decode_skill_mentions(record.skill_mentions_json)
            )
        )
    return message


class MessageRpcs:
    """Serves ``ListSessionMessages``."""

    ctx: HostContext

    async def ListSessionMessages(
        self, request: host_pb2.ListSessionMessagesRequest, context: Any
    ) -> host_pb2.ListSessionMessagesResponse:
        """Page a Session's messages by version cursor (HOST-MSG-2)."""
        page = await list_messages(
            self.ctx,
            request.workspace_id,
            request.session_id,
            after_version=request.after_version if request.HasField("after_version") else None,
            before_version=request.before_version if request.HasField("before_version") else None,
            limit=request.limit,
            descending=request.order == host_pb2.MESSAGE_ORDER_DESC,
        )
        return host_pb2.ListSessionMessagesResponse(
            messages=[message_to_proto(row) for row in page.messages],
            latest_version=checked_cursor(page.latest_version, field="latest_version"),
            has_more=page.has_more,
        )
