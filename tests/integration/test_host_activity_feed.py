"""The activity feed over real gRPC: event set, delta lane, ordering, cursors (HOST-OBS, RT-2)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc
import pytest
from sqlalchemy import select

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import activity_pb2, host_pb2, runtime_pb2
from store.engine import create_sync_engine_for
from store.models import ActivityEvent
from tests.integration.host_activity import DEVICE, WS, HostUnderTest, error_reason, start_host
from tests.support.activity_watch import Watcher, kind
from tests.support.runtime_client import ScriptedRuntime, interaction, text_message, turn_patch
from tests.support.servers import LiveServer

RUNNING = canonical_pb2.TURN_PHASE_RUNNING
SETTLED = canonical_pb2.TURN_PHASE_SETTLED
COMPLETED = canonical_pb2.TURN_OUTCOME_COMPLETED

WAIT_SECONDS = 30.0
"""Upper bound of any wait for something that must happen; only a failing test reaches it."""


def _delta(
    turn_id: str,
    message_id: str,
    text: str,
    *,
    op: int = canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
    target: int = canonical_pb2.DELTA_TARGET_TEXT,
    offset: int | None = None,
    session_id: str = "s1",
) -> canonical_pb2.MessageDelta:
    delta = canonical_pb2.MessageDelta(
        workspace_id=WS,
        session_id=session_id,
        turn_id=turn_id,
        message_id=message_id,
        target=target,  # type: ignore[arg-type]
        operation=op,  # type: ignore[arg-type]
        text=text,
    )
    if offset is not None:
        delta.offset_bytes = offset
    return delta


def _send_deltas(runtime: ScriptedRuntime, *deltas: canonical_pb2.MessageDelta) -> None:
    runtime.send(
        runtime_pb2.RuntimeLinkRequest(deltas=runtime_pb2.MessageDeltaBatch(deltas=list(deltas)))
    )


def _running_turn(host: HostUnderTest, runtime: ScriptedRuntime, submit_id: str = "c1") -> str:
    turn_id = host.send("hello", submit_id).turn.turn_id
    runtime.ack(runtime.next_command().command_id)
    runtime.report(WS, "s1", f"run-{turn_id}", turn_patch(turn_id, RUNNING, occurred_at_unix_ms=1))
    return turn_id


def _tool_call(message_id: str, turn_id: str, phase: int) -> runtime_pb2.ReportItem:
    return runtime_pb2.ReportItem(
        message_snapshot=runtime_pb2.MessageSnapshot(
            message_id=message_id,
            turn_id=turn_id,
            role=canonical_pb2.MESSAGE_ROLE_ASSISTANT,
            kind=canonical_pb2.MESSAGE_KIND_TOOL_CALL,
            user_visible_assistant_response=False,
            tool_call=runtime_pb2.ToolCallSnapshot(
                call_id=message_id,
                tool_name="Bash",
                tool_kind="command",
                phase=phase,  # type: ignore[arg-type]
                input_json='{"command": "ls"}',
            ),
        )
    )


def _db_event_ids(url: str, workspace_id: str = WS) -> list[int]:
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                select(ActivityEvent.id)
                .where(ActivityEvent.workspace_id == workspace_id)
                .order_by(ActivityEvent.id)
            )
            return [int(row[0]) for row in rows]
    finally:
        engine.dispose()


@pytest.mark.spec("HOST-OBS-1", "HOST-OBS-2")
def test_every_commit_writes_the_exact_event_set_in_causal_order(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    watcher = Watcher(host.server.channel, after_event_id=0)
    ready = watcher.wait_ready()
    runtime = host.runtime()
    turn_id = _running_turn(host, runtime)
    runtime.report(WS, "s1", "r-int", interaction(turn_id, "req-1"))
    runtime.report(
        WS,
        "s1",
        "r-end",
        turn_patch(turn_id, SETTLED, outcome=COMPLETED, occurred_at_unix_ms=2),
        text_message("m1", turn_id, "hi"),
    )
    events = watcher.wait_for(
        lambda es: any(kind(e) == "turn_update" and e.turn_update.turn.phase == SETTLED for e in es)
    )
    watcher.cancel()
    kinds = [kind(e) for e in events]
    # One exact sequence: the log's ids order it, so nothing here may vary between runs.
    assert ready.head_event_id == 1
    assert kinds == [
        "session_reconcile_required",  # CreateSession (before the watch, replayed)
        "turn_update",  # SendInput: the queued Turn
        "message_update",  # and its user message
        "turn_update",  # running
        "interaction_update",  # the Interaction opens
        "interaction_update",  # the settlement supersedes the open Interaction
        "message_update",  # the final text, frozen before ...
        "turn_update",  # ... the settlement
    ]
    opened, superseded = (e.interaction_update.interaction for e in events[4:6])
    assert [opened.status, superseded.status] == [
        canonical_pb2.INTERACTION_STATUS_PENDING,
        canonical_pb2.INTERACTION_STATUS_SUPERSEDED,
    ]
    ids = [e.event_id for e in events]
    assert ids == _db_event_ids(migrated_db_url)  # the whole log, in its order, once each
    final = events[-1].turn_update
    assert final.turn.outcome == COMPLETED
    assert not final.HasField("active_turn_id")
    update = next(e.message_update for e in reversed(events) if kind(e) == "message_update")
    assert update.message_count == len(update.messages) == 1
    assert update.messages[0].message_id == "m1"
    assert update.messages[0].sequence > 0
    assert update.messages[0].version > 0
    assert update.latest_message_version == update.messages[0].version
    runtime.close()


@pytest.mark.spec("HOST-RT-2", "HOST-OBS-2")
def test_a_delta_sent_before_a_report_reaches_the_consumer_before_its_events(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    turn_id = _running_turn(host, runtime)
    watcher = Watcher(host.server.channel)
    watcher.wait_ready()
    set_op = canonical_pb2.DELTA_OPERATION_SET
    _send_deltas(runtime, _delta(turn_id, "m1", "Hel", op=set_op), _delta(turn_id, "m1", "lo"))
    runtime.report(
        WS,
        "s1",
        "r-end",
        text_message("m1", turn_id, "Hello"),
        turn_patch(turn_id, SETTLED, outcome=COMPLETED, occurred_at_unix_ms=2),
    )
    # Late: the Turn settled, so these are dropped (never after the terminal update).
    _send_deltas(runtime, _delta(turn_id, "m1", " again"))
    # A later durable message (of the settled Turn: HOST-MSG-7 allows no turnless text).
    runtime.report(WS, "s1", "r-after", text_message("other", turn_id, "x"))
    events = watcher.wait_for(lambda es: any(kind(e) == "message_update" for e in es[3:]))
    watcher.cancel()
    kinds = [kind(e) for e in events]
    assert kinds[:2] == ["message_delta", "message_delta"]
    assert [e.message_delta.delta.text for e in events[:2]] == ["Hel", "lo"]
    assert kinds[2:4] == ["message_update", "turn_update"]
    assert "message_delta" not in kinds[2:]
    runtime.close()


@pytest.mark.spec("HOST-RT-2")
def test_tool_output_needs_its_anchor_and_exact_offsets(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    turn_id = _running_turn(host, runtime)
    watcher = Watcher(host.server.channel)
    watcher.wait_ready()
    out = canonical_pb2.DELTA_TARGET_TOOL_OUTPUT
    set_op = canonical_pb2.DELTA_OPERATION_SET
    # No anchor yet: dropped, and the Session must reconcile (never a guessed row).
    _send_deltas(runtime, _delta(turn_id, "call-1", "early", op=set_op, target=out))
    runtime.report(WS, "s1", "r-call", _tool_call("call-1", turn_id, 1))
    _send_deltas(
        runtime,
        _delta(turn_id, "call-1", "é", op=set_op, target=out),
        _delta(turn_id, "call-1", "x", target=out, offset=2),
        _delta(turn_id, "call-1", "bad", target=out, offset=1),  # mismatch
        _delta(turn_id, "call-1", "y", target=out, offset=3),  # anchor broken until a set
    )
    runtime.report(WS, "s1", "r-done", _tool_call("call-1", turn_id, 2))
    _send_deltas(runtime, _delta(turn_id, "call-1", "late", op=set_op, target=out))
    events = watcher.wait_for(
        lambda es: (
            sum(kind(e) == "session_reconcile_required" for e in es) >= 2
            and sum(kind(e) == "message_update" for e in es) >= 2
        )
    )
    watcher.cancel()
    deltas = [e.message_delta.delta for e in events if kind(e) == "message_delta"]
    assert [(d.text, d.offset_bytes if d.HasField("offset_bytes") else None) for d in deltas] == [
        ("é", None),
        ("x", 2),
    ]
    kinds = [kind(e) for e in events]
    assert kinds[0] == "session_reconcile_required"  # the unanchored output
    assert kinds.index("message_delta") > kinds.index("message_update")  # anchor first
    runtime.close()


@pytest.mark.spec("HOST-RT-2")
def test_deltas_must_name_a_persisted_turn(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    turn_id = _running_turn(host, runtime)
    watcher = Watcher(host.server.channel)
    watcher.wait_ready()
    _send_deltas(runtime, _delta("no-such-turn", "m1", "x"), _delta(turn_id, "m1", "ok"))
    events = watcher.wait_for(lambda es: len(es) >= 1)
    watcher.cancel()
    assert [e.message_delta.delta.text for e in events] == ["ok"]
    runtime.close()


def _at_least(count: int) -> Callable[[list[activity_pb2.ActivityEvent]], bool]:
    return lambda events: len(events) >= count


def _rename_forever(host: HostUnderTest, stop: threading.Event, tag: str, count: int) -> None:
    for index in range(count):
        if stop.is_set():
            return
        host.stub.RenameSession(
            host_pb2.RenameSessionRequest(workspace_id=WS, session_id="s1", title=f"{tag}-{index}"),
            metadata=DEVICE,
            timeout=WAIT_SECONDS,
        )


@pytest.mark.spec("HOST-OBS-2", "HOST-OBS-1")
def test_catch_up_to_live_is_exactly_once_with_concurrent_writers(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    for round_number in range(3):
        stop = threading.Event()
        writers = [
            threading.Thread(target=_rename_forever, args=(host, stop, f"{round_number}-{n}", 25))
            for n in range(3)
        ]
        for writer in writers:
            writer.start()
        watchers = []
        for cursor in (0, None, 0):
            watchers.append(Watcher(host.server.channel, after_event_id=cursor))
        for writer in writers:
            writer.join(timeout=WAIT_SECONDS * 25)  # each RPC is bounded by WAIT_SECONDS
            assert not writer.is_alive(), f"round {round_number}: a writer hangs"
        expected = _db_event_ids(migrated_db_url)
        for watcher in watchers:
            ready = watcher.wait_ready()
            start = 0 if watcher is not watchers[1] else ready.head_event_id
            want = [i for i in expected if i > start]
            got = watcher.wait_for(_at_least(len(want)))
            watcher.cancel()
            ids = [e.event_id for e in got]
            assert ids == want, f"round {round_number}: duplicates or gaps"


@pytest.mark.spec("HOST-OBS-2")
def test_a_cursor_outside_the_retained_log_is_out_of_range(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(
        live_server,
        migrated_db_url,
        activity_event_max_rows=2,
        activity_event_prune_interval_seconds=0.05,
    )
    for index in range(5):
        host.stub.RenameSession(
            host_pb2.RenameSessionRequest(workspace_id=WS, session_id="s1", title=f"t{index}"),
            metadata=DEVICE,
        )
    deadline = time.monotonic() + WAIT_SECONDS
    while len(retained := _db_event_ids(migrated_db_url)) > 2:
        assert time.monotonic() < deadline, f"the log was never pruned to 2 rows: {retained}"
        time.sleep(0.05)
    for cursor in (0, retained[-1] + 100):
        watcher = Watcher(host.server.channel, after_event_id=cursor)
        watcher.wait_done()
        assert watcher.error is not None
        assert watcher.error.code() == grpc.StatusCode.OUT_OF_RANGE
        assert error_reason(watcher.error) == "EVENT_CURSOR_EXPIRED"
    ok = Watcher(host.server.channel, after_event_id=retained[0] - 1)
    assert ok.wait_ready().oldest_retained_event_id == retained[0]
    got = ok.wait_for(lambda es: len(es) >= 2)
    ok.cancel()
    assert [e.event_id for e in got] == retained


@pytest.mark.spec("HOST-OBS-2", "SEC-1")
def test_watch_requires_a_service_principal_of_the_workspace(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    watcher = Watcher(host.server.channel, principal="ws1-device")
    watcher.wait_done()
    assert watcher.error is not None
    assert watcher.error.code() == grpc.StatusCode.PERMISSION_DENIED


def test_event_payloads_carry_no_row_ids_or_patches() -> None:
    names = {field.name for field in activity_pb2.ActivityEvent.DESCRIPTOR.fields}
    assert "state_patch" not in names
    assert "row_id" not in names
