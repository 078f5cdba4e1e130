"""Domain activity events <-> ``agentactivity.host.v1.ActivityEvent`` (HOST-OBS-2, HOST-RT-2).

The durable log stores each event as the serialized ``ActivityEvent`` proto with
``event_id`` unset: the contract's own binary form, so a stored event survives upgrades that
only add fields. The reader sets ``event_id`` from the row id.
"""

from __future__ import annotations

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import activity_pb2
from services.host.activity.events import (
    DurableEvent,
    InteractionUpdate,
    MessageDelta,
    MessageUpdate,
    SessionDeleted,
    SessionReconcileRequired,
    TurnUpdate,
)
from services.host.model.cursor_bounds import checked_cursor
from services.host.repository.activity_events import StoredEvent
from services.host.wire.messages import message_to_proto
from services.host.wire.projection import pending_interaction_to_proto, turn_to_proto

__all__ = [
    "ProtoEventCodec",
    "delta_from_proto",
    "delta_to_proto",
    "fill_delta",
    "stored_to_proto",
]

DELTA_TARGETS = {
    "text": canonical_pb2.DELTA_TARGET_TEXT,
    "reasoning": canonical_pb2.DELTA_TARGET_REASONING,
    "tool_output": canonical_pb2.DELTA_TARGET_TOOL_OUTPUT,
}
DELTA_OPERATIONS = {
    "set": canonical_pb2.DELTA_OPERATION_SET,
    "append_text": canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
}
_TARGET_NAMES = {value: key for key, value in DELTA_TARGETS.items()}
_OPERATION_NAMES = {value: key for key, value in DELTA_OPERATIONS.items()}


class ProtoEventCodec:
    """The :class:`~services.host.activity.events.EventCodec` of the Host wire layer."""

    def encode(self, workspace_id: str, occurred_at_unix_ms: int, event: DurableEvent) -> bytes:
        """Serialize ``event`` as an ``ActivityEvent`` without ``event_id``."""
        message = activity_pb2.ActivityEvent(
            workspace_id=workspace_id, occurred_at_unix_ms=occurred_at_unix_ms
        )
        if isinstance(event, MessageUpdate):
            message.message_update.CopyFrom(
                activity_pb2.MessageUpdateEvent(
                    session_id=event.session_id,
                    messages=[message_to_proto(record) for record in event.messages],
                    message_count=len(event.messages),
                    latest_message_version=checked_cursor(
                        event.latest_message_version, field="latest_message_version"
                    ),
                )
            )
        elif isinstance(event, TurnUpdate):
            update = activity_pb2.TurnUpdateEvent(turn=turn_to_proto(event.turn))
            if event.active_turn_id is not None:
                update.active_turn_id = event.active_turn_id
            message.turn_update.CopyFrom(update)
        elif isinstance(event, InteractionUpdate):
            message.interaction_update.CopyFrom(
                activity_pb2.InteractionUpdateEvent(
                    interaction=pending_interaction_to_proto(event.interaction)
                )
            )
        elif isinstance(event, SessionReconcileRequired):
            message.session_reconcile_required.session_id = event.session_id
        elif isinstance(event, SessionDeleted):
            message.session_deleted.CopyFrom(
                activity_pb2.SessionDeletedEvent(
                    session_id=event.session_id,
                    generation=event.generation,
                    deleted_at_unix_ms=event.deleted_at_unix_ms,
                )
            )
        else:
            message.session_restored.CopyFrom(
                activity_pb2.SessionRestoredEvent(
                    session_id=event.session_id, generation=event.generation
                )
            )
        return message.SerializeToString()


def stored_to_proto(stored: StoredEvent) -> activity_pb2.ActivityEvent:
    """A stored row as the event ``WatchActivity`` streams (``event_id`` = row id)."""
    message = activity_pb2.ActivityEvent.FromString(stored.payload)
    message.event_id = checked_cursor(stored.event_id, field="event_id")
    message.workspace_sequence = stored.workspace_seq
    if message.WhichOneof("event") == "message_update":
        # CON-4 on the way out too: rows written before encode checked this field.
        checked_cursor(
            message.message_update.latest_message_version, field="latest_message_version"
        )
    if not message.workspace_id:
        message.workspace_id = stored.workspace_id
    if not message.occurred_at_unix_ms:
        message.occurred_at_unix_ms = stored.created_at_unix_ms
    return message


def fill_delta(message: canonical_pb2.MessageDelta, delta: MessageDelta) -> None:
    """Write a live delta into ``message`` in place (the stream's hot path)."""
    message.workspace_id = delta.workspace_id
    message.session_id = delta.session_id
    message.turn_id = delta.turn_id
    message.message_id = delta.message_id
    message.target = DELTA_TARGETS.get(delta.target, canonical_pb2.DELTA_TARGET_UNSPECIFIED)
    message.operation = DELTA_OPERATIONS.get(
        delta.operation, canonical_pb2.DELTA_OPERATION_UNSPECIFIED
    )
    message.text = delta.text
    if delta.offset_bytes is not None:
        message.offset_bytes = delta.offset_bytes


def delta_to_proto(delta: MessageDelta) -> canonical_pb2.MessageDelta:
    """The contract form of a live delta."""
    message = canonical_pb2.MessageDelta()
    fill_delta(message, delta)
    return message


def delta_from_proto(message: canonical_pb2.MessageDelta) -> MessageDelta:
    """A runtime's delta as the domain sees it (unknown enums become empty strings)."""
    return MessageDelta(
        workspace_id=message.workspace_id,
        session_id=message.session_id,
        turn_id=message.turn_id,
        message_id=message.message_id,
        target=_TARGET_NAMES.get(message.target, ""),
        operation=_OPERATION_NAMES.get(message.operation, ""),
        text=message.text,
        offset_bytes=message.offset_bytes if message.HasField("offset_bytes") else None,
    )
