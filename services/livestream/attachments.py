"""Attachment baselines read fresh from Host (LIVE-ATT-1).

An attach publishes ``attachment_changed`` at once, then runs the baseline as a task of
the publisher: the Session's Turns (one ``turn_update`` each, with the Session's active
Turn), an ``interaction_snapshot`` carrying its exact root Turn (present even when empty)
and the ``attachment_caught_up`` barrier echoing the attachment's identity. A newer
revision of the binding, a detach or the end of the epoch cancels the task before its
barrier. Nothing of a baseline is ever served from livestream memory: a replacement
attach after a reconnect reads Host again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from agentactivity.livestream.v1 import livestream_pb2
from services.livestream.deliveries import express
from services.livestream.publisher import Binding, Publisher
from services.livestream.source import ActivitySource, SessionNotFound, SourceUnavailable

__all__ = ["attach", "detach", "rebaseline"]

log = logging.getLogger(__name__)

Delivery = livestream_pb2.Delivery
RejectedReason = livestream_pb2.AttachmentRejectedReason


def _publish(publisher: Publisher, workspace_id: str, delivery: Delivery, safe_bytes: int) -> None:
    for fitted in express(workspace_id, delivery, safe_bytes):
        publisher.publish(fitted)


def attach(
    publisher: Publisher,
    request: livestream_pb2.ClientAttach,
    source: ActivitySource,
    *,
    safe_bytes: int,
) -> None:
    """Start (or replace) the attachment of ``request.binding_id``.

    The caller checked the revision and the workspace.
    """
    binding = publisher.bindings.get(request.binding_id)
    if binding is None:
        binding = publisher.bindings[request.binding_id] = Binding(request.binding_id, 0)
    if binding.task is not None:
        binding.task.cancel()
    binding.revision = request.revision
    binding.workspace_id = request.workspace_id
    binding.session_id = request.session_id
    binding.caller_turn_id = request.caller_turn_id if request.HasField("caller_turn_id") else None
    binding.caught_up = False
    changed = livestream_pb2.AttachmentChanged(
        binding_id=request.binding_id,
        revision=request.revision,
        workspace_id=request.workspace_id,
        session_id=request.session_id,
    )
    if binding.caller_turn_id is not None:
        changed.caller_turn_id = binding.caller_turn_id
    publisher.publish(Delivery(attachment_changed=changed))
    binding.task = asyncio.create_task(
        _baseline(publisher, binding, binding.revision, source, safe_bytes),
        name=f"baseline-{request.binding_id}",
    )


def rebaseline(
    publisher: Publisher, binding: Binding, source: ActivitySource, *, safe_bytes: int
) -> None:
    """Read again the baseline of a binding whose barrier was not reached.

    A publisher handed over from another replica mid-baseline (SCALE-4): its
    ``attachment_changed`` was already sequenced, so only the baseline and its barrier
    follow (Turns already sent are sent again; they are state, not increments).
    """
    if binding.task is not None:
        binding.task.cancel()
    binding.task = asyncio.create_task(
        _baseline(publisher, binding, binding.revision, source, safe_bytes),
        name=f"baseline-{binding.binding_id}",
    )


def detach(publisher: Publisher, request: livestream_pb2.ClientDetach) -> None:
    """End the attachment of ``request.binding_id``.

    Idempotent: an unknown binding is acknowledged the same way.
    """
    binding = publisher.bindings.get(request.binding_id)
    if binding is None:
        binding = publisher.bindings[request.binding_id] = Binding(request.binding_id, 0)
    if binding.task is not None:
        binding.task.cancel()
        binding.task = None
    workspace_id = binding.workspace_id if binding.session_id is not None else ""
    binding.revision = request.revision
    binding.session_id = None
    binding.caught_up = False
    publisher.publish(
        Delivery(
            attachment_changed=livestream_pb2.AttachmentChanged(
                binding_id=request.binding_id,
                revision=request.revision,
                workspace_id=workspace_id,
            )
        )
    )


def _observed(read: asyncio.Future[Any]) -> None:
    """Retrieve a shielded read's outcome.

    So one nobody awaits anymore is not reported as 'exception never retrieved'.
    """
    if not read.cancelled():
        read.exception()


async def _baseline(
    publisher: Publisher,
    binding: Binding,
    revision: int,
    source: ActivitySource,
    safe_bytes: int,
) -> None:
    workspace_id, session_id = binding.workspace_id, binding.session_id or ""
    identity: dict[str, Any] = {
        "binding_id": binding.binding_id,
        "revision": revision,
        "workspace_id": workspace_id,
        "session_id": session_id,
    }
    # The read is shielded: a replaced attachment or a discarded publisher cancels this
    # task, not Host's query (a cancelled read mid-query is noise in Host's logs); the
    # read is bounded by its deadline and its result is then dropped.
    read = asyncio.ensure_future(source.read_baseline(workspace_id, session_id))
    read.add_done_callback(_observed)
    # Held by the publisher until done, so discarding the publisher (or stopping the
    # server) cancels it instead of leaving it pending.
    publisher.reads.add(read)
    read.add_done_callback(publisher.reads.discard)
    try:
        baseline = await asyncio.shield(read)
    except (SessionNotFound, SourceUnavailable) as error:
        if binding.revision != revision or binding.session_id != session_id:
            return
        reason = (
            RejectedReason.ATTACHMENT_REJECTED_REASON_SESSION_NOT_FOUND
            if isinstance(error, SessionNotFound)
            else RejectedReason.ATTACHMENT_REJECTED_REASON_HOST_UNAVAILABLE
        )
        publisher.publish(
            Delivery(
                attachment_rejected=livestream_pb2.AttachmentRejected(reason=reason, **identity)
            )
        )
        binding.task = None
        return
    if binding.revision != revision or binding.session_id != session_id:
        return  # replaced while Host was read; the newer revision runs its own baseline
    active = (
        baseline.session.active_turn_id if baseline.session.HasField("active_turn_id") else None
    )
    for turn in baseline.turns:
        update = livestream_pb2.TurnUpdate(turn=turn)
        if active is not None:
            update.active_turn_id = active
        _publish(publisher, workspace_id, Delivery(turn_update=update), safe_bytes)
    snapshot = livestream_pb2.InteractionSnapshot(interactions=baseline.interactions, **identity)
    caught_up = livestream_pb2.AttachmentCaughtUp(
        canonical_turn_ids=sorted({t.turn_id for t in baseline.turns}),
        **identity,
    )
    if baseline.root_turn_id is not None:
        snapshot.root_turn_id = baseline.root_turn_id
        caught_up.current_interaction_root_turn_id = baseline.root_turn_id
    if binding.caller_turn_id is not None:
        caught_up.caller_turn_id = binding.caller_turn_id
    _publish(publisher, workspace_id, Delivery(interaction_snapshot=snapshot), safe_bytes)
    _publish(publisher, workspace_id, Delivery(attachment_caught_up=caught_up), safe_bytes)
    binding.caught_up = True
    binding.task = None
