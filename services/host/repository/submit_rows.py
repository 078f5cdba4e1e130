"""The rows of a ``SendInput`` submit as statements of one write transaction (ADR 0034).

The submit (``services.host.turns.submit_write``) is a synchronous function of a
:class:`~store.direct_writes.WriteConnection`: on a direct write it runs on the store's writer
thread in one hop, inside an ORM transaction (``CreateSession`` with input, an interrupt that
settles the active Turn) on that transaction's connection. Its statements are here: fixed
arity, built once, compiled once per backend. Reads return named tuples with the columns of
the row views (``repository.row_views``); the rows it inserts are :class:`NewTurn` and
:class:`NewMessage`, which are row views too, so the records the activity events describe
are built from exactly what was written.

Locks are those of ``SessionRowRepository.lock_with_root`` (SCALE-1, ADR 0037): the Session
row ``FOR UPDATE`` on Postgres, its root's first; SQLite writers hold the database lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, cast

from sqlalchemy import Table, and_, bindparam, insert, or_, select, update
from sqlalchemy.sql import ColumnElement

from store.direct_reads import ReadQuery
from store.direct_writes import WriteConnection, WriteStatement
from store.models import (
    DEPLOYMENT_WORKSPACE_KEY,
    AgentTarget,
    Message,
    RuntimeCommandOutbox,
    Session,
    Turn,
)
from store.read_unions import ReadUnion, UnionPart

__all__ = [
    "NewMessage",
    "NewTurn",
    "SubmitRows",
    "insert_message",
    "insert_turn",
    "lock_with_root",
    "message",
    "set_message_cursor",
    "submit_rows",
    "target",
    "turn",
    "turn_by_client_submit_id",
]

_S = cast(Table, Session.__table__)
_T = cast(Table, Turn.__table__)
_M = cast(Table, Message.__table__)
_A = cast(Table, AgentTarget.__table__)
_C = cast(Table, RuntimeCommandOutbox.__table__)


def _key(table: Table) -> ColumnElement[bool]:
    return and_(table.c.workspace_id == bindparam("ws"), table.c.session_id == bindparam("sid"))


_SESSION: Final = ReadQuery(select(_S).where(_key(_S)))
_SESSION_LOCKED: Final = ReadQuery(select(_S).where(_key(_S)).with_for_update())
# Locks the row only when it is its own root, so a child is never locked before its root.
_SESSION_LOCKED_IF_ROOT: Final = ReadQuery(
    select(_S).where(_key(_S), _S.c.root_session_id == _S.c.session_id).with_for_update()
)
_MESSAGE: Final = ReadQuery(select(_M).where(_key(_M), _M.c.message_id == bindparam("mid")))
_TURN: Final = ReadQuery(select(_T).where(_key(_T), _T.c.turn_id == bindparam("tid")))
_TURN_BY_SUBMIT: Final = ReadQuery(
    select(_T).where(_key(_T), _T.c.client_submit_id == bindparam("submit"))
)
# Workspace-private first, else deployment-wide (``SessionRowRepository.target``).
_TARGET: Final = ReadQuery(
    select(_A)
    .where(
        _A.c.agent_target_id == bindparam("target_id"),
        or_(_A.c.workspace_id == bindparam("ws"), _A.c.workspace_id == DEPLOYMENT_WORKSPACE_KEY),
    )
    .order_by(_A.c.workspace_id == DEPLOYMENT_WORKSPACE_KEY)
    .limit(1)
)

# What a submit reads once it holds the Session's lock, as one statement on Postgres (a
# separate statement after the lock, so it sees what the lock's previous holder committed):
# its message (a replay), its agent target and active Turn (found through the Session row by
# scalar subquery), and whether the Session has commands still ``pending``.
_SESSION_TARGET: Final = (
    select(_S.c.agent_target_id).where(_key(_S)).scalar_subquery().correlate(None)
)
_SESSION_ACTIVE_TURN: Final = (
    select(_S.c.active_turn_id).where(_key(_S)).scalar_subquery().correlate(None)
)
_SUBMIT_ROWS: Final = ReadUnion(
    message=UnionPart(select(_M).where(_key(_M), _M.c.message_id == bindparam("mid"))),
    target=UnionPart(
        select(_A).where(
            _A.c.agent_target_id == _SESSION_TARGET,
            or_(
                _A.c.workspace_id == bindparam("ws"),
                _A.c.workspace_id == DEPLOYMENT_WORKSPACE_KEY,
            ),
        ),
        order_by=(_A.c.workspace_id == DEPLOYMENT_WORKSPACE_KEY,),
        limit=1,
    ),
    active=UnionPart(select(_T).where(_key(_T), _T.c.turn_id == _SESSION_ACTIVE_TURN)),
    pending=UnionPart(
        select(_C.c.id).where(
            _C.c.workspace_id == bindparam("ws"),
            _C.c.session_id == bindparam("sid"),
            _C.c.state == "pending",
        ),
        limit=1,
    ),
)

_INSERT_TURN: Final = WriteStatement(insert(_T).values({c.key: bindparam(c.key) for c in _T.c}))
_INSERT_MESSAGE: Final = WriteStatement(insert(_M).values({c.key: bindparam(c.key) for c in _M.c}))
_SET_MESSAGE_CURSOR: Final = WriteStatement(
    update(_S)
    .where(_key(_S))
    .values(
        active_turn_id=bindparam("active"),
        updated_at_unix_ms=bindparam("updated"),
        next_message_sequence=bindparam("next_sequence"),
        message_version=bindparam("version"),
    )
)


@dataclass(frozen=True)
class NewTurn:
    """A Turn row as the submit inserts it (every column; a ``TurnRow``)."""

    workspace_id: str
    session_id: str
    turn_id: str
    client_submit_id: str | None
    submit_fingerprint: str | None
    phase: str
    outcome: str | None
    origin: str
    delivery: str | None
    mode: str | None
    root_turn_id: str | None
    version: int
    created_at_unix_ms: int
    updated_at_unix_ms: int
    started_at_unix_ms: int | None = None
    settled_at_unix_ms: int | None = None
    result_message_id: str | None = None
    result_resolved_empty: bool = False
    failure_message: str | None = None
    retracted_at_unix_ms: int | None = None
    deferred_settlement_json: str | None = None
    file_changes_json: str | None = None


@dataclass(frozen=True)
class NewMessage:
    """A Message row as the submit inserts it (every column; a ``MessageRow``)."""

    workspace_id: str
    session_id: str
    message_id: str
    sequence: int
    version: int
    turn_id: str | None
    occurred_at_unix_ms: int
    created_at_unix_ms: int
    updated_at_unix_ms: int
    role: str
    kind: str
    payload_json: str
    user_visible_assistant_response: bool | None
    command: str | None
    skill_mentions_json: str | None
    agent_mentions_json: str | None
    references_json: str | None


def lock_with_root(conn: WriteConnection, workspace_id: str, session_id: str) -> Any | None:
    """The Session row (``SessionRow`` columns), locked with its root's, root first.

    As ``SessionRowRepository.lock_with_root``: a root Session (the usual case) is locked by
    its first read; a child's root is locked before the child. ``None`` when it does not exist.
    """
    params = {"ws": workspace_id, "sid": session_id}
    root = conn.first(_SESSION_LOCKED_IF_ROOT, params)
    if root is not None:
        return root
    row = conn.first(_SESSION, params)
    if row is None:
        return None
    if row.root_session_id != row.session_id:
        # root_session_id never changes, so reading it without the lock is safe.
        conn.first(_SESSION_LOCKED, {"ws": workspace_id, "sid": row.root_session_id})
    return conn.first(_SESSION_LOCKED, params)


@dataclass(frozen=True)
class SubmitRows:
    """What a submit reads under the Session's lock (:func:`submit_rows`).

    Attributes:
        message: the submission's user message (``MessageRow`` columns): it is a replay.
        target: the Session's agent target (``TargetRow`` columns), workspace-private first.
        active: the Turn the Session's ``active_turn_id`` names (``TurnRow`` columns).
        has_pending: the Session has outbox rows still ``pending``.
    """

    message: Any | None
    target: Any | None
    active: Any | None
    has_pending: bool


def submit_rows(
    conn: WriteConnection, workspace_id: str, session_id: str, message_id: str
) -> SubmitRows:
    """The rows a submit decides on, read after :func:`lock_with_root` (one statement)."""
    parts = conn.union(_SUBMIT_ROWS, {"ws": workspace_id, "sid": session_id, "mid": message_id})
    messages, targets, active = parts["message"], parts["target"], parts["active"]
    return SubmitRows(
        messages[0] if messages else None,
        targets[0] if targets else None,
        active[0] if active else None,
        bool(parts["pending"]),
    )


def message(conn: WriteConnection, workspace_id: str, session_id: str, message_id: str) -> Any:
    """The Message row (``MessageRow`` columns) with this id in this Session, or ``None``."""
    return conn.first(_MESSAGE, {"ws": workspace_id, "sid": session_id, "mid": message_id})


def turn(conn: WriteConnection, workspace_id: str, session_id: str, turn_id: str) -> Any:
    """The Turn row (``TurnRow`` columns) with this identity, or ``None``."""
    return conn.first(_TURN, {"ws": workspace_id, "sid": session_id, "tid": turn_id})


def turn_by_client_submit_id(
    conn: WriteConnection, workspace_id: str, session_id: str, client_submit_id: str
) -> Any:
    """The Turn a submission created, found by its idempotency key, or ``None``."""
    params = {"ws": workspace_id, "sid": session_id, "submit": client_submit_id}
    return conn.first(_TURN_BY_SUBMIT, params)


def target(conn: WriteConnection, workspace_id: str, agent_target_id: str) -> Any:
    """The agent target row (``TargetRow`` columns): workspace-private first, else deployment."""
    return conn.first(_TARGET, {"ws": workspace_id, "target_id": agent_target_id})


def insert_turn(conn: WriteConnection, row: NewTurn) -> None:
    """Insert a Turn row (deferred: it travels with the transaction's next statement)."""
    conn.defer(_INSERT_TURN, vars(row))


def insert_message(conn: WriteConnection, row: NewMessage) -> None:
    """Insert a Message row (deferred)."""
    conn.defer(_INSERT_MESSAGE, vars(row))


def set_message_cursor(
    conn: WriteConnection,
    workspace_id: str,
    session_id: str,
    *,
    active_turn_id: str | None,
    updated_at_unix_ms: int,
    next_message_sequence: int,
    message_version: int,
) -> None:
    """Set the Session's active Turn, ``updated_at`` and message cursor (deferred ``UPDATE``)."""
    conn.defer(
        _SET_MESSAGE_CURSOR,
        {
            "ws": workspace_id,
            "sid": session_id,
            "active": active_turn_id,
            "updated": updated_at_unix_ms,
            "next_sequence": next_message_sequence,
            "version": message_version,
        },
    )
