"""Runtime message classification and Turn scope over real gRPC (HOST-MSG-1, HOST-MSG-7).

The runtime classifies every message it reports (``user_visible_assistant_response``) and
Host stores that value verbatim: the tests pair each kind with the classification its role
and kind would *not* suggest, so a Host that derived it would fail them. Execution messages
must name a Turn of their own Session; only a notice may be Session-scoped. A refused
snapshot refuses its whole report, which the store snapshots prove wrote nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, insert, update

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, runtime_pb2
from services.host.runtime import link
from store.engine import create_sync_engine_for
from store.models import Message, Session
from tests.integration.host_activity import DEVICE, TARGET_ID, WS, HostUnderTest, start_host
from tests.support.activity_watch import Watcher, kind
from tests.support.host_activity_calls import session_messages
from tests.support.runtime_client import ScriptedRuntime, text_message, turn_patch
from tests.support.servers import LiveServer
from tests.support.store_snapshot import snapshot

RUNNING = canonical_pb2.TURN_PHASE_RUNNING
APPLIED = runtime_pb2.REPORT_OUTCOME_APPLIED
REJECTED = runtime_pb2.REPORT_OUTCOME_REJECTED
ASSISTANT = canonical_pb2.MESSAGE_ROLE_ASSISTANT
SYSTEM = canonical_pb2.MESSAGE_ROLE_SYSTEM

EXECUTION_KINDS = {
    "text": canonical_pb2.MESSAGE_KIND_TEXT,
    "reasoning": canonical_pb2.MESSAGE_KIND_REASONING,
    "tool_call": canonical_pb2.MESSAGE_KIND_TOOL_CALL,
    "plan": canonical_pb2.MESSAGE_KIND_PLAN,
    "error": canonical_pb2.MESSAGE_KIND_ERROR,
}
"""The kinds HOST-MSG-7 binds to a Turn."""


def _snapshot(
    message_id: str,
    turn_id: str | None,
    kind: int,
    *,
    visible: bool | None,
    role: int = ASSISTANT,
) -> runtime_pb2.ReportItem:
    """A message snapshot; ``visible=None`` leaves the classification unset."""
    message = runtime_pb2.MessageSnapshot(
        message_id=message_id,
        role=role,  # type: ignore[arg-type]
        kind=kind,  # type: ignore[arg-type]
    )
    if turn_id is not None:
        message.turn_id = turn_id
    if visible is not None:
        message.user_visible_assistant_response = visible
    if kind == canonical_pb2.MESSAGE_KIND_TOOL_CALL:
        message.tool_call.CopyFrom(
            runtime_pb2.ToolCallSnapshot(
                call_id=message_id,
                tool_name="Bash",
                tool_kind="command",
                phase=runtime_pb2.TOOL_CALL_PHASE_COMPLETED,
                input_json='{"command": "ls"}',
                stdout="a\n",
            )
        )
    else:
        message.payload_json = '{"text": "body"}'
    return runtime_pb2.ReportItem(message_snapshot=message)


@pytest.fixture
def engine(migrated_db_url: str) -> Iterator[Engine]:
    engine = create_sync_engine_for(migrated_db_url)
    yield engine
    engine.dispose()


def _running_turn(host: HostUnderTest, runtime: ScriptedRuntime) -> str:
    turn_id = host.send("hello", "c1").turn.turn_id
    runtime.ack(runtime.next_command().command_id)
    assert runtime.report(WS, "s1", "r-run", turn_patch(turn_id, RUNNING)).outcome == APPLIED
    return turn_id


def _classifications(host: HostUnderTest) -> dict[str, bool | None]:
    """``message_id -> classification`` as ``ListSessionMessages`` returns them (unset: None)."""
    return {
        m.message_id: (
            m.user_visible_assistant_response
            if m.HasField("user_visible_assistant_response")
            else None
        )
        for m in session_messages(host.stub).messages
    }


@pytest.mark.spec("HOST-MSG-1")
def test_the_runtime_classification_is_stored_verbatim_and_events_carry_it(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    watcher = Watcher(host.server.channel, after_event_id=0)
    watcher.wait_ready()
    runtime = host.runtime()
    turn_id = _running_turn(host, runtime)
    # Against what role and kind would suggest: a visible tool call, a hidden assistant text.
    result = runtime.report(
        WS,
        "s1",
        "r-classified",
        _snapshot("tool-1", turn_id, canonical_pb2.MESSAGE_KIND_TOOL_CALL, visible=True),
        text_message("text-1", turn_id, "aside", visible=False),
    )
    assert result.outcome == APPLIED, result
    assert _classifications(host) == {
        "client-submit:user:c1": False,  # Host classifies the user row it writes itself
        "tool-1": True,
        "text-1": False,
    }
    events = watcher.wait_for(
        lambda es: (
            {"tool-1", "text-1"}
            <= {
                m.message_id
                for e in es
                if kind(e) == "message_update"
                for m in e.message_update.messages
            }
        )
    )
    in_events = {
        m.message_id: m.user_visible_assistant_response
        for e in events
        if kind(e) == "message_update"
        for m in e.message_update.messages
        if m.HasField("user_visible_assistant_response")
    }
    assert in_events == {"client-submit:user:c1": False, "tool-1": True, "text-1": False}
    # A re-classified snapshot is a change: a new version, the new value stored as sent.
    before = {m.message_id: m.version for m in session_messages(host.stub).messages}
    again = runtime.report(
        WS, "s1", "r-reclassified", text_message("text-1", turn_id, "aside", visible=True)
    )
    assert again.outcome == APPLIED, again
    after = {m.message_id: m for m in session_messages(host.stub).messages}
    assert after["text-1"].user_visible_assistant_response is True
    assert after["text-1"].version > before["text-1"]
    # And the identical snapshot is a replay.
    replay = runtime.report(
        WS, "s1", "r-replay", text_message("text-1", turn_id, "aside", visible=True)
    )
    assert replay.outcome == runtime_pb2.REPORT_OUTCOME_ALREADY_APPLIED
    watcher.cancel()
    runtime.close()


@pytest.mark.spec("HOST-MSG-1")
def test_a_snapshot_without_classification_refuses_the_whole_report(
    migrated_db_url: str, live_server: Callable[..., LiveServer], engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    turn_id = _running_turn(host, runtime)
    before = snapshot(engine, WS, ["s1"])
    for name, kind_value in EXECUTION_KINDS.items():
        result = runtime.report(
            WS,
            "s1",
            f"r-unclassified-{name}",
            runtime_pb2.ReportItem(session_patch=runtime_pb2.SessionPatch(title="changed")),
            text_message("fine", turn_id, "classified"),
            _snapshot(f"bare-{name}", turn_id, kind_value, visible=None),
        )
        assert (result.outcome, result.reason) == (REJECTED, link.INVALID_MESSAGE), name
        assert [r.index for r in result.item_results] == [2], name
        assert "user_visible_assistant_response" in result.item_results[0].message
        assert snapshot(engine, WS, ["s1"]) == before, name
    # A notice is no exception: its producer classifies it too.
    notice = runtime.report(
        WS,
        "s1",
        "r-bare-notice",
        _snapshot("n", None, canonical_pb2.MESSAGE_KIND_NOTICE, visible=None, role=SYSTEM),
    )
    assert (notice.outcome, notice.reason) == (REJECTED, link.INVALID_MESSAGE)
    assert snapshot(engine, WS, ["s1"]) == before
    runtime.close()


def _second_session_turn(host: HostUnderTest, runtime: ScriptedRuntime) -> str:
    """Session ``s2`` with a running Turn of its own; returns that Turn's id."""
    host.stub.CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id=WS, agent_target_id=TARGET_ID, session_id="s2", title="s2", cwd="/"
        ),
        metadata=DEVICE,
    )
    foreign = "t-of-s2"
    created = runtime.report(
        WS,
        "s2",
        "r-s2",
        turn_patch(foreign, RUNNING, origin=canonical_pb2.TURN_ORIGIN_USER),
    )
    assert created.outcome == APPLIED, created
    return foreign


@pytest.mark.spec("HOST-MSG-7")
@pytest.mark.parametrize("kind_name", sorted(EXECUTION_KINDS))
def test_an_execution_message_must_name_a_turn_of_its_session(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    engine: Engine,
    kind_name: str,
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    own = _running_turn(host, runtime)
    foreign = _second_session_turn(host, runtime)
    before = snapshot(engine, WS, ["s1", "s2"])
    kind_value = EXECUTION_KINDS[kind_name]
    cases: dict[str, Any] = {"no turn": None, "foreign turn": foreign, "unknown turn": "t-none"}
    for case, turn_id in cases.items():
        for role in (ASSISTANT, SYSTEM):
            result = runtime.report(
                WS,
                "s1",
                f"r-{case}-{role}",
                text_message("fine", own, "classified"),
                _snapshot("scoped", turn_id, kind_value, visible=False, role=role),
            )
            assert (result.outcome, result.reason) == (REJECTED, link.INVALID_MESSAGE), case
            assert [r.index for r in result.item_results] == [1], case
            assert snapshot(engine, WS, ["s1", "s2"]) == before, case
    # The same snapshot naming its own Turn is written.
    accepted = runtime.report(
        WS, "s1", "r-own", _snapshot("scoped", own, kind_value, visible=False)
    )
    assert accepted.outcome == APPLIED, accepted
    stored = {m.message_id: m for m in session_messages(host.stub).messages}
    assert stored["scoped"].turn_id == own
    runtime.close()


@pytest.mark.spec("HOST-MSG-7", "HOST-MSG-1")
def test_a_turnless_notice_is_session_scoped(
    migrated_db_url: str, live_server: Callable[..., LiveServer], engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    own = _running_turn(host, runtime)
    foreign = _second_session_turn(host, runtime)
    result = runtime.report(
        WS,
        "s1",
        "r-notice",
        _snapshot("notice-1", None, canonical_pb2.MESSAGE_KIND_NOTICE, visible=False, role=SYSTEM),
        _snapshot("notice-2", own, canonical_pb2.MESSAGE_KIND_NOTICE, visible=True, role=SYSTEM),
    )
    assert result.outcome == APPLIED, result
    stored = {m.message_id: m for m in session_messages(host.stub).messages}
    assert not stored["notice-1"].HasField("turn_id")
    assert stored["notice-1"].user_visible_assistant_response is False
    assert stored["notice-2"].turn_id == own
    assert stored["notice-2"].user_visible_assistant_response is True  # verbatim, not derived
    # A notice that names a Turn must name one of its own Session.
    before = snapshot(engine, WS, ["s1", "s2"])
    refused = runtime.report(
        WS,
        "s1",
        "r-foreign-notice",
        _snapshot("notice-3", foreign, canonical_pb2.MESSAGE_KIND_NOTICE, visible=False),
    )
    assert (refused.outcome, refused.reason) == (REJECTED, link.INVALID_MESSAGE)
    assert snapshot(engine, WS, ["s1", "s2"]) == before
    runtime.close()


@pytest.mark.spec("HOST-MSG-1")
def test_rows_stored_without_a_classification_read_back_unset(
    migrated_db_url: str, live_server: Callable[..., LiveServer], engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    legacy: dict[str, Any] = {
        "workspace_id": WS,
        "session_id": "s1",
        "turn_id": None,
        "occurred_at_unix_ms": 1_000,
        "created_at_unix_ms": 1_000,
        "updated_at_unix_ms": 1_000,
        "role": "assistant",
        "payload_json": '{"text": "from before the classification"}',
        "user_visible_assistant_response": None,
    }
    with engine.begin() as connection:
        connection.execute(
            insert(Message),
            [
                {
                    **legacy,
                    "message_id": "legacy-text",
                    "kind": "text",
                    "sequence": 1,
                    "version": 1,
                },
                {
                    **legacy,
                    "message_id": "legacy-plan",
                    "kind": "plan",
                    "sequence": 2,
                    "version": 2,
                },
            ],
        )
        connection.execute(
            update(Session)
            .where(Session.workspace_id == WS, Session.session_id == "s1")
            .values(message_version=2, next_message_sequence=3)
        )
    # Neither the assistant text nor the plan gets a derived value on the way out.
    assert _classifications(host) == {"legacy-text": None, "legacy-plan": None}
