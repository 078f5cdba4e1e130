"""Host activity events as live deliveries (LIVE-VAR-1, LIVE-FENCE-1, LIVE-COAL-1, LIVE-FRAME-1).

:class:`DeliveryMapper` turns what a workspace feed received together into the bodies of
sequenced deliveries, once for every publisher of the workspace (ADR 0019):

1. each event becomes its live variant: deltas and full Turn/Interaction updates pass
   through; canonical ``message_update`` and ``session_reconcile_required`` become scoped
   discontinuities; ``session_deleted`` / ``session_restored`` keep their typed reason;
2. a text, reasoning or tool delta for a Turn in the settled-Turn fence becomes a scoped
   ``late_delta_for_settled_turn`` discontinuity;
3. adjacent pure ``append_text`` deltas of one message, Turn and target are coalesced while
   the result stays within the safe size (tool output only with contiguous offsets);
4. a tool-output delta over the safe size is re-expressed as one ``set`` (or the first
   append) followed by contiguous ``append_text`` pieces cut on UTF-8 boundaries; anything
   else still over the safe size becomes ``delivery_too_large`` with reconcile keys.

Business values (``text``, ``payload_json`` ...) are copied as they are, never parsed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import activity_pb2
from agentactivity.livestream.v1 import livestream_pb2
from services.livestream.encoding import body_of, varint

__all__ = [
    "SEQUENCE_OVERHEAD_BYTES",
    "Body",
    "DeliveryMapper",
    "SettledTurnFence",
    "coalesce",
    "express",
    "reconcile_keys",
]

Delivery = livestream_pb2.Delivery
Reason = livestream_pb2.DiscontinuityReason

SEQUENCE_OVERHEAD_BYTES = 1 + len(varint(2**53 - 1))
"""Bytes the sequence field adds to a body (tag and the largest varint)."""

_APPEND = canonical_pb2.DELTA_OPERATION_APPEND_TEXT
_SET = canonical_pb2.DELTA_OPERATION_SET
_TOOL_OUTPUT = canonical_pb2.DELTA_TARGET_TOOL_OUTPUT


@dataclass(frozen=True, slots=True)
class Body:
    """One delivery's encoding without its sequence, and the workspace it is about."""

    workspace_id: str
    body: bytes
    kind: str


class SettledTurnFence:
    """A bounded FIFO of recently settled Turn ids (LIVE-FENCE-1).

    The bound does not grow with history: the oldest id is forgotten first, and an
    evicted Turn's late deltas then pass (clients still reject them against canonical
    message truth).
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._turns: OrderedDict[str, None] = OrderedDict()

    def settle(self, turn_id: str) -> None:
        """Remember ``turn_id`` as settled."""
        self._turns[turn_id] = None
        self._turns.move_to_end(turn_id)
        while len(self._turns) > self._capacity:
            self._turns.popitem(last=False)

    def __contains__(self, turn_id: object) -> bool:
        return turn_id in self._turns

    def __len__(self) -> int:
        return len(self._turns)


def reconcile_keys(
    workspace_id: str,
    session_id: str | None = None,
    turn_id: str | None = None,
    message_id: str | None = None,
) -> livestream_pb2.ReconcileKeys:
    """Reconcile keys; the narrower ids are kept only under a Session (keys nest)."""
    keys = livestream_pb2.ReconcileKeys(workspace_id=workspace_id)
    if session_id:
        keys.session_id = session_id
        if turn_id:
            keys.turn_id = turn_id
        if message_id:
            keys.message_id = message_id
    return keys


def discontinuity(reason: int, keys: livestream_pb2.ReconcileKeys) -> Delivery:
    """A discontinuity delivery."""
    return Delivery(discontinuity=livestream_pb2.Discontinuity(reason=reason, keys=keys))  # type: ignore[arg-type]


def keys_of(workspace_id: str, delivery: Delivery) -> livestream_pb2.ReconcileKeys:
    """What a delivery is about, as reconcile keys (for ``delivery_too_large``)."""
    kind = delivery.WhichOneof("kind")
    if kind == "message_delta":
        d = delivery.message_delta
        return reconcile_keys(workspace_id, d.session_id, d.turn_id, d.message_id)
    if kind == "turn_update":
        t = delivery.turn_update.turn
        return reconcile_keys(workspace_id, t.session_id, t.turn_id)
    if kind == "interaction_update":
        i = delivery.interaction_update
        return reconcile_keys(workspace_id, i.session_id, i.turn_id)
    if kind == "interaction_snapshot":
        return reconcile_keys(workspace_id, delivery.interaction_snapshot.session_id)
    if kind == "attachment_caught_up":
        return reconcile_keys(workspace_id, delivery.attachment_caught_up.session_id)
    return reconcile_keys(workspace_id)


def _live_variants(
    event: activity_pb2.ActivityEvent, fence: SettledTurnFence
) -> Iterable[Delivery]:
    ws = event.workspace_id
    kind = event.WhichOneof("event")
    if kind == "message_delta":
        delta = event.message_delta.delta
        if delta.turn_id in fence:
            keys = reconcile_keys(ws, delta.session_id, delta.turn_id, delta.message_id)
            yield discontinuity(Reason.DISCONTINUITY_REASON_LATE_DELTA_FOR_SETTLED_TURN, keys)
        else:
            yield Delivery(message_delta=delta)
    elif kind == "turn_update":
        update = event.turn_update
        if update.turn.phase == canonical_pb2.TURN_PHASE_SETTLED:
            fence.settle(update.turn.turn_id)
        turn_update = livestream_pb2.TurnUpdate(turn=update.turn)
        if update.HasField("active_turn_id"):
            turn_update.active_turn_id = update.active_turn_id
        yield Delivery(turn_update=turn_update)
    elif kind == "interaction_update":
        yield Delivery(interaction_update=event.interaction_update.interaction)
    elif kind == "message_update":
        yield from _message_update_discontinuities(ws, event.message_update)
    elif kind in _SESSION_DISCONTINUITIES:
        keys = reconcile_keys(ws, getattr(event, kind).session_id)
        yield discontinuity(_SESSION_DISCONTINUITIES[kind], keys)
    # An event kind this build does not know carries nothing it could project; the
    # closed Host feed never sends one (HOST-OBS-1).


_SESSION_DISCONTINUITIES: Final = {
    "session_reconcile_required": Reason.DISCONTINUITY_REASON_SESSION_RECONCILE_REQUIRED,
    "session_deleted": Reason.DISCONTINUITY_REASON_SESSION_DELETED,
    "session_restored": Reason.DISCONTINUITY_REASON_SESSION_RESTORED,
}
"""Session-wide event kinds and the discontinuity each becomes (keyed by the session id)."""


def _message_update_discontinuities(
    ws: str, messages: activity_pb2.MessageUpdateEvent
) -> Iterable[Delivery]:
    """One ``message_update`` discontinuity per updated message, or one for the Session."""
    for message in messages.messages:
        keys = reconcile_keys(ws, messages.session_id, message.turn_id, message.message_id)
        yield discontinuity(Reason.DISCONTINUITY_REASON_MESSAGE_UPDATE, keys)
    if not messages.messages:
        keys = reconcile_keys(ws, messages.session_id)
        yield discontinuity(Reason.DISCONTINUITY_REASON_MESSAGE_UPDATE, keys)


def _fits(delivery: Delivery, safe_bytes: int) -> bool:
    return delivery.ByteSize() + SEQUENCE_OVERHEAD_BYTES <= safe_bytes


def _mergeable(a: canonical_pb2.MessageDelta, b: canonical_pb2.MessageDelta) -> bool:
    if a.operation != _APPEND or b.operation != _APPEND:
        return False
    if (a.workspace_id, a.session_id, a.turn_id, a.message_id, a.target) != (
        b.workspace_id,
        b.session_id,
        b.turn_id,
        b.message_id,
        b.target,
    ):
        return False
    if a.target == _TOOL_OUTPUT:
        if not (a.HasField("offset_bytes") and b.HasField("offset_bytes")):
            return False
        return a.offset_bytes + len(a.text.encode()) == b.offset_bytes
    return not a.HasField("offset_bytes") and not b.HasField("offset_bytes")


def coalesce(deliveries: Sequence[Delivery], safe_bytes: int) -> list[Delivery]:
    """Merge adjacent pure ``append_text`` deltas (LIVE-COAL-1), never above the safe size."""
    out: list[Delivery] = []
    size = 0
    for delivery in deliveries:
        if out and delivery.WhichOneof("kind") == "message_delta":
            last = out[-1]
            if last.WhichOneof("kind") == "message_delta" and _mergeable(
                last.message_delta, delivery.message_delta
            ):
                added = len(delivery.message_delta.text.encode())
                # The merged text's length prefix may grow by a few bytes.
                if size + added + 4 <= safe_bytes:
                    last.message_delta.text += delivery.message_delta.text
                    size += added
                    continue
        copy = Delivery()
        copy.CopyFrom(delivery)
        out.append(copy)
        size = copy.ByteSize() + SEQUENCE_OVERHEAD_BYTES
    return out


def _utf8_cut(data: bytes, start: int, limit: int) -> int:
    """The end of the longest piece of ``data[start:]`` within ``limit`` bytes.

    The piece never splits a UTF-8 character.
    """
    end = min(start + limit, len(data))
    while end < len(data) and end > start and (data[end] & 0xC0) == 0x80:
        end -= 1
    return end


def _split_tool_output(delta: canonical_pb2.MessageDelta, safe_bytes: int) -> list[Delivery]:
    """One oversized tool-output operation as contiguous pieces within ``safe_bytes``.

    ``[]`` when its identity alone leaves no room for text.
    """
    data = delta.text.encode()
    shell = canonical_pb2.MessageDelta()
    shell.CopyFrom(delta)
    shell.text = ""
    shell.offset_bytes = 2**53 - 1  # the largest offset a piece can carry
    # Room for text: the safe size minus the sequence, the shell, the delivery's own
    # field tag/length and the text field's tag/length (at most 1 + 4 bytes).
    room = safe_bytes - SEQUENCE_OVERHEAD_BYTES - shell.ByteSize() - 1 - 4 - 1 - 4
    if room < 4:
        return []
    base = delta.offset_bytes if delta.HasField("offset_bytes") else None
    pieces: list[Delivery] = []
    start = 0
    while start < len(data) or not pieces:
        end = _utf8_cut(data, start, room)
        if end == start and start < len(data):
            return []  # cannot happen with room >= 4, but never loop forever
        piece = canonical_pb2.MessageDelta()
        piece.CopyFrom(delta)
        piece.text = data[start:end].decode()
        if pieces or delta.operation == _APPEND:
            piece.operation = _APPEND
            if pieces and delta.operation == _SET:
                piece.offset_bytes = start
            elif base is not None:
                piece.offset_bytes = base + start
            else:
                piece.ClearField("offset_bytes")
        pieces.append(Delivery(message_delta=piece))
        start = end
    return pieces


def express(workspace_id: str, delivery: Delivery, safe_bytes: int) -> list[Delivery]:
    """``delivery`` within the safe size (LIVE-FRAME-1).

    Itself, tool output cut into a ``set`` and contiguous appends, or a
    ``delivery_too_large`` discontinuity.
    """
    if _fits(delivery, safe_bytes):
        return [delivery]
    if (
        delivery.WhichOneof("kind") == "message_delta"
        and delivery.message_delta.target == _TOOL_OUTPUT
    ):
        pieces = _split_tool_output(delivery.message_delta, safe_bytes)
        if pieces:
            return pieces
    keys = keys_of(workspace_id, delivery)
    return [discontinuity(Reason.DISCONTINUITY_REASON_DELIVERY_TOO_LARGE, keys)]


def encode(workspace_id: str, deliveries: Iterable[Delivery], safe_bytes: int) -> list[Body]:
    """Express every delivery within the safe size and encode its body."""
    out: list[Body] = []
    for delivery in deliveries:
        for fitted in express(workspace_id, delivery, safe_bytes):
            out.append(Body(workspace_id, body_of(fitted), fitted.WhichOneof("kind") or ""))
    return out


class DeliveryMapper:
    """Maps one workspace's Host events to delivery bodies (see the module docstring)."""

    def __init__(self, workspace_id: str, *, safe_bytes: int, fence_size: int) -> None:
        self.workspace_id = workspace_id
        self.safe_bytes = safe_bytes
        self.fence = SettledTurnFence(fence_size)

    def map(self, events: Iterable[activity_pb2.ActivityEvent]) -> list[Body]:
        """The bodies for events received together, in order."""
        variants = [d for event in events for d in _live_variants(event, self.fence)]
        return encode(self.workspace_id, coalesce(variants, self.safe_bytes), self.safe_bytes)

    def workspace_discontinuity(self, reason: int) -> Body:
        """A workspace-wide discontinuity body (upstream resubscribed)."""
        delivery = discontinuity(reason, reconcile_keys(self.workspace_id))
        return Body(self.workspace_id, body_of(delivery), "discontinuity")
