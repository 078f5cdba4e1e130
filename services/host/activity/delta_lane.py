"""Host's side of the live delta lane (HOST-RT-2).

Runtimes send ``message_delta`` operations over the runtime link; only the runtime adapter
produces them (``delta_normalizer`` is the helper adapters use) and Host never diffs snapshots.
Host checks each delta and publishes it to the live lane at once, in link order, so it is out
before the runtime's next report is even read — a committed terminal confirmation can never
overtake it. Checks:

* every delta names a persisted Turn of the Session; a delta for a settled Turn is late and
  dropped (the Turn's terminal ``message_update`` already went out, and no delta may follow it);
* tool output names the exact tool-call message id of that Turn (the anchor); the first output
  is ``set`` and every ``append_text`` carries ``offset_bytes`` equal to the UTF-8 length
  published so far. A missing anchor or an offset mismatch drops the delta and writes a durable
  ``session_reconcile_required`` — never guessed concatenation. After a mismatch the anchor
  stays broken until the next ``set``;
* output after the tool call's terminal snapshot is dropped.

The lane's caches are bounded (recently validated Turns and anchors, a FIFO of settled Turns);
an evicted entry is simply re-read from the store.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncSession

from domainerrors import PermissionDenied
from services.host.activity.broker import ActivityBroker, CommittedBatch, LiveDelta
from services.host.activity.events import DELTA_OPERATIONS, DELTA_TARGETS, MessageDelta
from services.host.repository import unit_of_work
from services.host.repository.unit_of_work import ActivityOutbox, HostTransaction
from store.database import Database
from store.transactions import UnitOfWork

if TYPE_CHECKING:
    from services.host.activity.shared_lane import SharedLane

__all__ = ["DeltaLane", "DeltaOutcome"]

_log = logging.getLogger(__name__)

TurnKey = tuple[str, str, str]
MessageKey = tuple[str, str, str]


@dataclass
class _Anchor:
    turn_id: str
    live_bytes: int | None
    terminal: bool


@dataclass(frozen=True)
class DeltaOutcome:
    """What happened to one batch: published, dropped, and Sessions told to reconcile."""

    published: int
    dropped: int
    reconciled: tuple[tuple[str, str], ...]


class _Bounded(OrderedDict[object, object]):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def remember(self, key: object, value: object) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


class DeltaLane:
    """Validates runtime deltas and publishes them to the live lane.

    Args:
        broker: The live lane.
        clock: Unix-millisecond clock (the delta's receive time).
        outbox: The activity outbox a dropped delta's ``session_reconcile_required`` goes
            through (``None``: no events are recorded).
        cache_size: Bound of each cache (validated Turns, anchors, settled Turns).
    """

    def __init__(
        self,
        broker: ActivityBroker,
        clock: Callable[[], int],
        *,
        outbox: ActivityOutbox | None = None,
        cache_size: int = 8192,
    ) -> None:
        self.outbox = outbox
        self.shared: SharedLane | None = None
        """The live log shared with other replicas (``TUTTI_BUS=nats``), set at start."""
        self._broker = broker
        self._clock = clock
        self._live_turns = _Bounded(cache_size)
        self._settled = _Bounded(cache_size)
        self._anchors = _Bounded(cache_size)
        broker.add_observer(self._on_commit)

    def _on_commit(self, batch: CommittedBatch) -> None:
        for key in batch.settled_turns:
            self._live_turns.pop(key, None)
            self._settled.remember(key, True)
        for workspace_id, session_id, message_id, turn_id, terminal in batch.tool_call_anchors:
            key = (workspace_id, session_id, message_id)
            anchor = self._anchors.get(key)
            if isinstance(anchor, _Anchor) and anchor.turn_id == turn_id:
                anchor.terminal = anchor.terminal or terminal
            else:
                self._anchors.remember(key, _Anchor(turn_id, None, terminal))

    async def accept(
        self,
        database: Database,
        deltas: Sequence[MessageDelta],
        may_access: Callable[[str], bool],
    ) -> DeltaOutcome:
        """Check and publish a batch of deltas in order.

        Raises:
            PermissionDenied: ``WORKSPACE_SCOPE_MISMATCH`` (the link is closed, as for reports).
        """
        published = dropped = 0
        reconcile: dict[tuple[str, str], None] = {}
        reader: _LazyReader | None = None
        publish = self._broker.publish_delta
        try:
            for delta in deltas:
                if not may_access(delta.workspace_id):
                    raise PermissionDenied(
                        f"runtime may not send deltas for workspace {delta.workspace_id!r}",
                        reason="WORKSPACE_SCOPE_MISMATCH",
                        metadata={"workspace_id": delta.workspace_id},
                    )
                # Most deltas are decided by the caches alone; only a miss opens a read.
                verdict = self._check_cached(delta)
                if verdict is None:
                    if reader is None:
                        reader = _LazyReader(database)
                    verdict = await self._check_stored(reader, delta)
                if verdict == "ok":
                    live = LiveDelta(delta, self._clock())
                    publish(live)
                    if self.shared is not None:
                        await self.shared.send_delta(live)
                    published += 1
                    continue
                dropped += 1
                _log.debug("dropped delta for %s/%s: %s", delta.session_id, delta.turn_id, verdict)
                if verdict == "reconcile":
                    reconcile[(delta.workspace_id, delta.session_id)] = None
        finally:
            if reader is not None:
                await reader.close()
        for workspace_id, session_id in reconcile:
            await _write_reconcile(database, self.outbox, workspace_id, session_id)
        return DeltaOutcome(published, dropped, tuple(reconcile))

    async def reconcile(self, database: Database, workspace_id: str, session_id: str) -> None:
        """Write a durable ``session_reconcile_required`` (deltas of the Session were lost)."""
        await _write_reconcile(database, self.outbox, workspace_id, session_id)

    def _check_cached(self, delta: MessageDelta) -> str | None:
        """The verdict from the caches alone, or None when the store must be read."""
        if (
            delta.target not in DELTA_TARGETS
            or delta.operation not in DELTA_OPERATIONS
            or not delta.message_id
            or not delta.turn_id
            or not delta.session_id
        ):
            return "invalid"
        turn_key = (delta.workspace_id, delta.session_id, delta.turn_id)
        if turn_key in self._settled:
            return "late"
        if turn_key not in self._live_turns:
            return None
        if delta.target != "tool_output":
            return "ok"
        anchor = self._anchors.get((delta.workspace_id, delta.session_id, delta.message_id))
        if not isinstance(anchor, _Anchor):
            return None
        return _check_offset(anchor, delta)

    async def _check_stored(self, reader: _LazyReader, delta: MessageDelta) -> str:
        """The full check, reading the Turn and the tool-call anchor on a cache miss."""
        turn_key = (delta.workspace_id, delta.session_id, delta.turn_id)
        if turn_key not in self._live_turns:
            phase = await reader.tx().turns.phase_of(*turn_key)
            if phase is None:
                return "unknown_turn"
            if phase == "settled":
                self._settled.remember(turn_key, True)
                return "late"
            self._live_turns.remember(turn_key, True)
        if delta.target != "tool_output":
            return "ok"
        return await self._check_tool_output(reader, delta)

    async def _check_tool_output(self, reader: _LazyReader, delta: MessageDelta) -> str:
        key = (delta.workspace_id, delta.session_id, delta.message_id)
        anchor = self._anchors.get(key)
        if not isinstance(anchor, _Anchor):
            row = await reader.tx().messages.get(*key)
            if row is None or row.kind != "tool_call" or row.turn_id != delta.turn_id:
                return "reconcile"  # missing anchor
            phase = str(_payload(row.payload_json).get("phase") or "")
            anchor = _Anchor(delta.turn_id, None, phase not in ("", "running"))
            self._anchors.remember(key, anchor)
        return _check_offset(anchor, delta)


def _check_offset(anchor: _Anchor, delta: MessageDelta) -> str:
    """Tool output against its anchor: same Turn, not terminal, contiguous offsets."""
    if anchor.turn_id != delta.turn_id:
        return "reconcile"
    if anchor.terminal:
        return "late"
    size = len(delta.text.encode("utf-8"))
    if delta.operation == "set":
        if delta.offset_bytes not in (None, 0):
            anchor.live_bytes = None
            return "reconcile"
        anchor.live_bytes = size
        return "ok"
    if anchor.live_bytes is None or delta.offset_bytes != anchor.live_bytes:
        anchor.live_bytes = None
        return "reconcile"
    anchor.live_bytes += size
    return "ok"


class _LazyReader:
    """Opens a read transaction only on a cache miss (most deltas need none)."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self._session: AsyncSession | None = None
        self._tx: HostTransaction | None = None

    def tx(self) -> HostTransaction:
        """The read transaction's repositories, opened on first use."""
        if self._tx is None:
            self._session = AsyncSession(self._database.engine, expire_on_commit=False)
            self._tx = HostTransaction(self._session, UnitOfWork())
        return self._tx

    async def close(self) -> None:
        """End the read transaction, if one was opened."""
        if self._session is not None:
            await self._session.close()


def _payload(text: str | None) -> dict[str, object]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


async def _write_reconcile(
    database: Database, outbox: ActivityOutbox | None, workspace_id: str, session_id: str
) -> None:
    """A durable ``session_reconcile_required`` in its own small transaction."""

    async def command(tx: HostTransaction) -> None:
        tx.session_rows.request_reconcile(workspace_id, session_id)

    try:
        await unit_of_work.run(database, command, outbox=outbox)
    except Exception:  # noqa: BLE001 - the delta is already dropped; log and go on
        _log.exception("cannot write session_reconcile_required for %s", session_id)
