"""Repair retained oversized tool-call messages to the canonical payload budget (HOST-MSG-6).

Revision ID: 0009_tool_call_repair
Revises: 0008_turn_file_changes
Create Date: 2026-12-03

A data migration, no schema change. Every retained ``tool_call`` message (command and
non-command/MCP, rows of tombstoned Sessions included: they are still replication inputs)
whose stored ``payload_json`` exceeds the 768 KiB budget is re-projected with the forward
rules of HOST-MSG-5, HOST-MSG-4 and HOST-MSG-3, in that order:

1. projection: only canonical fields stay; provider envelopes (``content``, ``_meta``,
   ``rawOutput`` ...) fill canonical fields the row lacks and are then dropped;
2. HOST-MSG-4: a terminal ``command`` row whose ``output.text`` equals the Go-``TrimSpace``
   of its stored stdout or stderr loses that text and records ``output.textRemoved`` (a
   reconstructible alias); a structured string leaf equal to the output text becomes the
   duplicate marker at the same key or index;
3. HOST-MSG-3: streams cut to 1 MiB, other structured leaves to 64 KiB, then the output
   streams (and only then structured leaves) water-filled until the encoding fits.

A row is rewritten only when its encoded replacement fits; only ``payload_json`` changes (no
``version``, ``sequence``, timestamp, Session ``message_version``, and no activity event, as
nothing is appended to the log). Rows whose required data alone (inputs, identity, matches,
paths, file changes, non-string values, keys) does not fit, whose payload is not a JSON
object, or that cannot be re-encoded or walked (NaN/Infinity, nesting past the recursion
limit), stay byte-identical and are counted in the log (each one's key at WARNING, the
totals at INFO, logger ``store.migrations.tool_call_repair``). A repaired row fits and is never
selected again, so a second run changes nothing. Rows are visited in primary-key order in
bounded batches of keys (keyset pagination) and each payload is read, repaired and written
one at a time, so the table is never loaded whole.

Frozen rules, on purpose: this file carries its own copy of the projection instead of
importing ``services.host.turns.tool_payload``. A migration must mean the same thing
whenever it runs; a later change to the forward rules would otherwise silently change what
this revision did to databases not yet migrated. The store layer also may not import a
service (the import contracts in ``pyproject.toml``). No dataclasses either: Alembic loads this
file outside ``sys.modules``, where they cannot resolve their annotations. The copy reproduces the forward rules
of this date byte for byte (``tests/migrations/test_tool_call_repair.py`` compares them).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import context, op

revision: str = "0009_tool_call_repair"
down_revision: str | Sequence[str] | None = "0008_turn_file_changes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger("store.migrations.tool_call_repair")

PAYLOAD_BUDGET_BYTES = 768 * 1024
FIELD_LIMIT_BYTES = 1024 * 1024
STRUCTURED_LEAF_LIMIT_BYTES = 64 * 1024
TRUNCATION_MARKER = "[Output truncated]"
DUPLICATE_MARKER = "[Duplicate of output.text]"
KEY_BATCH = 500
"""Primary keys read per keyset page; payloads are then read one at a time."""

_MARKER_BYTES = len(TRUNCATION_MARKER.encode("utf-8"))
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_GO_SPACE = "\t\n\v\f\r \u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
_GO_SPACE += "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_TERMINAL_PHASES = ("completed", "failed")

_messages = sa.table(
    "messages",
    sa.column("workspace_id", sa.String),
    sa.column("session_id", sa.String),
    sa.column("message_id", sa.String),
    sa.column("kind", sa.String),
    sa.column("payload_json", sa.Text),
)


class Unfittable(Exception):
    """The row's required data alone exceeds the budget, or the row is not a payload."""


# ------------------------------------------------------------------------------ text rules


class _Text:
    __slots__ = ("data", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.data = text.encode("utf-8", "surrogatepass")

    def cut(self, cap: int) -> str:
        if len(self.data) <= cap:
            return self.text
        end = max(0, min(cap - _MARKER_BYTES, len(self.data)))
        while 0 < end < len(self.data) and self.data[end] & 0xC0 == 0x80:
            end -= 1
        return self.data[:end].decode("utf-8", "surrogatepass") + TRUNCATION_MARKER


def encode_payload(value: Any) -> str:
    """Compact JSON, non-ASCII kept, key order kept; lone surrogates re-escaped."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


# ------------------------------------------------------------------------------ projection

_ABSENT: Any = object()


def _content_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    parts = [
        item["text"]
        for item in content
        if isinstance(item, dict)
        and item.get("type") == "text"
        and isinstance(item.get("text"), str)
    ]
    return "\n".join(parts) if parts else None


def _first_str(*candidates: Any) -> str | None:
    for candidate in candidates:
        if isinstance(candidate, str):
            return candidate
    return None


class _Promoted:
    def __init__(
        self,
        text: str | None = None,
        error_text: str | None = None,
        matches: list[Any] | None = None,
        saved_paths: tuple[str, ...] = (),
        file_changes: list[Any] | None = None,
    ) -> None:
        self.text = text
        self.error_text = error_text
        self.matches = matches
        self.saved_paths = saved_paths
        self.file_changes = file_changes


def _promote(result: dict[str, Any]) -> _Promoted:
    """The canonical fields of a stored node; envelopes only fill what is missing (HOST-MSG-5)."""
    output = result.get("output")
    output_map: dict[str, Any] = output if isinstance(output, dict) else {}
    error = result.get("error")
    error_map: dict[str, Any] = error if isinstance(error, dict) else {}
    content_text = _content_text(output_map.get("content"))
    if content_text is None:
        content_text = _content_text(result.get("content"))
    text = _first_str(output_map.get("text"), result.get("text"), output, result.get("result"))
    error_text = _first_str(error_map.get("text"), error_map.get("message"), error)
    if result.get("isError") is True and error_text is None:
        error_text = content_text
    elif text is None:
        text = content_text
    matches = output_map.get("matches", result.get("matches"))
    file_changes = output_map.get("fileChanges", result.get("fileChanges"))
    paths: list[str] = []
    for source in (output_map, result):
        many = source.get("savedPaths")
        if isinstance(many, list):
            paths.extend(path for path in many if isinstance(path, str))
        one = source.get("savedPath")
        if isinstance(one, str):
            paths.append(one)
        if paths:
            break
    return _Promoted(
        text=text,
        error_text=error_text,
        matches=matches if isinstance(matches, list) else None,
        saved_paths=tuple(dict.fromkeys(paths)),
        file_changes=file_changes if isinstance(file_changes, list) else None,
    )


class _Node:
    def __init__(
        self,
        *,
        head: dict[str, Any],
        output_text: _Text | None,
        text_removed: str | None,
        error_text: _Text | None,
        stdout: _Text | None,
        stderr: _Text | None,
        matches: list[Any] | None,
        saved_paths: tuple[str, ...],
        file_changes: list[Any] | None,
        structured: Any,
        steps: list[_Node],
    ) -> None:
        self.head = head
        self.output_text = output_text
        self.text_removed = text_removed
        self.error_text = error_text
        self.stdout = stdout
        self.stderr = stderr
        self.matches = matches
        self.saved_paths = saved_paths
        self.file_changes = file_changes
        self.structured = structured
        self.steps = steps

    def streams(self) -> list[_Text]:
        own = [self.output_text, self.error_text, self.stdout, self.stderr]
        return [text for text in own if text is not None]


def _status(stored: dict[str, Any]) -> str | None:
    """The stored status; a legacy row without one gets the HOST-MSG-5 derivation."""
    status = stored.get("status")
    if isinstance(status, str) and status:
        return status
    exit_code = stored.get("exitCode")
    if isinstance(exit_code, int) and not isinstance(exit_code, bool):
        return "success" if exit_code == 0 else "failure"
    phase = stored.get("phase")
    return {"running": "running", "completed": "success", "failed": "failure"}.get(str(phase))


def _head(stored: dict[str, Any]) -> dict[str, Any]:
    head: dict[str, Any] = {}
    for key in ("callId", "toolName"):
        if key in stored:
            head[key] = stored[key]
    if stored.get("toolKind"):
        head["toolKind"] = stored["toolKind"]
    if "phase" in stored:
        head["phase"] = stored["phase"]
    status = _status(stored)
    if status is not None:
        head["status"] = status
    for key in ("exitCode", "title", "input"):
        if stored.get(key) is not None:
            head[key] = stored[key]
    return head


def _stream(stored: dict[str, Any], key: str) -> _Text | None:
    value = stored.get(key)
    return _Text(value) if isinstance(value, str) else None


def _text_alias(stored: dict[str, Any], text: str | None) -> str | None:
    """HOST-MSG-4: which stored stream a terminal command's text merely repeats, if any."""
    if text is None or stored.get("toolKind") != "command":
        return None
    if stored.get("phase") not in _TERMINAL_PHASES:
        return None
    for name in ("stdout", "stderr"):
        stream = stored.get(name)
        if isinstance(stream, str) and text == stream.strip(_GO_SPACE):
            return name
    return None


def _project(stored: Any) -> _Node:
    if not isinstance(stored, dict):
        raise Unfittable("a tool-call node is not a JSON object")
    promoted = _promote(stored)
    text = promoted.text
    output = stored.get("output")
    removed = output.get("textRemoved") if isinstance(output, dict) else None
    if not isinstance(removed, str) or text is not None:
        removed = _text_alias(stored, text)
        if removed is not None:
            text = None
    steps = stored.get("steps")
    if steps is not None and not isinstance(steps, list):
        raise Unfittable("steps is not a JSON array")
    return _Node(
        head=_head(stored),
        output_text=None if text is None else _Text(text),
        text_removed=removed,
        error_text=None if promoted.error_text is None else _Text(promoted.error_text),
        stdout=_stream(stored, "stdout"),
        stderr=_stream(stored, "stderr"),
        matches=promoted.matches,
        saved_paths=promoted.saved_paths,
        file_changes=promoted.file_changes,
        structured=stored.get("structuredContent", _ABSENT),
        steps=[_project(step) for step in steps or ()],
    )


# ------------------------------------------------------------------------------ rendering


class _Leaf:
    __slots__ = ("text",)

    def __init__(self, text: _Text) -> None:
        self.text = text


def _mark_structured(value: Any, output_text: str | None, leaves: list[_Leaf]) -> Any:
    if isinstance(value, str):
        if output_text and value == output_text:
            return DUPLICATE_MARKER
        leaf = _Leaf(_Text(value))
        leaves.append(leaf)
        return leaf
    if isinstance(value, list):
        return [_mark_structured(item, output_text, leaves) for item in value]
    if isinstance(value, dict):
        return {key: _mark_structured(item, output_text, leaves) for key, item in value.items()}
    return value


def _render_structured(value: Any, leaf_cap: int) -> Any:
    if isinstance(value, _Leaf):
        return value.text.cut(leaf_cap)
    if isinstance(value, list):
        return [_render_structured(item, leaf_cap) for item in value]
    if isinstance(value, dict):
        return {key: _render_structured(item, leaf_cap) for key, item in value.items()}
    return value


def _render_output(node: _Node, stream_cap: int) -> dict[str, Any]:
    output: dict[str, Any] = {}
    if node.output_text is not None:
        output["text"] = node.output_text.cut(stream_cap)
    if node.text_removed is not None:
        output["textRemoved"] = node.text_removed
    if node.matches is not None:
        output["matches"] = node.matches
    if len(node.saved_paths) == 1:
        output["savedPath"] = node.saved_paths[0]
    elif node.saved_paths:
        output["savedPaths"] = list(node.saved_paths)
    return output


def _render(node: _Node, stream_cap: int, leaf_cap: int) -> dict[str, Any]:
    payload = dict(node.head)
    output = _render_output(node, stream_cap)
    if output:
        payload["output"] = output
    if node.error_text is not None:
        payload["error"] = {"text": node.error_text.cut(stream_cap)}
    if node.stdout is not None:
        payload["stdout"] = node.stdout.cut(stream_cap)
    if node.stderr is not None:
        payload["stderr"] = node.stderr.cut(stream_cap)
    if node.file_changes is not None:
        payload["fileChanges"] = node.file_changes
    if node.structured is not _ABSENT:
        payload["structuredContent"] = _render_structured(node.structured, leaf_cap)
    if node.steps:
        payload["steps"] = [_render(step, stream_cap, leaf_cap) for step in node.steps]
    return payload


def _walk(node: _Node) -> list[_Node]:
    nodes = [node]
    for step in node.steps:
        nodes.extend(_walk(step))
    return nodes


def _largest_fitting_cap(low: int, high: int, fits: Callable[[int], bool]) -> int | None:
    if not fits(low):
        return None
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def repaired_payload(payload_json: str) -> str:
    """The stored payload re-projected and fitted to the budget (pure; the tested rule).

    Raises:
        Unfittable: not a JSON object, its required data alone exceeds the budget, or it
            cannot be re-encoded (NaN/Infinity that ``json.loads`` accepted but the strict
            encoder refuses) or walked (nesting deeper than the recursion limit). Any of
            these must leave the row as it is, never abort the whole upgrade.
    """
    try:
        return _refitted(payload_json)
    except (ValueError, RecursionError) as error:
        raise Unfittable(
            f"payload cannot be re-encoded ({type(error).__name__}: {error})"
        ) from None


def _refitted(payload_json: str) -> str:
    try:
        stored = json.loads(payload_json)
        root = _project(stored)
    except (ValueError, RecursionError) as error:
        raise Unfittable(f"payload is not a readable JSON object ({error})") from None
    leaves: list[_Leaf] = []
    for node in _walk(root):
        if node.structured is not _ABSENT:
            own = node.output_text.text if node.output_text is not None else None
            node.structured = _mark_structured(node.structured, own, leaves)
    streams = [text for node in _walk(root) for text in node.streams()]

    def size(stream_cap: int, leaf_cap: int) -> int:
        return _size(encode_payload(_render(root, stream_cap, leaf_cap)))

    stream_cap, leaf_cap = FIELD_LIMIT_BYTES, STRUCTURED_LEAF_LIMIT_BYTES
    if size(stream_cap, leaf_cap) > PAYLOAD_BUDGET_BYTES:
        longest = max((len(text.data) for text in streams), default=_MARKER_BYTES)
        cap = _largest_fitting_cap(
            _MARKER_BYTES,
            max(_MARKER_BYTES, min(stream_cap, longest)),
            lambda c: size(c, leaf_cap) <= PAYLOAD_BUDGET_BYTES,
        )
        if cap is not None:
            stream_cap = cap
        else:
            stream_cap = _MARKER_BYTES
            longest_leaf = max((len(leaf.text.data) for leaf in leaves), default=_MARKER_BYTES)
            leaf = _largest_fitting_cap(
                _MARKER_BYTES,
                max(_MARKER_BYTES, min(leaf_cap, longest_leaf)),
                lambda c: size(stream_cap, c) <= PAYLOAD_BUDGET_BYTES,
            )
            if leaf is None:
                raise Unfittable("required data alone exceeds the payload budget")
            leaf_cap = leaf
    encoded = encode_payload(_render(root, stream_cap, leaf_cap))
    if _size(encoded) > PAYLOAD_BUDGET_BYTES:  # never expected; never write a row that does not fit
        raise Unfittable("the replacement does not fit the payload budget")
    return encoded


# ------------------------------------------------------------------------------ migration


class RepairCounts:
    """What one run did: oversized rows examined, rewritten, and the keys left unchanged."""

    def __init__(self) -> None:
        self.examined = 0
        self.rewritten = 0
        self.unfittable: list[tuple[str, str, str]] = []


def repair(connection: sa.Connection) -> RepairCounts:
    """Repair every oversized tool-call row reachable through ``connection``."""
    counts = RepairCounts()
    m = _messages.c
    # A UTF-8 character is at most 4 bytes: fewer characters than budget/4 always fit.
    candidates = sa.and_(
        m.kind == "tool_call", sa.func.length(m.payload_json) > PAYLOAD_BUDGET_BYTES // 4
    )
    after: tuple[str, str, str] | None = None
    while True:
        query = sa.select(m.workspace_id, m.session_id, m.message_id).where(candidates)
        if after is not None:
            query = query.where(sa.tuple_(m.workspace_id, m.session_id, m.message_id) > after)
        page = connection.execute(
            query.order_by(m.workspace_id, m.session_id, m.message_id).limit(KEY_BATCH)
        ).all()
        if not page:
            break
        for workspace_id, session_id, message_id in page:
            _repair_row(connection, counts, (workspace_id, session_id, message_id))
        last = page[-1]
        after = (last.workspace_id, last.session_id, last.message_id)
    return counts


def _repair_row(connection: sa.Connection, counts: RepairCounts, key: tuple[str, str, str]) -> None:
    m = _messages.c
    match = sa.and_(m.workspace_id == key[0], m.session_id == key[1], m.message_id == key[2])
    payload_json = connection.execute(sa.select(m.payload_json).where(match)).scalar_one()
    if _size(payload_json) <= PAYLOAD_BUDGET_BYTES:
        return
    counts.examined += 1
    try:
        replacement = repaired_payload(payload_json)
    except Unfittable as reason:
        counts.unfittable.append(key)
        log.warning("tool-call repair left %s/%s/%s unchanged: %s", *key, reason)
        return
    connection.execute(sa.update(_messages).where(match).values(payload_json=replacement))
    counts.rewritten += 1


def upgrade() -> None:
    if context.is_offline_mode():
        # The repair reads each row to decide; rendered SQL cannot. Run it online.
        log.warning("tool-call repair skipped in offline (--sql) mode; run this revision online")
        return
    counts = repair(op.get_bind())
    log.info(
        "tool-call repair: %d oversized tool-call rows, %d rewritten, %d left unchanged",
        counts.examined,
        counts.rewritten,
        len(counts.unfittable),
    )


def downgrade() -> None:
    # The repair removed only reconstructible aliases and cut streams; nothing to restore.
    pass
