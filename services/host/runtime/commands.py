"""The commands Host sends a runtime, as typed values (HOST-RT-1, HOST-RT-5).

The domain builds these and hands them to the command outbox
(``services.host.turns.command_outbox.enqueue``); the wire's :class:`CommandCodec`
(``services.host.wire.command_codec``) encodes them as the ``RuntimeCommand`` oneof field they
name, and the outbox row stores that encoding until the command is delivered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from services.host.model.records import SessionSettingsValue
from services.host.turns.mentions import ComposerMode, Subagent
from services.host.turns.reference_metadata import ReferenceMeta

__all__ = [
    "ApplySettings",
    "CommandCodec",
    "DeliverInteractionResponse",
    "Guidance",
    "InterruptReason",
    "InterruptTurn",
    "QueryInteractionDisposition",
    "ReleaseSession",
    "ResumeSession",
    "RuntimeCommandValue",
    "RuntimeSessionContext",
    "StartTurn",
    "StopTurn",
]


@dataclass(frozen=True)
class RuntimeSessionContext:
    """What a runtime needs to run a Session (``RuntimeSessionContext``)."""

    agent_target_id: str
    provider: str
    cwd: str
    settings: SessionSettingsValue
    subagents: tuple[Subagent, ...]
    runtime_target_ref: str | None = None
    launch_options_json: str | None = None
    provider_session_ref: str | None = None
    runtime_context_json: str | None = None
    parent_session_id: str | None = None


@dataclass(frozen=True)
class StartTurn:
    """Start a user Turn (``start_turn``)."""

    turn_id: str
    client_submit_id: str
    user_message_id: str
    prompt: str
    mode: ComposerMode
    references: tuple[ReferenceMeta, ...]
    session: RuntimeSessionContext


@dataclass(frozen=True)
class Guidance:
    """Guide the active Turn with a user message (``guidance``)."""

    target_turn_id: str
    user_message_id: str
    prompt: str
    references: tuple[ReferenceMeta, ...]


class InterruptReason:
    """Why a Turn is interrupted (``InterruptReason``)."""

    DELIVERY = "delivery"
    SESSION_DELETED = "session_deleted"


@dataclass(frozen=True)
class InterruptTurn:
    """Interrupt a Turn (``interrupt_turn``); ``reason`` is an :class:`InterruptReason`."""

    turn_id: str
    reason: str


@dataclass(frozen=True)
class StopTurn:
    """Stop a Turn the user stopped (``stop_turn``)."""

    turn_id: str


@dataclass(frozen=True)
class DeliverInteractionResponse:
    """Deliver the answer of an Interaction (``deliver_interaction_response``)."""

    operation_id: str
    turn_id: str
    request_id: str
    action: str
    option_id: str | None = None
    payload_json: str | None = None


@dataclass(frozen=True)
class QueryInteractionDisposition:
    """Ask for the disposition of a delivered answer (``query_interaction_disposition``).

    Sent when a delivery got no disposition in time or its link was lost (HOST-INT-6); the
    runtime answers with an ``InteractionResponseDisposition`` for ``operation_id``.
    """

    operation_id: str
    turn_id: str
    request_id: str


@dataclass(frozen=True)
class ApplySettings:
    """Apply persisted Session settings to the live runtime (``apply_settings``)."""

    settings: SessionSettingsValue


@dataclass(frozen=True)
class ReleaseSession:
    """Release a Session's runtime state (``release_session``)."""

    reason: str


@dataclass(frozen=True)
class ResumeSession:
    """Resume (re-attach) the provider session without a Turn (``resume_session``, HOST-SES-9)."""

    session: RuntimeSessionContext


RuntimeCommandValue = (
    StartTurn
    | Guidance
    | InterruptTurn
    | StopTurn
    | DeliverInteractionResponse
    | QueryInteractionDisposition
    | ApplySettings
    | ReleaseSession
    | ResumeSession
)
"""Every command the outbox stores."""


class CommandCodec(Protocol):
    """Encodes a command as its ``RuntimeCommand`` oneof field (the wire layer implements it)."""

    def encode(self, command: RuntimeCommandValue) -> tuple[str, str]:
        """The oneof field name (``start_turn`` ...) and its proto3-JSON text."""
