"""Recipient projection (LIVE-PROJ-1).

A delivery goes out to a call only for workspaces the call's principal holds; any other
is replaced by ``filtered``, which carries nothing but keeps the sequence contiguous, so
the skip does not look like a gap. Identity fields are not renamed by this deployment
(device and Host share ids, ADR 0019), and business values are never parsed: a delivery
that is sent is sent byte-for-byte as it was encoded.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentactivity.livestream.v1 import livestream_pb2
from grpcserver.auth import Principal
from services.livestream.encoding import body_of, delivery_bytes

__all__ = ["hidden_workspaces", "project", "workspace_of"]

_FILTERED_BODY = body_of(livestream_pb2.Delivery(filtered=livestream_pb2.FilteredDelivery()))


def hidden_workspaces(scope: Iterable[str], principal: Principal) -> frozenset[str]:
    """The workspaces of ``scope`` the principal may not see (normally none)."""
    return frozenset(w for w in scope if not principal.may_access(w))


def workspace_of(delivery: livestream_pb2.Delivery) -> str:
    """The workspace a delivery is about ("" for one that names none)."""
    kind = delivery.WhichOneof("kind")
    if kind == "message_delta":
        return delivery.message_delta.workspace_id
    if kind == "turn_update":
        return delivery.turn_update.turn.workspace_id
    if kind == "interaction_update":
        return delivery.interaction_update.workspace_id
    if kind == "discontinuity":
        return delivery.discontinuity.keys.workspace_id
    if kind in (
        "attachment_changed",
        "interaction_snapshot",
        "attachment_caught_up",
        "attachment_rejected",
    ):
        return str(getattr(delivery, kind).workspace_id)
    return ""


def project(encoded: bytes, hidden: frozenset[str]) -> bytes:
    """``encoded`` as the recipient may see it: itself, or ``filtered`` at its sequence."""
    delivery = livestream_pb2.Delivery.FromString(encoded)
    if workspace_of(delivery) in hidden:
        return delivery_bytes(delivery.sequence, _FILTERED_BODY)
    return encoded
