"""``StopTurn`` and ``ListSessionTurns`` (HOST-TURN-4, HOST-TURN-5).

``StopTurn`` runs in the Session's mutation lane (HOST-LANE-1): it settles exactly the
named Turn ``canceled`` (its active child Turns first: a root Turn settles only after its
children, HOST-TURN-6) and writes a ``stop_turn`` command to the outbox; an already
settled Turn is returned unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from domainerrors import InvalidArgument, NotFound
from services.host.context import HostContext
from services.host.model.listing_cursors import CursorPosition, decode_cursor, encode_cursor
from services.host.model.records import TurnRecord
from services.host.model.session_rules import session_not_found
from services.host.repository.row_records import MessageRecord, message_record, turn_record
from services.host.repository.row_views import MessageRow, TurnRow
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.commands import StopTurn
from services.host.turns import command_outbox, lifecycle
from services.host.turns.submission import restored_input, user_message_id

DEFAULT_TURN_PAGE = 200
MAX_TURN_PAGE = 1000


@dataclass(frozen=True)
class StopResult:
    """The stopped (or already settled) Turn and its user row."""

    turn: TurnRecord
    already_settled: bool
    user_message: MessageRecord | None

    @property
    def restored_input(self) -> str | None:
        """What a composer restores (HOST-TURN-4)."""
        return restored_input(self.user_message)


async def stop_turn(
    ctx: HostContext, workspace_id: str, session_id: str, turn_id: str
) -> StopResult:
    """Settle ``turn_id`` as canceled, or return it unchanged if it already settled.

    Raises:
        NotFound: ``TURN_NOT_FOUND``.
    """
    if not turn_id:
        raise InvalidArgument.for_field("turn_id", "is required")

    async def run(repos: HostTransaction) -> StopResult:
        session = await repos.session_rows.lock_with_root(workspace_id, session_id)
        turn = await repos.turns.get(workspace_id, session_id, turn_id)
        if session is None or turn is None:
            raise NotFound(f"Turn {turn_id!r} not found", reason="TURN_NOT_FOUND")
        user_message = await _user_row(repos, turn)
        if turn.phase == "settled":
            return _stopped(turn, True, user_message)
        now = ctx.clock()
        for child in await repos.turns.active_children(workspace_id, turn_id):
            child_session = await repos.session_rows.get(workspace_id, child.session_id, lock=True)
            if child_session is not None:
                await lifecycle.settle(
                    repos, child_session, child, "canceled", now, release_root=False
                )
                command_outbox.enqueue(repos, ctx, child_session, StopTurn(child.turn_id))
        await lifecycle.settle(repos, session, turn, "canceled", now)
        command_outbox.enqueue(repos, ctx, session, StopTurn(turn.turn_id))
        return _stopped(turn, False, user_message)

    async with ctx.lanes.hold(workspace_id, session_id):
        return await ctx.transact(run)


def _stopped(turn: TurnRow, already_settled: bool, user_message: MessageRow | None) -> StopResult:
    """The result as records (the rows are final: the stop wrote everything it changes)."""
    message = None if user_message is None else message_record(user_message)
    return StopResult(turn_record(turn), already_settled, message)


async def _user_row(repos: HostTransaction, turn: TurnRow) -> MessageRow | None:
    if turn.client_submit_id is None:
        return None
    return await repos.messages.get(
        turn.workspace_id, turn.session_id, user_message_id(turn.client_submit_id)
    )


@dataclass(frozen=True)
class TurnPage:
    """One page of a Session's Turns in creation order."""

    turns: list[TurnRecord]
    next_cursor: str


def _listing(session_id: str) -> str:
    """The cursor's listing key: a Turn cursor is bound to its Session (and workspace)."""
    return f"session-turns/{session_id}"


def _encode_cursor(workspace_id: str, session_id: str, turn: TurnRecord) -> str:
    # The shared value-cursor codec; its position is the listing's (time, id) sort key,
    # here (created_at_unix_ms, turn_id).
    position = CursorPosition(turn.created_at_unix_ms, turn.turn_id)
    return encode_cursor(workspace_id, _listing(session_id), position)


def _decode_cursor(cursor: str, workspace_id: str, session_id: str) -> tuple[int, str]:
    position = decode_cursor(cursor, workspace_id, _listing(session_id))
    return position.updated_at_unix_ms, position.session_id


async def list_turns(
    ctx: HostContext,
    workspace_id: str,
    session_id: str,
    *,
    cursor: str,
    limit: int,
    include_retracted: bool,
) -> TurnPage:
    """Page a Session's Turns by a value cursor bound to the Session.

    Raises:
        InvalidArgument: negative ``limit`` or a foreign cursor (``INVALID_CURSOR``).
        NotFound: ``SESSION_NOT_FOUND``.
    """
    if limit < 0:
        raise InvalidArgument.for_field("limit", "must not be negative")
    size = min(limit or DEFAULT_TURN_PAGE, MAX_TURN_PAGE)
    after = _decode_cursor(cursor, workspace_id, session_id) if cursor else None

    async def run(repos: HostTransaction) -> TurnPage:
        if await repos.session_rows.get(workspace_id, session_id) is None:
            raise session_not_found(workspace_id, session_id)
        rows = await repos.turns.page(
            workspace_id,
            session_id,
            after=after,
            limit=size + 1,
            include_retracted=include_retracted,
        )
        more = len(rows) > size
        rows = rows[:size]
        next_cursor = _encode_cursor(workspace_id, session_id, rows[-1]) if more else ""
        return TurnPage(rows, next_cursor)

    return await ctx.transact(run, write=False)
