"""Host's hot reads as direct read transactions (``store.direct_reads``, ADR 0023).

``GetSession``, a transcript page and a submission's read-back run on every client poll and
every submit. Each function here is one synchronous read transaction: fixed-arity Core
statements compiled once, rows decoded straight into the records the wire projects
(``repository.row_records``), no ORM session or identity map. The functions run on a store
read thread (``ctx.read``), so they must not touch the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, cast

from sqlalchemy import Table, and_, bindparam, select
from sqlalchemy.sql import ColumnElement

from services.host.model.records import InteractionRecord, SessionRecord, TurnRecord
from services.host.repository.row_records import (
    MessageRecord,
    interaction_record,
    message_record,
    session_record,
    turn_record,
)
from store.direct_reads import ReadConnection
from store.models import Interaction, Message, Session, Turn
from store.read_unions import ReadUnion, UnionPart

__all__ = [
    "SESSION_RECORD_KEYS",
    "SessionReadSet",
    "SubmissionRows",
    "live_descendants_in_order",
    "message_page",
    "session_read_set",
    "submission_rows",
]

_S = cast(Table, Session.__table__)
_T = cast(Table, Turn.__table__)
_I = cast(Table, Interaction.__table__)
_M = cast(Table, Message.__table__)


def _key(table: Table) -> ColumnElement[bool]:
    return and_(table.c.workspace_id == bindparam("ws"), table.c.session_id == bindparam("sid"))


# What ``session_record`` reads: not the provider-private resume context or the launch-time
# subagent catalog, which can be large and are never projected, for the Session and every
# member of its tree.
_UNREAD_SESSION_COLUMNS: Final = frozenset(
    {
        "provider_resume_json",
        "launch_subagents_json",
        "provider_target_ref",
        "next_message_sequence",
    }
)
_SESSION_COLUMNS: Final = [c for c in _S.c if c.key not in _UNREAD_SESSION_COLUMNS]
SESSION_RECORD_KEYS: Final = tuple(c.key for c in _SESSION_COLUMNS)
"""The ``sessions`` columns ``session_record`` reads (what a direct read selects)."""

# The Session's own columns as scalar subqueries, so that the parts of one read do not depend
# on each other's results: each read below is one UNION ALL statement (ADR 0033).
_ACTIVE_TURN_ID = select(_S.c.active_turn_id).where(_key(_S)).scalar_subquery()
_ROOT_ID = select(_S.c.root_session_id).where(_key(_S)).scalar_subquery()
_GUIDED_TURN_ID = (
    select(_M.c.turn_id).where(_key(_M), _M.c.message_id == bindparam("mid")).scalar_subquery()
)

_SESSION: Final = UnionPart(select(*_SESSION_COLUMNS).where(_key(_S)))
_ACTIVE_TURN: Final = UnionPart(select(_T).where(_key(_T), _T.c.turn_id == _ACTIVE_TURN_ID))
_LATEST_TURN: Final = UnionPart(
    select(_T).where(_key(_T), _T.c.retracted_at_unix_ms.is_(None)),
    order_by=(_T.c.created_at_unix_ms.desc(), _T.c.turn_id.desc()),
    limit=1,
)
_PENDING: Final = UnionPart(
    select(_I).where(_key(_I), _I.c.status == "pending", _I.c.actionable.is_(True)),
    order_by=(_I.c.created_at_unix_ms, _I.c.turn_id, _I.c.request_id),
)
_LIVE_TREE: Final = UnionPart(
    select(*_SESSION_COLUMNS).where(
        _S.c.workspace_id == bindparam("ws"),
        _S.c.root_session_id == _ROOT_ID,
        _S.c.deleted_at_unix_ms.is_(None),
    ),
    order_by=(_S.c.created_at_unix_ms, _S.c.session_id),
)
_SESSION_READ_SET: Final = ReadUnion(
    session=_SESSION,
    active=_ACTIVE_TURN,
    latest=_LATEST_TURN,
    pending=_PENDING,
    tree=_LIVE_TREE,
)

_MESSAGE: Final = UnionPart(select(_M).where(_key(_M), _M.c.message_id == bindparam("mid")))
_TURN_BY_SUBMIT: Final = UnionPart(
    select(_T).where(_key(_T), _T.c.client_submit_id == bindparam("submit"))
)
_GUIDED_TURN: Final = UnionPart(select(_T).where(_key(_T), _T.c.turn_id == _GUIDED_TURN_ID))
_SUBMISSION: Final = ReadUnion(session=_SESSION, message=_MESSAGE, submitted=_TURN_BY_SUBMIT)
_GUIDANCE: Final = ReadUnion(
    session=_SESSION, message=_MESSAGE, submitted=_TURN_BY_SUBMIT, guided=_GUIDED_TURN
)

_MESSAGE_VERSION: Final = UnionPart(select(_S.c.message_version).where(_key(_S)))


def _message_page_read(*, descending: bool) -> ReadUnion:
    # Open bounds are passed as the widest values, so one statement serves every cursor.
    return ReadUnion(
        version=_MESSAGE_VERSION,
        page=UnionPart(
            select(_M).where(
                _key(_M),
                _M.c.version > bindparam("after"),
                _M.c.version < bindparam("before"),
            ),
            order_by=(_M.c.version.desc() if descending else _M.c.version.asc(),),
            limit=bindparam("limit"),
        ),
    )


_PAGE_ASC: Final = _message_page_read(descending=False)
_PAGE_DESC: Final = _message_page_read(descending=True)
_BELOW_EVERY_VERSION: Final = -1
_ABOVE_EVERY_VERSION: Final = 2**63 - 1


@dataclass(frozen=True)
class SessionReadSet:
    """``GetSession``'s rows, from one committed state (HOST-SES-3)."""

    session: SessionRecord
    active_turn: TurnRecord | None
    latest_turn: TurnRecord | None
    pending_interactions: list[InteractionRecord]
    children: list[SessionRecord]


def live_descendants_in_order(session_id: str, tree: list[SessionRecord]) -> list[SessionRecord]:
    """The live descendants of ``session_id`` among ``tree``, parents before their children."""
    children: dict[str, list[SessionRecord]] = {}
    for record in tree:
        if record.parent_session_id is not None:
            children.setdefault(record.parent_session_id, []).append(record)
    ordered: list[SessionRecord] = []
    frontier = [session_id]
    seen = {session_id}
    while frontier:
        next_frontier: list[str] = []
        for parent in frontier:
            for child in children.get(parent, []):
                if child.session_id not in seen:
                    seen.add(child.session_id)
                    ordered.append(child)
                    next_frontier.append(child.session_id)
        frontier = next_frontier
    return ordered


def session_read_set(
    conn: ReadConnection, workspace_id: str, session_id: str
) -> SessionReadSet | None:
    """The Session (live or tombstoned) with its Turns, pending Interactions and live tree."""
    parts = conn.union(_SESSION_READ_SET, {"ws": workspace_id, "sid": session_id})
    sessions, active, latest, pending, tree = (
        parts["session"],
        parts["active"],
        parts["latest"],
        parts["pending"],
        parts["tree"],
    )
    if not sessions:
        return None
    session = session_record(sessions[0])
    children: list[SessionRecord] = []
    if session.is_live:
        # The tree holds the Session itself; only its descendants become records.
        descendants = [session_record(r) for r in tree if r.session_id != session_id]
        children = live_descendants_in_order(session_id, descendants)
    return SessionReadSet(
        session=session,
        active_turn=turn_record(active[0]) if active else None,
        latest_turn=turn_record(latest[0]) if latest else None,
        pending_interactions=[interaction_record(r) for r in pending],
        children=children,
    )


def message_page(
    conn: ReadConnection,
    workspace_id: str,
    session_id: str,
    *,
    after_version: int | None,
    before_version: int | None,
    limit: int,
    descending: bool,
) -> tuple[int, list[MessageRecord]] | None:
    """The Session's ``message_version`` and a page of its messages.

    The page holds up to ``limit`` messages strictly between the version bounds, in version
    order; ``None`` when the Session does not exist.
    """
    bounds = {
        "ws": workspace_id,
        "sid": session_id,
        "after": _BELOW_EVERY_VERSION if after_version is None else after_version,
        "before": _ABOVE_EVERY_VERSION if before_version is None else before_version,
        "limit": limit,
    }
    parts = conn.union(_PAGE_DESC if descending else _PAGE_ASC, bounds)
    version, rows = parts["version"], parts["page"]
    if not version:
        return None
    return int(version[0].message_version), [message_record(r) for r in rows]


@dataclass(frozen=True)
class SubmissionRows:
    """A submission's durable rows, read by its identity (HOST-TURN-1)."""

    session: Any | None
    """The Session row, live or tombstoned: the columns ``session_record`` reads."""
    message: Any | None
    """The user message row (a ``MessageRow``) the submission wrote."""
    submitted_turn: Any | None
    """The Turn (a ``TurnRow``) the submission created, by its ``client_submit_id``."""
    guided_turn: Any | None
    """For a guidance message, the Turn it guides (a ``TurnRow``)."""


def submission_rows(
    conn: ReadConnection,
    workspace_id: str,
    session_id: str,
    message_id: str,
    client_submit_id: str,
    *,
    guidance: bool,
) -> SubmissionRows:
    """The rows of the submission ``client_submit_id`` wrote (its message id ``message_id``)."""
    parts = conn.union(
        _GUIDANCE if guidance else _SUBMISSION,
        {"ws": workspace_id, "sid": session_id, "mid": message_id, "submit": client_submit_id},
    )
    sessions, messages, submitted = parts["session"], parts["message"], parts["submitted"]
    guided = parts.get("guided", [])
    return SubmissionRows(
        sessions[0] if sessions else None,
        messages[0] if messages else None,
        submitted[0] if submitted and messages else None,
        guided[0] if guided and messages else None,
    )
