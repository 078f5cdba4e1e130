"""``GetTurnResult``: a settled Turn's frozen result (HOST-TURN-7).

Settlement freezes the result (HOST-TURN-6): the Turn names exactly one message
(``result_message_id``) or carries the resolved-empty marker. This read answers with exactly
that, whatever assistant text the Turn got afterwards. Only a Turn settled before resolution
metadata existed (neither is set) gets the bounded legacy fallback: the latest assistant text
among its newest :data:`LEGACY_FALLBACK_WINDOW` messages, flagged as such.
"""

from __future__ import annotations

from dataclasses import dataclass

from domainerrors import FailedPrecondition, InvalidArgument, NotFound
from services.host.context import HostContext
from services.host.model.records import TurnRecord
from services.host.model.session_rules import (
    MAX_ID_LENGTH,
    session_deleted,
    validate_session_id,
)
from services.host.repository.row_records import MessageRecord, message_record, turn_record
from services.host.repository.unit_of_work import HostTransaction

__all__ = ["LEGACY_FALLBACK_WINDOW", "TurnResult", "get_turn_result"]

LEGACY_FALLBACK_WINDOW = 200
"""How many of a legacy Turn's newest messages the fallback looks at."""
_MAX_TURN_ID_CHARS = 2 * MAX_ID_LENGTH


@dataclass(frozen=True)
class TurnResult:
    """A settled Turn and its result.

    Attributes:
        turn: the settled Turn.
        message: the result message (the frozen one, or the legacy fallback's find).
        resolved_empty: the Turn settled with no result message.
        legacy_fallback: ``message`` comes from the bounded fallback scan.
    """

    turn: TurnRecord
    message: MessageRecord | None
    resolved_empty: bool = False
    legacy_fallback: bool = False


def _turn_not_found(turn_id: str) -> NotFound:
    return NotFound(
        f"Turn {turn_id!r} not found", reason="TURN_NOT_FOUND", metadata={"turn_id": turn_id}
    )


async def get_turn_result(
    ctx: HostContext, workspace_id: str, session_id: str, turn_id: str
) -> TurnResult:
    """Read the frozen result of a settled Turn (HOST-TURN-7).

    Raises:
        InvalidArgument: a missing or malformed id.
        NotFound: ``TURN_NOT_FOUND`` (no such Turn in the Session), ``SESSION_DELETED``.
        FailedPrecondition: ``TURN_NOT_SETTLED`` for an active Turn.
    """
    validate_session_id(session_id)
    if not turn_id:
        raise InvalidArgument.for_field("turn_id", "is required")
    if len(turn_id) > _MAX_TURN_ID_CHARS:
        raise InvalidArgument.for_field(
            "turn_id", f"must be at most {_MAX_TURN_ID_CHARS} characters"
        )

    async def run(repos: HostTransaction) -> TurnResult:
        session = await repos.session_rows.get(workspace_id, session_id)
        if session is None:
            raise _turn_not_found(turn_id)
        if session.deleted_at_unix_ms is not None:
            raise session_deleted(session_id)
        turn = await repos.turns.get(workspace_id, session_id, turn_id)
        if turn is None:
            raise _turn_not_found(turn_id)
        if turn.phase != "settled":
            raise FailedPrecondition(
                f"Turn {turn_id!r} is not settled",
                reason="TURN_NOT_SETTLED",
                metadata={"turn_id": turn_id},
            )
        record = turn_record(turn)
        if turn.result_message_id is not None:
            frozen = await repos.messages.get(workspace_id, session_id, turn.result_message_id)
            return TurnResult(record, message_record(frozen) if frozen is not None else None)
        if turn.result_resolved_empty:
            return TurnResult(record, None, resolved_empty=True)
        found = await repos.messages.latest_assistant_text_within(
            workspace_id, session_id, turn_id, LEGACY_FALLBACK_WINDOW
        )
        message = message_record(found) if found is not None else None
        return TurnResult(record, message, legacy_fallback=True)

    return await ctx.transact(run, write=False)
