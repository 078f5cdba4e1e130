"""Crash safety of purge and batch delete: a real host process killed with SIGKILL.

A purge removes whole trees per transaction and a batch delete tombstones its whole closure
in one, so after a kill at any moment and a restart every tree is either fully present or
fully gone, and no component has mixed generations (HOST-DEL-1, HOST-DEL-3, HOST-DEL-9).

The kill is not timed: the host runs under ``tests.support.paused_host``, which holds one
chosen write transaction open right before its commit and reports what that transaction
and the committed store contain. The test kills the host only after that report, so the kill
provably lands inside the transaction, and then checks that none of it committed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from sqlalchemy import Engine, func, insert, select

from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from store.models import ResourceCleanupOutbox, Session
from tests.support.servers import write_admin_token_file
from tests.support.session_trees import add_messages

pytestmark = pytest.mark.slow

TREES = 400
PER_TREE = 4  # a root and three children
TOKEN = "crash-secret"


@pytest.fixture
def engine(sync_engine: Engine) -> Engine:
    """The test database's sync engine, under the short name these tests use."""
    return sync_engine


PAUSE_FILE = "paused.json"


def _start(
    tmp_path: Path, url: str, *, pause_in: tuple[str, int] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start a host; ``pause_in=(module, n)`` holds that module's n-th write transaction open."""
    tokens = write_admin_token_file(tmp_path / "tokens.yaml", TOKEN)
    port_file = tmp_path / "port"
    port_file.unlink(missing_ok=True)
    env = dict(
        os.environ,
        TUTTI_LISTEN_ADDRESS="127.0.0.1:0",
        TUTTI_AUTH_TOKENS_FILE=str(tokens),
        TUTTI_DATABASE_URL=url,
        TUTTI_DATA_DIR=str(tmp_path / "data"),
        TUTTI_LOG_FORMAT="text",
        TUTTI_REFLECTION="false",
    )
    if pause_in is None:
        entry = ["-c", "from tutti.cli import main; main()"]
    else:
        module, ordinal = pause_in
        pause = ["tests.support.paused_host", str(tmp_path / PAUSE_FILE), module, str(ordinal)]
        entry = ["-m", *pause]
    process = subprocess.Popen(
        [sys.executable, *entry, "serve", "host", "--port-file", str(port_file)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text().strip()):
        assert process.poll() is None, "server exited during start"
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    return process, f"127.0.0.1:{port_file.read_text().strip()}"


def _seed(engine: Engine, *, deleted: bool) -> None:
    rows = []
    for tree in range(TREES):
        root = f"t{tree:04d}"
        for member in range(PER_TREE):
            sid = root if member == 0 else f"{root}-c{member}"
            rows.append(
                {
                    "workspace_id": "ws-1",
                    "session_id": sid,
                    "parent_session_id": None if member == 0 else root,
                    "root_session_id": root,
                    "provider": "demo",
                    "rail_section_key": "conversations",
                    "created_at_unix_ms": 1_000,
                    "updated_at_unix_ms": 1_000,
                    "deleted_at_unix_ms": 500 if deleted else None,
                    "deletion_generation": f"g-{root}" if deleted else None,
                    "component_size": PER_TREE if deleted else None,
                }
            )
    with engine.begin() as connection:
        connection.execute(insert(Session), rows)
    add_messages(engine, [str(row["session_id"]) for row in rows], 5)


def _trees(engine: Engine) -> dict[str, list[tuple[int | None, str | None, int | None]]]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(
                Session.root_session_id,
                Session.deleted_at_unix_ms,
                Session.deletion_generation,
                Session.component_size,
            )
        ).all()
    trees: dict[str, list[tuple[int | None, str | None, int | None]]] = {}
    for root, deleted_at, generation, size in rows:
        trees.setdefault(root, []).append((deleted_at, generation, size))
    return trees


def _call_in_background(address: str, method: str, request: object) -> threading.Thread:
    def call() -> None:
        with grpc.insecure_channel(address) as channel:
            stub = host_pb2_grpc.HostServiceStub(channel)
            with contextlib.suppress(grpc.RpcError):  # the server is killed under the call
                getattr(stub, method)(
                    request, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=60
                )

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def _wait_paused(tmp_path: Path, process: subprocess.Popen[bytes]) -> dict[str, dict[str, int]]:
    """Block until the chosen transaction is held open; its counts (inside and committed)."""
    signal_file = tmp_path / PAUSE_FILE
    deadline = time.monotonic() + 60
    while not signal_file.exists():
        assert process.poll() is None, "the host exited before the transaction paused"
        assert time.monotonic() < deadline, "the transaction never paused"
        time.sleep(0.01)
    report: dict[str, dict[str, int]] = json.loads(signal_file.read_text())
    return report


def _counts(engine: Engine) -> dict[str, int]:
    """The same counts as ``paused_host`` reports, of the committed store."""
    trees = _trees(engine)
    return {
        "sessions": sum(len(members) for members in trees.values()),
        "trees": len(trees),
        "tombstoned": sum(m[0] is not None for members in trees.values() for m in members),
        "cleanup_rows": _cleanup_rows(engine),
    }


def _cleanup_rows(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(
            connection.execute(select(func.count()).select_from(ResourceCleanupOutbox)).scalar_one()
        )


def _kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)


def _restart_answers(tmp_path: Path, url: str) -> None:
    process, address = _start(tmp_path, url)
    try:
        with grpc.insecure_channel(address) as channel:
            stub = host_pb2_grpc.HostServiceStub(channel)
            page = stub.ListDeletedSessions(
                host_pb2.ListDeletedSessionsRequest(workspace_id="ws-1", limit=200),
                metadata=(("authorization", f"Bearer {TOKEN}"),),
                timeout=30,
            )
            assert all(item.restorable for item in page.items)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.spec("HOST-DEL-9")
def test_a_purge_killed_midway_leaves_every_tree_whole_or_gone(
    tmp_path: Path, migrated_db_url: str, engine: Engine
) -> None:
    _seed(engine, deleted=True)
    # The purge's second write transaction is held open: the first one has committed.
    process, address = _start(
        tmp_path, migrated_db_url, pause_in=("services.host.deletion.purge", 2)
    )
    try:
        _call_in_background(
            address,
            "PurgeDeletedSessions",
            host_pb2.PurgeDeletedSessionsRequest(cutoff_unix_ms=10_000, max_trees=TREES),
        )
        paused = _wait_paused(tmp_path, process)
    finally:
        _kill(process)
    committed, inside = paused["committed"], paused["inside"]
    assert committed["cleanup_rows"] > 0, "the first transaction committed trees"
    assert inside["trees"] < committed["trees"] < TREES, "the paused one removed more"
    # Killed inside the second transaction: exactly what the first committed remains.
    assert _counts(engine) == committed
    trees = _trees(engine)
    for root, members in trees.items():
        assert len(members) == PER_TREE, root
        assert set(members) == {(500, f"g-{root}", PER_TREE)}
    with engine.connect() as connection:
        cleaned = {row[0] for row in connection.execute(select(ResourceCleanupOutbox.session_id))}
    purged_roots = {f"t{tree:04d}" for tree in range(TREES)} - set(trees)
    assert cleaned == {
        sid
        for root in purged_roots
        for sid in [root, *(f"{root}-c{m}" for m in range(1, PER_TREE))]
    }
    _restart_answers(tmp_path, migrated_db_url)


@pytest.mark.spec("HOST-DEL-1", "HOST-DEL-3")
def test_a_batch_delete_killed_midway_is_all_or_nothing(
    tmp_path: Path, migrated_db_url: str, engine: Engine
) -> None:
    _seed(engine, deleted=False)
    # DeleteSessions' write transaction (its only one) is held open just before its commit.
    process, address = _start(
        tmp_path, migrated_db_url, pause_in=("services.host.deletion.delete", 1)
    )
    try:
        _call_in_background(
            address,
            "DeleteSessions",
            host_pb2.DeleteSessionsRequest(
                workspace_id="ws-1", session_ids=[f"t{tree:04d}" for tree in range(TREES)]
            ),
        )
        paused = _wait_paused(tmp_path, process)
    finally:
        _kill(process)
    # Inside, the transaction had tombstoned every member; nothing of it was committed.
    assert paused["inside"]["tombstoned"] == TREES * PER_TREE
    assert paused["committed"]["tombstoned"] == 0
    assert _counts(engine) == paused["committed"]
    trees = _trees(engine)
    assert len(trees) == TREES
    states = {members[0][0] is None for members in trees.values()}
    assert len(states) == 1, "a batch delete is one transaction: all or nothing"
    for root, members in trees.items():
        assert len(members) == PER_TREE
        assert len(set(members)) == 1, f"mixed tombstone state in {root}: {members}"
        deleted_at, generation, size = members[0]
        assert (deleted_at is None) == (generation is None) == (size is None)
        if size is not None:
            assert size == PER_TREE
    _restart_answers(tmp_path, migrated_db_url)
