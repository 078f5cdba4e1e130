"""Tombstones are frozen on the runtime link, and fenced ids stay fenced (HOST-DEL-3/-11).

A scripted runtime reports over a real socket, on SQLite and Postgres, about a tombstoned
Session (every kind of report item) and about a purged id whose resource cleanup is still
pending. Every such report is ``REPORT_OUTCOME_REJECTED`` with a typed reason, every item
is rejected, the stored rows of those Sessions are byte-for-byte unchanged, and the link
stays up. A constraint the store enforces, if a report ever reaches it, is a rejected
report as well, never ``INTERNAL`` (SEC-4).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, runtime_pb2
from services.host.runtime import link
from services.host.turns import messages
from store.engine import create_sync_engine_for
from tests.integration.host_activity import DEVICE, TARGET_ID, WS, HostUnderTest, start_host
from tests.support.host_sessions import error_of
from tests.support.runtime_client import ScriptedRuntime, interaction, text_message, turn_patch
from tests.support.servers import LiveServer, auth_metadata
from tests.support.store_snapshot import session_ids, snapshot

ADMIN = auth_metadata("admin")
QUEUED = canonical_pb2.TURN_PHASE_QUEUED
RUNNING = canonical_pb2.TURN_PHASE_RUNNING
SETTLED = canonical_pb2.TURN_PHASE_SETTLED
COMPLETED = canonical_pb2.TURN_OUTCOME_COMPLETED
USER = canonical_pb2.TURN_ORIGIN_USER
SUBAGENT = canonical_pb2.TURN_ORIGIN_SUBAGENT
APPLIED = runtime_pb2.REPORT_OUTCOME_APPLIED
REJECTED = runtime_pb2.REPORT_OUTCOME_REJECTED


@pytest.fixture
def engine(migrated_db_url: str) -> Iterator[Engine]:
    engine = create_sync_engine_for(migrated_db_url)
    yield engine
    engine.dispose()


def session_patch(**fields: object) -> runtime_pb2.ReportItem:
    """A ``session_patch`` item."""
    return runtime_pb2.ReportItem(session_patch=runtime_pb2.SessionPatch(**fields))  # type: ignore[arg-type]


def _every_kind_of_item(
    turn_id: str, operation_id: str, command_id: str
) -> list[tuple[str, list[runtime_pb2.ReportItem]]]:
    """Reports that each would change a live Session; named for the failure message."""
    usage = canonical_pb2.SessionUsage(input_tokens=5, output_tokens=7)
    return [
        ("title", [session_patch(title="rewritten")]),
        (
            "session fields",
            [
                session_patch(
                    agent_target_id=TARGET_ID,
                    cwd="/elsewhere",
                    usage=usage,
                    provider_session_ref="provider-2",
                    runtime_context_json='{"k": 1}',
                )
            ],
        ),
        ("running Turn", [turn_patch("t-running", RUNNING, origin=USER)]),
        ("queued Turn", [turn_patch("t-queued", QUEUED, origin=USER)]),
        (
            "settled new Turn",
            [turn_patch("t-settled", SETTLED, outcome=COMPLETED, origin=USER)],
        ),
        ("settle the interrupted Turn", [turn_patch(turn_id, SETTLED, outcome=COMPLETED)]),
        ("revive the interrupted Turn", [turn_patch(turn_id, RUNNING)]),
        ("new message", [text_message("m-new", turn_id, "late")]),
        ("changed message", [text_message("m1", turn_id, "changed")]),
        ("session message", [_session_message("m-session")]),
        ("new Interaction", [interaction(turn_id, "q-new")]),
        (
            "supersede Interaction",
            [interaction(turn_id, "q1", canonical_pb2.INTERACTION_STATUS_SUPERSEDED)],
        ),
        (
            "disposition",
            [
                runtime_pb2.ReportItem(
                    interaction_disposition=runtime_pb2.InteractionResponseDisposition(
                        operation_id=operation_id,
                        command_id=command_id,
                        turn_id=turn_id,
                        request_id="q1",
                        disposition=canonical_pb2.INTERACTION_STATUS_ANSWERED,
                    )
                )
            ],
        ),
        (
            "session lost",
            [runtime_pb2.ReportItem(session_lost=runtime_pb2.RuntimeSessionLost(reason="x"))],
        ),
        (
            "a whole batch",
            [
                session_patch(title="batch"),
                turn_patch("t-batch", RUNNING, origin=USER),
                text_message("m-batch", "t-batch", "text"),
                turn_patch("t-batch", SETTLED, outcome=COMPLETED),
            ],
        ),
        ("nothing", []),
    ]


def _session_message(message_id: str) -> runtime_pb2.ReportItem:
    return runtime_pb2.ReportItem(
        message_snapshot=runtime_pb2.MessageSnapshot(
            message_id=message_id,
            role=canonical_pb2.MESSAGE_ROLE_SYSTEM,
            kind=canonical_pb2.MESSAGE_KIND_NOTICE,
            payload_json='{"text": "note"}',
            user_visible_assistant_response=False,
        )
    )


def _assert_rejected_whole(
    result: runtime_pb2.ReportResult, reason: str, items: int, label: str
) -> None:
    assert result.outcome == REJECTED, (label, result)
    assert result.reason == reason, (label, result)
    assert [r.index for r in result.item_results] == list(range(items)), (label, result)
    assert all(r.outcome == REJECTED for r in result.item_results), (label, result)


def _active_tree(host: HostUnderTest, runtime: ScriptedRuntime) -> tuple[str, str, str]:
    """``s1`` with a running Turn, a message, a pending Interaction with a delivered
    response, and a child ``c1`` with a running Turn. Returns (turn, operation, command)."""
    turn = host.send("hello", "c1").turn.turn_id
    runtime.ack(runtime.next_command().command_id)
    first = runtime.report(
        WS,
        "s1",
        "r-start",
        turn_patch(turn, RUNNING),
        text_message("m1", turn, "thinking"),
        interaction(turn, "q1"),
    )
    assert first.outcome == APPLIED, first
    child = runtime.report(
        WS,
        "c1",
        "r-child",
        session_patch(parent_session_id="s1", parent_turn_id=turn, title="child"),
        turn_patch("ct1", RUNNING, origin=SUBAGENT, root_turn_id=turn),
    )
    assert child.outcome == APPLIED, child
    operation = host.stub.SubmitInteractionResponse(
        host_pb2.SubmitInteractionResponseRequest(
            workspace_id=WS,
            session_id="s1",
            turn_id=turn,
            request_id="q1",
            action="allow",
            idempotency_key="k1",
        ),
        metadata=DEVICE,
    ).operation
    deliver = runtime.next_command()
    assert deliver.WhichOneof("command") == "deliver_interaction_response"
    return turn, operation.operation_id, deliver.command_id


def _delete(host: HostUnderTest, *ids: str) -> None:
    host.stub.DeleteSessions(
        host_pb2.DeleteSessionsRequest(workspace_id=WS, session_ids=list(ids)), metadata=DEVICE
    )


def _drain_commands(runtime: ScriptedRuntime) -> None:
    """Acknowledge whatever Host sent (the delete's interrupts and releases)."""
    while not runtime.commands.empty():
        runtime.ack(runtime.next_command().command_id)


@pytest.mark.spec("HOST-DEL-3", "HOST-DEL-2", "HOST-RT-1", "SEC-4")
def test_every_report_item_for_a_tombstone_is_rejected_and_changes_nothing(
    migrated_db_url: str, live_server: Callable[..., LiveServer], engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    turn, operation, command = _active_tree(host, runtime)
    _delete(host, "s1")
    expected = {
        (kind, sid) for kind in ("interrupt_turn", "release_session") for sid in ("s1", "c1")
    }
    seen: set[tuple[str | None, str]] = set()
    while not expected <= seen:  # the delete's commands were dispatched in its transaction
        command_frame = runtime.next_command()
        seen.add((command_frame.WhichOneof("command"), command_frame.session_id))
    before = snapshot(engine, WS, ["s1", "c1"])
    sent = 0
    for session_id in ("s1", "c1"):
        for label, items in _every_kind_of_item(turn, operation, command):
            sent += 1
            result = runtime.report(WS, session_id, f"r-{sent}", *items)
            _assert_rejected_whole(
                result, link.SESSION_DELETED, len(items), f"{session_id}: {label}"
            )
    # The ScriptedRuntime is still linked: a tombstone's reports never end the link.
    assert runtime.error is None
    assert snapshot(engine, WS, ["s1", "c1"]) == before
    # The tombstone was frozen, not lost: once restored it takes reports again.
    host.stub.RestoreDeletedSession(
        host_pb2.RestoreDeletedSessionRequest(workspace_id=WS, session_id="s1"), metadata=DEVICE
    )
    _drain_commands(runtime)
    restored = runtime.report(WS, "s1", "r-after-restore", session_patch(title="back"))
    assert restored.outcome == APPLIED, restored
    runtime.close()


@pytest.mark.spec("HOST-DEL-11", "HOST-DEL-10", "HOST-CLEAN-1", "HOST-RT-3")
def test_a_report_never_recreates_a_purged_id_while_its_cleanup_is_pending(
    migrated_db_url: str, live_server: Callable[..., LiveServer], engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    _active_tree(host, runtime)
    host.stub.CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id=WS, agent_target_id=TARGET_ID, session_id="live", cwd="/w"
        ),
        metadata=DEVICE,
    )
    _delete(host, "s1")
    purged = host.stub.PurgeWorkspaceTombstones(
        host_pb2.PurgeWorkspaceTombstonesRequest(workspace_id=WS), metadata=ADMIN
    )
    assert sorted(purged.purged_session_ids) == ["c1", "s1"]
    _drain_commands(runtime)
    before = snapshot(engine, WS, ["s1", "c1", "live"])
    creations = [
        [session_patch(parent_session_id="live", title="resurrected")],
        [
            session_patch(parent_session_id="live"),
            turn_patch("t-x", RUNNING, origin=SUBAGENT),
        ],
        [turn_patch("t-y", SETTLED, outcome=COMPLETED, origin=USER)],
        [session_patch(title="no parent")],
    ]
    for session_id in ("s1", "c1"):
        for number, items in enumerate(creations):
            result = runtime.report(WS, session_id, f"r-{session_id}-{number}", *items)
            _assert_rejected_whole(result, link.SESSION_PURGED, len(items), session_id)
    assert runtime.error is None
    assert snapshot(engine, WS, ["s1", "c1", "live"]) == before
    assert session_ids(engine, WS) == {"live"}
    # CreateSession refuses the same ids, in this workspace and in any other.
    for workspace_id in (WS, "ws-2"):
        request = host_pb2.CreateSessionRequest(
            workspace_id=workspace_id, agent_target_id=TARGET_ID, session_id="c1", cwd="/w"
        )
        code, reason, _, _ = error_of(
            functools.partial(host.stub.CreateSession, request, metadata=ADMIN)
        )
        assert (code.name, reason) == ("FAILED_PRECONDITION", "RESOURCE_CLEANUP_PENDING")
    # A report in another workspace is fenced the same way (the fence is per id).
    elsewhere = runtime.report(
        "ws-2", "c1", "r-ws2", session_patch(parent_session_id="live", title="x")
    )
    assert elsewhere.reason == link.SESSION_PURGED
    # Completing the cleanup lifts the fence: the runtime may now create the child.
    host.stub.CompleteResourceCleanup(
        host_pb2.CompleteResourceCleanupRequest(workspace_id=WS, session_id="c1"), metadata=ADMIN
    )
    created = runtime.report(
        WS, "c1", "r-after-cleanup", session_patch(parent_session_id="live", title="new")
    )
    assert created.outcome == APPLIED, created
    assert session_ids(engine, WS) == {"live", "c1"}
    runtime.close()


@pytest.mark.spec("SEC-4", "HOST-RT-1", "HOST-INT-2")
def test_a_store_constraint_violation_rejects_the_report_instead_of_ending_the_link(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    turn = host.send("hello", "c1").turn.turn_id
    runtime.ack(runtime.next_command().command_id)
    assert runtime.report(WS, "s1", "r0", turn_patch(turn, RUNNING)).outcome == APPLIED
    write_snapshot = messages.write_snapshot

    async def corrupting(repos, session, **fields):  # type: ignore[no-untyped-def]
        written = await write_snapshot(repos, session, **fields)
        if fields["message_id"] == "bad":
            # A write the store refuses (ck_sessions_message_cursors): stands in for any
            # rule a report might break that only the database enforces.
            session.message_version = -1
        return written

    monkeypatch.setattr(messages, "write_snapshot", corrupting)
    before = snapshot(engine, WS, ["s1"])
    result = runtime.report(
        WS,
        "s1",
        "r-bad",
        text_message("fine", turn, "kept out too"),
        text_message("bad", turn, "breaks a constraint"),
    )
    assert result.outcome == REJECTED, result
    assert result.reason == "STORE_CONSTRAINT_VIOLATION"
    assert [r.index for r in result.item_results] == [1]
    assert "message_cursors" in result.item_results[0].message
    assert snapshot(engine, WS, ["s1"]) == before  # the whole report rolled back
    assert runtime.error is None
    after = runtime.report(WS, "s1", "r-next", text_message("next", turn, "fine"))
    assert after.outcome == APPLIED, after
    runtime.close()
