"""SearchGeneratedFiles (HOST-SES-8) through a real host on both backends.

Sessions and projects are made through the API; most settled Turns with their frozen
file-change snapshots are seeded in the store (the search reads only what is stored, and a
window of 500 Turns is too slow to drive through a runtime), and one test goes end to end
through the runtime link.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import grpc
import pytest
from sqlalchemy import insert
from sqlalchemy.engine import Engine

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2
from store.models import Turn
from tests.integration.host_activity import (
    DEVICE,
    TARGET_ID,
    WS,
    HostUnderTest,
    error_reason,
    start_host,
)
from tests.support.rpc_errors import error_details
from tests.support.runtime_client import turn_patch
from tests.support.servers import LiveServer

CREATED = canonical_pb2.FILE_CHANGE_KIND_CREATED
MODIFIED = canonical_pb2.FILE_CHANGE_KIND_MODIFIED
RENAMED = canonical_pb2.FILE_CHANGE_KIND_RENAMED


def add_project(host: HostUnderTest, key: str) -> None:
    host.stub.AddProject(
        host_pb2.AddProjectRequest(workspace_id=WS, section_key=key, label=key, path=f"/p/{key}"),
        metadata=DEVICE,
    )


def create(host: HostUnderTest, session_id: str, section_key: str) -> None:
    host.stub.CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id=WS,
            agent_target_id=TARGET_ID,
            session_id=session_id,
            cwd="/nonexistent/workspace",
            rail_section_key=section_key,
        ),
        metadata=DEVICE,
    )


def seed_turns(
    engine: Engine, turns: list[tuple[str, str, int | None, list[dict[str, str]]]]
) -> None:
    """Settled Turns ``(session_id, turn_id, settled_at or None for active, snapshot)``."""
    rows = [
        {
            "workspace_id": WS,
            "session_id": session_id,
            "turn_id": turn_id,
            "phase": "settled" if settled_at is not None else "running",
            "outcome": "completed" if settled_at is not None else None,
            "origin": "user",
            "version": 2,
            "created_at_unix_ms": 1,
            "updated_at_unix_ms": settled_at or 1,
            "started_at_unix_ms": 1,
            "settled_at_unix_ms": settled_at,
            "result_resolved_empty": settled_at is not None,
            "file_changes_json": json.dumps(snapshot),
        }
        for session_id, turn_id, settled_at, snapshot in turns
    ]
    with engine.begin() as connection:
        connection.execute(insert(Turn), rows)


def search(host: HostUnderTest, section_key: str, **fields: object) -> list[tuple[object, ...]]:
    response = host.stub.SearchGeneratedFiles(
        host_pb2.SearchGeneratedFilesRequest(
            workspace_id=WS,
            section_key=section_key,
            **fields,  # type: ignore[arg-type]
        ),
        metadata=DEVICE,
    )
    return [
        (
            f.path,
            f.change,
            f.previous_path if f.HasField("previous_path") else None,
            f.session_id,
            f.turn_id,
            f.settled_at_unix_ms,
        )
        for f in response.files
    ]


def entry(path: str, change: str, previous_path: str | None = None) -> dict[str, str]:
    value = {"path": path, "change": change}
    if previous_path is not None:
        value["previous_path"] = previous_path
    return value


@pytest.fixture
def host(migrated_db_url: str, live_server: Callable[..., LiveServer]) -> HostUnderTest:
    host = start_host(live_server, migrated_db_url)
    for key in ("proj-a", "proj-ab", "proj-b"):
        add_project(host, key)
    return host


@pytest.mark.spec("HOST-SES-8", "HOST-TURN-8")
def test_one_entry_per_path_from_the_exact_sections_live_sessions_newest_first(
    host: HostUnderTest, sync_engine: Engine
) -> None:
    create(host, "a1", "proj-a")
    create(host, "a2", "proj-a")
    create(host, "gone", "proj-a")
    create(host, "ab", "proj-ab")
    create(host, "b1", "proj-b")
    seed_turns(
        sync_engine,
        [
            (
                "a1",
                "t1",
                100,
                [entry("x.py", "created"), entry("y.py", "created"), entry("old.txt", "created")],
            ),
            (
                "a2",
                "t2",
                200,
                [
                    entry("x.py", "modified"),
                    entry("y.py", "deleted"),
                    entry("new.txt", "renamed", "old.txt"),
                ],
            ),
            ("ab", "t3", 300, [entry("prefix-section.py", "created")]),
            ("b1", "t4", 400, [entry("other-section.py", "created")]),
            ("gone", "t5", 500, [entry("ghost.py", "created"), entry("x.py", "deleted")]),
            ("a1", "t6", None, [entry("active.py", "created"), entry("x.py", "deleted")]),
        ],
    )
    host.stub.DeleteSessions(
        host_pb2.DeleteSessionsRequest(workspace_id=WS, session_ids=["gone"]), metadata=DEVICE
    )
    assert search(host, "proj-a") == [
        ("new.txt", RENAMED, "old.txt", "a2", "t2", 200),
        ("x.py", MODIFIED, None, "a2", "t2", 200),
    ]
    assert search(host, "proj-ab") == [("prefix-section.py", CREATED, None, "ab", "t3", 300)]
    assert search(host, "proj-b") == [("other-section.py", CREATED, None, "b1", "t4", 400)]
    assert search(host, "conversations") == []
    assert search(host, "no-such-section") == []


@pytest.mark.spec("HOST-SES-8")
def test_query_is_a_case_insensitive_path_substring_and_limit_bounds_the_answer(
    host: HostUnderTest, sync_engine: Engine
) -> None:
    create(host, "a1", "proj-a")
    seed_turns(
        sync_engine,
        [
            ("a1", "t1", 100, [entry(f"src/Module{i:03d}.py", "created") for i in range(150)]),
            ("a1", "t2", 200, [entry("README.md", "modified")]),
        ],
    )
    everything = search(host, "proj-a", limit=1000)
    assert len(everything) == 151
    assert everything[0][:2] == ("README.md", MODIFIED)  # newest first
    assert [row[0] for row in everything[1:]] == [f"src/Module{i:03d}.py" for i in range(150)]
    assert len(search(host, "proj-a")) == 100  # the default limit
    assert [row[0] for row in search(host, "proj-a", limit=2)] == [
        "README.md",
        "src/Module000.py",
    ]
    assert [row[0] for row in search(host, "proj-a", query="readme")] == ["README.md"]
    assert [row[0] for row in search(host, "proj-a", query="MODULE14")] == [
        f"src/Module14{i}.py" for i in range(10)
    ]
    assert search(host, "proj-a", query="nothing-like-it") == []
    assert len(search(host, "proj-a", query="")) == 100


@pytest.mark.spec("HOST-SES-8")
def test_only_the_500_most_recently_settled_turns_are_read(
    host: HostUnderTest, sync_engine: Engine
) -> None:
    create(host, "a1", "proj-a")
    create(host, "a2", "proj-a")
    turns: list[tuple[str, str, int | None, list[dict[str, str]]]] = [
        ("a1", "oldest", 1, [entry("oldest.py", "created"), entry("shared.py", "created")])
    ]
    turns += [
        ("a1" if i % 2 else "a2", f"t{i:03d}", 1_000 + i, [entry(f"p{i:03d}.py", "created")])
        for i in range(500)
    ]
    seed_turns(sync_engine, turns)
    found = search(host, "proj-a", limit=1000)
    assert len(found) == 500
    paths = {row[0] for row in found}
    assert "oldest.py" not in paths
    assert "shared.py" not in paths
    assert found[0][0] == "p499.py"


@pytest.mark.spec("HOST-SES-8", "SEC-4")
@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"section_key": ""}, "section_key"),
        ({"section_key": "   "}, "section_key"),
        ({"section_key": "proj-a", "limit": 0}, "limit"),
        ({"section_key": "proj-a", "limit": -1}, "limit"),
        ({"section_key": "proj-a", "limit": 1001}, "limit"),
        ({"section_key": "proj-a", "query": "q" * 1025}, "query"),
    ],
)
def test_a_missing_section_key_or_an_out_of_range_limit_is_invalid(
    host: HostUnderTest, sync_engine: Engine, fields: dict[str, object], field: str
) -> None:
    create(host, "a1", "proj-a")
    seed_turns(sync_engine, [("a1", "t1", 100, [entry("x.py", "created")])])
    with pytest.raises(grpc.RpcError) as caught:
        host.stub.SearchGeneratedFiles(
            host_pb2.SearchGeneratedFilesRequest(workspace_id=WS, **fields),  # type: ignore[arg-type]
            metadata=DEVICE,
        )
    code, _, violated = error_details(caught.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert violated == {field}
    assert error_reason(caught.value) == "INVALID_ARGUMENT"


@pytest.mark.spec("HOST-SES-8", "HOST-TURN-8")
def test_snapshots_reported_over_the_runtime_link_are_searchable_once_settled(
    host: HostUnderTest,
) -> None:
    create(host, "a1", "proj-a")
    runtime = host.runtime()
    turn_id = host.send("write it", "c1", session_id="a1").turn.turn_id
    runtime.next_command()
    snapshot = canonical_pb2.FileChangeSet(
        changes=[canonical_pb2.FileChange(path="out/report.md", change=CREATED)]
    )
    running = canonical_pb2.TURN_PHASE_RUNNING
    runtime.report(WS, "a1", "r1", turn_patch(turn_id, running, file_changes=snapshot))
    assert search(host, "proj-a") == []  # not settled yet
    runtime.report(
        WS,
        "a1",
        "r2",
        turn_patch(
            turn_id, canonical_pb2.TURN_PHASE_SETTLED, outcome=canonical_pb2.TURN_OUTCOME_COMPLETED
        ),
    )
    (found,) = search(host, "proj-a")
    assert found[:5] == ("out/report.md", CREATED, None, "a1", turn_id)
    assert isinstance(found[5], int)
    assert found[5] > 0
    runtime.close()
