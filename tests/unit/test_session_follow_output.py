"""What ``tutti session send --follow`` prints for a tool call (OPS-2, HOST-OBS-2)."""

from __future__ import annotations

import json

import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import activity_pb2
from tutti.session_commands import TOOL_CALL_PREVIEW_CHARS, _print_event, clip


@pytest.mark.spec("OPS-2")
def test_a_short_text_is_printed_whole() -> None:
    text = "x" * TOOL_CALL_PREVIEW_CHARS
    assert clip(text) == text


@pytest.mark.spec("OPS-2")
def test_a_cut_says_how_many_utf8_bytes_were_cut() -> None:
    assert clip("abcdef", 4) == "abcd … (2 more bytes)"
    # Characters are kept whole; what was cut is counted in UTF-8 bytes (é is 2, 🙂 is 4).
    assert clip("abcé🙂", 3) == "abc … (6 more bytes)"
    assert clip("é" * 5, 2) == "éé … (6 more bytes)"


def _tool_call_event(payload: str) -> activity_pb2.ActivityEvent:
    message = canonical_pb2.Message(
        session_id="s-1",
        turn_id="t-1",
        kind=canonical_pb2.MESSAGE_KIND_TOOL_CALL,
        payload_json=payload,
    )
    return activity_pb2.ActivityEvent(
        workspace_id="local",
        message_update=activity_pb2.MessageUpdateEvent(
            session_id="s-1", messages=[message], message_count=1
        ),
    )


@pytest.mark.spec("OPS-2", "HOST-OBS-2")
def test_follow_marks_a_long_tool_call_as_cut(capsys: pytest.CaptureFixture[str]) -> None:
    payload = json.dumps({"toolName": "Task", "input": {"prompt": "ü" * 300}}, ensure_ascii=False)
    assert not _print_event(_tool_call_event(payload), "s-1", "t-1")
    printed = capsys.readouterr().out.strip()
    cut = len(payload[TOOL_CALL_PREVIEW_CHARS:].encode("utf-8"))
    assert printed == f"[tool call] {payload[:TOOL_CALL_PREVIEW_CHARS]} … ({cut} more bytes)"
    assert cut > len(payload) - TOOL_CALL_PREVIEW_CHARS, "bytes, not characters"


@pytest.mark.spec("OPS-2", "HOST-OBS-2")
def test_follow_prints_a_short_tool_call_whole(capsys: pytest.CaptureFixture[str]) -> None:
    payload = '{"toolName":"Task","input":{"subagent":"explorer"}}'
    _print_event(_tool_call_event(payload), "s-1", "t-1")
    assert capsys.readouterr().out.strip() == f"[tool call] {payload}"
