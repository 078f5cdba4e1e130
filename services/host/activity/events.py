"""The activity feed's event vocabulary (HOST-OBS-2), as plain domain values.

Exactly seven kinds exist: the six durable ones below and the ephemeral
:class:`MessageDelta`. None carries a storage row id or a state patch: entities travel whole
(:class:`MessageUpdate`, :class:`TurnUpdate`, :class:`InteractionUpdate`) or as identity only
(:class:`SessionReconcileRequired`). The wire layer encodes them as ``ActivityEvent`` protos
(:class:`EventCodec`); the domain never sees the contract types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from services.host.model.records import InteractionRecord, TurnRecord
from services.host.repository.row_records import MessageRecord

__all__ = [
    "DELTA_OPERATIONS",
    "DELTA_TARGETS",
    "DurableEvent",
    "EventCodec",
    "InteractionUpdate",
    "MessageDelta",
    "MessageUpdate",
    "SessionDeleted",
    "SessionReconcileRequired",
    "SessionRestored",
    "TurnUpdate",
    "event_type",
]

DELTA_TARGETS = frozenset({"text", "reasoning", "tool_output"})
DELTA_OPERATIONS = frozenset({"set", "append_text"})


@dataclass(frozen=True)
class MessageUpdate:
    """Full durable messages of one Session written by one commit, ordered by version."""

    session_id: str
    messages: tuple[MessageRecord, ...]
    latest_message_version: int


@dataclass(frozen=True)
class TurnUpdate:
    """The full Turn after a commit, with the Session's ``active_turn_id`` of that commit."""

    turn: TurnRecord
    active_turn_id: str | None


@dataclass(frozen=True)
class InteractionUpdate:
    """The full Interaction after a committed transition."""

    interaction: InteractionRecord


@dataclass(frozen=True)
class SessionReconcileRequired:
    """The Session changed in a way only an authoritative read conveys (identity only)."""

    session_id: str


@dataclass(frozen=True)
class SessionDeleted:
    """One newly tombstoned Session (HOST-DEL-6)."""

    session_id: str
    generation: str
    deleted_at_unix_ms: int


@dataclass(frozen=True)
class SessionRestored:
    """One restored Session (HOST-DEL-8)."""

    session_id: str
    generation: str


DurableEvent = (
    MessageUpdate
    | TurnUpdate
    | InteractionUpdate
    | SessionReconcileRequired
    | SessionDeleted
    | SessionRestored
)

_EVENT_TYPES: dict[type, str] = {
    MessageUpdate: "message_update",
    TurnUpdate: "turn_update",
    InteractionUpdate: "interaction_update",
    SessionReconcileRequired: "session_reconcile_required",
    SessionDeleted: "session_deleted",
    SessionRestored: "session_restored",
}


def event_type(event: DurableEvent) -> str:
    """The ``ActivityEvent.event`` oneof name of a durable event (the row's ``event_type``)."""
    return _EVENT_TYPES[type(event)]


def session_of(event: DurableEvent) -> str:
    """The Session a durable event is about."""
    if isinstance(event, TurnUpdate):
        return event.turn.session_id
    if isinstance(event, InteractionUpdate):
        return event.interaction.session_id
    return event.session_id


@dataclass(frozen=True)
class MessageDelta:
    """One ephemeral live operation from a runtime adapter (HOST-RT-2).

    Attributes:
        target: ``text``, ``reasoning`` or ``tool_output``.
        operation: ``set`` or ``append_text``.
        text: The whole value (``set``) or the suffix (``append_text``).
        offset_bytes: The prior UTF-8 length, for tool-output ``append_text``.
    """

    workspace_id: str
    session_id: str
    turn_id: str
    message_id: str
    target: str
    operation: str
    text: str
    offset_bytes: int | None = None


class EventCodec(Protocol):
    """Serializes a durable event as the contract's ``ActivityEvent`` (the wire layer owns it)."""

    def encode(self, workspace_id: str, occurred_at_unix_ms: int, event: DurableEvent) -> bytes:
        """The stored payload of one event (its ``event_id`` is assigned by the log)."""
        ...
