"""A root Turn settles only once no child Turn is still active (HOST-TURN-6), both backends.

A scripted runtime starts a child Session whose Turn works for the root Turn, then reports
the root's terminal patch: Host records it (outcome and frozen result) but keeps the root
active until the child settles.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, runtime_pb2
from tests.integration.host_activity import DEVICE, WS, HostUnderTest, error_reason, start_host
from tests.support.runtime_client import ScriptedRuntime, text_message, turn_patch
from tests.support.servers import LiveServer

RUNNING = canonical_pb2.TURN_PHASE_RUNNING
SETTLED = canonical_pb2.TURN_PHASE_SETTLED
COMPLETED = canonical_pb2.TURN_OUTCOME_COMPLETED
APPLIED = runtime_pb2.REPORT_OUTCOME_APPLIED


def _turn(host: HostUnderTest, session_id: str, turn_id: str) -> canonical_pb2.Turn:
    turns = host.stub.ListSessionTurns(
        host_pb2.ListSessionTurnsRequest(workspace_id=WS, session_id=session_id),
        metadata=DEVICE,
    ).turns
    found: canonical_pb2.Turn = next(t for t in turns if t.turn_id == turn_id)
    return found


def _start_child(runtime: ScriptedRuntime, root_turn_id: str, child_turn_id: str) -> None:
    """The runtime reports a subagent: child Session ``child-1`` and its running Turn."""
    result = runtime.report(
        WS,
        "child-1",
        f"start-{child_turn_id}",
        runtime_pb2.ReportItem(
            session_patch=runtime_pb2.SessionPatch(
                parent_session_id="s1", parent_turn_id=root_turn_id, title="subagent"
            )
        ),
        turn_patch(
            child_turn_id,
            RUNNING,
            origin=canonical_pb2.TURN_ORIGIN_SUBAGENT,
            root_turn_id=root_turn_id,
        ),
    )
    assert result.outcome == APPLIED, result


def _root_with_active_child(host: HostUnderTest) -> tuple[ScriptedRuntime, str]:
    runtime = host.runtime()
    root = host.send("hello", "c1").turn.turn_id
    runtime.ack(runtime.next_command().command_id)
    runtime.report(WS, "s1", "r0", turn_patch(root, RUNNING))
    _start_child(runtime, root, "child-turn-1")
    # Provider order: the root's answer, then its terminal patch, while the child runs.
    reported = runtime.report(
        WS,
        "s1",
        "r1",
        text_message("answer", root, "the answer"),
        turn_patch(root, SETTLED, outcome=COMPLETED),
    )
    assert reported.outcome == APPLIED
    return runtime, root


@pytest.mark.spec("HOST-TURN-6", "HOST-RT-3")
def test_a_root_turn_settles_only_after_its_last_child(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, root = _root_with_active_child(host)

    deferred = _turn(host, "s1", root)
    assert deferred.phase == RUNNING  # recorded, not settled: a child is still active
    assert not deferred.HasField("settled_at_unix_ms")
    session = host.stub.GetSession(
        host_pb2.GetSessionRequest(workspace_id=WS, session_id="s1"), metadata=DEVICE
    )
    assert session.session.active_turn_id == root
    assert [child.session_id for child in session.children] == ["child-1"]
    # The Session is still busy: a new Turn is refused and nothing is written.
    with pytest.raises(grpc.RpcError) as caught:
        host.send("next", "c2")
    assert error_reason(caught.value) == "TURN_ACTIVE"
    # A repeated terminal patch is a replay; a later root message cannot become the result.
    replay = runtime.report(WS, "s1", "r2", turn_patch(root, SETTLED, outcome=COMPLETED))
    assert replay.outcome == runtime_pb2.REPORT_OUTCOME_ALREADY_APPLIED
    runtime.report(WS, "s1", "r3", text_message("late", root, "too late"))

    # The last child settles: the root settles in the same transaction, as reported.
    done = runtime.report(
        WS, "child-1", "r4", turn_patch("child-turn-1", SETTLED, outcome=COMPLETED)
    )
    assert done.outcome == APPLIED
    settled = _turn(host, "s1", root)
    assert settled.phase == SETTLED
    assert settled.outcome == COMPLETED
    assert settled.result_message_id == "answer"
    assert settled.version > deferred.version
    assert _turn(host, "child-1", "child-turn-1").outcome == COMPLETED
    after = host.stub.GetSession(
        host_pb2.GetSessionRequest(workspace_id=WS, session_id="s1"), metadata=DEVICE
    )
    assert not after.session.HasField("active_turn_id")
    assert host.send("next", "c2").turn.phase == canonical_pb2.TURN_PHASE_QUEUED
    runtime.close()


@pytest.mark.spec("HOST-TURN-6", "HOST-TURN-4")
def test_stop_turn_cancels_the_children_then_the_deferred_root(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, root = _root_with_active_child(host)
    stopped = host.stub.StopTurn(
        host_pb2.StopTurnRequest(workspace_id=WS, session_id="s1", turn_id=root),
        metadata=DEVICE,
    )
    assert not stopped.already_settled
    assert stopped.turn.outcome == canonical_pb2.TURN_OUTCOME_CANCELED
    # The result frozen when the runtime reported the root's end is kept.
    assert stopped.turn.result_message_id == "answer"
    child = _turn(host, "child-1", "child-turn-1")
    assert child.outcome == canonical_pb2.TURN_OUTCOME_CANCELED
    assert child.settled_at_unix_ms <= stopped.turn.settled_at_unix_ms
    stops = {runtime.next_command().stop_turn.turn_id for _ in range(2)}
    assert stops == {root, "child-turn-1"}
    runtime.close()


@pytest.mark.spec("HOST-TURN-6", "HOST-TURN-4")
def test_stopping_the_last_child_releases_the_deferred_root(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, root = _root_with_active_child(host)
    host.stub.StopTurn(
        host_pb2.StopTurnRequest(workspace_id=WS, session_id="child-1", turn_id="child-turn-1"),
        metadata=DEVICE,
    )
    settled = _turn(host, "s1", root)
    assert settled.phase == SETTLED
    assert settled.outcome == COMPLETED  # the outcome the runtime reported for the root
    assert settled.result_message_id == "answer"
    runtime.close()


@pytest.mark.spec("HOST-TURN-6")
def test_a_root_turn_without_children_settles_at_once(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    root = host.send("hello", "c1").turn.turn_id
    _start_child(runtime, root, "child-turn-1")
    runtime.report(WS, "child-1", "r1", turn_patch("child-turn-1", SETTLED, outcome=COMPLETED))
    result = runtime.report(WS, "s1", "r2", turn_patch(root, SETTLED, outcome=COMPLETED))
    assert result.outcome == APPLIED
    settled = _turn(host, "s1", root)
    assert settled.phase == SETTLED
    assert settled.result_resolved_empty
    runtime.close()
