"""Canonical tool-call payloads and their budgets (HOST-MSG-3, HOST-MSG-4, HOST-MSG-5).

A runtime reports a :class:`ToolCallSnapshot` (the domain twin of
``host.v1.ToolCallSnapshot``); :func:`build_tool_call_payload` turns it into the JSON
stored in ``messages.payload_json``. Pure rules, no I/O.

Order of operations (HOST-MSG-3, exactly):

1. **Projection** (HOST-MSG-5): only canonical fields are kept — output/error text,
   matches, saved path(s), file changes, stdout, stderr, exit code, the provider's status
   and the call's identity, title and input. ``provider_result_json`` only fills canonical
   fields the adapter left unset (readable text, matches, saved paths, file changes);
   its envelopes (``content``, ``output.content``, ``rawInput``/``rawOutput``,
   ``toolResponse``, ``_meta``...), image base64 data and unknown keys are dropped.
   ``status`` is the provider's status when present, else ``success`` for exit code 0
   and ``failure`` for any other exit code, else the reported phase (``running``,
   ``success`` for completed, ``failure`` for failed) — never inferred from command text.
   HOST-MSG-4 is applied here, on untruncated values: a ``command`` tool (explicit
   ``tool_kind == "command"``, never inferred from input shape) in a terminal phase
   omits ``output.text`` when it equals Go-``strings.TrimSpace`` of stdout or stderr and
   records ``output.textRemoved: "stdout" | "stderr"`` so a consumer clears text kept from
   the running snapshot. Nested steps follow their own phase.
2. **Field bound**: every output stream — ``output.text``, ``error.text``, ``stdout``,
   ``stderr``, nested steps included — longer than 1 MiB (UTF-8) becomes its longest
   valid UTF-8 prefix that fits 1 MiB together with the marker, plus
   :data:`TRUNCATION_MARKER` (no separator).
3. **Structured content**: a string leaf exactly equal to the (untruncated) output text
   of the same call becomes :data:`DUPLICATE_MARKER` at the same key or index; other
   string leaves longer than ``structured_leaf_bytes`` (64 KiB) are cut like a stream.
4. **Payload budget**: the payload is encoded (:func:`encode_payload`: compact JSON,
   ``ensure_ascii=False``, keys in projection order, UTF-8). While it exceeds 768 KiB the
   output streams are cut further by *water-filling*: the largest common cap ``C`` (in
   bytes, marker included, ``len(marker) <= C <= 1 MiB``, found by binary search) such
   that cutting every stream longer than ``C`` makes the payload fit; shorter streams stay
   intact. If even ``C = len(marker)`` does not fit, streams stay at that minimum and
   structured string leaves are water-filled the same way. If that still does not fit,
   the remaining data — inputs, identity, matches, paths, file changes, non-string values,
   object keys and the fixed markers — alone exceeds the budget and
   ``ResourceExhausted(reason="TOOL_PAYLOAD_TOO_LARGE")`` is raised so nothing is
   persisted. Inputs and non-string values are never shortened.

Payload shape (keys omitted when absent)::

    {"callId", "toolName", "toolKind", "phase", "status", "exitCode", "title", "input",
     "output": {"text", "textRemoved", "matches", "savedPath" | "savedPaths"},
     "error": {"text"}, "stdout", "stderr", "fileChanges", "structuredContent",
     "steps": [<same shape>...]}

``savedPath`` holds a single saved path, ``savedPaths`` two or more.

Public API:
    ToolCallPhase, ToolCallSnapshot, PayloadLimits, DEFAULT_LIMITS, ToolPayload
    build_tool_call_payload(snapshot, *, limits=DEFAULT_LIMITS, field="tool_call")
        -> ToolPayload
    derive_status(*, provider_status, exit_code, phase) -> str
    go_trim_space(text) -> str
    truncate_utf8(text, max_bytes) -> str
    encode_payload(value) -> str
    Constants: TRUNCATION_MARKER, DUPLICATE_MARKER, TEXT_REMOVED_KEY, COMMAND_TOOL_KIND,
        FIELD_LIMIT_BYTES, PAYLOAD_BUDGET_BYTES, STRUCTURED_LEAF_LIMIT_BYTES,
        MAX_STEP_DEPTH, MAX_JSON_DEPTH, TOOL_PAYLOAD_TOO_LARGE, INVALID_TOOL_CALL.

Nesting (SEC-4): nested ``steps`` deeper than :data:`MAX_STEP_DEPTH` and ``*_json``
values nested deeper than :data:`MAX_JSON_DEPTH` are ``InvalidArgument``
``INVALID_TOOL_CALL``, checked before the recursive projection, rendering and encoding
touch them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from domainerrors import FieldViolation, InvalidArgument, ResourceExhausted

__all__ = [
    "COMMAND_TOOL_KIND",
    "DEFAULT_LIMITS",
    "DUPLICATE_MARKER",
    "FIELD_LIMIT_BYTES",
    "INVALID_TOOL_CALL",
    "MAX_JSON_DEPTH",
    "MAX_STEP_DEPTH",
    "PAYLOAD_BUDGET_BYTES",
    "STRUCTURED_LEAF_LIMIT_BYTES",
    "TEXT_REMOVED_KEY",
    "TOOL_PAYLOAD_TOO_LARGE",
    "TRUNCATION_MARKER",
    "PayloadLimits",
    "ToolCallPhase",
    "ToolCallSnapshot",
    "ToolPayload",
    "build_tool_call_payload",
    "derive_status",
    "encode_payload",
    "go_trim_space",
    "truncate_utf8",
]

TRUNCATION_MARKER = "[Output truncated]"
"""Appended to a shortened stream or structured leaf (HOST-MSG-3)."""
DUPLICATE_MARKER = "[Duplicate of output.text]"
"""Replaces a structured string leaf equal to the output text (HOST-MSG-3 step 3)."""
TEXT_REMOVED_KEY = "textRemoved"
"""``output.textRemoved`` names the stream a removed command text aliased (HOST-MSG-4)."""
COMMAND_TOOL_KIND = "command"
"""The explicit tool identity that enables the HOST-MSG-4 text omission."""

FIELD_LIMIT_BYTES = 1024 * 1024
PAYLOAD_BUDGET_BYTES = 768 * 1024
STRUCTURED_LEAF_LIMIT_BYTES = 64 * 1024

MAX_STEP_DEPTH = 32
"""Deepest nesting of ``steps`` (the reported call is level 1)."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects in one ``*_json`` value (``[]`` is level 1)."""

TOOL_PAYLOAD_TOO_LARGE = "TOOL_PAYLOAD_TOO_LARGE"
"""ResourceExhausted reason: inputs and other required data alone exceed the budget."""
INVALID_TOOL_CALL = "INVALID_TOOL_CALL"
"""InvalidArgument reason: a ``*_json`` field of the snapshot is not the JSON it must be."""

_MARKER_BYTES = len(TRUNCATION_MARKER.encode("utf-8"))
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

# Go's unicode.IsSpace (strings.TrimSpace), which differs from str.isspace: the ASCII
# information separators U+001C..U+001F are not spaces in Go.
_GO_SPACE = "\t\n\v\f\r \u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
_GO_SPACE += "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


class ToolCallPhase(StrEnum):
    """Lifecycle event behind a snapshot; completed and failed are terminal."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True)
class ToolCallSnapshot:
    """A provider tool call as a runtime reports it (mirrors ``host.v1.ToolCallSnapshot``).

    ``*_json`` fields hold JSON text exactly as received; ``None`` means absent.
    """

    call_id: str
    tool_name: str
    tool_kind: str
    phase: ToolCallPhase
    input_json: str = ""
    provider_status: str | None = None
    exit_code: int | None = None
    title: str | None = None
    output_text: str | None = None
    error_text: str | None = None
    stdout: str | None = None
    stderr: str | None = None
    matches_json: str | None = None
    saved_paths: tuple[str, ...] = ()
    file_changes_json: str | None = None
    structured_content_json: str | None = None
    provider_result_json: str | None = None
    steps: tuple[ToolCallSnapshot, ...] = ()


@dataclass(frozen=True)
class PayloadLimits:
    """Byte bounds of HOST-MSG-3 (tests shrink them; production uses the defaults)."""

    field_bytes: int = FIELD_LIMIT_BYTES
    """Per output stream (step 2)."""
    payload_bytes: int = PAYLOAD_BUDGET_BYTES
    """Whole encoded payload (step 4)."""
    structured_leaf_bytes: int = STRUCTURED_LEAF_LIMIT_BYTES
    """Per structured-content string leaf (step 3)."""

    def __post_init__(self) -> None:
        if min(self.field_bytes, self.structured_leaf_bytes) < _MARKER_BYTES:
            raise ValueError("limits must leave room for the truncation marker")


DEFAULT_LIMITS = PayloadLimits()


@dataclass(frozen=True)
class ToolPayload:
    """The bounded payload to store.

    Attributes:
        payload: the JSON value (as :func:`json.loads` of ``payload_json`` would give).
        payload_json: the exact text to write to ``messages.payload_json``.
        size_bytes: UTF-8 size of ``payload_json`` (``<= limits.payload_bytes``).
        shortened: whether any stream or structured leaf was cut or duplicate-marked.
    """

    payload: dict[str, Any]
    payload_json: str
    size_bytes: int
    shortened: bool


# ---------------------------------------------------------------------------- text rules


def go_trim_space(text: str) -> str:
    """``strings.TrimSpace`` of Go: strip leading and trailing Unicode white space."""
    return text.strip(_GO_SPACE)


def _utf8_prefix(data: bytes, limit: int) -> str:
    """The longest prefix of UTF-8 ``data`` of at most ``limit`` bytes, on a character boundary."""
    end = max(0, min(limit, len(data)))
    # Back off continuation bytes (10xxxxxx) so no character is split.
    while 0 < end < len(data) and data[end] & 0xC0 == 0x80:
        end -= 1
    return data[:end].decode("utf-8", "surrogatepass")


def truncate_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` UTF-8 bytes, marked when cut.

    ``text`` itself if it fits, else a valid UTF-8 prefix plus :data:`TRUNCATION_MARKER`,
    together at most ``max_bytes`` (``max_bytes`` must be at least the marker's length).
    """
    if max_bytes < _MARKER_BYTES:
        raise ValueError("max_bytes must leave room for the truncation marker")
    return _Text(text).cut(max_bytes)


class _Text:
    """A string with its UTF-8 form cached: streams are cut many times while fitting."""

    __slots__ = ("data", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        # surrogatepass: structured leaves parsed from JSON may hold lone surrogates;
        # encode_payload escapes them, so the stored bytes are still valid UTF-8.
        self.data = text.encode("utf-8", "surrogatepass")

    def cut(self, cap: int) -> str:
        if len(self.data) <= cap:
            return self.text
        return _utf8_prefix(self.data, cap - _MARKER_BYTES) + TRUNCATION_MARKER


def encode_payload(value: Any) -> str:
    r"""Compact JSON (``,``/``:`` separators, non-ASCII kept, key order kept, no NaN).

    Lone surrogates (possible in JSON ``\uD800`` escapes) are re-escaped so the text
    always encodes to valid UTF-8.
    """
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return _LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def derive_status(
    *, provider_status: str | None, exit_code: int | None, phase: ToolCallPhase
) -> str:
    """The stored ``status`` (HOST-MSG-5).

    The provider's status wins verbatim (open vocabulary); otherwise exit code 0 is
    ``success`` and any other exit code ``failure``; otherwise the provider's explicit
    lifecycle phase decides (``running``; ``success`` for completed; ``failure`` for
    failed). Command text is never consulted.
    """
    if provider_status:
        return provider_status
    if exit_code is not None:
        return "success" if exit_code == 0 else "failure"
    return {
        ToolCallPhase.RUNNING: "running",
        ToolCallPhase.COMPLETED: "success",
        ToolCallPhase.FAILED: "failure",
    }[phase]


# ---------------------------------------------------------------------------- projection

_ABSENT: Any = object()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _too_deep(path: str, what: str, limit: int) -> InvalidArgument:
    return InvalidArgument(
        f"{path}: {what} nest deeper than {limit} levels",
        field_violations=[FieldViolation(path, f"{what} must not nest deeper than {limit} levels")],
        reason=INVALID_TOOL_CALL,
    )


def _json_deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays/objects in ``value`` nest deeper than ``limit`` (iterative walk)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, list | dict))
    return False


def _parse_json(raw: str, path: str) -> Any:
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise _too_deep(path, "arrays and objects", MAX_JSON_DEPTH) from None
    except ValueError as error:
        raise InvalidArgument(
            f"{path}: not valid JSON",
            field_violations=[FieldViolation(path, f"must be valid JSON ({error})")],
            reason=INVALID_TOOL_CALL,
        ) from None
    # Checked here, before _mark_structured, _render_structured and json.dumps recurse.
    if isinstance(value, list | dict) and _json_deeper_than(value, MAX_JSON_DEPTH):
        raise _too_deep(path, "arrays and objects", MAX_JSON_DEPTH)
    return value


def _parse_array(raw: str, path: str) -> list[Any]:
    value = _parse_json(raw, path)
    if not isinstance(value, list):
        raise InvalidArgument(
            f"{path}: must be a JSON array",
            field_violations=[FieldViolation(path, "must be a JSON array")],
            reason=INVALID_TOOL_CALL,
        )
    return value


@dataclass
class _Promoted:
    text: str | None = None
    error_text: str | None = None
    matches: list[Any] | None = None
    saved_paths: tuple[str, ...] = ()
    file_changes: list[Any] | None = None


def _content_text(content: Any) -> str | None:
    """Readable text of an MCP-style content array; images and other parts are dropped."""
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


def _promote(result: Any) -> _Promoted:
    """Canonical fields a raw provider result carries; everything else is discarded."""
    if isinstance(result, str):
        return _Promoted(text=result)
    if not isinstance(result, dict):
        return _Promoted()
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
        # An MCP error result carries its message as content.
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


@dataclass
class _Node:
    """One projected call: fixed parts plus the strings budgeting may cut."""

    head: dict[str, Any]
    output_text: _Text | None
    text_removed: str | None
    error_text: _Text | None
    stdout: _Text | None
    stderr: _Text | None
    matches: list[Any] | None
    saved_paths: tuple[str, ...]
    file_changes: list[Any] | None
    structured: Any
    steps: list[_Node] = field(default_factory=list)

    def streams(self) -> list[_Text]:
        own = [self.output_text, self.error_text, self.stdout, self.stderr]
        return [text for text in own if text is not None]


def _text_alias(snapshot: ToolCallSnapshot, text: str | None) -> str | None:
    """HOST-MSG-4: which stream a terminal command's text merely repeats, if any."""
    if (
        text is None
        or snapshot.tool_kind != COMMAND_TOOL_KIND
        or snapshot.phase is ToolCallPhase.RUNNING
    ):
        return None
    for name, stream in (("stdout", snapshot.stdout), ("stderr", snapshot.stderr)):
        if stream is not None and text == go_trim_space(stream):
            return name
    return None


def _project(snapshot: ToolCallSnapshot, path: str, depth: int = 1) -> _Node:
    # Checked before descending: projection, rendering and _walk recurse at most this deep.
    if snapshot.steps and depth + 1 > MAX_STEP_DEPTH:
        raise _too_deep(f"{path}.steps", "tool steps", MAX_STEP_DEPTH)
    promoted = _Promoted()
    if snapshot.provider_result_json is not None:
        promoted = _promote(
            _parse_json(snapshot.provider_result_json, f"{path}.provider_result_json")
        )
    head: dict[str, Any] = {"callId": snapshot.call_id, "toolName": snapshot.tool_name}
    if snapshot.tool_kind:
        head["toolKind"] = snapshot.tool_kind
    head["phase"] = snapshot.phase.value
    head["status"] = derive_status(
        provider_status=snapshot.provider_status, exit_code=snapshot.exit_code, phase=snapshot.phase
    )
    if snapshot.exit_code is not None:
        head["exitCode"] = snapshot.exit_code
    if snapshot.title is not None:
        head["title"] = snapshot.title
    if snapshot.input_json:
        head["input"] = _parse_json(snapshot.input_json, f"{path}.input_json")

    text = snapshot.output_text if snapshot.output_text is not None else promoted.text
    removed = _text_alias(snapshot, text)
    if removed is not None:
        text = None
    error_text = snapshot.error_text if snapshot.error_text is not None else promoted.error_text
    matches = (
        _parse_array(snapshot.matches_json, f"{path}.matches_json")
        if snapshot.matches_json is not None
        else promoted.matches
    )
    file_changes = (
        _parse_array(snapshot.file_changes_json, f"{path}.file_changes_json")
        if snapshot.file_changes_json is not None
        else promoted.file_changes
    )
    structured = (
        _parse_json(snapshot.structured_content_json, f"{path}.structured_content_json")
        if snapshot.structured_content_json is not None
        else _ABSENT
    )
    return _Node(
        head=head,
        output_text=None if text is None else _Text(text),
        text_removed=removed,
        error_text=None if error_text is None else _Text(error_text),
        stdout=None if snapshot.stdout is None else _Text(snapshot.stdout),
        stderr=None if snapshot.stderr is None else _Text(snapshot.stderr),
        matches=matches,
        saved_paths=snapshot.saved_paths or promoted.saved_paths,
        file_changes=file_changes,
        structured=structured,
        steps=[
            _project(step, f"{path}.steps[{index}]", depth + 1)
            for index, step in enumerate(snapshot.steps)
        ],
    )


# ---------------------------------------------------------------------------- structured


@dataclass(frozen=True)
class _Leaf:
    """A structured string leaf that budgeting may cut (not a duplicate marker)."""

    text: _Text


def _mark_structured(value: Any, output_text: str | None, leaves: list[_Leaf]) -> tuple[Any, bool]:
    """Replace duplicates of the output text; wrap other string leaves for cutting."""
    if isinstance(value, str):
        if output_text and value == output_text:
            return DUPLICATE_MARKER, True
        leaf = _Leaf(_Text(value))
        leaves.append(leaf)
        return leaf, False
    if isinstance(value, list):
        items = [_mark_structured(item, output_text, leaves) for item in value]
        return [item for item, _ in items], any(marked for _, marked in items)
    if isinstance(value, dict):
        entries = {key: _mark_structured(item, output_text, leaves) for key, item in value.items()}
        return {key: item for key, (item, _) in entries.items()}, any(
            marked for _, marked in entries.values()
        )
    return value, False


def _render_structured(value: Any, leaf_cap: int) -> Any:
    if isinstance(value, _Leaf):
        return value.text.cut(leaf_cap)
    if isinstance(value, list):
        return [_render_structured(item, leaf_cap) for item in value]
    if isinstance(value, dict):
        return {key: _render_structured(item, leaf_cap) for key, item in value.items()}
    return value


# ---------------------------------------------------------------------------- rendering


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


def _render_output(node: _Node, stream_cap: int) -> dict[str, Any]:
    """The node's ``output`` object; empty when it has none of its fields."""
    output: dict[str, Any] = {}
    if node.output_text is not None:
        output["text"] = node.output_text.cut(stream_cap)
    if node.text_removed is not None:
        output[TEXT_REMOVED_KEY] = node.text_removed
    if node.matches is not None:
        output["matches"] = node.matches
    if len(node.saved_paths) == 1:
        output["savedPath"] = node.saved_paths[0]
    elif node.saved_paths:
        output["savedPaths"] = list(node.saved_paths)
    return output


def _walk(node: _Node) -> list[_Node]:
    nodes = [node]
    for step in node.steps:
        nodes.extend(_walk(step))
    return nodes


def _largest_fitting_cap(low: int, high: int, fits: Callable[[int], bool]) -> int | None:
    """Largest cap in ``[low, high]`` for which ``fits`` holds; ``None`` if even ``low`` fails.

    ``fits`` is monotone: a smaller cap never makes the payload larger.
    """
    if not fits(low):
        return None
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def build_tool_call_payload(
    snapshot: ToolCallSnapshot,
    *,
    limits: PayloadLimits = DEFAULT_LIMITS,
    field: str = "tool_call",
) -> ToolPayload:
    """Project and bound a tool-call snapshot for storage (HOST-MSG-3..5).

    Args:
        snapshot: the runtime's tool-call snapshot.
        limits: the byte bounds; production uses :data:`DEFAULT_LIMITS`.
        field: the request path of ``snapshot`` for field violations.

    Returns:
        The payload whose encoded form fits ``limits.payload_bytes``; identical input
        always gives identical bytes.

    Raises:
        InvalidArgument: reason ``INVALID_TOOL_CALL`` for a ``*_json`` field that is not
            valid JSON (or not an array where one is required).
        ResourceExhausted: reason ``TOOL_PAYLOAD_TOO_LARGE`` when the data that is never
            shortened does not fit the budget; nothing may be persisted.
    """
    root = _project(snapshot, field)
    leaves: list[_Leaf] = []
    duplicates = _mark_all_structured(root, leaves)
    streams = [text for node in _walk(root) for text in node.streams()]

    def attempt(stream_cap: int, leaf_cap: int) -> tuple[dict[str, Any], str, int]:
        payload = _render(root, stream_cap, leaf_cap)
        encoded = encode_payload(payload)
        return payload, encoded, len(encoded.encode("utf-8"))

    def shortened(stream_cap: int, leaf_cap: int) -> bool:
        return (
            duplicates
            or any(len(text.data) > stream_cap for text in streams)
            or any(len(leaf.text.data) > leaf_cap for leaf in leaves)
        )

    stream_cap, leaf_cap = limits.field_bytes, limits.structured_leaf_bytes
    payload, encoded, size = attempt(stream_cap, leaf_cap)
    if size > limits.payload_bytes:
        stream_cap, leaf_cap = _fitting_caps(attempt, streams, leaves, limits, field)
        payload, encoded, size = attempt(stream_cap, leaf_cap)
    return ToolPayload(payload, encoded, size, shortened(stream_cap, leaf_cap))


def _mark_all_structured(root: _Node, leaves: list[_Leaf]) -> bool:
    """Mark the structured content of every node; whether any duplicate was replaced."""
    duplicates = False
    for node in _walk(root):
        if node.structured is not _ABSENT:
            own_text = node.output_text.text if node.output_text is not None else None
            node.structured, marked = _mark_structured(node.structured, own_text, leaves)
            duplicates = duplicates or marked
    return duplicates


_Attempt = Callable[[int, int], tuple[dict[str, Any], str, int]]
"""Renders at ``(stream_cap, leaf_cap)``: the payload, its encoding and its size in bytes."""


def _fitting_caps(
    attempt: _Attempt,
    streams: list[_Text],
    leaves: list[_Leaf],
    limits: PayloadLimits,
    field: str,
) -> tuple[int, int]:
    """The largest ``(stream_cap, leaf_cap)`` that fit the budget: streams are cut first.

    Raises:
        ResourceExhausted: ``TOOL_PAYLOAD_TOO_LARGE`` when even the smallest caps do not fit.
    """
    budget = limits.payload_bytes
    stream_cap, leaf_cap = limits.field_bytes, limits.structured_leaf_bytes
    longest = max((len(text.data) for text in streams), default=_MARKER_BYTES)
    cap = _largest_fitting_cap(
        _MARKER_BYTES,
        max(_MARKER_BYTES, min(stream_cap, longest)),
        lambda c: attempt(c, leaf_cap)[2] <= budget,
    )
    if cap is not None:
        return cap, leaf_cap
    stream_cap = _MARKER_BYTES
    longest_leaf = max((len(leaf.text.data) for leaf in leaves), default=_MARKER_BYTES)
    cap = _largest_fitting_cap(
        _MARKER_BYTES,
        max(_MARKER_BYTES, min(leaf_cap, longest_leaf)),
        lambda c: attempt(stream_cap, c)[2] <= budget,
    )
    if cap is None:
        _, _, minimum = attempt(_MARKER_BYTES, _MARKER_BYTES)
        raise ResourceExhausted(
            f"{field}: the tool-call payload needs {minimum} bytes without its output "
            f"streams; the budget is {budget}",
            reason=TOOL_PAYLOAD_TOO_LARGE,
            metadata={
                "field": field,
                "minimum_bytes": str(minimum),
                "budget_bytes": str(budget),
            },
        )
    return stream_cap, cap
