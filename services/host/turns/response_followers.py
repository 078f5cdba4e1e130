"""Competing responders: operations that follow the one that claimed an Interaction (HOST-INT-5).

Exactly one response operation ever claims an Interaction (the claim moves it ``pending ->
resolving`` and nothing returns it to ``pending``); its id is stored with the claimed answer.
A later ``SubmitInteractionResponse`` under another idempotency key is a *follower*: it is
never dispatched, and its disposition is derived from the claimant's:

* a different action, option or payload is ``superseded`` at once;
* the same answer is ``resolving`` while the claimant is open, then ``answered`` when the
  claimant completes ``answered`` and ``superseded`` for any other outcome.

Followers complete in the transaction that completes their claimant, so every read of a
follower shows the followed outcome.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from services.host.repository.row_views import InteractionRow, OperationRow
from services.host.repository.unit_of_work import HostTransaction

CLAIMANT_KEY = "operation_id"
"""Key of the claimant's operation id in the Interaction's stored answer."""


@dataclass(frozen=True)
class Answer:
    """The answer of a response: what competing responders compare."""

    action: str
    option_id: str | None
    payload_json: str | None

    def same_as(self, other: Answer) -> bool:
        """Whether both say the same thing (payloads compared as JSON values, not text)."""
        return (
            self.action == other.action
            and self.option_id == other.option_id
            and _payload(self.payload_json) == _payload(other.payload_json)
        )


def _payload(text: str | None) -> object:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:  # stored before validation existed: compare the text itself
        return text


def operation_answer(operation: OperationRow) -> Answer:
    """The answer an operation carries."""
    return Answer(operation.action, operation.option_id, operation.answer_json)


def claimant_id(interaction: InteractionRow) -> str | None:
    """The id of the operation that claimed the Interaction, as stored with its answer."""
    if not interaction.answer_json:
        return None
    try:
        stored = json.loads(interaction.answer_json)
    except ValueError:
        return None
    value = stored.get(CLAIMANT_KEY) if isinstance(stored, dict) else None
    return value if isinstance(value, str) else None


async def claimant(repos: HostTransaction, interaction: InteractionRow) -> OperationRow | None:
    """The operation that claimed the Interaction, or ``None`` when none did.

    Claims stored before the claimant's id was kept with the answer fall back to the
    Interaction's first operation: followers only ever come after their claimant.
    """
    ws, sid = interaction.workspace_id, interaction.session_id
    operation_id = claimant_id(interaction)
    if operation_id is not None:
        return await repos.operations.get(ws, operation_id)
    if interaction.answer_json is None:
        return None
    return await repos.operations.first_for_interaction(
        ws, sid, interaction.turn_id, interaction.request_id
    )


def follower_disposition(answer: Answer, leader: OperationRow) -> str | None:
    """A follower's disposition given its claimant, or ``None`` while it must keep waiting."""
    if not answer.same_as(operation_answer(leader)):
        return "superseded"
    if leader.state != "completed":
        return None
    return "answered" if leader.disposition == "answered" else "superseded"


async def complete_open_operations(
    repos: HostTransaction,
    interaction: InteractionRow,
    disposition: str,
    now: int,
    *,
    detail: str | None = None,
) -> None:
    """Complete the Interaction's open operations: the claimant with ``disposition``.

    Every follower becomes ``answered`` when the claimant does and ``superseded`` otherwise.
    The claimant is found as :func:`claimant` finds it, so a claim stored before its id was
    kept still tells its followers apart.
    """
    leader = await claimant(repos, interaction)
    leader_id = None if leader is None else leader.operation_id
    for operation in await repos.operations.open_for_interaction(
        interaction.workspace_id,
        interaction.session_id,
        interaction.turn_id,
        interaction.request_id,
    ):
        follows = leader_id is not None and operation.operation_id != leader_id
        outcome = disposition
        if follows and disposition != "answered":
            outcome = "superseded"
        repos.operations.complete(
            operation, outcome, now, detail=f"follows {leader_id}" if follows else detail
        )
