"""Minimal valid rows for the canonical tables, for schema-level tests.

Each builder returns the column values of one valid row; keyword arguments override them. Every
row of one builder has the same keys (nullable columns are present as ``None``), because an
executemany insert takes its column list from the first row.
"""

from __future__ import annotations

from typing import Any

from store.models import CONVERSATIONS_SECTION_KEY

NOW_MS = 1_700_000_000_000
WORKSPACE = "ws-1"


def _with(row: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    unknown = set(overrides) - set(row)
    if unknown:
        raise KeyError(f"builder has no column(s) {sorted(unknown)}; add them to its defaults")
    row.update(overrides)
    return row


def session_row(session_id: str = "s-1", **overrides: Any) -> dict[str, Any]:
    """A live root Session in the conversations section."""
    row: dict[str, Any] = {
        "workspace_id": WORKSPACE,
        "session_id": session_id,
        "root_session_id": session_id,
        "provider": "demo",
        "title": f"Session {session_id}",
        "rail_section_key": CONVERSATIONS_SECTION_KEY,
        "created_at_unix_ms": NOW_MS,
        "updated_at_unix_ms": NOW_MS,
        "parent_session_id": None,
        "active_turn_id": None,
        "pinned_at_unix_ms": None,
        "deleted_at_unix_ms": None,
        "deletion_generation": None,
        "component_size": None,
        "tombstone_legacy": False,
    }
    return _with(row, overrides)


def turn_row(session_id: str = "s-1", turn_id: str = "t-1", **overrides: Any) -> dict[str, Any]:
    """A running user Turn."""
    row: dict[str, Any] = {
        "workspace_id": WORKSPACE,
        "session_id": session_id,
        "turn_id": turn_id,
        "phase": "running",
        "origin": "user",
        "delivery": "new_turn",
        "created_at_unix_ms": NOW_MS,
        "updated_at_unix_ms": NOW_MS,
        "outcome": None,
        "client_submit_id": None,
        "result_message_id": None,
        "result_resolved_empty": False,
    }
    return _with(row, overrides)


def message_row(
    session_id: str = "s-1",
    message_id: str = "m-1",
    *,
    sequence: int = 1,
    turn_id: str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """A user text Message; ``version`` defaults to ``sequence``."""
    row: dict[str, Any] = {
        "workspace_id": WORKSPACE,
        "session_id": session_id,
        "message_id": message_id,
        "sequence": sequence,
        "version": sequence,
        "turn_id": turn_id,
        "occurred_at_unix_ms": NOW_MS,
        "created_at_unix_ms": NOW_MS,
        "updated_at_unix_ms": NOW_MS,
        "role": "user",
        "kind": "text",
        "payload_json": '{"text":"hello"}',
    }
    return _with(row, overrides)


def interaction_row(
    session_id: str = "s-1", turn_id: str = "t-1", request_id: str = "r-1", **overrides: Any
) -> dict[str, Any]:
    """A pending permission Interaction."""
    row: dict[str, Any] = {
        "workspace_id": WORKSPACE,
        "session_id": session_id,
        "turn_id": turn_id,
        "request_id": request_id,
        "kind": "permission",
        "status": "pending",
        "occurred_at_unix_ms": NOW_MS,
        "created_at_unix_ms": NOW_MS,
        "updated_at_unix_ms": NOW_MS,
    }
    return _with(row, overrides)


def activity_event_row(**overrides: Any) -> dict[str, Any]:
    """A durable activity event."""
    row: dict[str, Any] = {
        "workspace_id": WORKSPACE,
        "workspace_seq": 1,
        "session_id": "s-1",
        "event_type": "turn_update",
        "payload": b"\x08\x01",
        "created_at_unix_ms": NOW_MS,
    }
    return _with(row, overrides)
