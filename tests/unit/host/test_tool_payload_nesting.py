"""Tool-call nesting bounds are checked before any recursive walk (SEC-4, HOST-MSG-3)."""

from __future__ import annotations

import json

import pytest

from domainerrors import InvalidArgument
from services.host.turns.tool_payload import (
    INVALID_TOOL_CALL,
    MAX_JSON_DEPTH,
    MAX_STEP_DEPTH,
    ToolCallPhase,
    ToolCallSnapshot,
    build_tool_call_payload,
)


def _call(depth: int) -> ToolCallSnapshot:
    """A call whose ``steps`` nest ``depth`` levels (the call itself is level 1)."""
    call = ToolCallSnapshot(
        call_id=f"c{depth}", tool_name="Bash", tool_kind="", phase=ToolCallPhase.RUNNING
    )
    for level in range(depth - 1, 0, -1):
        call = ToolCallSnapshot(
            call_id=f"c{level}",
            tool_name="Bash",
            tool_kind="",
            phase=ToolCallPhase.RUNNING,
            steps=(call,),
        )
    return call


def _nested_json(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.spec("SEC-4", "HOST-MSG-3")
def test_steps_at_the_bound_project_and_one_deeper_is_invalid() -> None:
    payload = build_tool_call_payload(_call(MAX_STEP_DEPTH)).payload
    for _ in range(MAX_STEP_DEPTH - 1):
        payload = payload["steps"][0]
    assert "steps" not in payload
    with pytest.raises(InvalidArgument) as refused:
        build_tool_call_payload(_call(MAX_STEP_DEPTH + 1))
    assert refused.value.reason == INVALID_TOOL_CALL
    [violation] = refused.value.field_violations
    assert violation.field == "tool_call" + ".steps[0]" * (MAX_STEP_DEPTH - 1) + ".steps"


@pytest.mark.spec("SEC-4", "HOST-MSG-3")
@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 5_000, 200_000])
def test_json_nested_past_the_bound_is_invalid_never_a_recursion_error(levels: int) -> None:
    snapshot = ToolCallSnapshot(
        call_id="c",
        tool_name="Bash",
        tool_kind="",
        phase=ToolCallPhase.COMPLETED,
        structured_content_json=_nested_json(levels),
    )
    with pytest.raises(InvalidArgument) as refused:
        build_tool_call_payload(snapshot)
    assert refused.value.reason == INVALID_TOOL_CALL
    assert [v.field for v in refused.value.field_violations] == [
        "tool_call.structured_content_json"
    ]


@pytest.mark.spec("SEC-4", "HOST-MSG-3")
def test_json_at_the_bound_is_kept() -> None:
    snapshot = ToolCallSnapshot(
        call_id="c",
        tool_name="Bash",
        tool_kind="",
        phase=ToolCallPhase.COMPLETED,
        input_json=_nested_json(MAX_JSON_DEPTH),
    )
    payload = build_tool_call_payload(snapshot).payload
    assert json.dumps(payload["input"]) == json.dumps(json.loads(_nested_json(MAX_JSON_DEPTH)))
