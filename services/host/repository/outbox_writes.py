"""Runtime command outbox rows as statements of a write transaction (HOST-RT-1, ADR 0034).

The statements ``services.host.turns.command_outbox`` runs when a command is written by a
write function (``store.direct_writes``) instead of through ``RuntimeCommandRepository``: the
row's insert, the Session's older ``pending`` rows locked for dispatch, their marking, and the
response operation a dispatched delivery moves (HOST-INT-3). Fixed arity, compiled once.
"""

from __future__ import annotations

from typing import Any, Final, cast

from sqlalchemy import Table, and_, bindparam, insert, select, update

from store.direct_reads import ReadQuery
from store.direct_writes import WriteConnection, WriteStatement
from store.models import InteractionResponseOperation, RuntimeCommandOutbox

__all__ = [
    "insert_command",
    "mark_dispatched",
    "operation",
    "pending_of_session",
    "set_operation",
]

_C = cast(Table, RuntimeCommandOutbox.__table__)
_O = cast(Table, InteractionResponseOperation.__table__)

# A new row has no id yet (the sequence gives it) and no error.
_COMMAND_COLUMNS: Final = tuple(c.key for c in _C.c if c.key not in ("id", "last_error"))
_INSERT: Final = WriteStatement(insert(_C).values({k: bindparam(k) for k in _COMMAND_COLUMNS}))
# Locked (Postgres) and in id order, like ``RuntimeCommandRepository.pending_of``: a
# concurrent acknowledgement or withdrawal commits first, and its row is then not returned.
_PENDING_OF_SESSION: Final = ReadQuery(
    select(_C)
    .where(
        _C.c.workspace_id == bindparam("ws"),
        _C.c.state == "pending",
        _C.c.session_id == bindparam("sid"),
    )
    .order_by(_C.c.id)
    .with_for_update()
)
_MARK_DISPATCHED: Final = WriteStatement(
    update(_C)
    .where(_C.c.id == bindparam("row_id"))
    .values(
        state="dispatched", attempts=bindparam("new_attempts"), updated_at_unix_ms=bindparam("now")
    )
)
_OPERATION: Final = ReadQuery(
    select(_O.c.state, _O.c.attempts).where(
        and_(_O.c.workspace_id == bindparam("ws"), _O.c.operation_id == bindparam("op"))
    )
)
_SET_OPERATION: Final = WriteStatement(
    update(_O)
    .where(and_(_O.c.workspace_id == bindparam("ws"), _O.c.operation_id == bindparam("op")))
    .values(
        state=bindparam("new_state"),
        attempts=bindparam("new_attempts"),
        next_attempt_at_unix_ms=bindparam("next_attempt"),
        updated_at_unix_ms=bindparam("now"),
    )
)


def insert_command(conn: WriteConnection, values: dict[str, Any]) -> None:
    """Insert a new outbox row (``command_rows.pending_values``: no ``id``, no error).

    Deferred: it travels with the transaction's next statement (``WriteConnection.defer``).
    """
    conn.defer(_INSERT, values)


def pending_of_session(conn: WriteConnection, workspace_id: str, session_id: str) -> list[Any]:
    """The Session's ``pending`` rows (``CommandRow`` columns), locked, oldest first."""
    return conn.all(_PENDING_OF_SESSION, {"ws": workspace_id, "sid": session_id})


def mark_dispatched(conn: WriteConnection, row_id: int, attempts: int, now: int) -> None:
    """Mark a row ``dispatched`` with its new attempt count."""
    conn.execute(_MARK_DISPATCHED, {"row_id": row_id, "new_attempts": attempts, "now": now})


def operation(conn: WriteConnection, workspace_id: str, operation_id: str) -> Any | None:
    """A response operation's ``state`` and ``attempts``, or ``None``."""
    return conn.first(_OPERATION, {"ws": workspace_id, "op": operation_id})


def set_operation(
    conn: WriteConnection,
    workspace_id: str,
    operation_id: str,
    *,
    state: str,
    attempts: int,
    next_attempt_at_unix_ms: int,
    now: int,
) -> None:
    """Set a response operation's state, attempts and next disposition query time."""
    conn.execute(
        _SET_OPERATION,
        {
            "ws": workspace_id,
            "op": operation_id,
            "new_state": state,
            "new_attempts": attempts,
            "next_attempt": next_attempt_at_unix_ms,
            "now": now,
        },
    )
