"""A runtime's command acknowledgement as one direct write transaction (HOST-RT-5, ADR 0034).

Every command a runtime receives is acknowledged once, so this transaction runs once per
``SendInput`` and per interaction response. :func:`record_ack` is a *synchronous* function of a
:class:`~store.direct_writes.WriteConnection`: its three to six point statements (fixed arity,
compiled once per backend) and the decisions between them run on a store writer thread in one
hop (``ctx.write``), with no ORM session. It changes no activity (outbox rows and response
operations are not in the activity feed), so no event rows are due.

Rules (the outbox's retention, ``services.host.turns.command_outbox``): ``accepted`` completes
the row, ``rejected`` fails it for good, ``failed`` puts it back to ``pending``. A completed or
failed row is deleted at once unless it delivers a response operation that has not completed,
or it is a rejected awaited command (its waiter settles it); acknowledged deliveries of
completed operations are then pruned, at most ``PRUNE_BATCH`` per acknowledgement. Only a
delivery moves its operation, and only a ``failed`` one (back to ``pending``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, cast

from sqlalchemy import Table, and_, bindparam, delete, or_, select, update

from services.host.repository.command_rows import ACKNOWLEDGED, AWAITED_COMMAND_KINDS, PRUNE_BATCH
from store.direct_reads import ReadConnection, ReadQuery
from store.direct_writes import WriteConnection, WriteStatement
from store.models import InteractionResponseOperation, RuntimeCommandOutbox

__all__ = ["DELIVER", "AckOutcome", "StoredCommand", "record_ack", "stored_command"]

DELIVER: Final = "deliver_interaction_response"
"""Kind of the command that delivers a response operation's answer."""

_NEW_STATE: Final = {"accepted": "completed", "rejected": "failed"}
"""The row's state after each acknowledgement status (anything else: ``pending``)."""

_C = cast(Table, RuntimeCommandOutbox.__table__)
_O = cast(Table, InteractionResponseOperation.__table__)

# Locked (Postgres; SQLite writers hold the database lock), so an acknowledgement and a
# withdrawal of the same command serialize and the later one sees the earlier one's commit.
_COMMAND: Final = ReadQuery(
    select(
        _C.c.id,
        _C.c.workspace_id,
        _C.c.state,
        _C.c.command_kind,
        _C.c.operation_id,
        _C.c.last_error,
    )
    .where(_C.c.command_id == bindparam("command_id"))
    .with_for_update()
)
_OPERATION_STATE: Final = ReadQuery(
    select(_O.c.state).where(
        and_(_O.c.workspace_id == bindparam("ws"), _O.c.operation_id == bindparam("op"))
    )
)
_SET_COMMAND: Final = WriteStatement(
    update(_C)
    .where(_C.c.id == bindparam("row_id"))
    .values(
        state=bindparam("new_state"),
        last_error=bindparam("new_error"),
        updated_at_unix_ms=bindparam("now"),
    )
)
_DELETE_COMMAND: Final = WriteStatement(delete(_C).where(_C.c.id == bindparam("row_id")))
_OPERATION_BACK_TO_PENDING: Final = WriteStatement(
    update(_O)
    .where(and_(_O.c.workspace_id == bindparam("ws"), _O.c.operation_id == bindparam("op")))
    .values(state="pending", last_error=bindparam("new_error"), updated_at_unix_ms=bindparam("now"))
)
# Acknowledged deliveries (accepted or rejected) whose response operation has completed, at
# most PRUNE_BATCH, deleted by one statement. Such a row outlives its acknowledgement only
# while its operation is open. Rows without an operation are not touched (``failed`` ones
# include the commands of deleted Sessions, which stay until the purge), nor awaited commands,
# which their waiter settles. Fixed arity: the state and kind lists are spelled out.
_SETTLED_DELIVERIES: Final = (
    select(_C.c.id)
    .join(
        _O,
        and_(_O.c.workspace_id == _C.c.workspace_id, _O.c.operation_id == _C.c.operation_id),
    )
    .where(
        or_(*(_C.c.state == state for state in ACKNOWLEDGED)),
        _C.c.operation_id.is_not(None),
        *(_C.c.command_kind != kind for kind in AWAITED_COMMAND_KINDS),
        _O.c.state == "completed",
    )
    .limit(PRUNE_BATCH)
    .correlate(None)
)
_PRUNE_SETTLED: Final = WriteStatement(delete(_C).where(_C.c.id.in_(_SETTLED_DELIVERIES)))


@dataclass(frozen=True)
class AckOutcome:
    """What an acknowledgement did to its row.

    Attributes:
        found: the row existed (``False``: an acknowledgement of an unknown or deleted
            command, ignored).
        applied: the acknowledgement changed the row (``False`` when it was acknowledged
            already, or unknown).
        state: the row's state after the acknowledgement (its old one when it was
            acknowledged already, and the acknowledgement was ignored).
        error: the row's ``last_error`` after it.
        pruned: acknowledged deliveries of completed operations deleted besides it.
        kind: the command's kind (``None`` when the row was not found).
    """

    found: bool
    applied: bool = False
    state: str | None = None
    error: str | None = None
    pruned: int = 0
    kind: str | None = None


def record_ack(
    conn: WriteConnection, command_id: str, status: str, detail: str | None, now: int
) -> AckOutcome:
    """Record an acknowledgement on its outbox row, in the open direct write transaction.

    Args:
        conn: the transaction.
        command_id: the acknowledged command.
        status: ``accepted``, ``rejected`` or ``failed``.
        detail: the runtime's reason (or message); ``None`` when it gave none.
        now: the acknowledgement's time (unix ms).
    """
    row = conn.first(_COMMAND, {"command_id": command_id})
    if row is None:
        return AckOutcome(found=False)
    if row.state in ACKNOWLEDGED:
        return AckOutcome(found=True, state=row.state, error=row.last_error, kind=row.command_kind)
    state = _NEW_STATE.get(status, "pending")
    if status == "accepted":
        error = row.last_error
    else:
        error = detail or ("rejected" if status == "rejected" else "failed")
    operation_state: str | None = None
    operation = {"ws": row.workspace_id, "op": row.operation_id}
    if row.operation_id is not None and row.command_kind == DELIVER:
        # Only a delivery moves its operation: an acknowledged disposition query says nothing
        # about the answer, and a failed one keeps the operation resolving (HOST-INT-6).
        found = conn.first(_OPERATION_STATE, operation)
        operation_state = None if found is None else found.state
        if operation_state not in (None, "completed") and status == "failed":
            conn.execute(_OPERATION_BACK_TO_PENDING, {**operation, "new_error": error, "now": now})
    if state not in ACKNOWLEDGED:
        conn.execute(
            _SET_COMMAND, {"row_id": row.id, "new_state": state, "new_error": error, "now": now}
        )
        return AckOutcome(found=True, applied=True, state=state, error=error, kind=row.command_kind)
    # A rejected awaited command stays until its waiter settled it (withdraw_awaited): the row
    # left behind is how the waiter tells a rejection from an acceptance it missed.
    kept = row.command_kind in AWAITED_COMMAND_KINDS and state == "failed"
    if not kept and operation_state in (None, "completed"):
        conn.execute(_DELETE_COMMAND, {"row_id": row.id})
    else:
        conn.execute(
            _SET_COMMAND, {"row_id": row.id, "new_state": state, "new_error": error, "now": now}
        )
    pruned = conn.execute(_PRUNE_SETTLED)
    return AckOutcome(
        found=True,
        applied=True,
        state=state,
        error=error,
        pruned=pruned,
        kind=row.command_kind,
    )


_STORED: Final = ReadQuery(
    select(_C.c.state, _C.c.attempts, _C.c.last_error).where(
        _C.c.command_id == bindparam("command_id")
    )
)


@dataclass(frozen=True)
class StoredCommand:
    """An outbox row as an awaiting replica reads it (SCALE-2): its state and last error."""

    state: str
    attempts: int
    last_error: str | None


def stored_command(conn: ReadConnection, command_id: str) -> StoredCommand | None:
    """The row of ``command_id`` (one statement), or ``None`` once it is deleted."""
    row = conn.first(_STORED, {"command_id": command_id})
    return None if row is None else StoredCommand(row.state, row.attempts, row.last_error)
