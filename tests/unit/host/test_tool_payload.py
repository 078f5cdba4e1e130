"""Canonical tool-call projection, field and payload budgets, command text rule
(HOST-MSG-3, HOST-MSG-4, HOST-MSG-5)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domainerrors import InvalidArgument, ResourceExhausted
from services.host.turns.tool_payload import (
    DUPLICATE_MARKER,
    FIELD_LIMIT_BYTES,
    INVALID_TOOL_CALL,
    PAYLOAD_BUDGET_BYTES,
    TEXT_REMOVED_KEY,
    TOOL_PAYLOAD_TOO_LARGE,
    TRUNCATION_MARKER,
    PayloadLimits,
    ToolCallPhase,
    ToolCallSnapshot,
    build_tool_call_payload,
    derive_status,
    encode_payload,
    go_trim_space,
    truncate_utf8,
)

MARKER_BYTES = len(TRUNCATION_MARKER.encode())
RUNNING = ToolCallPhase.RUNNING
COMPLETED = ToolCallPhase.COMPLETED
FAILED = ToolCallPhase.FAILED


def call(**overrides: Any) -> ToolCallSnapshot:
    base = ToolCallSnapshot(
        call_id="call-1", tool_name="Bash", tool_kind="command", phase=COMPLETED
    )
    return replace(base, **overrides)


def payload_of(snapshot: ToolCallSnapshot, limits: PayloadLimits | None = None) -> dict[str, Any]:
    result = build_tool_call_payload(snapshot, limits=limits or PayloadLimits())
    assert json.loads(result.payload_json) == result.payload
    return result.payload


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


# ---------------------------------------------------------------------------- HOST-MSG-5


@pytest.mark.spec("HOST-MSG-5")
def test_only_canonical_fields_are_stored() -> None:
    provider_result = {
        "content": [
            {"type": "text", "text": "listing"},
            {"type": "image", "data": "iVBORw0KGgo" * 100, "mimeType": "image/png"},
        ],
        "rawInput": {"command": "ls"},
        "rawOutput": {"stdout": "dup"},
        "toolResponse": {"stdout": "dup", "interrupted": False},
        "_meta": {"adapter": "claude-sdk", "latencyMs": 12},
        "providerOnly": 1,
    }
    payload = payload_of(
        call(
            tool_kind="mcp",
            tool_name="files.list",
            input_json='{"path": "."}',
            provider_result_json=json.dumps(provider_result),
            title="List files",
        )
    )
    assert payload == {
        "callId": "call-1",
        "toolName": "files.list",
        "toolKind": "mcp",
        "phase": "completed",
        "status": "success",
        "title": "List files",
        "input": {"path": "."},
        "output": {"text": "listing"},
    }
    assert "iVBOR" not in json.dumps(payload)


@pytest.mark.spec("HOST-MSG-5")
def test_the_provider_result_only_fills_fields_the_adapter_left_unset() -> None:
    provider_result = {
        "output": {
            "text": "provider text",
            "matches": [{"path": "a.py", "line": 3}],
            "savedPaths": ["/out/a.png", "/out/b.png"],
            "content": [{"type": "text", "text": "duplicate"}],
        },
        "fileChanges": [{"path": "a.py", "kind": "edit"}],
        "error": {"message": "partial"},
    }
    payload = payload_of(
        call(
            tool_kind="file_edit",
            output_text="adapter text",
            provider_result_json=json.dumps(provider_result),
        )
    )
    assert payload["output"] == {
        "text": "adapter text",
        "matches": [{"path": "a.py", "line": 3}],
        "savedPaths": ["/out/a.png", "/out/b.png"],
    }
    assert payload["fileChanges"] == [{"path": "a.py", "kind": "edit"}]
    assert payload["error"] == {"text": "partial"}


@pytest.mark.spec("HOST-MSG-5")
def test_an_mcp_error_result_promotes_its_content_to_error_text() -> None:
    result = {"isError": True, "content": [{"type": "text", "text": "boom"}]}
    payload = payload_of(call(tool_kind="mcp", provider_result_json=json.dumps(result)))
    assert payload["error"] == {"text": "boom"}
    assert "output" not in payload


@pytest.mark.spec("HOST-MSG-5")
def test_a_single_saved_path_is_saved_path() -> None:
    payload = payload_of(call(tool_kind="image_gen", saved_paths=("/out/1.png",)))
    assert payload["output"] == {"savedPath": "/out/1.png"}
    promoted = payload_of(
        call(tool_kind="image_gen", provider_result_json='{"savedPath": "/out/2.png"}')
    )
    assert promoted["output"] == {"savedPath": "/out/2.png"}


@pytest.mark.spec("HOST-MSG-5")
@pytest.mark.parametrize(
    ("provider_status", "exit_code", "phase", "expected"),
    [
        ("canceled", 0, COMPLETED, "canceled"),
        ("success", 1, COMPLETED, "success"),
        (None, 0, COMPLETED, "success"),
        (None, 0, FAILED, "success"),
        (None, 2, COMPLETED, "failure"),
        (None, -9, RUNNING, "failure"),
        (None, None, RUNNING, "running"),
        (None, None, COMPLETED, "success"),
        (None, None, FAILED, "failure"),
        ("", 3, COMPLETED, "failure"),
    ],
)
def test_status_comes_from_the_provider_else_the_exit_code(
    provider_status: str | None, exit_code: int | None, phase: ToolCallPhase, expected: str
) -> None:
    assert derive_status(provider_status=provider_status, exit_code=exit_code, phase=phase) == (
        expected
    )


@pytest.mark.spec("HOST-MSG-5")
def test_status_is_never_inferred_from_command_text() -> None:
    payload = payload_of(
        call(
            input_json='{"command": "false || exit 1"}',
            output_text="Error: exit status 1\nFAILED",
            stdout="FAILED",
            exit_code=0,
        )
    )
    assert payload["status"] == "success"
    assert payload["exitCode"] == 0


@pytest.mark.spec("HOST-MSG-5")
@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("input_json", "{not json", "tool_call.input_json"),
        ("matches_json", '{"a": 1}', "tool_call.matches_json"),
        ("file_changes_json", "3", "tool_call.file_changes_json"),
        ("structured_content_json", "NaN", "tool_call.structured_content_json"),
        ("provider_result_json", "[1,", "tool_call.provider_result_json"),
    ],
)
def test_malformed_json_fields_are_invalid_arguments(field: str, value: str, path: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        build_tool_call_payload(call(**{field: value}))
    assert raised.value.reason == INVALID_TOOL_CALL
    assert [v.field for v in raised.value.field_violations] == [path]


@pytest.mark.spec("HOST-MSG-5")
def test_field_paths_of_nested_steps() -> None:
    snapshot = call(steps=(call(), call(steps=(call(input_json="{"),))))
    with pytest.raises(InvalidArgument) as raised:
        build_tool_call_payload(snapshot)
    assert raised.value.field_violations[0].field == "tool_call.steps[1].steps[0].input_json"


# ---------------------------------------------------------------------------- HOST-MSG-4


@pytest.mark.spec("HOST-MSG-4")
@pytest.mark.parametrize("phase", [COMPLETED, FAILED])
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_terminal_command_text_equal_to_a_trimmed_stream_is_removed(
    phase: ToolCallPhase, stream: str
) -> None:
    raw = "\n  total 0\nfile\n\u00a0"
    snapshot = call(phase=phase, output_text="total 0\nfile", exit_code=0)
    snapshot = (
        replace(snapshot, stdout=raw) if stream == "stdout" else replace(snapshot, stderr=raw)
    )
    payload = payload_of(snapshot)
    assert payload["output"] == {TEXT_REMOVED_KEY: stream}
    assert payload[stream] == "\n  total 0\nfile\n\u00a0"  # the raw stream stays canonical


@pytest.mark.spec("HOST-MSG-4")
def test_running_snapshots_and_non_command_tools_keep_text() -> None:
    running = payload_of(call(phase=RUNNING, output_text="x", stdout="x\n"))
    assert running["output"] == {"text": "x"}
    # Explicit non-command identity wins over command-shaped input.
    mcp = payload_of(
        call(tool_kind="mcp", input_json='{"command": "ls"}', output_text="x", stdout="x\n")
    )
    assert mcp["output"] == {"text": "x"}
    unknown = payload_of(call(tool_kind="", output_text="x", stdout="x"))
    assert unknown["output"] == {"text": "x"}


@pytest.mark.spec("HOST-MSG-4")
def test_text_that_differs_from_the_streams_is_kept() -> None:
    payload = payload_of(call(output_text="summary", stdout="summary plus", stderr="other"))
    assert payload["output"] == {"text": "summary"}


@pytest.mark.spec("HOST-MSG-4")
def test_the_alias_uses_go_trim_space() -> None:
    assert go_trim_space("\u3000\t x \u2028\u0085") == "x"
    assert go_trim_space("\x1cx\x1f") == "\x1cx\x1f"  # not white space in Go
    payload = payload_of(call(output_text="x", stdout="\x1cx"))
    assert payload["output"] == {"text": "x"}


@pytest.mark.spec("HOST-MSG-4")
def test_nested_steps_follow_their_own_phase() -> None:
    step_done = call(call_id="s1", phase=COMPLETED, output_text="a", stdout="a\n")
    step_running = call(call_id="s2", phase=RUNNING, output_text="b", stdout="b\n")
    parent = call(phase=RUNNING, output_text="p", stdout="p", steps=(step_done, step_running))
    payload = payload_of(parent)
    assert payload["output"] == {"text": "p"}
    assert payload["steps"][0]["output"] == {TEXT_REMOVED_KEY: "stdout"}
    assert payload["steps"][1]["output"] == {"text": "b"}


@pytest.mark.spec("HOST-MSG-4", "HOST-MSG-3")
def test_the_alias_is_compared_before_truncation() -> None:
    big = "é" * 600
    limits = PayloadLimits(field_bytes=256, payload_bytes=10_000, structured_leaf_bytes=64)
    payload = payload_of(call(output_text=big, stdout=big + "\n"), limits)
    assert payload["output"] == {TEXT_REMOVED_KEY: "stdout"}
    assert payload["stdout"].endswith(TRUNCATION_MARKER)


# ---------------------------------------------------------------------------- HOST-MSG-3


@pytest.mark.spec("HOST-MSG-3")
def test_truncate_utf8_keeps_a_valid_prefix_and_the_marker() -> None:
    assert truncate_utf8("short", 100) == "short"
    text = "a" + "😀" * 10  # 1 + 40 bytes
    cut = truncate_utf8(text, MARKER_BYTES + 6)
    assert cut == "a😀" + TRUNCATION_MARKER  # "a" + half an emoji would split it
    assert utf8_len(cut) <= MARKER_BYTES + 6
    with pytest.raises(ValueError):
        truncate_utf8(text, MARKER_BYTES - 1)


@pytest.mark.spec("HOST-MSG-3")
def test_each_stream_is_cut_to_the_field_bound_nested_steps_included() -> None:
    limits = PayloadLimits(field_bytes=100, payload_bytes=100_000, structured_leaf_bytes=64)
    long = "x" * 150
    snapshot = call(
        tool_kind="mcp",
        output_text=long,
        error_text=long,
        stdout=long,
        stderr="fits",
        steps=(call(tool_kind="mcp", stdout=long, output_text="ok"),),
    )
    payload = payload_of(snapshot, limits)
    cut = "x" * (100 - MARKER_BYTES) + TRUNCATION_MARKER
    assert payload["output"]["text"] == cut
    assert payload["error"]["text"] == cut
    assert payload["stdout"] == cut
    assert payload["stderr"] == "fits"
    assert payload["steps"][0]["stdout"] == cut
    assert payload["steps"][0]["output"]["text"] == "ok"


@pytest.mark.spec("HOST-MSG-3")
def test_the_default_bounds_are_one_mebibyte_and_768_kibibytes() -> None:
    assert FIELD_LIMIT_BYTES == 1024 * 1024
    assert PAYLOAD_BUDGET_BYTES == 768 * 1024
    result = build_tool_call_payload(call(stdout="y" * (3 * 1024 * 1024), input_json='{"a":1}'))
    assert result.size_bytes <= PAYLOAD_BUDGET_BYTES
    assert result.size_bytes > PAYLOAD_BUDGET_BYTES - 64  # water-filling uses the budget
    assert result.payload["stdout"].endswith(TRUNCATION_MARKER)
    assert result.shortened


@pytest.mark.spec("HOST-MSG-3")
def test_structured_duplicates_become_markers_in_place() -> None:
    text = "the output"
    structured = {
        "summary": text,
        "items": ["a", text, 3, None, {"deep": text}],
        "other": "kept",
        "flag": True,
    }
    payload = payload_of(
        call(tool_kind="mcp", output_text=text, structured_content_json=json.dumps(structured))
    )
    assert payload["structuredContent"] == {
        "summary": DUPLICATE_MARKER,
        "items": ["a", DUPLICATE_MARKER, 3, None, {"deep": DUPLICATE_MARKER}],
        "other": "kept",
        "flag": True,
    }
    assert list(payload["structuredContent"]) == ["summary", "items", "other", "flag"]


@pytest.mark.spec("HOST-MSG-3")
def test_long_structured_leaves_are_shortened_and_steps_compare_their_own_text() -> None:
    limits = PayloadLimits(field_bytes=1000, payload_bytes=100_000, structured_leaf_bytes=40)
    leaf = "ü" * 40  # 80 bytes
    step = call(tool_kind="mcp", output_text="step text", structured_content_json='["step text"]')
    payload = payload_of(
        call(
            tool_kind="mcp",
            output_text="parent",
            structured_content_json=json.dumps({"big": leaf, "n": 12345678901234567890}),
            steps=(step,),
        ),
        limits,
    )
    big = payload["structuredContent"]["big"]
    assert big == "ü" * 11 + TRUNCATION_MARKER  # 22 + 18 bytes
    assert payload["structuredContent"]["n"] == 12345678901234567890
    assert payload["steps"][0]["structuredContent"] == [DUPLICATE_MARKER]


@pytest.mark.spec("HOST-MSG-3")
def test_water_filling_keeps_short_streams_and_cuts_long_ones_to_one_cap() -> None:
    limits = PayloadLimits(field_bytes=10_000, payload_bytes=1_500, structured_leaf_bytes=64)
    snapshot = call(
        tool_kind="mcp",
        input_json=json.dumps({"keep": "i" * 300}),
        output_text="short",
        stdout="o" * 5_000,
        stderr="e" * 800,
    )
    result = build_tool_call_payload(snapshot, limits=limits)
    payload = result.payload
    assert result.size_bytes <= 1_500
    assert payload["input"] == {"keep": "i" * 300}
    assert payload["output"]["text"] == "short"
    assert payload["stdout"].endswith(TRUNCATION_MARKER)
    assert payload["stderr"].endswith(TRUNCATION_MARKER)
    # One common cap: both long streams were cut to the same length.
    assert utf8_len(payload["stdout"]) == utf8_len(payload["stderr"])
    # And it is the largest cap that fits: one more byte would not.
    bigger = dict(payload, stdout="o" * (utf8_len(payload["stdout"]) - MARKER_BYTES + 1))
    bigger["stdout"] += TRUNCATION_MARKER
    bigger["stderr"] = bigger["stdout"].replace("o", "e")
    assert utf8_len(encode_payload(bigger)) > 1_500


@pytest.mark.spec("HOST-MSG-3")
def test_structured_leaves_are_refitted_only_after_streams_are_at_their_minimum() -> None:
    limits = PayloadLimits(field_bytes=10_000, payload_bytes=600, structured_leaf_bytes=400)
    structured = {"a": "s" * 400, "b": "t" * 400}
    result = build_tool_call_payload(
        call(tool_kind="mcp", stdout="o" * 2_000, structured_content_json=json.dumps(structured)),
        limits=limits,
    )
    assert result.size_bytes <= 600
    assert result.payload["stdout"] == TRUNCATION_MARKER
    leaves = result.payload["structuredContent"]
    assert leaves["a"].endswith(TRUNCATION_MARKER)
    assert utf8_len(leaves["a"]) == utf8_len(leaves["b"])


@pytest.mark.spec("HOST-MSG-3")
def test_required_data_that_cannot_fit_is_an_error() -> None:
    limits = PayloadLimits(field_bytes=1_000, payload_bytes=500, structured_leaf_bytes=64)
    with pytest.raises(ResourceExhausted) as raised:
        build_tool_call_payload(
            call(input_json=json.dumps({"script": "x" * 600}), stdout="y" * 900), limits=limits
        )
    assert raised.value.reason == TOOL_PAYLOAD_TOO_LARGE
    assert raised.value.metadata["budget_bytes"] == "500"
    assert int(raised.value.metadata["minimum_bytes"]) > 500
    # Non-string values are never shortened either.
    with pytest.raises(ResourceExhausted):
        build_tool_call_payload(
            call(structured_content_json=json.dumps(list(range(200)))), limits=limits
        )


@pytest.mark.spec("HOST-MSG-3")
def test_lone_surrogates_in_json_input_are_stored_as_valid_utf8() -> None:
    result = build_tool_call_payload(call(input_json='{"k": "\\ud800x"}'))
    result.payload_json.encode("utf-8")  # never raises
    assert json.loads(result.payload_json)["input"] == {"k": "\ud800x"}


@pytest.mark.spec("HOST-MSG-3")
def test_the_encoding_is_compact_and_keeps_non_ascii() -> None:
    assert encode_payload({"a": ["é", 1]}) == '{"a":["é",1]}'


# ---------------------------------------------------------------------------- properties

CHARS = st.characters(codec="utf-8", exclude_categories=["Cs"])
TEXT = st.text(CHARS, max_size=200)
# Streams are often long so the budget rules have work to do.
STREAM = st.none() | TEXT | st.text(CHARS, min_size=200, max_size=1_500)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(CHARS, max_size=60),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=8,
)


def snapshots(depth: int) -> st.SearchStrategy[ToolCallSnapshot]:
    steps = st.just(()) if depth == 0 else st.lists(snapshots(depth - 1), max_size=2).map(tuple)
    return st.builds(
        ToolCallSnapshot,
        call_id=st.text(max_size=8),
        tool_name=st.sampled_from(["Bash", "mcp.search", "Edit"]),
        tool_kind=st.sampled_from(["command", "mcp", "file_edit", ""]),
        phase=st.sampled_from(list(ToolCallPhase)),
        input_json=st.one_of(st.just(""), JSON.map(json.dumps)),
        provider_status=st.none() | st.sampled_from(["success", "canceled", ""]),
        exit_code=st.none() | st.integers(-3, 3),
        title=st.none() | TEXT,
        output_text=STREAM,
        error_text=STREAM,
        stdout=STREAM,
        stderr=STREAM,
        matches_json=st.none() | st.lists(JSON, max_size=3).map(json.dumps),
        saved_paths=st.lists(st.text(max_size=10), max_size=3).map(tuple),
        file_changes_json=st.none() | st.lists(JSON, max_size=2).map(json.dumps),
        structured_content_json=st.none()
        | JSON.map(json.dumps)
        | st.dictionaries(st.text(max_size=3), STREAM, max_size=3).map(json.dumps),
        provider_result_json=st.none() | JSON.map(json.dumps),
        steps=steps,
    )


LIMITS = st.builds(
    PayloadLimits,
    field_bytes=st.integers(MARKER_BYTES, 300),
    payload_bytes=st.integers(300, 8_000),
    structured_leaf_bytes=st.integers(MARKER_BYTES, 120),
)


def skeleton(value: Any) -> Any:
    """The value with every string leaf blanked: what shortening may never change."""
    if isinstance(value, str):
        return str
    if isinstance(value, list):
        return [skeleton(item) for item in value]
    if isinstance(value, dict):
        return {key: skeleton(item) for key, item in value.items()}
    return value


def check_node(snapshot: ToolCallSnapshot, stored: dict[str, Any], limits: PayloadLimits) -> None:
    if snapshot.input_json:
        assert stored["input"] == json.loads(snapshot.input_json)
    else:
        assert "input" not in stored
    assert stored.get("exitCode") == snapshot.exit_code
    assert stored["callId"] == snapshot.call_id
    if snapshot.matches_json is not None:
        assert stored["output"]["matches"] == json.loads(snapshot.matches_json)
    if snapshot.file_changes_json is not None:
        assert stored["fileChanges"] == json.loads(snapshot.file_changes_json)
    if snapshot.structured_content_json is not None:
        original = json.loads(snapshot.structured_content_json)
        assert skeleton(stored["structuredContent"]) == skeleton(original)
    for name, raw in (("stdout", snapshot.stdout), ("stderr", snapshot.stderr)):
        if raw is None:
            assert name not in stored
            continue
        value = stored[name]
        assert utf8_len(value) <= max(limits.field_bytes, utf8_len(raw))
        if value != raw:
            assert value.endswith(TRUNCATION_MARKER)
            assert raw.startswith(value[: -len(TRUNCATION_MARKER)])
    output = stored.get("output", {})
    if (
        snapshot.tool_kind == "command"
        and snapshot.phase is not RUNNING
        and snapshot.output_text is not None
        and snapshot.output_text
        in {go_trim_space(s) for s in (snapshot.stdout, snapshot.stderr) if s is not None}
    ):
        assert "text" not in output
        assert output[TEXT_REMOVED_KEY] in {"stdout", "stderr"}
    elif snapshot.output_text is not None:
        assert "text" in output
    assert [step["callId"] for step in stored.get("steps", [])] == [
        step.call_id for step in snapshot.steps
    ]
    for step, stored_step in zip(snapshot.steps, stored.get("steps", []), strict=True):
        check_node(step, stored_step, limits)


@pytest.mark.spec("HOST-MSG-3", "HOST-MSG-4", "HOST-MSG-5")
@given(snapshots(2), LIMITS)
def test_budgeted_payloads_are_valid_deterministic_and_within_budget(
    snapshot: ToolCallSnapshot, limits: PayloadLimits
) -> None:
    # The smallest payload the rules allow: every stream and leaf at the bare marker.
    floor = PayloadLimits(
        field_bytes=MARKER_BYTES, payload_bytes=10**9, structured_leaf_bytes=MARKER_BYTES
    )
    minimum = build_tool_call_payload(snapshot, limits=floor).size_bytes
    if minimum > limits.payload_bytes:
        # Only required data that cannot fit fails, and then nothing is returned.
        with pytest.raises(ResourceExhausted) as raised:
            build_tool_call_payload(snapshot, limits=limits)
        assert raised.value.reason == TOOL_PAYLOAD_TOO_LARGE
        return
    result = build_tool_call_payload(snapshot, limits=limits)
    encoded = result.payload_json.encode("utf-8")  # valid UTF-8
    assert len(encoded) == result.size_bytes <= limits.payload_bytes
    assert json.loads(result.payload_json) == result.payload
    again = build_tool_call_payload(snapshot, limits=limits)
    assert again.payload_json == result.payload_json  # same input, same bytes
    check_node(snapshot, result.payload, limits)


@pytest.mark.spec("HOST-MSG-3")
@given(TEXT, st.integers(MARKER_BYTES, 100))
def test_truncation_is_a_utf8_safe_prefix(text: str, limit: int) -> None:
    cut = truncate_utf8(text, limit)
    assert utf8_len(cut) <= max(limit, 0) or cut == text
    if cut != text:
        assert cut.endswith(TRUNCATION_MARKER)
        assert text.startswith(cut[: -len(TRUNCATION_MARKER)])
        # Maximal: one more character would not fit.
        kept = len(cut) - len(TRUNCATION_MARKER)
        assert utf8_len(text[: kept + 1]) + MARKER_BYTES > limit
