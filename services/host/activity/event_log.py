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

A direct write that changes activity (the submit, ADR 0034) appends on its own connection
instead: :meth:`ActivityLog.append_resolved` builds the same event set (:func:`event_set`, the
one builder) from the state the write reports it left, with nothing to read; the ORM path
resolves that state through its transaction first (:func:`resolve_state`).

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
from services.host.repository.activity_events import (
    AppendedRun,
    NewEventRow,
    StoredEvent,
    append_events,
)
from services.host.repository.changes import ChangeSet, ResolvedState, TurnKey
from services.host.repository.row_records import MessageRecord
from services.host.repository.unit_of_work import HostTransaction
from store.direct_writes import WriteConnection

__all__ = ["ActivityLog", "EventSet", "ResolvedState", "event_set", "resolve_state"]

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

        The state the events report (Session cursors, Turn phases) is read through ``tx``
        first (:func:`resolve_state`), then the one builder (:func:`event_set`) runs on it.

        Raises:
            Exception: the append failed; the transaction rolls back with it.
        """
        now = self.clock()
        changes = tx.changes.snapshot()
        groups = _message_groups(changes.messages)
        found = _build(changes, groups, await _resolve(changes, groups, tx))
        if not found.events:
            return None
        rows = self._rows(found, now)
        batches = self._batches(rows, await tx.events.append(rows), found, changes)

        async def publish() -> None:
            self.publish(batches)

        return publish

    def append_resolved(
        self, conn: WriteConnection, changes: ChangeSet, state: ResolvedState
    ) -> list[CommittedBatch]:
        """Append the events of ``changes`` in an open direct write; the batches to publish.

        For a write function that changes activity (the submit, ADR 0034): it runs on the
        store's writer thread with the state it wrote (``state``), so nothing is read. The
        caller publishes the batches (:meth:`publish`) after the commit.

        Raises:
            Exception: the append failed; the transaction rolls back with it.
        """
        now = self.clock()
        found = event_set(changes, state)
        if not found.events:
            return []
        rows = self._rows(found, now)
        return self._batches(rows, append_events(conn, rows), found, changes)

    def publish(self, batches: list[CommittedBatch]) -> None:
        """The commit observer: hand each batch to the broker; never raises."""
        for batch in batches:
            try:
                self.broker.publish_batch(batch)
            except Exception:  # noqa: BLE001 - observer failure never undoes a commit
                _log.exception("publishing committed activity events failed")

    def _rows(self, found: EventSet, now: int) -> list[NewEventRow]:
        """The event rows to append, in event order."""
        return [
            NewEventRow(
                workspace_id=workspace_id,
                session_id=session_of(item),
                event_type=event_type(item),
                payload=self.codec.encode(workspace_id, now, item),
                created_at_unix_ms=now,
            )
            for workspace_id, item in found.events
        ]

    @staticmethod
    def _batches(
        rows: list[NewEventRow],
        appended: dict[str, AppendedRun],
        found: EventSet,
        changes: ChangeSet,
    ) -> list[CommittedBatch]:
        """One :class:`CommittedBatch` per workspace of the appended rows, to publish."""
        settled_keys = tuple(
            (turn.workspace_id, turn.session_id, turn.turn_id)
            for turn in changes.turns
            if turn.phase == "settled"
        )
        stored_by_ws, redundant = _stored_events(rows, appended, found.redundant_by_position)
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
class EventSet:
    """A commit's events in order, and what its batches carry beside them."""

    events: list[tuple[str, DurableEvent]] = field(default_factory=list)
    redundant_by_position: dict[int, dict[str, str]] = field(default_factory=dict)
    anchors: list[_ToolCallAnchor] = field(default_factory=list)


@dataclass(frozen=True)
class _MessageGroup:
    """One Session's changed Messages in version order, with their decoded payloads."""

    key: SessionKey
    payloads: list[tuple[MessageRecord, dict[str, Any]]]


def event_set(changes: ChangeSet, state: ResolvedState) -> EventSet:
    """The events describing ``changes`` over the resolved final ``state`` (one builder).

    In the order of the module docstring. Synchronous: the ORM path resolves ``state``
    first (:meth:`ActivityLog.append`), a direct write passes the state it wrote.

    Raises:
        KeyError: ``state`` lacks a Session or Turn the events report (a bug of the caller).
    """
    return _build(changes, _message_groups(changes.messages), state)


def _build(changes: ChangeSet, groups: list[_MessageGroup], state: ResolvedState) -> EventSet:
    settled = {**state.settled, **_settled_in(changes)}
    found = EventSet()
    for key, names in changes.sessions.items():
        # A created Session (CREATED) or a reconcile request (RECONCILE) is never in the set.
        if key not in changes.deleted and names - _NOT_RECONCILED:
            found.events.append((key[0], SessionReconcileRequired(key[1])))
    for key, generation in changes.restored.items():
        found.events.append((key[0], SessionRestored(key[1], generation)))
    _add_turn_updates(found, state, changes.turns, settled=False)
    for interaction in changes.interactions:
        found.events.append((interaction.workspace_id, InteractionUpdate(interaction)))
    for group in groups:
        workspace_id, session_id = group.key
        _, latest = state.sessions[group.key]
        found.anchors.extend(_tool_call_anchors(workspace_id, session_id, group.payloads))
        texts = _live_texts(settled, group)
        if texts:
            found.redundant_by_position[len(found.events)] = texts
        rows = tuple(row for row, _ in group.payloads)
        found.events.append((workspace_id, MessageUpdate(session_id, rows, latest)))
    _add_turn_updates(found, state, changes.turns, settled=True)
    for key, (generation, deleted_at) in changes.deleted.items():
        found.events.append((key[0], SessionDeleted(key[1], generation, deleted_at)))
    return found


async def resolve_state(changes: ChangeSet, tx: HostTransaction) -> ResolvedState:
    """The state :func:`event_set` reports for ``changes``, read through the ORM transaction."""
    return await _resolve(changes, _message_groups(changes.messages), tx)


async def _resolve(
    changes: ChangeSet, groups: list[_MessageGroup], tx: HostTransaction
) -> ResolvedState:
    """Read, through ``tx``, the state :func:`_build` reports: the reads it always made.

    The same reads in the same order as the builder asks for them: each Session's cursor
    once, and a Turn's phase only while a Session's Messages are all live text so far.
    """
    state = ResolvedState()
    settled = _settled_in(changes)

    async def read_session(key: SessionKey) -> None:
        if key not in state.sessions:
            found = await tx.session_rows.cursor_state(*key)
            state.sessions[key] = (None, 0) if found is None else found

    for turn in changes.turns:
        if turn.phase != "settled":
            await read_session((turn.workspace_id, turn.session_id))
    for group in groups:
        await read_session(group.key)
        for row, payload in group.payloads:
            turn_key = _live_text_turn(group.key, row, payload)
            if turn_key is None:
                break
            if turn_key not in settled:
                settled[turn_key] = state.settled[turn_key] = (
                    await tx.turns.phase_of(*turn_key) == "settled"
                )
            if settled[turn_key]:
                break
    for turn in changes.turns:
        if turn.phase == "settled":
            await read_session((turn.workspace_id, turn.session_id))
    return state


def _settled_in(changes: ChangeSet) -> dict[TurnKey, bool]:
    """Whether each Turn the transaction changed is settled (known without a read)."""
    return {
        (turn.workspace_id, turn.session_id, turn.turn_id): turn.phase == "settled"
        for turn in changes.turns
    }


def _message_groups(messages: tuple[MessageRecord, ...]) -> list[_MessageGroup]:
    """One group per Session, in first-recorded order, its Messages in version order."""
    by_session: dict[SessionKey, list[MessageRecord]] = {}
    for message in messages:
        by_session.setdefault((message.workspace_id, message.session_id), []).append(message)
    groups: list[_MessageGroup] = []
    for key, rows in by_session.items():
        rows.sort(key=lambda message: message.version)
        groups.append(_MessageGroup(key, [(row, _payload(row.payload_json)) for row in rows]))
    return groups


def _add_turn_updates(
    found: EventSet, state: ResolvedState, turns: tuple[TurnRecord, ...], *, settled: bool
) -> None:
    """``turn_update`` for each of ``turns`` that is settled (or, with ``settled=False``, not)."""
    for turn in turns:
        if (turn.phase == "settled") == settled:
            active, _ = state.sessions[(turn.workspace_id, turn.session_id)]
            found.events.append((turn.workspace_id, TurnUpdate(turn, active)))


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


def _live_text_turn(key: SessionKey, row: MessageRecord, payload: dict[str, Any]) -> TurnKey | None:
    """The Turn of a live-text Message (text or reasoning of a Turn); ``None`` for any other."""
    live = row.kind in _LIVE_TEXT_KINDS and isinstance(payload.get("text"), str)
    return (key[0], key[1], row.turn_id) if live and row.turn_id is not None else None


def _live_texts(settled: dict[TurnKey, bool], group: _MessageGroup) -> dict[str, str] | None:
    """``{message_id: text}`` when every Message is live text of an unsettled Turn, else None."""
    texts: dict[str, str] = {}
    for row, payload in group.payloads:
        turn_key = _live_text_turn(group.key, row, payload)
        if turn_key is None or settled[turn_key]:
            return None
        texts[row.message_id] = str(payload["text"])
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
