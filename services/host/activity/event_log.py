"""The activity outbox: the durable event log's writer and its one commit observer (HOST-OBS-1/2).

Every committed change of canonical activity is described by ``activity_events`` rows written
**in the same transaction** as the change, and announced after the commit by one observer that
publishes a wake hint to the in-process :class:`~services.host.activity.broker.ActivityBroker`.

How changes are found: every Host command runs through
``services.host.repository.unit_of_work.run`` (``HostContext.transact``), whose repositories
record, explicitly, each Session, Turn, Message and Interaction they create or change
(``HostTransaction.changes``). Last in the transaction — after the command and its
participants — :meth:`ActivityLog.append` reads those changes, builds the exact event set and
appends the rows, numbered per workspace (``services.host.repository.activity_events``); a failure
here rolls the command back, as a change without its event row must not commit. The hook it
returns — the commit observer — publishes one :class:`CommittedBatch` per workspace after the
commit. Its failure is logged and never undoes the commit: the rows are the truth, publication
is a hint (a subscriber that misses one reads the log).

Event set per commit, in this order (so a consumer sees rows before the terminal state that
references them, mirroring the causal write barrier of HOST-RT-3):
``session_reconcile_required`` (created Sessions, or Session fields no other event carries),
``session_restored``, ``turn_update`` for non-settled Turns, ``interaction_update``, one
``message_update`` per Session, ``turn_update`` for settled Turns, ``session_deleted``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from services.host.activity.broker import ActivityBroker, CommittedBatch
from services.host.activity.events import (
    DurableEvent,
    EventCodec,
    InteractionUpdate,
    MessageUpdate,
    SessionDeleted,
    SessionReconcileRequired,
    SessionRestored,
    TurnUpdate,
    event_type,
    session_of,
)
from services.host.model.records import TurnRecord
from services.host.repository.activity_events import AppendedRun, NewEventRow, StoredEvent
from services.host.repository.changes import ChangeSet
from services.host.repository.row_records import MessageRecord
from services.host.repository.unit_of_work import HostTransaction

__all__ = ["ActivityLog"]

_log = logging.getLogger(__name__)

_NOT_RECONCILED = frozenset(
    {
        # Carried by turn_update (active Turn) and message_update (message cursor).
        "active_turn_id",
        "message_version",
        "next_message_sequence",
        "updated_at_unix_ms",
        # Provider-private; never exposed to clients, so nothing to re-read.
        "provider_resume_json",
        # Tombstone fields: session_deleted / session_restored carry them.
        "deleted_at_unix_ms",
        "deletion_generation",
        "component_size",
        "tombstone_legacy",
    }
)
_LIVE_TEXT_KINDS = frozenset({"text", "reasoning"})
_RUNNING_TOOL_PHASES = frozenset({"running", ""})

SessionKey = tuple[str, str]
_ToolCallAnchor = tuple[str, str, str, str, bool]


class ActivityLog:
    """Appends a transaction's event rows before its commit and publishes them after it.

    Args:
        codec: Serializes events as the contract's ``ActivityEvent`` (wire layer).
        broker: Where the commit observer publishes.
        clock: Unix-millisecond clock for ``created_at`` / ``occurred_at``.
    """

    def __init__(self, codec: EventCodec, broker: ActivityBroker, clock: Callable[[], int]) -> None:
        self.codec = codec
        self.broker = broker
        self.clock = clock

    async def append(self, tx: HostTransaction) -> Callable[[], Awaitable[None]] | None:
        """Append the events of ``tx.changes`` in ``tx``; return the commit observer.

        Raises:
            Exception: the append failed; the transaction rolls back with it.
        """
        now = self.clock()
        changes = tx.changes.snapshot()
        found = await _event_set(changes, _FinalState(tx))
        if not found.events:
            return None
        settled = tuple(
            (turn.workspace_id, turn.session_id, turn.turn_id)
            for turn in changes.turns
            if turn.phase == "settled"
        )
        batches = await self._append(tx, now, found, settled)

        async def publish() -> None:
            self.publish(batches)

        return publish

    def publish(self, batches: list[CommittedBatch]) -> None:
        """The commit observer: hand each batch to the broker; never raises."""
        for batch in batches:
            try:
                self.broker.publish_batch(batch)
            except Exception:  # noqa: BLE001 - observer failure never undoes a commit
                _log.exception("publishing committed activity events failed")

    async def _append(
        self,
        tx: HostTransaction,
        now: int,
        found: _EventSet,
        settled_keys: tuple[tuple[str, str, str], ...],
    ) -> list[CommittedBatch]:
        """Append the event rows; one :class:`CommittedBatch` per workspace to publish."""
        rows_to_append = [
            NewEventRow(
                workspace_id=workspace_id,
                session_id=session_of(item),
                event_type=event_type(item),
                payload=self.codec.encode(workspace_id, now, item),
                created_at_unix_ms=now,
            )
            for workspace_id, item in found.events
        ]
        appended = await tx.events.append(rows_to_append)
        stored_by_ws, redundant = _stored_events(
            rows_to_append, appended, found.redundant_by_position
        )
        batches: list[CommittedBatch] = []
        for workspace_id, stored_events in stored_by_ws.items():
            ids_here = {item.event_id for item in stored_events}
            batches.append(
                CommittedBatch(
                    workspace_id=workspace_id,
                    previous_seq=appended[workspace_id].previous_seq,
                    events=tuple(stored_events),
                    redundant_texts={k: v for k, v in redundant.items() if k in ids_here},
                    settled_turns=tuple(key for key in settled_keys if key[0] == workspace_id),
                    tool_call_anchors=tuple(a for a in found.anchors if a[0] == workspace_id),
                )
            )
        return batches


@dataclass
class _FinalState:
    """Memoized reads of the state a transaction leaves, as its events report it."""

    tx: HostTransaction
    sessions: dict[SessionKey, tuple[str | None, int]] = field(default_factory=dict)
    settled: dict[tuple[str, str, str], bool] = field(default_factory=dict)

    async def session(self, workspace_id: str, session_id: str) -> tuple[str | None, int]:
        """The Session's active Turn id and message version (``(None, 0)`` when gone)."""
        key = (workspace_id, session_id)
        if key not in self.sessions:
            found = await self.tx.session_rows.cursor_state(workspace_id, session_id)
            self.sessions[key] = (None, 0) if found is None else found
        return self.sessions[key]

    async def turn_settled(self, workspace_id: str, session_id: str, turn_id: str) -> bool:
        """Whether the Turn exists and is settled."""
        key = (workspace_id, session_id, turn_id)
        if key not in self.settled:
            phase = await self.tx.turns.phase_of(workspace_id, session_id, turn_id)
            self.settled[key] = phase == "settled"
        return self.settled[key]


@dataclass
class _EventSet:
    """A commit's events in order, and what its batches carry beside them."""

    events: list[tuple[str, DurableEvent]] = field(default_factory=list)
    redundant_by_position: dict[int, dict[str, str]] = field(default_factory=dict)
    anchors: list[_ToolCallAnchor] = field(default_factory=list)


async def _event_set(changes: ChangeSet, state: _FinalState) -> _EventSet:
    """The events describing ``changes``, in the order of the module docstring."""
    for turn in changes.turns:
        state.settled[(turn.workspace_id, turn.session_id, turn.turn_id)] = turn.phase == "settled"
    found = _EventSet()
    for key, names in changes.sessions.items():
        # A created Session (CREATED) or a reconcile request (RECONCILE) is never in the set.
        if key not in changes.deleted and names - _NOT_RECONCILED:
            found.events.append((key[0], SessionReconcileRequired(key[1])))
    for key, generation in changes.restored.items():
        found.events.append((key[0], SessionRestored(key[1], generation)))
    await _add_turn_updates(found, state, changes.turns, settled=False)
    for interaction in changes.interactions:
        found.events.append((interaction.workspace_id, InteractionUpdate(interaction)))
    await _add_message_updates(found, state, changes.messages)
    await _add_turn_updates(found, state, changes.turns, settled=True)
    for key, (generation, deleted_at) in changes.deleted.items():
        found.events.append((key[0], SessionDeleted(key[1], generation, deleted_at)))
    return found


async def _add_turn_updates(
    found: _EventSet, state: _FinalState, turns: tuple[TurnRecord, ...], *, settled: bool
) -> None:
    """``turn_update`` for each of ``turns`` that is settled (or, with ``settled=False``, not)."""
    for turn in turns:
        if (turn.phase == "settled") == settled:
            active, _ = await state.session(turn.workspace_id, turn.session_id)
            found.events.append((turn.workspace_id, TurnUpdate(turn, active)))


async def _add_message_updates(
    found: _EventSet, state: _FinalState, messages: tuple[MessageRecord, ...]
) -> None:
    """One ``message_update`` per Session, its Messages in version order."""
    by_session: dict[SessionKey, list[MessageRecord]] = {}
    for message in messages:
        by_session.setdefault((message.workspace_id, message.session_id), []).append(message)
    for (workspace_id, session_id), rows in by_session.items():
        rows.sort(key=lambda message: message.version)
        _, latest = await state.session(workspace_id, session_id)
        payloads = [(row, _payload(row.payload_json)) for row in rows]
        found.anchors.extend(_tool_call_anchors(workspace_id, session_id, payloads))
        texts = await _live_texts(state, workspace_id, session_id, payloads)
        if texts:
            found.redundant_by_position[len(found.events)] = texts
        found.events.append((workspace_id, MessageUpdate(session_id, tuple(rows), latest)))


def _tool_call_anchors(
    workspace_id: str, session_id: str, payloads: list[tuple[MessageRecord, dict[str, Any]]]
) -> list[_ToolCallAnchor]:
    """``(workspace, session, message, turn, finished)`` of each tool-call Message of a Turn."""
    anchors: list[_ToolCallAnchor] = []
    for row, payload in payloads:
        if row.kind == "tool_call" and row.turn_id is not None:
            phase = str(payload.get("phase") or "")
            anchors.append(
                (
                    workspace_id,
                    session_id,
                    row.message_id,
                    row.turn_id,
                    phase not in _RUNNING_TOOL_PHASES,
                )
            )
    return anchors


async def _live_texts(
    state: _FinalState,
    workspace_id: str,
    session_id: str,
    payloads: list[tuple[MessageRecord, dict[str, Any]]],
) -> dict[str, str] | None:
    """``{message_id: text}`` when every Message is live text of an unsettled Turn, else None."""
    texts: dict[str, str] = {}
    for row, payload in payloads:
        text = payload.get("text")
        if (
            row.kind in _LIVE_TEXT_KINDS
            and row.turn_id is not None
            and isinstance(text, str)
            and not await state.turn_settled(workspace_id, session_id, row.turn_id)
        ):
            texts[row.message_id] = text
        else:
            return None
    return texts


def _stored_events(
    rows: list[NewEventRow],
    appended: dict[str, AppendedRun],
    redundant_by_position: dict[int, dict[str, str]],
) -> tuple[dict[str, list[StoredEvent]], dict[int, dict[str, str]]]:
    """The appended rows as stored events per workspace, and the redundant texts by event id."""
    cursor: dict[str, int] = {}
    stored_by_ws: dict[str, list[StoredEvent]] = {}
    redundant: dict[int, dict[str, str]] = {}
    for position, new_row in enumerate(rows):
        run = appended[new_row.workspace_id]
        index = cursor.get(new_row.workspace_id, 0)
        cursor[new_row.workspace_id] = index + 1
        stored = StoredEvent(
            event_id=run.ids[index],
            workspace_seq=run.previous_seq + 1 + index,
            workspace_id=new_row.workspace_id,
            session_id=new_row.session_id,
            event_type=new_row.event_type,
            payload=new_row.payload,
            created_at_unix_ms=new_row.created_at_unix_ms,
        )
        stored_by_ws.setdefault(new_row.workspace_id, []).append(stored)
        if position in redundant_by_position:
            redundant[stored.event_id] = redundant_by_position[position]
    return stored_by_ws, redundant


def _payload(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
