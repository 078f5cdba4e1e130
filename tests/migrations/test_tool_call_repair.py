"""The tool-call repair data migration on SQLite and Postgres (HOST-MSG-6).

The store is migrated to the revision before the repair, seeded with legacy oversized
tool-call rows the forward rules would never have written (command and MCP, in a live and a
tombstoned Session, one that cannot fit), then upgraded. Each repaired row must be exactly
what today's forward projection (``build_tool_call_payload``) writes for the same call,
which also proves the migration's frozen copy of the rules matches them.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from services.host.turns.tool_payload import (
    PAYLOAD_BUDGET_BYTES,
    ToolCallPhase,
    ToolCallSnapshot,
    build_tool_call_payload,
)
from store import migrate
from store.engine import create_sync_engine_for

REPAIR = "0009_tool_call_repair"
WS = "ws-1"
NOW_MS = 1_700_000_000_000
KIB = 1024

# Lightweight tables with only the columns seeded, so the seed does not depend on columns a
# later revision adds to the models.
_sessions = sa.table(
    "sessions",
    *(
        sa.column(name)
        for name in (
            "workspace_id",
            "session_id",
            "root_session_id",
            "provider",
            "title",
            "rail_section_key",
            "created_at_unix_ms",
            "updated_at_unix_ms",
            "deleted_at_unix_ms",
            "deletion_generation",
            "component_size",
            "message_version",
            "next_message_sequence",
            "settings_json",
            "capabilities_json",
            "tombstone_legacy",
        )
    ),
)
_turns = sa.table(
    "turns",
    *(
        sa.column(name)
        for name in (
            "workspace_id",
            "session_id",
            "turn_id",
            "phase",
            "origin",
            "delivery",
            "outcome",
            "version",
            "result_resolved_empty",
            "created_at_unix_ms",
            "updated_at_unix_ms",
        )
    ),
)
_messages = sa.table(
    "messages",
    *(
        sa.column(name)
        for name in (
            "workspace_id",
            "session_id",
            "message_id",
            "sequence",
            "version",
            "turn_id",
            "occurred_at_unix_ms",
            "created_at_unix_ms",
            "updated_at_unix_ms",
            "role",
            "kind",
            "payload_json",
            "user_visible_assistant_response",
        )
    ),
)


def _encode(value: Any) -> str:
    """How a legacy Host stored a payload (compact, non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


BIG_STDOUT = "line of output ünïcode\n" * (500 * KIB // 24) + "\n"
MCP_TEXT = "result text " * (300 * KIB // 12)
MCP_NOTE = "n" * (200 * KIB)
STRUCTURED = {"result": MCP_TEXT, "note": MCP_NOTE, "count": 3, "items": [MCP_TEXT, 1.5]}

LEGACY: dict[str, tuple[str, Any]] = {
    # A terminal command whose text repeats its trimmed stdout (stored before HOST-MSG-4).
    "cmd-alias": (
        "s-live",
        {
            "callId": "cmd-alias",
            "toolName": "Bash",
            "toolKind": "command",
            "phase": "completed",
            "status": "success",
            "exitCode": 0,
            "input": {"command": "cat big.log"},
            "output": {"text": BIG_STDOUT.strip()},
            "stdout": BIG_STDOUT,
        },
    ),
    # A tombstoned Session's command whose streams together exceed the budget.
    "cmd-streams": (
        "s-tomb",
        {
            "callId": "cmd-streams",
            "toolName": "Bash",
            "toolKind": "command",
            "phase": "failed",
            "status": "failure",
            "exitCode": 2,
            "title": "make",
            "input": {"command": "make"},
            "output": {"text": "make failed"},
            "stdout": "o" * (900 * KIB),
            "stderr": "e" * (200 * KIB),
        },
    ),
    # An MCP call with its provider envelope, duplicate structured text and a long leaf.
    "mcp-live": (
        "s-live",
        {
            "callId": "mcp-live",
            "toolName": "mcp__search__query",
            "toolKind": "mcp",
            "phase": "completed",
            "status": "success",
            "input": {"q": "x"},
            "output": {"text": MCP_TEXT},
            "structuredContent": STRUCTURED,
            "content": [{"type": "text", "text": MCP_TEXT}],
            "_meta": {"adapter": "v0"},
        },
    ),
    # A tombstoned non-command tool: its text equals stdout, which only commands may drop.
    "read-tomb": (
        "s-tomb",
        {
            "callId": "read-tomb",
            "toolName": "Read",
            "toolKind": "read",
            "phase": "completed",
            "status": "success",
            "input": {"path": "/big"},
            "output": {"text": "r" * (500 * KIB), "savedPath": "/work/big.out"},
            "stdout": "r" * (500 * KIB),
        },
    ),
    # Its input alone exceeds the budget: it must stay byte-identical.
    "unfittable": (
        "s-live",
        {
            "callId": "unfittable",
            "toolName": "Write",
            "toolKind": "edit",
            "phase": "completed",
            "status": "success",
            "input": {"content": "i" * (800 * KIB)},
            "stdout": "s" * (100 * KIB),
        },
    ),
    # Small rows, even with an envelope, are not the migration's business.
    "small": (
        "s-live",
        {
            "callId": "small",
            "toolName": "Bash",
            "toolKind": "command",
            "phase": "completed",
            "status": "success",
            "output": {"text": "hi"},
            "stdout": "hi\n",
            "_meta": {"x": 1},
        },
    ),
}

EXPECTED_SNAPSHOTS = {
    "cmd-alias": ToolCallSnapshot(
        call_id="cmd-alias",
        tool_name="Bash",
        tool_kind="command",
        phase=ToolCallPhase.COMPLETED,
        provider_status="success",
        exit_code=0,
        input_json='{"command": "cat big.log"}',
        output_text=BIG_STDOUT.strip(),
        stdout=BIG_STDOUT,
    ),
    "cmd-streams": ToolCallSnapshot(
        call_id="cmd-streams",
        tool_name="Bash",
        tool_kind="command",
        phase=ToolCallPhase.FAILED,
        provider_status="failure",
        exit_code=2,
        title="make",
        input_json='{"command": "make"}',
        output_text="make failed",
        stdout="o" * (900 * KIB),
        stderr="e" * (200 * KIB),
    ),
    "mcp-live": ToolCallSnapshot(
        call_id="mcp-live",
        tool_name="mcp__search__query",
        tool_kind="mcp",
        phase=ToolCallPhase.COMPLETED,
        provider_status="success",
        input_json='{"q": "x"}',
        output_text=MCP_TEXT,
        structured_content_json=json.dumps(STRUCTURED),
    ),
    "read-tomb": ToolCallSnapshot(
        call_id="read-tomb",
        tool_name="Read",
        tool_kind="read",
        phase=ToolCallPhase.COMPLETED,
        provider_status="success",
        input_json='{"path": "/big"}',
        output_text="r" * (500 * KIB),
        saved_paths=("/work/big.out",),
        stdout="r" * (500 * KIB),
    ),
}
"""The same calls as a runtime reports them today: the forward rules give the expected rows."""

UNTOUCHED = ("unfittable", "small", "big-text")


@pytest.fixture
def before_repair_url(empty_db_url: str) -> str:
    """A database at the revision just before the repair."""
    script = ScriptDirectory.from_config(migrate.alembic_config())
    previous = script.get_revision(REPAIR).down_revision
    assert isinstance(previous, str)
    migrate.upgrade(empty_db_url, previous)
    return empty_db_url


@pytest.fixture
def engine(before_repair_url: str) -> Iterator[Engine]:
    engine = create_sync_engine_for(before_repair_url)
    yield engine
    engine.dispose()


def _seed(engine: Engine) -> None:
    sessions = [
        {
            "workspace_id": WS,
            "session_id": session_id,
            "root_session_id": session_id,
            "provider": "demo",
            "title": session_id,
            "rail_section_key": "conversations",
            "created_at_unix_ms": NOW_MS,
            "updated_at_unix_ms": NOW_MS + 7,
            "deleted_at_unix_ms": deleted,
            "deletion_generation": "g" if deleted else None,
            "component_size": 1 if deleted else None,
            "message_version": 40,
            "next_message_sequence": 20,
            "settings_json": "{}",
            "capabilities_json": "{}",
            "tombstone_legacy": False,
        }
        for session_id, deleted in (("s-live", None), ("s-tomb", NOW_MS + 9))
    ]
    turns = [
        {
            "workspace_id": WS,
            "session_id": session_id,
            "turn_id": "t-1",
            "phase": "settled",
            "origin": "user",
            "delivery": "new_turn",
            "outcome": "completed",
            "version": 3,
            "result_resolved_empty": False,
            "created_at_unix_ms": NOW_MS,
            "updated_at_unix_ms": NOW_MS,
        }
        for session_id in ("s-live", "s-tomb")
    ]
    rows = [
        _message(session_id, message_id, index, _encode(payload), "tool_call")
        for index, (message_id, (session_id, payload)) in enumerate(LEGACY.items())
    ]
    rows.append(_message("s-live", "big-text", 10, _encode({"text": "t" * (900 * KIB)}), "text"))
    with engine.begin() as connection:
        connection.execute(sa.insert(_sessions), sessions)
        connection.execute(sa.insert(_turns), turns)
        connection.execute(sa.insert(_messages), rows)


def _message(
    session_id: str, message_id: str, index: int, payload: str, kind: str
) -> dict[str, Any]:
    return {
        "workspace_id": WS,
        "session_id": session_id,
        "message_id": message_id,
        "sequence": index + 1,
        "version": 30 - index,  # not the sequence: a repair must keep both as they are
        "turn_id": "t-1",
        "occurred_at_unix_ms": NOW_MS + 100 + index,
        "created_at_unix_ms": NOW_MS + 200 + index,
        "updated_at_unix_ms": NOW_MS + 300 + index,
        "role": "assistant",
        "kind": kind,
        "payload_json": payload,
        "user_visible_assistant_response": None if index % 2 else False,
    }


def _table(engine: Engine, name: str) -> list[dict[str, Any]]:
    with engine.connect() as connection:
        result = connection.execute(sa.text(f"SELECT * FROM {name}"))
        rows = [dict(row) for row in result.mappings()]
    return sorted(rows, key=lambda row: json.dumps(row, sort_keys=True, default=str))


def _messages_by_id(engine: Engine) -> dict[str, dict[str, Any]]:
    return {row["message_id"]: row for row in _table(engine, "messages")}


@pytest.mark.spec("HOST-MSG-6")
def test_the_repair_refits_oversized_tool_calls_and_changes_nothing_else(
    before_repair_url: str, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    _seed(engine)
    before = _messages_by_id(engine)
    sessions, events = _table(engine, "sessions"), _table(engine, "activity_events")
    assert all(_size(before[m]["payload_json"]) > PAYLOAD_BUDGET_BYTES for m in EXPECTED_SNAPSHOTS)

    with caplog.at_level(logging.INFO, logger="store.migrations.tool_call_repair"):
        migrate.upgrade(before_repair_url, REPAIR)

    after = _messages_by_id(engine)
    assert after.keys() == before.keys()
    for message_id, snapshot in EXPECTED_SNAPSHOTS.items():
        repaired = after[message_id]["payload_json"]
        assert repaired == build_tool_call_payload(snapshot).payload_json, message_id
        assert _size(repaired) <= PAYLOAD_BUDGET_BYTES, message_id
        # Only the payload changed: version, sequence, timestamps, Turn, classification kept.
        unchanged = {k: v for k, v in before[message_id].items() if k != "payload_json"}
        assert {k: v for k, v in after[message_id].items() if k != "payload_json"} == unchanged
    # The HOST-MSG-4 alias went, with its explicit removal; a non-command keeps its text.
    alias = json.loads(after["cmd-alias"]["payload_json"])
    assert "text" not in alias["output"]
    assert alias["output"]["textRemoved"] == "stdout"
    assert alias["stdout"] == BIG_STDOUT
    read = json.loads(after["read-tomb"]["payload_json"])
    assert "text" in read["output"]
    assert "textRemoved" not in read["output"]
    mcp = json.loads(after["mcp-live"]["payload_json"])
    assert "content" not in mcp
    assert "_meta" not in mcp
    assert mcp["structuredContent"]["result"] == "[Duplicate of output.text]"
    assert mcp["structuredContent"]["items"][0] == "[Duplicate of output.text]"
    assert mcp["structuredContent"]["count"] == 3
    for message_id in UNTOUCHED:
        assert after[message_id] == before[message_id], message_id
    assert _table(engine, "sessions") == sessions  # message_version and updated_at kept
    assert _table(engine, "activity_events") == events  # no event
    summary = [r.getMessage() for r in caplog.records if "rewritten" in r.getMessage()]
    assert summary == [
        "tool-call repair: 5 oversized tool-call rows, 4 rewritten, 1 left unchanged"
    ]
    assert any("ws-1/s-live/unfittable unchanged" in r.getMessage() for r in caplog.records)


@pytest.mark.spec("HOST-MSG-6")
def test_a_second_repair_changes_nothing(before_repair_url: str, engine: Engine) -> None:
    _seed(engine)
    migrate.upgrade(before_repair_url, REPAIR)
    once = (_table(engine, "messages"), _table(engine, "sessions"))
    script = ScriptDirectory.from_config(migrate.alembic_config())
    previous = script.get_revision(REPAIR).down_revision
    assert isinstance(previous, str)

    migrate.downgrade(before_repair_url, previous)
    migrate.upgrade(before_repair_url, REPAIR)

    assert (_table(engine, "messages"), _table(engine, "sessions")) == once
    assert _table(engine, "activity_events") == []


def _unencodable_rows() -> dict[str, str]:
    """Oversized rows ``json.loads`` reads but the repair cannot re-encode or walk."""
    big = "s" * (1100 * KIB)  # over the budget, so the repair examines the row
    head = '{"callId":"%s","toolName":"t","toolKind":"mcp","phase":"completed","status":"success"'
    # NaN: accepted by json.loads, refused by the repair's strict (allow_nan=False) encoder.
    nan = head % "nan-input" + f',"input":{{"limit":NaN,"ratio":Infinity}},"stdout":"{big}"}}'
    # Nesting json.loads accepts but the repair's per-level recursion (two frames a level)
    # cannot walk.
    depth = sys.getrecursionlimit() // 2 + 50
    nested = "[" * depth + '"leaf"' + "]" * depth
    deep = head % "deep-structured" + f',"stdout":"{big}","structuredContent":{nested}}}'
    return {"nan-input": nan, "deep-structured": deep}


@pytest.mark.spec("HOST-MSG-6")
def test_rows_that_cannot_be_re_encoded_or_walked_stay_byte_identical(
    before_repair_url: str, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """NaN/Infinity or very deep nesting leaves the row unchanged; the upgrade goes on."""
    _seed(engine)
    odd = _unencodable_rows()
    with engine.begin() as connection:
        connection.execute(
            sa.insert(_messages),
            [
                _message("s-live", message_id, 20 + index, payload, "tool_call")
                for index, (message_id, payload) in enumerate(odd.items())
            ],
        )
    before = _messages_by_id(engine)

    with caplog.at_level(logging.INFO, logger="store.migrations.tool_call_repair"):
        migrate.upgrade(before_repair_url, REPAIR)

    after = _messages_by_id(engine)
    for message_id, payload in odd.items():
        assert after[message_id] == before[message_id], message_id
        assert after[message_id]["payload_json"] == payload, message_id
        assert any(f"ws-1/s-live/{message_id} unchanged" in r.getMessage() for r in caplog.records)
    # The other oversized rows were still repaired in the same upgrade.
    for message_id, snapshot in EXPECTED_SNAPSHOTS.items():
        assert after[message_id]["payload_json"] == build_tool_call_payload(snapshot).payload_json
    summary = [r.getMessage() for r in caplog.records if "rewritten" in r.getMessage()]
    assert summary == [
        "tool-call repair: 7 oversized tool-call rows, 4 rewritten, 3 left unchanged"
    ]


def _repair_module() -> Any:
    """The migration module itself, loaded from its file as Alembic loads it."""
    script = ScriptDirectory.from_config(migrate.alembic_config())
    revision = script.get_revision(REPAIR)
    assert revision is not None
    spec = importlib.util.spec_from_file_location("tool_call_repair_under_test", revision.path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.spec("HOST-MSG-6")
def test_the_repair_pages_through_the_table_by_key(
    before_repair_url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _seed(engine)
    module = _repair_module()
    # Pages of two keys: every oversized row is still found, each exactly once.
    monkeypatch.setattr(module, "KEY_BATCH", 2)
    with engine.begin() as connection:
        counts = module.repair(connection)
    assert (counts.examined, counts.rewritten) == (5, 4)
    assert counts.unfittable == [(WS, "s-live", "unfittable")]
    after = _messages_by_id(engine)
    for message_id, snapshot in EXPECTED_SNAPSHOTS.items():
        assert after[message_id]["payload_json"] == build_tool_call_payload(snapshot).payload_json
    with engine.begin() as connection:
        again = module.repair(connection)
    assert (again.examined, again.rewritten, again.unfittable) == (
        1,
        0,
        [(WS, "s-live", "unfittable")],
    )


@pytest.mark.spec("HOST-MSG-6")
def test_nested_steps_and_provider_envelopes_are_projected_like_a_forward_write() -> None:
    module = _repair_module()
    inner_out = "step output\n" * (40 * KIB)
    legacy = {
        "callId": "outer",
        "toolName": "Task",
        "toolKind": "agent",
        "phase": "completed",
        "status": "success",
        "input": {"prompt": "go"},
        # Legacy envelope only: the text is promoted from it, then the envelope dropped.
        "toolResponse": {"raw": "x" * (300 * KIB)},
        "content": [{"type": "text", "text": "summary " * (30 * KIB)}, {"type": "image"}],
        "steps": [
            {
                "callId": "inner",
                "toolName": "Bash",
                "toolKind": "command",
                "phase": "completed",
                "status": "success",
                "exitCode": 0,
                "input": {"command": "run"},
                "output": {"text": inner_out.strip()},
                "stdout": inner_out,
                "rawOutput": {"stdout": inner_out},
            }
        ],
    }
    forward = ToolCallSnapshot(
        call_id="outer",
        tool_name="Task",
        tool_kind="agent",
        phase=ToolCallPhase.COMPLETED,
        provider_status="success",
        input_json='{"prompt": "go"}',
        output_text="summary " * (30 * KIB),
        steps=(
            ToolCallSnapshot(
                call_id="inner",
                tool_name="Bash",
                tool_kind="command",
                phase=ToolCallPhase.COMPLETED,
                provider_status="success",
                exit_code=0,
                input_json='{"command": "run"}',
                output_text=inner_out.strip(),
                stdout=inner_out,
            ),
        ),
    )
    stored = _encode(legacy)
    assert _size(stored) > PAYLOAD_BUDGET_BYTES
    assert module.repaired_payload(stored) == build_tool_call_payload(forward).payload_json
    with pytest.raises(module.Unfittable):
        module.repaired_payload('["not", "an object"]')
    with pytest.raises(module.Unfittable):
        module.repaired_payload(_encode({"callId": "c", "input": {"blob": "i" * (800 * KIB)}}))
