"""The torture test's checker: what one application saw against what Host holds.

For one :class:`~tests.integration.livestream.torture_app.TortureApp` it returns every
violation of "every delivery once and in order, or an explicit discontinuity /
``resume_rejected`` followed by a reconciliation that converges":

1. **deltas** (LIVE-SUB-1, LIVE-RESUME-1, LIVE-COAL-1): per message, the delta texts the app
   saw parse as the producer's numbered deltas, each delivery a contiguous run (coalescing
   merges only adjacent appends), strictly increasing across deliveries (no duplicate, no
   reordering). Every delta the app did not see is covered by a :class:`Reconcile` whose
   keys include the message, that the app read after the delta was sent and between the
   deliveries around the hole (or at the end); only a leading hole of deltas sent before
   the app's first ``stream_ready`` is exempt (it was not subscribed yet);
2. **Turn versions**: every version Host committed for a Turn reached the app, or the app
   went past it by a Host read (a reread for a Turn-or-wider reconcile key, its start-up
   read) or an attachment baseline; a live ``turn_update`` that skips a version is a silent
   gap, and live ``turn_update`` versions of a Turn strictly increase;
3. **convergence**: after the producer stopped, the app's projection (Turn -> version and
   phase, message -> text) equals Host's canonical state;
4. **attachments** (LIVE-ATT-1, LIVE-CTL-1): every ``attachment_caught_up`` names a set of
   Turns Host held at some point (a prefix of the Session's Turns in creation order), each
   delivered by its baseline, including every Turn the same epoch had already shown
   before the ``attachment_changed``, none created after the barrier was seen; and every
   binding ends caught up at its latest revision;
5. **sequences**: deliveries of one epoch arrive with strictly increasing sequences and an
   epoch that was left never comes back; no :class:`Terminated`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from services.livestream.subscriber import (
    AttachmentCaughtUp,
    AttachmentDetached,
    AttachmentRejected,
    AttachmentStarted,
    Delivered,
    Reconcile,
    ReconcileKey,
    Terminated,
)
from tests.integration.livestream.torture_app import Entry, Reread, TortureApp
from tests.integration.livestream.torture_worlds import SentLog, SessionView

__all__ = ["check_app", "describe"]

WS = "ws-1"
_PIECE = re.compile(r"([^#;|]+)#(\d+);")


def covers(keys: Iterable[ReconcileKey], session_id: str, turn_id: str, message_id: str) -> bool:
    """Whether one of ``keys`` includes the message (keys nest: workspace > Session > ...)."""
    for key in keys:
        if key.workspace_id != WS:
            continue
        if key.session_id is None:
            return True
        if key.session_id != session_id:
            continue
        if key.turn_id is not None and key.turn_id != turn_id:
            continue
        if key.message_id is not None and key.message_id != message_id:
            continue
        return True
    return False


def _indices(message_id: str, text: str) -> list[int] | None:
    found = list(_PIECE.finditer(text))
    if "".join(m.group(0) for m in found) != text or not found:
        return None
    if any(m.group(1) != message_id for m in found):
        return None
    return [int(m.group(2)) for m in found]


@dataclass(frozen=True)
class _Window:
    session_id: str
    start: int
    end: int


def _baseline_windows(log: list[Entry]) -> list[_Window]:
    """Index ranges in which a binding's baseline was in progress."""
    windows: list[_Window] = []
    open_: dict[str, tuple[str, int, int]] = {}

    def close(binding_id: str, at: int) -> None:
        if binding_id in open_:
            session_id, start, _ = open_.pop(binding_id)
            windows.append(_Window(session_id, start, at))

    for entry in log:
        for binding_id, (_, _, token) in list(open_.items()):
            if token != entry.token:
                close(binding_id, entry.index)
        event = entry.event
        if isinstance(event, AttachmentStarted):
            close(event.binding_id, entry.index)
            open_[event.binding_id] = (event.session_id, entry.index, entry.token)
        elif isinstance(event, AttachmentCaughtUp | AttachmentDetached | AttachmentRejected):
            close(event.binding_id, entry.index)
    for binding_id in list(open_):
        close(binding_id, len(log))
    return windows


def _in_window(windows: list[_Window], session_id: str, index: int) -> bool:
    return any(w.session_id == session_id and w.start < index <= w.end for w in windows)


def _initial_reread(log: list[Entry]) -> int:
    for entry in log:
        if isinstance(entry.event, Reread) and entry.event.reason == "initial":
            return entry.index
    return len(log)


def _check_sequences(log: list[Entry], out: list[str]) -> None:
    last: dict[str, int] = {}
    current: str | None = None
    left: set[str] = set()
    for entry in log:
        event = entry.event
        if isinstance(event, Terminated):
            out.append(f"[{entry.index}] the Subscriber terminated: {event}")
        if not isinstance(event, Delivered):
            continue
        if event.epoch != current:
            if event.epoch in left:
                out.append(f"[{entry.index}] epoch {event.epoch} came back after it was left")
            if current is not None:
                left.add(current)
            current = event.epoch
        previous = last.get(event.epoch, 0)
        if event.sequence <= previous:
            out.append(
                f"[{entry.index}] sequence {event.sequence} after {previous} in epoch "
                f"{event.epoch} (duplicate or reordered delivery)"
            )
        last[event.epoch] = max(previous, event.sequence)


def _check_deltas(app: TortureApp, sent: SentLog, out: list[str]) -> None:
    log = app.log
    pieces: dict[str, list[tuple[int, list[int]]]] = {}
    reconciles: list[Entry] = [e for e in log if isinstance(e.event, Reconcile)]
    for entry in log:
        event = entry.event
        if not isinstance(event, Delivered) or event.kind != "message_delta":
            continue
        delta = event.delivery.message_delta
        record = sent.messages.get(delta.message_id)
        if record is None:
            continue  # another iteration's message
        if (delta.session_id, delta.turn_id) != (record.session_id, record.turn_id):
            out.append(f"[{entry.index}] delta of {delta.message_id} names the wrong Session/Turn")
        indices = _indices(delta.message_id, delta.text)
        if indices is None:
            out.append(f"[{entry.index}] delta text {delta.text!r} is not the producer's")
            continue
        pieces.setdefault(delta.message_id, []).append((entry.index, indices))
    ready_at = app.first_ready_at if app.first_ready_at is not None else float("inf")
    for message_id, record in sent.messages.items():
        seen = pieces.get(message_id, [])
        last = 0
        for index, run in seen:
            if run != list(range(run[0], run[0] + len(run))):
                out.append(f"[{index}] {message_id}: a delivery of non-adjacent deltas {run}")
            if run[0] <= last:
                out.append(
                    f"[{index}] {message_id}: deltas {run} after delta {last} "
                    "(duplicate or reordered)"
                )
            last = max(last, run[-1])
        have = {i for _, run in seen for i in run}
        gaps: list[int] = []
        for i in range(1, len(record.sent_at) + 1):
            if i in have:
                continue
            before = [index for index, run in seen if run[-1] < i]
            after = [index for index, run in seen if run[0] > i]
            low = before[-1] if before else -1
            high = after[0] if after else len(log)
            sent_at = record.sent_at[i - 1]
            if low == -1 and sent_at < ready_at:
                continue  # sent before the app was subscribed at all
            if any(
                low < r.index < high
                and r.at >= sent_at
                and covers(r.event.keys, record.session_id, record.turn_id, message_id)
                for r in reconciles
            ):
                continue
            gaps.append(i)
        if gaps:
            around = [(index, run[0], run[-1]) for index, run in seen]
            out.append(
                f"{message_id}: deltas {_ranges(gaps)} of {len(record.sent_at)} never reached "
                f"the app and no Reconcile for them followed their loss (deliveries seen "
                f"[app index, first, last]: {around[:12]}{' ...' if len(around) > 12 else ''})"
            )


def _ranges(values: list[int]) -> str:
    parts: list[str] = []
    start = prev = values[0]
    for value in [*values[1:], None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return ",".join(parts)


def _check_turns(
    app: TortureApp, sent: SentLog, history: dict[str, list[int]], out: list[str]
) -> None:
    log = app.log
    windows = _baseline_windows(log)
    initial = _initial_reread(log)
    learned: dict[str, list[tuple[int, int, str]]] = {}
    for entry in log:
        event = entry.event
        if isinstance(event, Delivered) and event.kind == "turn_update":
            turn = event.delivery.turn_update.turn
            kind = "baseline" if _in_window(windows, turn.session_id, entry.index) else "live"
            learned.setdefault(turn.turn_id, []).append((entry.index, turn.version, kind))
        elif isinstance(event, Reread):
            for session_id in event.turns_read:
                for turn_id, (version, _) in event.views[session_id].turns.items():
                    learned.setdefault(turn_id, []).append((entry.index, version, "reread"))
    for turn_id, versions in history.items():
        events = learned.get(turn_id, [])
        live = [(i, v) for i, v, k in events if k == "live"]
        for (_, a), (index, b) in itertools.pairwise(live):
            if b <= a:
                out.append(
                    f"[{index}] Turn {turn_id}: live turn_update version {b} after {a} "
                    "(duplicate or reordered)"
                )
        for version in sorted(set(versions)):
            if any(v == version for _, v, _ in events):
                continue
            past = next(((i, v, k) for i, v, k in events if v > version), None)
            if past is None or past[2] != "live" or past[0] < initial:
                continue  # convergence decides; or a Host read / baseline went past it
            out.append(
                f"[{past[0]}] Turn {turn_id} ({sent.turns.get(turn_id, ('?',))[0]}): version "
                f"{version} never reached the app; a live turn_update jumped to {past[1]} "
                f"(Host versions {versions}, app learned {[(i, v, k) for i, v, k in events]})"
            )


def _check_convergence(app: TortureApp, host: dict[str, SessionView], out: list[str]) -> None:
    for session_id in app.sessions:
        view = host[session_id]
        for turn_id, canonical in view.turns.items():
            mine = app.turns.get(turn_id)
            if mine != canonical:
                out.append(
                    f"convergence: Turn {turn_id} of {session_id} is {mine} in the app, "
                    f"{canonical} in Host (version, phase)"
                )
        for message_id, text in view.messages.items():
            mine_text = app.texts.get(message_id)
            if mine_text != text:
                out.append(
                    f"convergence: message {message_id} is {_short(mine_text)} in the app, "
                    f"{_short(text)} in Host"
                )


def _short(text: str | None) -> str:
    if text is None or len(text) < 60:
        return repr(text)
    return repr(text[:25] + "..." + text[-25:])


def _check_attachments(
    app: TortureApp, sent: SentLog, host: dict[str, SessionView], out: list[str]
) -> None:
    log = app.log
    started: dict[str, Entry] = {}
    for entry in log:
        event = entry.event
        if isinstance(event, AttachmentStarted):
            started[event.binding_id] = entry
        if not isinstance(event, AttachmentCaughtUp):
            continue
        where = f"[{entry.index}] barrier {event.binding_id} r{event.revision}"
        order = list(host[event.session_id].turns) if event.session_id in host else []
        names = event.canonical_turn_ids
        if names != set(order[: len(names)]):
            out.append(
                f"{where}: canonical_turn_ids {sorted(names)} are not Turns Host held at any "
                f"point (Host's Turns in creation order: {order})"
            )
        if event.current_root_turn_id is not None and event.current_root_turn_id not in names:
            out.append(f"{where}: root {event.current_root_turn_id} outside canonical_turn_ids")
        begin = started.get(event.binding_id)
        if begin is None or begin.event.revision != event.revision:
            out.append(f"{where}: no attachment_changed of this revision before it")
            continue
        delivered = set()
        shown_before = set()
        for other in log[: entry.index]:
            e = other.event
            if not isinstance(e, Delivered) or e.kind != "turn_update":
                continue
            turn = e.delivery.turn_update.turn
            if turn.session_id != event.session_id:
                continue
            if other.index > begin.index:
                delivered.add(turn.turn_id)
            elif other.token == begin.token:
                shown_before.add(turn.turn_id)
        if not names <= delivered:
            out.append(f"{where}: names Turns {sorted(names - delivered)} its baseline never sent")
        if not shown_before <= names:
            out.append(
                f"{where}: misses Turns {sorted(shown_before - names)} the same epoch delivered "
                "before its attachment_changed (the baseline was not read fresh from Host)"
            )
        late = {t for t in names if t in sent.turns and sent.turns[t][1] > entry.at}
        if late:
            out.append(f"{where}: names Turns {sorted(late)} created after the app saw it")
    final = app.final_state
    if final is None:
        out.append("the app never finished a Subscriber")
        return
    for binding_id, session_id in app.bindings.items():
        attachment = final.attachments.get(binding_id)
        revision = final.revisions.get(binding_id)
        if (
            attachment is None
            or not attachment.caught_up
            or attachment.session_id != session_id
            or attachment.revision != revision
        ):
            out.append(
                f"binding {binding_id} did not end caught up on {session_id} at revision "
                f"{revision}: {attachment}"
            )


def check_app(
    app: TortureApp,
    sent: SentLog,
    host: dict[str, SessionView],
    history: dict[str, list[int]],
) -> list[str]:
    """Every violation in what ``app`` saw (empty: the run is correct)."""
    out: list[str] = []
    if app.failure is not None:
        out.append(f"the app failed: {app.failure!r}")
    _check_sequences(app.log, out)
    _check_deltas(app, sent, out)
    _check_turns(app, sent, history, out)
    _check_convergence(app, host, out)
    _check_attachments(app, sent, host, out)
    return [f"{app.name}: {line}" for line in out]


def describe(app: TortureApp, around: int | None = None, width: int = 40) -> str:
    """A compact trace of the app's log (``around``: only entries near that index)."""
    lines = []
    for entry in app.log:
        if around is not None and abs(entry.index - around) > width:
            continue
        lines.append(f"  {entry.index:5d} run{entry.run} tok{entry.token} {_event(entry.event)}")
    return "\n".join(lines)


def _event(event: object) -> str:
    if isinstance(event, Delivered):
        d = event.delivery
        body = ""
        if event.kind == "message_delta":
            body = d.message_delta.text[:60]
        elif event.kind == "turn_update":
            t = d.turn_update.turn
            body = f"{t.turn_id} v{t.version} phase {t.phase}"
        elif event.kind == "discontinuity":
            body = str(d.discontinuity.reason)
        return f"Delivered {event.epoch[:6]}:{event.sequence} {event.kind} {body}"
    if isinstance(event, Reread):
        return f"Reread {event.reason} {sorted(event.turns_read)}"
    return repr(event)[:200]
