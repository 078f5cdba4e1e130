"""The monotonic Turn lifecycle and frozen settlement (HOST-TURN-5, HOST-TURN-6).

Phases move ``queued -> running <-> awaiting_interaction -> settled``; every committed
change bumps ``version``; a settled Turn never becomes active again and clears only its
own active reference on the Session. Settlement freezes the result: the Turn's latest
persisted assistant text message, or an explicit resolved-empty marker.

A root Turn settles only once no child Turn (a Turn of a child Session whose
``root_turn_id`` names it) is still active (HOST-TURN-6):

* a runtime's terminal patch for a root Turn with active children is *recorded*
  (:func:`settle_when_children_done`): outcome, failure message and the frozen result
  candidate go to ``deferred_settlement_json`` and the Turn stays active; the settlement of
  its last active child settles it with the recorded values, in the same transaction;
* a forced settlement (``StopTurn``, an interrupt delivery, runtime loss) settles the
  active children first, with the same outcome, then the root.

Every caller locks Session rows root first (``SessionRowRepository.lock_with_root``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from services.host.repository.row_views import SessionRow, TurnRow
from services.host.repository.turn_rows import ACTIVE_PHASES
from services.host.repository.unit_of_work import HostTransaction
from services.host.turns import response_followers

PHASE_RANK = {"queued": 0, "running": 1, "awaiting_interaction": 1, "settled": 2}
"""``running`` and ``awaiting_interaction`` share a rank: they may alternate."""


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


def is_active(turn: TurnRow) -> bool:
    """Whether the Turn is before ``settled``."""
    return turn.phase in ACTIVE_PHASES


def advance_phase(repos: HostTransaction, turn: TurnRow, phase: str, now: int) -> PhaseChange:
    """Move a Turn to a non-terminal ``phase`` if that is forward (never backwards).

    A settled Turn or a backwards move is a stale replay and changes nothing.
    """
    if turn.phase == phase:
        return PhaseChange(changed=False)
    if turn.phase == "settled" or PHASE_RANK[phase] < PHASE_RANK[turn.phase]:
        return PhaseChange(changed=False, stale=True)
    started = turn.started_at_unix_ms
    if phase in ("running", "awaiting_interaction") and started is None:
        started = now
    repos.turns.update(
        turn,
        phase=phase,
        started_at_unix_ms=started,
        version=turn.version + 1,
        updated_at_unix_ms=now,
    )
    return PhaseChange(changed=True)


@dataclass(frozen=True)
class DeferredSettlement:
    """A root Turn's reported settlement, waiting for its active children (HOST-TURN-6).

    Attributes:
        outcome: the reported outcome the Turn settles with.
        failure_message: the reported failure text (``failed`` only).
        result_message_id: the frozen result candidate: the latest durable assistant text
            when the report arrived; ``None`` is the resolved-empty marker.
        reported_at_unix_ms: when Host recorded the report.
    """

    outcome: str
    failure_message: str | None
    result_message_id: str | None
    reported_at_unix_ms: int

    def to_json(self) -> str:
        """The ``turns.deferred_settlement_json`` text."""
        return json.dumps(
            {
                "outcome": self.outcome,
                "failure_message": self.failure_message,
                "result_message_id": self.result_message_id,
                "reported_at_unix_ms": self.reported_at_unix_ms,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> DeferredSettlement:
        """Parse a stored ``deferred_settlement_json``."""
        data = json.loads(text)
        return cls(
            outcome=str(data["outcome"]),
            failure_message=data.get("failure_message"),
            result_message_id=data.get("result_message_id"),
            reported_at_unix_ms=int(data.get("reported_at_unix_ms") or 0),
        )


def deferred_settlement(turn: TurnRow) -> DeferredSettlement | None:
    """The settlement recorded for an active root Turn, if any."""
    if turn.deferred_settlement_json is None:
        return None
    return DeferredSettlement.from_json(turn.deferred_settlement_json)


async def settle_when_children_done(
    repos: HostTransaction,
    session: SessionRow,
    turn: TurnRow,
    outcome: str,
    now: int,
    *,
    failure_message: str | None = None,
) -> PhaseChange:
    """Apply a runtime's terminal patch: settle now, or record it while children run.

    A root Turn with active child Turns stays active; the patch (outcome, failure message,
    and the result frozen from the durable messages now) is recorded and applied when the
    last child settles (HOST-TURN-6). A repeated patch is a replay.
    """
    if turn.phase == "settled":
        return PhaseChange(changed=False, stale=turn.outcome != outcome)
    recorded = deferred_settlement(turn)
    if recorded is not None:
        return PhaseChange(changed=False, stale=recorded.outcome != outcome)
    if not await repos.turns.active_children(turn.workspace_id, turn.turn_id):
        return await settle(repos, session, turn, outcome, now, failure_message=failure_message)
    result = await repos.messages.latest_assistant_text(
        turn.workspace_id, turn.session_id, turn.turn_id
    )
    recorded = DeferredSettlement(
        outcome=outcome,
        failure_message=failure_message if outcome == "failed" else None,
        result_message_id=result.message_id if result is not None else None,
        reported_at_unix_ms=now,
    )
    repos.turns.update(
        turn,
        deferred_settlement_json=recorded.to_json(),
        version=turn.version + 1,
        updated_at_unix_ms=now,
    )
    return PhaseChange(changed=True)


async def settle(
    repos: HostTransaction,
    session: SessionRow,
    turn: TurnRow,
    outcome: str,
    now: int,
    *,
    failure_message: str | None = None,
    open_interactions_become: str | None = None,
    release_root: bool = True,
) -> PhaseChange:
    """Settle ``turn`` with ``outcome``, freezing its result (idempotent on a settled Turn).

    The caller has already written every message of the Turn it knows about (the causal
    write barrier, HOST-RT-3), so the result read here is the latest durable assistant text
    (or the candidate frozen when a deferred settlement was recorded). Active child Turns
    settle first, with the same outcome for a stop or an interrupt (``canceled`` otherwise).
    Settling a child Turn settles its root Turn when that root's settlement was deferred
    and this was its last active child (unless ``release_root`` is false: a cascade from
    the root itself).
    """
    if turn.phase == "settled":
        return PhaseChange(changed=False, stale=turn.outcome != outcome)
    child_outcome = outcome if outcome in ("canceled", "interrupted") else "canceled"
    for child in await repos.turns.active_children(turn.workspace_id, turn.turn_id):
        child_session = await repos.session_rows.get(
            child.workspace_id, child.session_id, lock=True
        )
        if child_session is not None:
            await settle(repos, child_session, child, child_outcome, now, release_root=False)
    recorded = deferred_settlement(turn)
    if recorded is not None:
        result_message_id = recorded.result_message_id
    else:
        result = await repos.messages.latest_assistant_text(
            turn.workspace_id, turn.session_id, turn.turn_id
        )
        result_message_id = result.message_id if result is not None else None
    repos.turns.update(
        turn,
        phase="settled",
        outcome=outcome,
        settled_at_unix_ms=now,
        updated_at_unix_ms=now,
        version=turn.version + 1,
        result_message_id=result_message_id,
        result_resolved_empty=result_message_id is None,
        deferred_settlement_json=None,
        failure_message=(
            failure_message if outcome == "failed" and failure_message else turn.failure_message
        ),
    )
    repos.session_rows.update(
        session,
        active_turn_id=None if session.active_turn_id == turn.turn_id else session.active_turn_id,
        updated_at_unix_ms=max(session.updated_at_unix_ms, now),
    )
    status = open_interactions_become or _OPEN_INTERACTIONS_ON_SETTLE[outcome]
    await close_open_interactions(repos, turn, status, now)
    if release_root and turn.root_turn_id is not None and turn.root_turn_id != turn.turn_id:
        await _release_root(repos, session, turn.root_turn_id, now)
    return PhaseChange(changed=True)


async def _release_root(
    repos: HostTransaction, child_session: SessionRow, root_turn_id: str, now: int
) -> None:
    """Settle a deferred root Turn whose last active child just settled (HOST-TURN-6)."""
    workspace_id = child_session.workspace_id
    root_session = await repos.session_rows.get(
        workspace_id, child_session.root_session_id, lock=True
    )
    if root_session is None:
        return
    root = await repos.turns.get(workspace_id, root_session.session_id, root_turn_id)
    if root is None or not is_active(root):
        return
    recorded = deferred_settlement(root)
    if recorded is None or await repos.turns.active_children(workspace_id, root_turn_id):
        return
    await settle(
        repos,
        root_session,
        root,
        recorded.outcome,
        now,
        failure_message=recorded.failure_message,
    )


async def close_open_interactions(
    repos: HostTransaction, turn: TurnRow, status: str, now: int
) -> None:
    """Terminalize the Turn's pending and resolving Interactions and their operations."""
    for interaction in await repos.interactions.open_for_turn(
        turn.workspace_id, turn.session_id, turn.turn_id
    ):
        repos.interactions.update(
            interaction,
            status=status,
            version=interaction.version + 1,
            updated_at_unix_ms=now,
        )
        # The claimant takes the status; its followers become superseded (HOST-INT-5).
        await response_followers.complete_open_operations(repos, interaction, status, now)
