"""Interaction RPCs: responses, operations and attention (HOST-INT-3, HOST-INT-4)."""

from __future__ import annotations

import hashlib
from typing import Any

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2
from services.host.context import HostContext
from services.host.turns.interactions import (
    OperationView,
    ResponseRequest,
    get_operation,
    list_attention,
    submit_response,
)
from services.host.wire.projection import (
    INTERACTION_KINDS,
    INTERACTION_STATUSES,
    pending_interaction_to_proto,
)

_OPERATION_STATES = {
    "pending": host_pb2.INTERACTION_RESPONSE_OPERATION_STATUS_PENDING,
    "resolving": host_pb2.INTERACTION_RESPONSE_OPERATION_STATUS_RESOLVING,
    "completed": host_pb2.INTERACTION_RESPONSE_OPERATION_STATUS_COMPLETED,
}


def operation_to_proto(view: OperationView) -> host_pb2.InteractionResponseOperation:
    """The durable operation with its Interaction's current state."""
    row = view.operation
    message = host_pb2.InteractionResponseOperation(
        operation_id=row.operation_id,
        idempotency_key=row.idempotency_key,
        workspace_id=row.workspace_id,
        session_id=row.session_id,
        turn_id=row.turn_id,
        request_id=row.request_id,
        action=row.action,
        status=_OPERATION_STATES.get(
            row.state, host_pb2.INTERACTION_RESPONSE_OPERATION_STATUS_UNSPECIFIED
        ),
        disposition=INTERACTION_STATUSES.get(
            row.disposition or "", canonical_pb2.INTERACTION_STATUS_UNSPECIFIED
        ),
        created_at_unix_ms=row.created_at_unix_ms,
        updated_at_unix_ms=row.updated_at_unix_ms,
        dispatch_attempts=row.attempts,
    )
    if row.option_id is not None:
        message.option_id = row.option_id
    if row.answer_json is not None:
        message.payload_json = row.answer_json
    if row.completed_at_unix_ms is not None:
        message.completed_at_unix_ms = row.completed_at_unix_ms
    if row.state == "completed" and row.last_error is not None:
        message.detail = row.last_error
    if view.interaction is not None:
        message.interaction.CopyFrom(pending_interaction_to_proto(view.interaction))
    return message


class InteractionRpcs:
    """Serves the interaction-response and attention RPCs."""

    ctx: HostContext

    async def SubmitInteractionResponse(
        self, request: host_pb2.SubmitInteractionResponseRequest, context: Any
    ) -> host_pb2.SubmitInteractionResponseResponse:
        """Claim a pending Interaction through a durable operation (HOST-INT-3)."""
        view = await submit_response(
            self.ctx,
            ResponseRequest(
                workspace_id=request.workspace_id,
                session_id=request.session_id,
                turn_id=request.turn_id,
                request_id=request.request_id,
                action=request.action,
                option_id=request.option_id if request.HasField("option_id") else None,
                payload_json=request.payload_json if request.HasField("payload_json") else None,
                idempotency_key=request.idempotency_key,
                wait_timeout_ms=request.wait_timeout_ms,
            ),
        )
        return host_pb2.SubmitInteractionResponseResponse(
            operation=operation_to_proto(view), replayed=view.replayed
        )

    async def GetInteractionResponseOperation(
        self, request: host_pb2.GetInteractionResponseOperationRequest, context: Any
    ) -> host_pb2.GetInteractionResponseOperationResponse:
        """Read a durable response operation (HOST-INT-3)."""
        view = await get_operation(self.ctx, request.workspace_id, request.operation_id)
        return host_pb2.GetInteractionResponseOperationResponse(operation=operation_to_proto(view))

    async def ListAttentionItems(
        self, request: host_pb2.ListAttentionItemsRequest, context: Any
    ) -> host_pb2.ListAttentionItemsResponse:
        """One item per actionable target of the workspace (HOST-INT-4)."""
        items = []
        for entry in await list_attention(self.ctx, request.workspace_id):
            row, session = entry.interaction, entry.session
            identity = "\x1f".join((row.workspace_id, row.session_id, row.turn_id, row.request_id))
            item = host_pb2.AttentionItem(
                item_id="interaction:" + hashlib.sha256(identity.encode()).hexdigest()[:32],
                kind=host_pb2.ATTENTION_ITEM_KIND_INTERACTION,
                interaction_kind=INTERACTION_KINDS.get(
                    row.kind, canonical_pb2.INTERACTION_KIND_OTHER
                ),
                workspace_id=row.workspace_id,
                session_id=row.session_id,
                turn_id=row.turn_id,
                request_id=row.request_id,
                root_session_id=session.root_session_id,
                provider=session.provider,
                title=session.title,
                cwd=session.cwd or "",
                summary=row.summary or row.title or "",
                occurred_at_unix_ms=row.occurred_at_unix_ms,
            )
            items.append(item)
        items.sort(key=lambda item: (item.occurred_at_unix_ms, item.item_id))
        return host_pb2.ListAttentionItemsResponse(items=items)
