"""Runtime commands as the wire carries them: the one encoder of ``RuntimeCommand`` bodies.

The domain enqueues typed commands (``services.host.runtime.commands``); :class:`ProtoCommandCodec`
encodes each as the ``RuntimeCommand`` oneof field it names, in proto3 JSON, which the command
outbox stores and ``runtime_codec.command_to_proto`` parses back when it sends the frame. The
composer-mode mapping of the whole wire (:data:`COMPOSER_MODES`) lives here too.
"""

from __future__ import annotations

import json

from google.protobuf import json_format
from google.protobuf.message import Message

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, runtime_pb2
from services.host.runtime.commands import (
    ApplySettings,
    DeliverInteractionResponse,
    Guidance,
    InterruptReason,
    InterruptTurn,
    QueryInteractionDisposition,
    ReleaseSession,
    ResumeSession,
    RuntimeCommandValue,
    RuntimeSessionContext,
    StartTurn,
    StopTurn,
)
from services.host.turns.mentions import ComposerMode
from services.host.wire.projection import settings_to_proto
from services.host.wire.references_codec import references_to_proto

__all__ = ["COMPOSER_MODES", "ProtoCommandCodec"]

COMPOSER_MODES = {
    canonical_pb2.COMPOSER_MODE_UNSPECIFIED: ComposerMode.AGENT,
    canonical_pb2.COMPOSER_MODE_AGENT: ComposerMode.AGENT,
    canonical_pb2.COMPOSER_MODE_PLAN: ComposerMode.PLAN,
    canonical_pb2.COMPOSER_MODE_GOAL: ComposerMode.GOAL,
}
"""Composer modes of the wire; unspecified means agent (HOST-MENT-1), any other number is
refused (SEC-2)."""

_MODE_NUMBERS = {
    mode: number
    for number, mode in COMPOSER_MODES.items()
    if number != canonical_pb2.COMPOSER_MODE_UNSPECIFIED
}
_INTERRUPT_REASONS = {
    InterruptReason.DELIVERY: runtime_pb2.INTERRUPT_REASON_DELIVERY,
    InterruptReason.SESSION_DELETED: runtime_pb2.INTERRUPT_REASON_SESSION_DELETED,
}


class ProtoCommandCodec:
    """Encodes typed runtime commands as proto3 JSON of their ``RuntimeCommand`` field."""

    def encode(self, command: RuntimeCommandValue) -> tuple[str, str]:
        """The oneof field name and the compact, key-sorted proto3 JSON of its message."""
        kind, message = _to_proto(command)
        value = json_format.MessageToDict(message)
        return kind, json.dumps(value, separators=(",", ":"), sort_keys=True)


def _to_proto(command: RuntimeCommandValue) -> tuple[str, Message]:
    """The ``RuntimeCommand`` oneof field and message of one command."""
    if isinstance(command, StartTurn):
        return "start_turn", runtime_pb2.StartTurnCommand(
            turn_id=command.turn_id,
            origin=canonical_pb2.TURN_ORIGIN_USER,
            client_submit_id=command.client_submit_id,
            user_message_id=command.user_message_id,
            prompt=command.prompt,
            mode=_MODE_NUMBERS[command.mode],
            references=references_to_proto(command.references),
            session=_session_context(command.session),
        )
    if isinstance(command, Guidance):
        return "guidance", runtime_pb2.GuidanceCommand(
            target_turn_id=command.target_turn_id,
            user_message_id=command.user_message_id,
            prompt=command.prompt,
            references=references_to_proto(command.references),
        )
    if isinstance(command, InterruptTurn):
        return "interrupt_turn", runtime_pb2.InterruptTurnCommand(
            turn_id=command.turn_id, reason=_INTERRUPT_REASONS[command.reason]
        )
    if isinstance(command, StopTurn):
        return "stop_turn", runtime_pb2.StopTurnCommand(turn_id=command.turn_id)
    if isinstance(command, DeliverInteractionResponse):
        return "deliver_interaction_response", runtime_pb2.DeliverInteractionResponseCommand(
            operation_id=command.operation_id,
            turn_id=command.turn_id,
            request_id=command.request_id,
            action=command.action,
            option_id=command.option_id,
            payload_json=command.payload_json,
        )
    if isinstance(command, QueryInteractionDisposition):
        return "query_interaction_disposition", runtime_pb2.QueryInteractionDispositionCommand(
            operation_id=command.operation_id,
            turn_id=command.turn_id,
            request_id=command.request_id,
        )
    if isinstance(command, ApplySettings):
        return "apply_settings", runtime_pb2.ApplySettingsCommand(
            settings=settings_to_proto(command.settings)
        )
    if isinstance(command, ResumeSession):
        return "resume_session", runtime_pb2.ResumeSessionCommand(
            session=_session_context(command.session)
        )
    if isinstance(command, ReleaseSession):
        return "release_session", runtime_pb2.ReleaseSessionCommand(reason=command.reason)
    raise TypeError(f"not a runtime command: {command!r}")


def _session_context(context: RuntimeSessionContext) -> runtime_pb2.RuntimeSessionContext:
    return runtime_pb2.RuntimeSessionContext(
        agent_target_id=context.agent_target_id,
        provider=context.provider,
        runtime_target_ref=context.runtime_target_ref or "",
        launch_options_json=context.launch_options_json or "",
        cwd=context.cwd,
        settings=settings_to_proto(context.settings),
        subagents=[
            host_pb2.SubagentDescriptor(name=agent.name, description=agent.description)
            for agent in context.subagents
        ],
        provider_session_ref=context.provider_session_ref,
        runtime_context_json=context.runtime_context_json,
        parent_session_id=context.parent_session_id,
    )
