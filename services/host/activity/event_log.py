"""The durable activity event log and its one commit observer (HOST-OBS-1, HOST-OBS-2).

Every committed change of canonical activity is described by ``activity_events`` rows written
**in the same transaction** as the change, and announced after the commit by one observer that
publishes a wake hint to the in-process :class:`~services.host.activity.broker.ActivityBroker`.

How changes are found: the log is attached to the store's engine (:meth:`ActivityLog.attach`)
and listens to the ORM unit of work of every transaction on it, whichever repository scope the
transaction uses:

* ``before_flush`` records which Message, Turn, Interaction and Session rows the transaction
  creates or changes (ORM writes, which is how the activity lifecycle writes);
* writers that use Core statements say what they changed with :func:`note_session_changed`,
  :func:`note_session_deleted` and :func:`note_session_restored`;
* ``before_commit`` (after every participant ran, so nothing is missed) flushes, reads the
  final state of those rows, builds the exact event set, and appends the rows under the append
  lock (``services.host.repository.activity_events``); a failure here rolls the command back, as a
  change without its event row must not commit;
* ``after_commit`` — the commit observer — publishes one :class:`CommittedBatch` per workspace.
  Its failure is logged and never undoes the commit: the rows are the truth, publication is a
  hint (a subscriber that misses one reads the log).

Event set per commit, in this order (so a consumer sees rows before the terminal state that
references them, mirroring the causal write barrier of HOST-RT-3):
``session_reconcile_required`` (created Sessions, or Session fields no other event carries),
``session_restored``, ``turn_update`` for non-settled Turns, ``interaction_update``, one
``message_update`` per Session, ``turn_update`` for settled Turns, ``session_deleted``.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, event, inspect, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import UOWTransaction

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
from services.host.repository.activity_events import NewEventRow, StoredEvent, append_rows
from services.host.repository.row_records import interaction_record, message_record, turn_record
from store.models import Interaction, Message, Session, Turn

__all__ = [
    "ActivityLog",
    "note_session_changed",
    "note_session_deleted",
    "note_session_restored",
]

_log = logging.getLogger(__name__)

_INFO_KEY = "services.host.activity.event_log.recorder"
_LOGS: weakref.WeakKeyDictionary[Engine, ActivityLog] = weakref.WeakKeyDictionary()
_installed = False

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


class ActivityLog:
    """Writes event rows in the transactions of one engine and publishes them after commit.

    Args:
        codec: Serializes events as the contract's ``ActivityEvent`` (wire layer).
        broker: Where the commit observer publishes.
        clock: Unix-millisecond clock for ``created_at`` / ``occurred_at``.
    """

    def __init__(self, codec: EventCodec, broker: ActivityBroker, clock: Callable[[], int]) -> None:
        self.codec = codec
        self.broker = broker
        self.clock = clock

    def attach(self, engine: AsyncEngine) -> None:
        """Record events for every transaction on ``engine`` from now on."""
        _install()
        _LOGS[engine.sync_engine] = self

    @staticmethod
    def detach(engine: AsyncEngine) -> None:
        """Stop recording for ``engine``."""
        _LOGS.pop(engine.sync_engine, None)

    def publish(self, batches: list[CommittedBatch]) -> None:
        """The commit observer: hand each batch to the broker; never raises."""
        for batch in batches:
            try:
                self.broker.publish_batch(batch)
            except Exception:  # noqa: BLE001 - observer failure never undoes a commit
                _log.exception("publishing committed activity events failed")


SessionKey = tuple[str, str]


@dataclass
class _Recorder:
    log: ActivityLog
    messages: dict[tuple[str, str, str], Message] = field(default_factory=dict)
    turns: dict[tuple[str, str, str], Turn] = field(default_factory=dict)
    interactions: dict[tuple[str, str, str, str], Interaction] = field(default_factory=dict)
    reconcile: dict[SessionKey, None] = field(default_factory=dict)
    deleted: dict[SessionKey, SessionDeleted] = field(default_factory=dict)
    restored: dict[SessionKey, SessionRestored] = field(default_factory=dict)
    batches: list[CommittedBatch] = field(default_factory=list)

    def empty(self) -> bool:
        return not (
            self.messages
            or self.turns
            or self.interactions
            or self.reconcile
            or self.deleted
            or self.restored
        )

    def capture(self, obj: object, *, new: bool) -> None:
        if isinstance(obj, Message):
            self.messages[(obj.workspace_id, obj.session_id, obj.message_id)] = obj
        elif isinstance(obj, Turn):
            self.turns[(obj.workspace_id, obj.session_id, obj.turn_id)] = obj
        elif isinstance(obj, Interaction):
            key = (obj.workspace_id, obj.session_id, obj.turn_id, obj.request_id)
            self.interactions[key] = obj
        elif isinstance(obj, Session):
            self._capture_session(obj, new=new)

    def _capture_session(self, row: Session, *, new: bool) -> None:
        key = (row.workspace_id, row.session_id)
        if new:
            self.reconcile[key] = None
            return
        state = inspect(row)
        changed = {attr.key for attr in state.attrs if attr.history.has_changes()}
        if "deleted_at_unix_ms" in changed:
            before = state.attrs.deleted_at_unix_ms.history.deleted
            old = before[0] if before else None
            if old is None and row.deleted_at_unix_ms is not None:
                self.deleted[key] = SessionDeleted(
                    row.session_id, row.deletion_generation or "", row.deleted_at_unix_ms
                )
            elif old is not None and row.deleted_at_unix_ms is None:
                generations = state.attrs.deletion_generation.history.deleted
                generation = generations[0] if generations else row.deletion_generation
                self.restored[key] = SessionRestored(row.session_id, str(generation or ""))
        if changed - _NOT_RECONCILED:
            self.reconcile[key] = None

    # ------------------------------------------------------------------ finalize

    def finalize(self, db: OrmSession) -> None:
        """Build and append the commit's events (inside the transaction)."""
        now = self.log.clock()
        state = _FinalState(db)
        turns = [row for row in self.turns.values() if _persistent(row)]
        for row in turns:
            state.settled[(row.workspace_id, row.session_id, row.turn_id)] = row.phase == "settled"
        found = _EventSet()
        for key in self.reconcile:
            if key not in self.deleted:
                found.events.append((key[0], SessionReconcileRequired(key[1])))
        for key, restored in self.restored.items():
            found.events.append((key[0], restored))
        _add_turn_updates(found, state, turns, settled=False)
        for interaction in self.interactions.values():
            if _persistent(interaction):
                found.events.append(
                    (interaction.workspace_id, InteractionUpdate(interaction_record(interaction)))
                )
        self._add_message_updates(found, state)
        _add_turn_updates(found, state, turns, settled=True)
        for key, deleted in self.deleted.items():
            found.events.append((key[0], deleted))
        if not found.events:
            return
        settled_keys = tuple(
            (row.workspace_id, row.session_id, row.turn_id)
            for row in turns
            if row.phase == "settled"
        )
        self._append(db, now, found, settled_keys)

    def _add_message_updates(self, found: _EventSet, state: _FinalState) -> None:
        """One ``message_update`` per Session, its Messages in version order."""
        by_session: dict[SessionKey, list[Message]] = {}
        for message in self.messages.values():
            if _persistent(message):
                by_session.setdefault((message.workspace_id, message.session_id), []).append(
                    message
                )
        for (workspace_id, session_id), rows in by_session.items():
            rows.sort(key=lambda message: message.version)
            _, latest = state.session(workspace_id, session_id)
            payloads = [(row, _payload(row.payload_json)) for row in rows]
            found.anchors.extend(_tool_call_anchors(workspace_id, session_id, payloads))
            texts = _live_texts(state, workspace_id, session_id, payloads)
            if texts:
                found.redundant_by_position[len(found.events)] = texts
            found.events.append(
                (
                    workspace_id,
                    MessageUpdate(session_id, tuple(message_record(m) for m in rows), latest),
                )
            )

    def _append(
        self,
        db: OrmSession,
        now: int,
        found: _EventSet,
        settled_keys: tuple[tuple[str, str, str], ...],
    ) -> None:
        """Append the event rows and queue one :class:`CommittedBatch` per workspace."""
        codec = self.log.codec
        rows_to_append = [
            NewEventRow(
                workspace_id=workspace_id,
                session_id=session_of(item),
                event_type=event_type(item),
                payload=codec.encode(workspace_id, now, item),
                created_at_unix_ms=now,
            )
            for workspace_id, item in found.events
        ]
        appended = append_rows(db, rows_to_append)
        stored_by_ws, redundant = _stored_events(
            rows_to_append, appended, found.redundant_by_position
        )
        for workspace_id, stored_events in stored_by_ws.items():
            ids_here = {item.event_id for item in stored_events}
            self.batches.append(
                CommittedBatch(
                    workspace_id=workspace_id,
                    previous_event_id=appended[workspace_id][0],
                    events=tuple(stored_events),
                    redundant_texts={k: v for k, v in redundant.items() if k in ids_here},
                    settled_turns=tuple(key for key in settled_keys if key[0] == workspace_id),
                    tool_call_anchors=tuple(a for a in found.anchors if a[0] == workspace_id),
                )
            )


_ToolCallAnchor = tuple[str, str, str, str, bool]


@dataclass
class _FinalState:
    """Memoized reads of the state a transaction leaves, as its events report it."""

    db: OrmSession
    sessions: dict[SessionKey, tuple[str | None, int]] = field(default_factory=dict)
    settled: dict[tuple[str, str, str], bool] = field(default_factory=dict)

    def session(self, workspace_id: str, session_id: str) -> tuple[str | None, int]:
        """The Session's active Turn id and message version (``(None, 0)`` when gone)."""
        key = (workspace_id, session_id)
        if key not in self.sessions:
            row = self.db.execute(
                select(Session.active_turn_id, Session.message_version).where(
                    Session.workspace_id == workspace_id, Session.session_id == session_id
                )
            ).one_or_none()
            self.sessions[key] = (None, 0) if row is None else (row[0], int(row[1]))
        return self.sessions[key]

    def turn_settled(self, workspace_id: str, session_id: str, turn_id: str) -> bool:
        """Whether the Turn exists and is settled."""
        key = (workspace_id, session_id, turn_id)
        if key not in self.settled:
            turn = self.db.get(Turn, key)
            self.settled[key] = turn is not None and turn.phase == "settled"
        return self.settled[key]


@dataclass
class _EventSet:
    """A commit's events in order, and what its batches carry beside them."""

    events: list[tuple[str, DurableEvent]] = field(default_factory=list)
    redundant_by_position: dict[int, dict[str, str]] = field(default_factory=dict)
    anchors: list[_ToolCallAnchor] = field(default_factory=list)


def _add_turn_updates(
    found: _EventSet, state: _FinalState, turns: list[Turn], *, settled: bool
) -> None:
    """``turn_update`` for each of ``turns`` that is settled (or, with ``settled=False``, not)."""
    for row in turns:
        if (row.phase == "settled") == settled:
            active, _ = state.session(row.workspace_id, row.session_id)
            found.events.append((row.workspace_id, TurnUpdate(turn_record(row), active)))


def _tool_call_anchors(
    workspace_id: str, session_id: str, payloads: list[tuple[Message, dict[str, Any]]]
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


def _live_texts(
    state: _FinalState,
    workspace_id: str,
    session_id: str,
    payloads: list[tuple[Message, dict[str, Any]]],
) -> dict[str, str] | None:
    """``{message_id: text}`` when every Message is live text of an unsettled Turn, else None."""
    texts: dict[str, str] = {}
    for row, payload in payloads:
        text = payload.get("text")
        if (
            row.kind in _LIVE_TEXT_KINDS
            and row.turn_id is not None
            and isinstance(text, str)
            and not state.turn_settled(workspace_id, session_id, row.turn_id)
        ):
            texts[row.message_id] = text
        else:
            return None
    return texts


def _stored_events(
    rows: list[NewEventRow],
    appended: dict[str, tuple[int, list[int]]],
    redundant_by_position: dict[int, dict[str, str]],
) -> tuple[dict[str, list[StoredEvent]], dict[int, dict[str, str]]]:
    """The appended rows as stored events per workspace, and the redundant texts by event id."""
    cursor: dict[str, int] = {}
    stored_by_ws: dict[str, list[StoredEvent]] = {}
    redundant: dict[int, dict[str, str]] = {}
    for position, new_row in enumerate(rows):
        ids = appended[new_row.workspace_id][1]
        index = cursor.get(new_row.workspace_id, 0)
        cursor[new_row.workspace_id] = index + 1
        stored = StoredEvent(
            event_id=ids[index],
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


def _persistent(row: object) -> bool:
    return bool(inspect(row).persistent)


def _payload(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# ---------------------------------------------------------------------- plumbing


def _sync(db: AsyncSession | OrmSession) -> OrmSession:
    return db.sync_session if isinstance(db, AsyncSession) else db


def _log_for(db: OrmSession) -> ActivityLog | None:
    bind = db.bind
    if bind is None:
        return None
    engine = bind if isinstance(bind, Engine) else getattr(bind, "engine", None)
    return None if engine is None else _LOGS.get(engine)


def _recorder(db: OrmSession) -> _Recorder | None:
    recorder = db.info.get(_INFO_KEY)
    if isinstance(recorder, _Recorder):
        return recorder
    log = _log_for(db)
    if log is None:
        return None
    recorder = _Recorder(log)
    db.info[_INFO_KEY] = recorder
    return recorder


def note_session_changed(db: AsyncSession | OrmSession, workspace_id: str, session_id: str) -> None:
    """A Core statement changed (or created) a Session: ``session_reconcile_required``."""
    recorder = _recorder(_sync(db))
    if recorder is not None:
        recorder.reconcile[(workspace_id, session_id)] = None


def note_session_deleted(
    db: AsyncSession | OrmSession,
    workspace_id: str,
    session_id: str,
    *,
    generation: str,
    deleted_at_unix_ms: int,
) -> None:
    """Record a newly tombstoned Session (``session_deleted``, HOST-DEL-6)."""
    recorder = _recorder(_sync(db))
    if recorder is not None:
        recorder.deleted[(workspace_id, session_id)] = SessionDeleted(
            session_id, generation, deleted_at_unix_ms
        )


def note_session_restored(
    db: AsyncSession | OrmSession, workspace_id: str, session_id: str, *, generation: str
) -> None:
    """Record a restored Session (``session_restored``, HOST-DEL-8)."""
    recorder = _recorder(_sync(db))
    if recorder is not None:
        recorder.restored[(workspace_id, session_id)] = SessionRestored(session_id, generation)


def _before_flush(db: OrmSession, flush_context: UOWTransaction, instances: object) -> None:
    if not (db.new or db.dirty):
        return
    recorder = _recorder(db)
    if recorder is None:
        return
    for obj in db.new:
        recorder.capture(obj, new=True)
    for obj in db.dirty:
        if db.is_modified(obj, include_collections=False):
            recorder.capture(obj, new=False)


def _before_commit(db: OrmSession) -> None:
    if db.in_nested_transaction():
        return
    recorder = db.info.get(_INFO_KEY)
    if not isinstance(recorder, _Recorder):
        return
    db.flush()
    if not recorder.empty():
        recorder.finalize(db)


def _after_commit(db: OrmSession) -> None:
    recorder = db.info.pop(_INFO_KEY, None)
    if isinstance(recorder, _Recorder) and recorder.batches:
        recorder.log.publish(recorder.batches)


def _after_rollback(db: OrmSession) -> None:
    db.info.pop(_INFO_KEY, None)


def _install() -> None:
    global _installed
    if _installed:
        return
    event.listen(OrmSession, "before_flush", _before_flush)
    event.listen(OrmSession, "before_commit", _before_commit)
    event.listen(OrmSession, "after_commit", _after_commit)
    event.listen(OrmSession, "after_rollback", _after_rollback)
    _installed = True
