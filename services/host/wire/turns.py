"""Turn RPCs: ``SendInput``, ``StopTurn``, ``ListSessionTurns``, ``GetTurnResult`` (HOST-TURN-*)."""

from __future__ import annotations

from typing import Any

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2
from grpcserver.request_checks import mapped_enum
from services.host.context import HostContext
from services.host.turns.results import get_turn_result
from services.host.turns.stop_and_list import list_turns, stop_turn
from services.host.turns.submission import Submission, send_input
from services.host.wire.command_codec import COMPOSER_MODES
from services.host.wire.messages import message_to_proto
from services.host.wire.projection import session_to_proto, turn_to_proto
from services.host.wire.references_codec import references_from_proto

DELIVERIES = {
    canonical_pb2.DELIVERY_MODE_NEW_TURN: "new_turn",
    canonical_pb2.DELIVERY_MODE_GUIDANCE: "guidance",
    canonical_pb2.DELIVERY_MODE_INTERRUPT: "interrupt",
}


class TurnRpcs:
    """Serves the Turn RPCs."""

    ctx: HostContext

    async def SendInput(
        self, request: host_pb2.SendInputRequest, context: Any
    ) -> host_pb2.SendInputResponse:
        """Submit input with the durable submit barrier (HOST-TURN-1..3, HOST-REF-1)."""
        references = references_from_proto(request.references)
        result = await send_input(
            self.ctx,
            Submission(
                workspace_id=request.workspace_id,
                session_id=request.session_id,
                client_submit_id=request.client_submit_id,
                delivery=DELIVERIES.get(request.delivery, ""),
                target_turn_id=(
                    request.target_turn_id if request.HasField("target_turn_id") else None
                ),
                mode=mapped_enum(COMPOSER_MODES, request.mode, field="mode"),
                content=request.content,
                references=references,
            ),
        )
        response = host_pb2.SendInputResponse(
            turn=turn_to_proto(result.turn),
            user_message=message_to_proto(result.user_message),
            session=session_to_proto(result.session),
            replayed=result.replayed,
        )
        if result.interrupted_turn_id is not None:
            response.interrupted_turn_id = result.interrupted_turn_id
        return response

    async def StopTurn(
        self, request: host_pb2.StopTurnRequest, context: Any
    ) -> host_pb2.StopTurnResponse:
        """Settle exactly ``turn_id`` as canceled; a settled Turn is unchanged (HOST-TURN-4)."""
        result = await stop_turn(
            self.ctx, request.workspace_id, request.session_id, request.turn_id
        )
        response = host_pb2.StopTurnResponse(
            turn=turn_to_proto(result.turn),
            already_settled=result.already_settled,
        )
        restored = result.restored_input
        if restored is not None:
            response.restored_input = restored
        if result.user_message is not None:
            response.user_message.CopyFrom(message_to_proto(result.user_message))
        return response

    async def ListSessionTurns(
        self, request: host_pb2.ListSessionTurnsRequest, context: Any
    ) -> host_pb2.ListSessionTurnsResponse:
        """Page a Session's Turns in creation order (HOST-TURN-5)."""
        page = await list_turns(
            self.ctx,
            request.workspace_id,
            request.session_id,
            cursor=request.cursor,
            limit=request.limit,
            include_retracted=request.include_retracted,
        )
        return host_pb2.ListSessionTurnsResponse(
            turns=[turn_to_proto(row) for row in page.turns],
            retracted_turn_ids=[
                row.turn_id for row in page.turns if row.retracted_at_unix_ms is not None
            ],
            next_cursor=page.next_cursor,
        )

    async def GetTurnResult(
        self, request: host_pb2.GetTurnResultRequest, context: Any
    ) -> host_pb2.GetTurnResultResponse:
        """A settled Turn's frozen result; legacy Turns get the bounded fallback (HOST-TURN-7)."""
        result = await get_turn_result(
            self.ctx, request.workspace_id, request.session_id, request.turn_id
        )
        response = host_pb2.GetTurnResultResponse(
            turn=turn_to_proto(result.turn),
            resolved_empty=result.resolved_empty,
            legacy_fallback=result.legacy_fallback,
        )
        if result.message is not None:
            response.message.CopyFrom(message_to_proto(result.message))
        return response
