"""Byte-for-byte snapshots of the store rows that belong to some Sessions, for tests.

``snapshot(engine, workspace_id, session_ids)`` reads every row of every table keyed by
``(workspace_id, session_id)`` (Sessions, Turns, messages, Interactions, response and Host
operations, runtime commands, cleanup rows) for those Sessions, every column, ordered by
primary key, plus the workspace's activity events. Two equal snapshots mean nothing about
those Sessions changed: no title, version, Turn, message or ``updated_at``, and no event.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Engine, Table, select

from store.models import ActivityEvent, Base

_KEYED: tuple[Table, ...] = tuple(
    table
    for table in Base.metadata.sorted_tables
    if "workspace_id" in table.c and "session_id" in table.c and table.name != "activity_events"
)
"""Tables whose rows belong to one Session of one workspace."""


def snapshot(
    engine: Engine, workspace_id: str, session_ids: Iterable[str], *, events: bool = True
) -> dict[str, Any]:
    """Every stored row of ``session_ids`` in ``workspace_id`` and, with ``events``, every
    activity event of the workspace."""
    ids = sorted(set(session_ids))
    found: dict[str, Any] = {}
    with engine.connect() as connection:
        for table in _KEYED:
            query = (
                select(table)
                .where(table.c.workspace_id == workspace_id, table.c.session_id.in_(ids))
                .order_by(*table.primary_key.columns)
            )
            found[table.name] = [tuple(row) for row in connection.execute(query)]
        if events:
            query = select(ActivityEvent.id, ActivityEvent.payload).where(
                ActivityEvent.workspace_id == workspace_id
            )
            found["activity_events"] = [tuple(row) for row in connection.execute(query)]
    return found


def session_ids(engine: Engine, workspace_id: str) -> set[str]:
    """Every Session id (live or tombstoned) stored in ``workspace_id``."""
    sessions = Base.metadata.tables["sessions"]
    with engine.connect() as connection:
        query = select(sessions.c.session_id).where(sessions.c.workspace_id == workspace_id)
        return {row[0] for row in connection.execute(query)}


__all__ = ["session_ids", "snapshot"]
