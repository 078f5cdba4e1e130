"""The monotonic Turn lifecycle and frozen settlement (HOST-TURN-5, HOST-TURN-6).

Phases move ``queued -> running <-> awaiting_interaction -> settled``; every committed
change bumps ``version``; a settled Turn never becomes active again and clears only its
own active reference on the Session. Settlement freezes the result: the Turn's latest
persisted assistant text message, or an explicit resolved-empty marker.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.host.activity_store import ActivityRepositories
from store.models import Session, Turn

PHASE_RANK = {"queued": 0, "running": 1, "awaiting_interaction": 1, "settled": 2}
"""``running`` and ``awaiting_interaction`` share a rank: they may alternate."""

ACTIVE_PHASES = ("queued", "running", "awaiting_interaction")

# What a Turn's still-open Interactions become when it settles: a user stop or an
# interrupt delivery interrupts them; runtime loss and provider settlement leave them
# no longer actionable (HOST-INT-1, HOST-INT-3).
_OPEN_INTERACTIONS_ON_SETTLE = {
    "canceled": "interrupted",
    "interrupted": "superseded",
    "completed": "superseded",
    "failed": "superseded",
}


@dataclass(frozen=True)
class PhaseChange:
    """What applying a phase did: ``changed`` false means an exact or stale replay."""

    changed: bool
    stale: bool = False


def is_active(turn: Turn) -> bool:
    """Whether the Turn is before ``settled``."""
    return turn.phase in ACTIVE_PHASES


def advance_phase(turn: Turn, phase: str, now: int) -> PhaseChange:
    """Move a Turn to a non-terminal ``phase`` if that is forward (never backwards).

    A settled Turn or a backwards move is a stale replay and changes nothing.
    """
    if turn.phase == phase:
        return PhaseChange(changed=False)
    if turn.phase == "settled" or PHASE_RANK[phase] < PHASE_RANK[turn.phase]:
        return PhaseChange(changed=False, stale=True)
    turn.phase = phase
    if phase in ("running", "awaiting_interaction") and turn.started_at_unix_ms is None:
        turn.started_at_unix_ms = now
    turn.version += 1
    turn.updated_at_unix_ms = now
    return PhaseChange(changed=True)


async def settle(
    repos: ActivityRepositories,
    session: Session,
    turn: Turn,
    outcome: str,
    now: int,
    *,
    failure_message: str | None = None,
    open_interactions_become: str | None = None,
) -> PhaseChange:
    """Settle ``turn`` with ``outcome``, freezing its result (idempotent on a settled Turn).

    The caller has already written every message of the Turn it knows about (the causal
    write barrier, HOST-RT-3), so the result read here is the latest durable assistant text.
    """
    if turn.phase == "settled":
        return PhaseChange(changed=False, stale=turn.outcome != outcome)
    result = await repos.messages.latest_assistant_text(
        turn.workspace_id, turn.session_id, turn.turn_id
    )
    turn.phase = "settled"
    turn.outcome = outcome
    turn.settled_at_unix_ms = now
    turn.updated_at_unix_ms = now
    turn.version += 1
    turn.result_message_id = result.message_id if result is not None else None
    turn.result_resolved_empty = result is None
    if outcome == "failed" and failure_message:
        turn.failure_message = failure_message
    if session.active_turn_id == turn.turn_id:
        session.active_turn_id = None
    session.updated_at_unix_ms = max(session.updated_at_unix_ms, now)
    status = open_interactions_become or _OPEN_INTERACTIONS_ON_SETTLE[outcome]
    await close_open_interactions(repos, turn, status, now)
    return PhaseChange(changed=True)


async def close_open_interactions(
    repos: ActivityRepositories, turn: Turn, status: str, now: int
) -> None:
    """Terminalize the Turn's pending and resolving Interactions and their operations."""
    for interaction in await repos.interactions.open_for_turn(
        turn.workspace_id, turn.session_id, turn.turn_id
    ):
        interaction.status = status
        interaction.version += 1
        interaction.updated_at_unix_ms = now
        for operation in await repos.operations.open_for_interaction(
            interaction.workspace_id,
            interaction.session_id,
            interaction.turn_id,
            interaction.request_id,
        ):
            operation.state = "completed"
            operation.disposition = status
            operation.completed_at_unix_ms = now
            operation.updated_at_unix_ms = now
