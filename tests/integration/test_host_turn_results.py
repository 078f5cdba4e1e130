"""GetTurnResult (HOST-TURN-7) and Turn file-change snapshots (HOST-TURN-8) on both backends.

Turns are driven through a scripted runtime over the real ``RuntimeLink``; the legacy Turns of
the fallback (settled before resolution metadata existed) are seeded directly in the store,
because no code path of this build writes one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.engine import Engine

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, runtime_pb2
from store.models import Message, Turn
from tests.integration.host_activity import DEVICE, WS, HostUnderTest, error_reason, start_host
from tests.support.activity_watch import Watcher, kind
from tests.support.runtime_client import ScriptedRuntime, turn_patch
from tests.support.servers import LiveServer

RUNNING = canonical_pb2.TURN_PHASE_RUNNING
SETTLED = canonical_pb2.TURN_PHASE_SETTLED
COMPLETED = canonical_pb2.TURN_OUTCOME_COMPLETED
APPLIED = runtime_pb2.REPORT_OUTCOME_APPLIED
REJECTED = runtime_pb2.REPORT_OUTCOME_REJECTED
CREATED = canonical_pb2.FILE_CHANGE_KIND_CREATED
MODIFIED = canonical_pb2.FILE_CHANGE_KIND_MODIFIED
DELETED = canonical_pb2.FILE_CHANGE_KIND_DELETED
RENAMED = canonical_pb2.FILE_CHANGE_KIND_RENAMED


def assistant_text(message_id: str, turn_id: str, text: str) -> runtime_pb2.ReportItem:
    """An assistant text snapshot, classified by its producer (HOST-MSG-1)."""
    return runtime_pb2.ReportItem(
        message_snapshot=runtime_pb2.MessageSnapshot(
            message_id=message_id,
            turn_id=turn_id,
            role=canonical_pb2.MESSAGE_ROLE_ASSISTANT,
            kind=canonical_pb2.MESSAGE_KIND_TEXT,
            payload_json=json.dumps({"text": text}),
            user_visible_assistant_response=True,
        )
    )


def change(path: str, kind: int, previous_path: str | None = None) -> canonical_pb2.FileChange:
    entry = canonical_pb2.FileChange(path=path, change=kind)  # type: ignore[arg-type]
    if previous_path is not None:
        entry.previous_path = previous_path
    return entry


def files(*entries: canonical_pb2.FileChange) -> canonical_pb2.FileChangeSet:
    return canonical_pb2.FileChangeSet(changes=list(entries))


def snapshot(turn: canonical_pb2.Turn) -> list[tuple[str, int, str | None]]:
    return [
        (e.path, e.change, e.previous_path if e.HasField("previous_path") else None)
        for e in turn.file_changes
    ]


def started(host: HostUnderTest, submit_id: str = "c1") -> tuple[ScriptedRuntime, str]:
    runtime = host.runtime()
    turn_id = host.send("hello", submit_id).turn.turn_id
    runtime.next_command()
    return runtime, turn_id


def result(
    host: HostUnderTest, turn_id: str, session_id: str = "s1"
) -> host_pb2.GetTurnResultResponse:
    response: host_pb2.GetTurnResultResponse = host.stub.GetTurnResult(
        host_pb2.GetTurnResultRequest(workspace_id=WS, session_id=session_id, turn_id=turn_id),
        metadata=DEVICE,
    )
    return response


def latest_turn(host: HostUnderTest) -> canonical_pb2.Turn:
    detail = host.stub.GetSession(
        host_pb2.GetSessionRequest(workspace_id=WS, session_id="s1"), metadata=DEVICE
    )
    return detail.latest_turn


def listed_turn(host: HostUnderTest, turn_id: str) -> canonical_pb2.Turn:
    page = host.stub.ListSessionTurns(
        host_pb2.ListSessionTurnsRequest(workspace_id=WS, session_id="s1"), metadata=DEVICE
    )
    (turn,) = [t for t in page.turns if t.turn_id == turn_id]
    return turn


# ------------------------------------------------------------------------ HOST-TURN-7


@pytest.mark.spec("HOST-TURN-7", "HOST-TURN-6")
def test_result_is_exactly_the_frozen_message_even_after_later_assistant_text(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, turn_id = started(host)
    settled = runtime.report(
        WS,
        "s1",
        "r1",
        turn_patch(turn_id, RUNNING),
        assistant_text("m1", turn_id, "the answer"),
        turn_patch(turn_id, SETTLED, outcome=COMPLETED),
    )
    assert settled.outcome == APPLIED
    late = runtime.report(WS, "s1", "r2", assistant_text("m2", turn_id, "said after settling"))
    assert late.outcome == APPLIED

    frozen = result(host, turn_id)
    assert frozen.turn.turn_id == turn_id
    assert frozen.turn.phase == SETTLED
    assert frozen.HasField("message")
    assert frozen.message.message_id == "m1"
    assert json.loads(frozen.message.payload_json)["text"] == "the answer"
    assert not frozen.resolved_empty
    assert not frozen.legacy_fallback
    runtime.close()


@pytest.mark.spec("HOST-TURN-7")
def test_a_resolved_empty_turn_has_no_message_even_after_later_assistant_text(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, turn_id = started(host)
    runtime.report(WS, "s1", "r1", turn_patch(turn_id, SETTLED, outcome=COMPLETED))
    assert runtime.report(WS, "s1", "r2", assistant_text("m2", turn_id, "late")).outcome == APPLIED

    empty = result(host, turn_id)
    assert empty.resolved_empty
    assert not empty.HasField("message")
    assert not empty.legacy_fallback
    assert empty.turn.result_resolved_empty
    runtime.close()


@pytest.mark.spec("HOST-TURN-7")
def test_active_turn_is_not_settled_and_unknown_turn_is_not_found(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, turn_id = started(host)
    with pytest.raises(grpc.RpcError) as active:
        result(host, turn_id)
    assert active.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(active.value) == "TURN_NOT_SETTLED"
    runtime.report(WS, "s1", "r1", turn_patch(turn_id, RUNNING))
    with pytest.raises(grpc.RpcError) as running:
        result(host, turn_id)
    assert error_reason(running.value) == "TURN_NOT_SETTLED"

    for session_id, unknown in (("s1", "turn-nope"), ("no-such-session", turn_id)):
        with pytest.raises(grpc.RpcError) as missing:
            result(host, unknown, session_id=session_id)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert error_reason(missing.value) == "TURN_NOT_FOUND"
    with pytest.raises(grpc.RpcError) as blank:
        result(host, "")
    assert blank.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    runtime.close()


def _seed_legacy_turn(
    engine: Engine, turn_id: str, first_sequence: int, kinds: list[tuple[str, str]]
) -> list[str]:
    """A Turn settled without resolution metadata, and its messages (role, kind) in order."""
    ids = []
    with engine.begin() as connection:
        connection.execute(
            insert(Turn).values(
                workspace_id=WS,
                session_id="s1",
                turn_id=turn_id,
                phase="settled",
                outcome="completed",
                origin="user",
                version=3,
                created_at_unix_ms=1_000,
                updated_at_unix_ms=2_000,
                started_at_unix_ms=1_000,
                settled_at_unix_ms=2_000,
                result_message_id=None,
                result_resolved_empty=False,
            )
        )
        rows = []
        for offset, (role, kind) in enumerate(kinds):
            sequence = first_sequence + offset
            message_id = f"{turn_id}-m{sequence}"
            ids.append(message_id)
            rows.append(
                {
                    "workspace_id": WS,
                    "session_id": "s1",
                    "message_id": message_id,
                    "sequence": sequence,
                    "version": sequence,
                    "turn_id": turn_id,
                    "occurred_at_unix_ms": 1_000 + sequence,
                    "created_at_unix_ms": 1_000 + sequence,
                    "updated_at_unix_ms": 1_000 + sequence,
                    "role": role,
                    "kind": kind,
                    "payload_json": json.dumps({"text": f"message {sequence}"}),
                    "user_visible_assistant_response": None,
                }
            )
        connection.execute(insert(Message), rows)
    return ids


@pytest.mark.spec("HOST-TURN-7")
def test_legacy_turn_gets_the_latest_assistant_text_among_its_newest_200_messages(
    migrated_db_url: str, live_server: Callable[..., LiveServer], sync_engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    # 260 messages: assistant text at positions 0 (outside the newest 200) and 150, and
    # assistant reasoning after it (not text, so not a result).
    kinds = [("user", "text")] * 260
    kinds[0] = ("assistant", "text")
    kinds[150] = ("assistant", "text")
    kinds[200] = ("assistant", "reasoning")
    ids = _seed_legacy_turn(sync_engine, "legacy-1", 1, kinds)
    found = result(host, "legacy-1")
    assert found.legacy_fallback
    assert not found.resolved_empty
    assert found.message.message_id == ids[150]

    # The only assistant text is older than the newest 200 messages: the bounded scan
    # does not reach it.
    kinds = [("assistant", "text")] + [("assistant", "tool_call")] * 200
    _seed_legacy_turn(sync_engine, "legacy-2", 1_000, kinds)
    beyond = result(host, "legacy-2")
    assert beyond.legacy_fallback
    assert not beyond.HasField("message")
    assert not beyond.resolved_empty

    # One message fewer and it is inside the window.
    kinds = [("assistant", "text")] + [("assistant", "tool_call")] * 199
    inside_ids = _seed_legacy_turn(sync_engine, "legacy-3", 2_000, kinds)
    inside = result(host, "legacy-3")
    assert inside.legacy_fallback
    assert inside.message.message_id == inside_ids[0]


@pytest.mark.spec("HOST-TURN-7")
def test_a_turn_with_resolution_metadata_never_takes_the_fallback(
    migrated_db_url: str, live_server: Callable[..., LiveServer], sync_engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    ids = _seed_legacy_turn(sync_engine, "meta", 1, [("assistant", "text"), ("assistant", "text")])
    with sync_engine.begin() as connection:
        connection.execute(
            update(Turn).where(Turn.turn_id == "meta").values(result_message_id=ids[0])
        )
    frozen = result(host, "meta")
    assert frozen.message.message_id == ids[0]
    assert not frozen.legacy_fallback


# ------------------------------------------------------------------------ HOST-TURN-8


@pytest.mark.spec("HOST-TURN-8", "HOST-TURN-6")
def test_file_changes_replace_until_settled_and_are_frozen_after(
    migrated_db_url: str, live_server: Callable[..., LiveServer], sync_engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, turn_id = started(host)
    first = files(change("src/a.py", CREATED))
    assert (
        runtime.report(WS, "s1", "r1", turn_patch(turn_id, RUNNING, file_changes=first)).outcome
        == APPLIED
    )
    assert snapshot(latest_turn(host)) == [("src/a.py", CREATED, None)]

    second = files(change("src/a.py", MODIFIED), change("docs/new.md", RENAMED, "docs/old.md"))
    before = latest_turn(host).version
    # Same phase, new snapshot: the patch applies and the Turn's version moves.
    assert (
        runtime.report(WS, "s1", "r2", turn_patch(turn_id, RUNNING, file_changes=second)).outcome
        == APPLIED
    )
    assert latest_turn(host).version > before
    expected = [("src/a.py", MODIFIED, None), ("docs/new.md", RENAMED, "docs/old.md")]
    assert snapshot(latest_turn(host)) == expected

    # A patch without file_changes leaves the stored snapshot.
    awaiting = canonical_pb2.TURN_PHASE_AWAITING_INTERACTION
    runtime.report(WS, "s1", "r3", turn_patch(turn_id, awaiting))
    assert snapshot(latest_turn(host)) == expected

    final = files(change("src/a.py", DELETED))
    runtime.report(
        WS, "s1", "r4", turn_patch(turn_id, SETTLED, outcome=COMPLETED, file_changes=final)
    )
    settled = latest_turn(host)
    assert settled.phase == SETTLED
    assert snapshot(settled) == [("src/a.py", DELETED, None)]
    assert snapshot(listed_turn(host, turn_id)) == [("src/a.py", DELETED, None)]
    assert snapshot(result(host, turn_id).turn) == [("src/a.py", DELETED, None)]

    # Frozen: a later patch with another snapshot changes nothing.
    later = files(change("src/b.py", CREATED))
    runtime.report(
        WS, "s1", "r5", turn_patch(turn_id, SETTLED, outcome=COMPLETED, file_changes=later)
    )
    runtime.report(WS, "s1", "r6", turn_patch(turn_id, RUNNING, file_changes=later))
    frozen = latest_turn(host)
    assert snapshot(frozen) == [("src/a.py", DELETED, None)]
    assert frozen.version == settled.version
    with sync_engine.connect() as connection:
        stored = connection.execute(
            select(Turn.file_changes_json).where(Turn.turn_id == turn_id)
        ).scalar_one()
    assert stored is not None
    assert json.loads(stored) == [{"path": "src/a.py", "change": "deleted"}]
    runtime.close()


@pytest.mark.spec("HOST-TURN-8")
def test_a_turn_settled_without_a_snapshot_has_an_empty_list(
    migrated_db_url: str, live_server: Callable[..., LiveServer], sync_engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, turn_id = started(host)
    # Tool calls that write files are never turned into a snapshot (Host parses no payloads).
    verdict = runtime.report(
        WS,
        "s1",
        "r1",
        turn_patch(turn_id, RUNNING),
        runtime_pb2.ReportItem(
            message_snapshot=runtime_pb2.MessageSnapshot(
                message_id="edit",
                turn_id=turn_id,
                role=canonical_pb2.MESSAGE_ROLE_ASSISTANT,
                kind=canonical_pb2.MESSAGE_KIND_TOOL_CALL,
                user_visible_assistant_response=False,
                tool_call=runtime_pb2.ToolCallSnapshot(
                    call_id="edit",
                    tool_name="Edit",
                    tool_kind="edit",
                    phase=runtime_pb2.TOOL_CALL_PHASE_COMPLETED,
                    input_json='{"file_path": "src/a.py"}',
                    file_changes_json='[{"path": "src/a.py", "kind": "modified"}]',
                ),
            )
        ),
        assistant_text("m1", turn_id, "I edited src/a.py"),
        turn_patch(turn_id, SETTLED, outcome=COMPLETED),
    )
    assert verdict.outcome == APPLIED
    assert host.counts() == (1, 3)  # the tool call is stored
    assert list(latest_turn(host).file_changes) == []
    with sync_engine.connect() as connection:
        stored = connection.execute(
            select(Turn.file_changes_json).where(Turn.turn_id == turn_id)
        ).scalar_one()
    assert stored is None
    runtime.close()


@pytest.mark.spec("HOST-TURN-8", "HOST-RT-1")
@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(files(change("", CREATED)), id="empty-path"),
        pytest.param(files(change("   ", CREATED)), id="blank-path"),
        pytest.param(files(change("x" * 4097, CREATED)), id="long-path"),
        pytest.param(files(change("a\tb", CREATED)), id="control-character"),
        pytest.param(
            files(change("a.py", canonical_pb2.FILE_CHANGE_KIND_UNSPECIFIED)), id="no-kind"
        ),
        pytest.param(files(change("a.py", 99)), id="undefined-kind"),
        pytest.param(files(change("a.py", RENAMED)), id="rename-without-previous"),
        pytest.param(files(change("a.py", MODIFIED, "b.py")), id="previous-without-rename"),
        pytest.param(files(change("a.py", RENAMED, "a.py")), id="rename-to-itself"),
        pytest.param(files(change("a.py", CREATED), change("a.py", MODIFIED)), id="duplicate"),
        pytest.param(
            files(*[change(f"f{i}", CREATED) for i in range(2001)]), id="too-many-entries"
        ),
    ],
)
def test_an_invalid_snapshot_rejects_the_whole_report(
    migrated_db_url: str, live_server: Callable[..., LiveServer], bad: canonical_pb2.FileChangeSet
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, turn_id = started(host)
    good = files(change("kept.py", CREATED))
    runtime.report(WS, "s1", "r0", turn_patch(turn_id, RUNNING, file_changes=good))
    before = latest_turn(host)
    verdict = runtime.report(
        WS,
        "s1",
        "r1",
        assistant_text("m1", turn_id, "text in the same report"),
        turn_patch(turn_id, SETTLED, outcome=COMPLETED, file_changes=bad),
    )
    assert verdict.outcome == REJECTED
    after = latest_turn(host)
    assert after == before
    assert snapshot(after) == [("kept.py", CREATED, None)]
    assert host.counts() == (1, 1)  # the text of the rejected report was not written
    runtime.close()


@pytest.mark.spec("HOST-TURN-8", "HOST-OBS-1")
def test_turn_update_events_carry_the_snapshot(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime, turn_id = started(host)
    watcher = Watcher(host.server.channel)
    watcher.wait_ready()
    snap = files(change("out/log.txt", CREATED))
    runtime.report(WS, "s1", "r1", turn_patch(turn_id, RUNNING, file_changes=snap))

    def carried(events: list[Any]) -> bool:
        return any(
            kind(e) == "turn_update"
            and e.turn_update.turn.turn_id == turn_id
            and snapshot(e.turn_update.turn) == [("out/log.txt", CREATED, None)]
            for e in events
        )

    watcher.wait_for(carried)
    watcher.cancel()
    runtime.close()
