"""Build Session trees directly in the store for deletion tests (HOST-DEL-*).

Child Sessions only come from runtime reports in production; tests write them directly,
with exactly the columns a reported child gets, plus optional Turns, Interactions, Messages
and outbox rows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from sqlalchemy import Engine, insert, select, update

from store.models import (
    ActivityEvent,
    Interaction,
    Message,
    ResourceCleanupOutbox,
    RuntimeCommandOutbox,
    Session,
    Turn,
)

__all__ = [
    "add_active_turn",
    "add_messages",
    "add_tree",
    "cleanup_rows",
    "commands",
    "events",
    "sessions",
]


def add_tree(
    engine: Engine,
    parents: Mapping[str, str | None],
    *,
    workspace_id: str = "ws-1",
    section_key: str = "conversations",
    updated_at: Mapping[str, int] | None = None,
    titles: Mapping[str, str] | None = None,
    agent_target_id: str = "demo",
    provider: str = "demo-provider",
) -> None:
    """Insert Sessions ``id -> parent id`` (parents may be listed after children)."""
    roots: dict[str, str] = {}

    def root(session_id: str) -> str:
        if session_id not in roots:
            parent = parents.get(session_id)
            roots[session_id] = session_id if parent is None else root(parent)
        return roots[session_id]

    ordered: list[str] = []

    def visit(session_id: str) -> None:
        if session_id in ordered:
            return
        parent = parents.get(session_id)
        if parent is not None and parent in parents:
            visit(parent)
        ordered.append(session_id)

    for session_id in parents:
        visit(session_id)
    with engine.begin() as connection:
        for session_id in ordered:
            parent = parents[session_id]
            if parent is not None and parent not in parents:
                parent_root = connection.execute(
                    select(Session.root_session_id).where(
                        Session.workspace_id == workspace_id, Session.session_id == parent
                    )
                ).scalar_one()
                roots[session_id] = parent_root
            stamp = (updated_at or {}).get(session_id, 1_000)
            connection.execute(
                insert(Session).values(
                    workspace_id=workspace_id,
                    session_id=session_id,
                    parent_session_id=parent,
                    root_session_id=root(session_id),
                    agent_target_id=agent_target_id,
                    provider=provider,
                    title=(titles or {}).get(session_id, f"title {session_id}"),
                    cwd="/work/elsewhere",
                    rail_section_key=section_key,
                    created_at_unix_ms=stamp,
                    updated_at_unix_ms=stamp,
                )
            )


def add_active_turn(
    engine: Engine,
    session_id: str,
    turn_id: str,
    *,
    workspace_id: str = "ws-1",
    pending_interactions: int = 0,
    root_turn_id: str | None = None,
) -> None:
    """A running Turn that is the Session's active Turn, with pending Interactions."""
    with engine.begin() as connection:
        connection.execute(
            insert(Turn).values(
                workspace_id=workspace_id,
                session_id=session_id,
                turn_id=turn_id,
                phase="running",
                origin="user",
                root_turn_id=root_turn_id,
                created_at_unix_ms=1_000,
                updated_at_unix_ms=1_000,
                started_at_unix_ms=1_000,
            )
        )
        connection.execute(
            update(Session)
            .where(Session.workspace_id == workspace_id, Session.session_id == session_id)
            .values(active_turn_id=turn_id)
        )
        for index in range(pending_interactions):
            connection.execute(
                insert(Interaction).values(
                    workspace_id=workspace_id,
                    session_id=session_id,
                    turn_id=turn_id,
                    request_id=f"q{index}",
                    kind="permission",
                    status="pending",
                    occurred_at_unix_ms=1_000,
                    created_at_unix_ms=1_000,
                    updated_at_unix_ms=1_000,
                )
            )
        connection.execute(
            insert(RuntimeCommandOutbox).values(
                workspace_id=workspace_id,
                session_id=session_id,
                command_id=f"cmd-start-{turn_id}",
                command_kind="start_turn",
                payload_json=json.dumps({"turnId": turn_id}),
                state="pending",
                next_attempt_at_unix_ms=1_000,
                created_at_unix_ms=1_000,
                updated_at_unix_ms=1_000,
            )
        )


def add_messages(
    engine: Engine,
    session_ids: Sequence[str],
    per_session: int,
    *,
    workspace_id: str = "ws-1",
    payload: str = '{"text":"hello"}',
) -> None:
    """``per_session`` turnless messages in each Session (bulk)."""
    rows = [
        {
            "workspace_id": workspace_id,
            "session_id": session_id,
            "message_id": f"m-{session_id}-{index}",
            "sequence": index + 1,
            "version": index + 1,
            "occurred_at_unix_ms": 1_000,
            "created_at_unix_ms": 1_000,
            "updated_at_unix_ms": 1_000,
            "role": "assistant",
            "kind": "text",
            "payload_json": payload,
        }
        for session_id in session_ids
        for index in range(per_session)
    ]
    with engine.begin() as connection:
        for start in range(0, len(rows), 5_000):
            connection.execute(insert(Message), rows[start : start + 5_000])
        for session_id in session_ids:
            connection.execute(
                update(Session)
                .where(Session.workspace_id == workspace_id, Session.session_id == session_id)
                .values(message_version=per_session, next_message_sequence=per_session + 1)
            )


def sessions(engine: Engine, workspace_id: str = "ws-1") -> dict[str, Session]:
    """Every Session row of the workspace by id (detached values)."""
    with engine.connect() as connection:
        rows = connection.execute(select(Session).where(Session.workspace_id == workspace_id))
        return {row.session_id: row for row in rows}  # type: ignore[misc]


def events(engine: Engine, event_type: str) -> list[tuple[str, bytes]]:
    """``(session_id, payload)`` of the activity events of one type, in id order."""
    with engine.connect() as connection:
        rows = connection.execute(
            select(ActivityEvent.session_id, ActivityEvent.payload)
            .where(ActivityEvent.event_type == event_type)
            .order_by(ActivityEvent.id)
        )
        return [(str(row[0]), bytes(row[1])) for row in rows]


def commands(engine: Engine) -> list[tuple[str, str, str]]:
    """``(session_id, command_kind, state)`` of every runtime command, in id order."""
    with engine.connect() as connection:
        rows = connection.execute(
            select(
                RuntimeCommandOutbox.session_id,
                RuntimeCommandOutbox.command_kind,
                RuntimeCommandOutbox.state,
            ).order_by(RuntimeCommandOutbox.id)
        )
        return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]


def cleanup_rows(engine: Engine) -> set[tuple[str, str]]:
    """``(workspace_id, session_id)`` of every pending cleanup row."""
    with engine.connect() as connection:
        rows = connection.execute(
            select(ResourceCleanupOutbox.workspace_id, ResourceCleanupOutbox.session_id)
        )
        return {(str(r[0]), str(r[1])) for r in rows}
