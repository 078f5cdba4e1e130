"""The shared live lane's items on the bus (ADR 0041): the contract's ``ActivityEvent``.

A delta travels as the ``message_delta`` event Host streams anyway (``occurred_at`` = when
Host received it); a commit hint as an event with no payload that names the last committed
event and its workspace sequence; a fence as an event with no payload, ``event_id`` -1 (never
a durable id) and its token after a newline in ``workspace_id``. Only Host replicas read
these subjects; livestream keeps reading ``WatchActivity``.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from agentactivity.host.v1 import activity_pb2
from livelog.codec import ItemDecodeError
from services.host.activity.broker import LiveDelta
from services.host.activity.shared_lane import CommitHint, FenceItem, LaneItem
from services.host.wire.activity_codec import delta_from_proto, fill_delta

__all__ = ["LiveLaneCodec"]

_FENCE_EVENT_ID = -1
"""The ``event_id`` of a fence (never a durable id: those are positive)."""


class LiveLaneCodec:
    """Encodes :data:`~services.host.activity.shared_lane.LaneItem` as ``ActivityEvent``."""

    def encode(self, item: LaneItem) -> bytes:
        """The item's wire bytes."""
        message = activity_pb2.ActivityEvent()
        if isinstance(item, LiveDelta):
            message.workspace_id = item.delta.workspace_id
            message.occurred_at_unix_ms = item.received_at_unix_ms
            fill_delta(message.message_delta.delta, item.delta)
        elif isinstance(item, CommitHint):
            message.workspace_id = item.workspace_id
            message.event_id = item.last_event_id
            message.workspace_sequence = item.last_seq
        else:
            message.workspace_id = f"{item.workspace_id}\n{item.token}"
            message.event_id = _FENCE_EVENT_ID
        return message.SerializeToString()

    def decode(self, data: bytes) -> LaneItem:
        """The item of ``data``.

        Raises:
            ItemDecodeError: ``data`` is not an item of the lane.
        """
        try:
            message = activity_pb2.ActivityEvent.FromString(data)
        except DecodeError as error:
            raise ItemDecodeError(str(error)) from error
        kind = message.WhichOneof("event")
        if kind == "message_delta":
            try:
                delta = delta_from_proto(message.message_delta.delta)
            except (ValueError, TypeError) as error:
                raise ItemDecodeError(f"bad delta on the live lane: {error}") from error
            return LiveDelta(delta, message.occurred_at_unix_ms)
        if kind is not None:
            raise ItemDecodeError(f"unexpected {kind} on the live lane")
        if message.event_id == _FENCE_EVENT_ID:
            workspace_id, _, token = message.workspace_id.partition("\n")
            return FenceItem(workspace_id, token)
        return CommitHint(message.workspace_id, message.event_id, message.workspace_sequence)
