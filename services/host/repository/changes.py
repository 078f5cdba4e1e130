"""What one transaction changed of canonical activity: the input of the activity outbox.

The repositories' write methods record here, explicitly, every Session, Turn, Message and
Interaction they create or change (``HostTransaction.changes``); the activity outbox
(``services.host.activity.event_log``) reads the :class:`ChangeSet` before the commit and
appends the event rows that describe it (HOST-OBS-1). Nothing is inferred from ORM state: a
write that bypasses these methods produces no event, so every write goes through them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import inspect

from services.host.model.records import InteractionRecord, TurnRecord
from services.host.repository.row_records import (
    MessageRecord,
    interaction_record,
    message_record,
    turn_record,
)
from services.host.repository.row_views import InteractionRow, MessageRow, TurnRow

__all__ = [
    "CREATED",
    "RECONCILE",
    "ActivityChanges",
    "ChangeSet",
    "ResolvedState",
    "apply_fields",
]

SessionKey = tuple[str, str]
TurnKey = tuple[str, str, str]

CREATED = "*created*"
"""The pseudo field name recorded for a Session the transaction created."""

RECONCILE = "*reconcile*"
"""The pseudo field name of an explicit ``session_reconcile_required`` (a dropped delta)."""


@dataclass(frozen=True)
class ChangeSet:
    """A transaction's changes as records, in the order they were first recorded.

    Attributes:
        messages: created or changed Messages, as they are now.
        turns: created or changed Turns, as they are now.
        interactions: created or changed Interactions, as they are now.
        sessions: Sessions created or changed, with the changed column names
            (:data:`CREATED` for a new Session).
        deleted: newly tombstoned Sessions: ``(generation, deleted_at_unix_ms)``.
        restored: restored Sessions: their former generation.
    """

    messages: tuple[MessageRecord, ...]
    turns: tuple[TurnRecord, ...]
    interactions: tuple[InteractionRecord, ...]
    sessions: dict[SessionKey, frozenset[str]]
    deleted: dict[SessionKey, tuple[str, int]]
    restored: dict[SessionKey, str]


@dataclass
class ResolvedState:
    """The state a transaction leaves, as its events report it (what the event builder reads).

    The activity outbox reads it through the transaction; a write function that wrote it
    passes it (``services.host.activity.event_log``, ADR 0034).

    Attributes:
        sessions: per Session, its active Turn id and message version after the transaction
            (``(None, 0)`` when it is gone).
        settled: per Turn, whether it exists and is settled after the transaction (the Turns
            the transaction changed are known from its changes).
    """

    sessions: dict[SessionKey, tuple[str | None, int]] = field(default_factory=dict)
    settled: dict[TurnKey, bool] = field(default_factory=dict)


@dataclass
class ActivityChanges:
    """Collects a transaction's changes as its repositories write them."""

    _messages: dict[tuple[str, str, str], MessageRow | MessageRecord] = field(default_factory=dict)
    _turns: dict[tuple[str, str, str], TurnRow | TurnRecord] = field(default_factory=dict)
    _interactions: dict[tuple[str, str, str, str], InteractionRow] = field(default_factory=dict)
    _sessions: dict[SessionKey, set[str]] = field(default_factory=dict)
    _deleted: dict[SessionKey, tuple[str, int]] = field(default_factory=dict)
    _restored: dict[SessionKey, str] = field(default_factory=dict)

    def empty(self) -> bool:
        """Whether nothing was recorded."""
        return not (
            self._messages
            or self._turns
            or self._interactions
            or self._sessions
            or self._deleted
            or self._restored
        )

    def message(self, row: MessageRow) -> None:
        """A Message was created or changed."""
        self._messages[(row.workspace_id, row.session_id, row.message_id)] = row

    def turn(self, row: TurnRow) -> None:
        """A Turn was created or changed."""
        self._turns[(row.workspace_id, row.session_id, row.turn_id)] = row

    def written(self, *, turns: Iterable[TurnRecord], messages: Iterable[MessageRecord]) -> None:
        """Turns and Messages a write function wrote on this transaction's connection.

        A write function (``store.direct_writes``, run on the transaction's connection) writes
        with Core statements, not through the repositories' ORM rows, so it reports what it
        wrote as records; they are described as they are given (ADR 0034).
        """
        for turn in turns:
            self._turns[(turn.workspace_id, turn.session_id, turn.turn_id)] = turn
        for message in messages:
            self._messages[(message.workspace_id, message.session_id, message.message_id)] = message

    def interaction(self, row: InteractionRow) -> None:
        """An Interaction was created or changed."""
        key = (row.workspace_id, row.session_id, row.turn_id, row.request_id)
        self._interactions[key] = row

    def session(self, workspace_id: str, session_id: str, fields: Iterable[str]) -> None:
        """A Session was created, changed these columns, or must be re-read by its readers.

        :data:`CREATED` names a new Session, :data:`RECONCILE` an explicit re-read request.
        """
        self._sessions.setdefault((workspace_id, session_id), set()).update(fields)

    def session_deleted(
        self, workspace_id: str, session_id: str, *, generation: str, deleted_at_unix_ms: int
    ) -> None:
        """A Session was tombstoned (HOST-DEL-6)."""
        self._deleted[(workspace_id, session_id)] = (generation, deleted_at_unix_ms)

    def session_restored(self, workspace_id: str, session_id: str, *, generation: str) -> None:
        """A tombstoned Session was restored (HOST-DEL-8)."""
        self._restored[(workspace_id, session_id)] = generation

    def snapshot(self) -> ChangeSet:
        """The changes as records of the rows' current values (rows since deleted are left out)."""
        return ChangeSet(
            messages=tuple(
                r if isinstance(r, MessageRecord) else message_record(r)
                for r in self._messages.values()
                if isinstance(r, MessageRecord) or _live(r)
            ),
            turns=tuple(
                r if isinstance(r, TurnRecord) else turn_record(r)
                for r in self._turns.values()
                if isinstance(r, TurnRecord) or _live(r)
            ),
            interactions=tuple(
                interaction_record(r) for r in self._interactions.values() if _live(r)
            ),
            sessions={key: frozenset(names) for key, names in self._sessions.items()},
            deleted=dict(self._deleted),
            restored=dict(self._restored),
        )


def apply_fields(row: Any, values: dict[str, Any]) -> list[str]:
    """Set ``values`` on an ORM row; return the names whose value actually changed."""
    changed: list[str] = []
    for name, value in values.items():
        if getattr(row, name) != value:
            setattr(row, name, value)
            changed.append(name)
    return changed


def _live(row: object) -> bool:
    # A row deleted later in the same transaction (a purge) has no state left to describe.
    return bool(inspect(row).persistent)
