"""Hot reads as one ``UNION ALL`` statement (``store.read_unions``, ADR 0033) on both backends.

Host's Postgres hot reads run as one statement in autocommit; SQLite's as one statement per
part in a read transaction. Either form must return exactly the aggregate of the other —
Sessions with and without an active Turn, Interactions, trees with tombstones, transcript
pages, submissions — and a one-statement read must see one committed state while a writer
commits around it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import pytest
from sqlalchemy import Engine, Table, insert, literal_column, select, text, update
from sqlalchemy.orm import Session as OrmSession

from services.host.repository import hot_reads
from services.host.repository.row_records import session_record, turn_record
from store.direct_reads import DirectReads, ReadConnection, ReadQuery
from store.models import Interaction, Message, Session, Turn
from store.read_unions import ReadUnion, UnionPart

_S = cast(Table, Session.__table__)
_T = cast(Table, Turn.__table__)
_I = cast(Table, Interaction.__table__)
_M = cast(Table, Message.__table__)

ResultT = TypeVar("ResultT")


def _session(engine: Engine, session_id: str, **values: Any) -> None:
    row: dict[str, Any] = {
        "workspace_id": "ws-1",
        "session_id": session_id,
        "root_session_id": session_id,
        "agent_target_id": "demo",
        "provider": "demo",
        "title": f"title {session_id}",
        "cwd": "/work",
        "rail_section_key": "conversations",
        "settings_json": '{"model": "m"}',
        "capabilities_json": "{}",
        "message_version": 0,
        "next_message_sequence": 1,
        "created_at_unix_ms": 1,
        "updated_at_unix_ms": 1,
        "tombstone_legacy": False,
        **values,
    }
    with engine.begin() as connection:
        connection.execute(insert(_S).values(**row))


def _turn(engine: Engine, session_id: str, turn_id: str, created: int, **values: Any) -> None:
    row: dict[str, Any] = {
        "workspace_id": "ws-1",
        "session_id": session_id,
        "turn_id": turn_id,
        "client_submit_id": f"submit-{turn_id}",
        "phase": "settled",
        "outcome": "completed",
        "origin": "user",
        "version": 1,
        "created_at_unix_ms": created,
        "updated_at_unix_ms": created,
        "result_resolved_empty": False,
        **values,
    }
    with engine.begin() as connection:
        connection.execute(insert(_T).values(**row))


def _interaction(
    engine: Engine, turn_id: str, request_id: str, created: int, **values: Any
) -> None:
    row: dict[str, Any] = {
        "workspace_id": "ws-1",
        "session_id": "root",
        "turn_id": turn_id,
        "request_id": request_id,
        "kind": "approval",
        "status": "pending",
        "actionable": True,
        "title": f"may I {request_id}?",
        "options_json": '[{"option_id": "yes", "label": "Yes"}]',
        "version": 1,
        "occurred_at_unix_ms": created,
        "created_at_unix_ms": created,
        "updated_at_unix_ms": created,
        **values,
    }
    with engine.begin() as connection:
        connection.execute(insert(_I).values(**row))


def _message(engine: Engine, session_id: str, message_id: str, version: int, **values: Any) -> None:
    row: dict[str, Any] = {
        "workspace_id": "ws-1",
        "session_id": session_id,
        "message_id": message_id,
        "sequence": version,
        "version": version,
        "occurred_at_unix_ms": version,
        "created_at_unix_ms": version,
        "updated_at_unix_ms": version,
        "role": "assistant",
        "kind": "text",
        "payload_json": f'{{"text": "m{version}"}}',
        "user_visible_assistant_response": version % 2 == 0,
        **values,
    }
    with engine.begin() as connection:
        connection.execute(insert(_M).values(**row))
        connection.execute(
            update(_S)
            .where(_S.c.workspace_id == "ws-1", _S.c.session_id == session_id)
            .values(message_version=version, next_message_sequence=version + 1)
        )


def _seed_tree(engine: Engine) -> None:
    """A root with an active Turn, a later settled one, a retracted one, Interactions in
    every state and a tree with a tombstoned branch; a tombstoned root beside it."""
    _session(engine, "root", created_at_unix_ms=1)
    _turn(engine, "root", "t-1", 1)
    _turn(engine, "root", "t-3", 3, phase="running", outcome=None, started_at_unix_ms=3)
    _turn(engine, "root", "t-5", 5, failure_message=None, file_changes_json=None)
    _turn(engine, "root", "t-9", 9, retracted_at_unix_ms=10)
    with engine.begin() as connection:
        connection.execute(update(_S).where(_S.c.session_id == "root").values(active_turn_id="t-3"))
    _interaction(engine, "t-3", "q-late", 20)
    _interaction(engine, "t-3", "q-early", 10)
    _interaction(engine, "t-3", "q-tie-b", 15)
    _interaction(engine, "t-1", "q-tie-a", 15)
    _interaction(engine, "t-3", "q-info", 12, actionable=False)
    _interaction(engine, "t-1", "q-done", 5, status="answered", answer_json='{"option_id": "y"}')
    tree = {"root_session_id": "root"}
    _session(engine, "child", parent_session_id="root", created_at_unix_ms=4, **tree)
    _session(engine, "grandchild", parent_session_id="child", created_at_unix_ms=2, **tree)
    _session(engine, "sibling", parent_session_id="root", created_at_unix_ms=4, **tree)
    tombstone = {"deleted_at_unix_ms": 9, "deletion_generation": "g", "component_size": 2}
    _session(engine, "gone", parent_session_id="root", created_at_unix_ms=5, **tree, **tombstone)
    _session(
        engine, "gone-child", parent_session_id="gone", created_at_unix_ms=6, **tree, **tombstone
    )
    _session(engine, "dead", created_at_unix_ms=7, tombstone_legacy=True, deleted_at_unix_ms=8)


def _orm_session(engine: Engine, session_id: str) -> Any:
    with OrmSession(engine) as orm:
        row = orm.get(Session, ("ws-1", session_id))
        assert row is not None
        return session_record(row)


async def _in_both_forms(url: str, read: Callable[[ReadConnection], ResultT]) -> list[ResultT]:
    """``read`` with its union as one statement (autocommit), then as one statement per part."""
    results = []
    for one in (True, False):
        reads = DirectReads(url, connections=1, unions_as_one_statement=one)
        try:
            results.append(await reads.run(read, one_statement=True))
        finally:
            await reads.close()
    return results


@pytest.mark.spec("HOST-SES-3")
@pytest.mark.parametrize("session_id", ["root", "child", "grandchild", "gone", "dead", "nobody"])
def test_get_sessions_aggregate_is_the_same_read_as_one_statement_or_by_parts(
    migrated_db_url: str, sync_engine: Engine, session_id: str
) -> None:
    _seed_tree(sync_engine)
    one, parts = asyncio.run(
        _in_both_forms(
            migrated_db_url, lambda conn: hot_reads.session_read_set(conn, "ws-1", session_id)
        )
    )
    assert one == parts
    if session_id == "nobody":
        assert one is None
        return
    assert one is not None
    # The same records the ORM rows give (the read selects only the columns records use).
    assert one.session == _orm_session(sync_engine, session_id)
    assert one.children == [_orm_session(sync_engine, c.session_id) for c in one.children]
    children = [c.session_id for c in one.children]
    if session_id == "root":
        assert one.session.settings.model == "m"
        assert one.active_turn is not None
        assert one.active_turn.turn_id == "t-3"
        assert one.active_turn.phase == "running"
        assert one.latest_turn is not None
        assert one.latest_turn.turn_id == "t-5"
        pending = [i.request_id for i in one.pending_interactions]
        assert pending == ["q-early", "q-tie-a", "q-tie-b", "q-late"]
        assert one.pending_interactions[0].options[0].label == "Yes"
        # Parents before children; among siblings by creation, then id; no tombstones.
        assert children == ["child", "sibling", "grandchild"]
    else:
        assert one.active_turn is None
        assert one.latest_turn is None
        assert one.pending_interactions == []
    if session_id == "child":
        assert children == ["grandchild"]
    if session_id in ("gone", "dead"):
        assert one.session.tombstone is not None
        assert children == []
    if session_id == "dead":
        assert one.session.tombstone is not None
        assert one.session.tombstone.legacy is True


@pytest.mark.spec("HOST-MSG-2")
@pytest.mark.parametrize(
    ("after", "before", "limit", "descending", "expected"),
    [
        (None, None, 10, False, [1, 2, 3, 4, 5]),
        (None, None, 2, True, [5, 4]),
        (1, 5, 10, False, [2, 3, 4]),
        (2, None, 2, False, [3, 4]),
        (None, 3, 10, True, [2, 1]),
        (5, None, 10, False, []),
    ],
)
def test_a_transcript_page_is_the_same_read_as_one_statement_or_by_parts(
    migrated_db_url: str,
    sync_engine: Engine,
    after: int | None,
    before: int | None,
    limit: int,
    descending: bool,
    expected: list[int],
) -> None:
    _session(sync_engine, "root")
    _session(sync_engine, "empty")
    _turn(sync_engine, "root", "t-1", 1)
    for version in range(1, 6):
        _message(
            sync_engine, "root", f"m-{version}", version, turn_id="t-1", command=f"/c{version}"
        )

    def page(session_id: str) -> Callable[[ReadConnection], Any]:
        return lambda conn: hot_reads.message_page(
            conn,
            "ws-1",
            session_id,
            after_version=after,
            before_version=before,
            limit=limit,
            descending=descending,
        )

    one, parts = asyncio.run(_in_both_forms(migrated_db_url, page("root")))
    assert one == parts
    version, rows = one
    assert version == 5
    assert [r.version for r in rows] == expected
    assert all(r.user_visible_assistant_response is (r.version % 2 == 0) for r in rows)
    assert all(r.command == f"/c{r.version}" for r in rows)
    assert asyncio.run(_in_both_forms(migrated_db_url, page("empty"))) == [(0, [])] * 2
    assert asyncio.run(_in_both_forms(migrated_db_url, page("nobody"))) == [None] * 2


@pytest.mark.spec("HOST-TURN-1")
def test_a_submissions_read_back_is_the_same_read_as_one_statement_or_by_parts(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    _session(sync_engine, "root")
    _turn(sync_engine, "root", "t-1", 1, submit_fingerprint="fp-1")
    _turn(sync_engine, "root", "t-2", 2, phase="running", outcome=None)
    _message(sync_engine, "root", "u-1", 1, role="user", turn_id="t-1")
    _message(sync_engine, "root", "u-guide", 2, role="user", turn_id="t-2")

    def rows(message_id: str, submit: str, guidance: bool) -> Any:
        found = asyncio.run(
            _in_both_forms(
                migrated_db_url,
                lambda conn: hot_reads.submission_rows(
                    conn, "ws-1", "root", message_id, submit, guidance=guidance
                ),
            )
        )
        assert found[0] == found[1]
        return found[0]

    submitted = rows("u-1", "submit-t-1", guidance=False)
    assert submitted.session.session_id == "root"
    assert submitted.message.message_id == "u-1"
    assert submitted.submitted_turn.submit_fingerprint == "fp-1"
    assert turn_record(submitted.submitted_turn).turn_id == "t-1"
    assert submitted.guided_turn is None
    guided = rows("u-guide", "guide-1", guidance=True)
    assert guided.submitted_turn is None
    assert guided.guided_turn.turn_id == "t-2"
    missing = rows("u-none", "submit-none", guidance=True)
    assert missing.message is None
    assert missing.submitted_turn is None
    assert missing.guided_turn is None
    assert session_record(missing.session).session_id == "root"


def test_a_one_statement_read_refuses_a_second_statement(migrated_db_url: str) -> None:
    query = ReadQuery(select(_S.c.session_id))

    def two(conn: ReadConnection) -> Any:
        conn.all(query)
        return conn.all(query)

    async def run() -> Any:
        reads = DirectReads(migrated_db_url, unions_as_one_statement=True)
        try:
            assert await reads.run(two) == []  # a transaction read may run several
            return await reads.run(two, one_statement=True)
        finally:
            await reads.close()

    with pytest.raises(RuntimeError, match="second statement"):
        asyncio.run(run())


def test_a_one_statement_read_runs_in_autocommit_and_read_only(
    migrated_db_url: str, backend: str
) -> None:
    """Postgres: no ``BEGIN``, so the statement runs at the server's default isolation (its
    own snapshot), still read-only; a read of several statements is ``REPEATABLE READ``."""
    if backend != "postgres":
        pytest.skip("SQLite reads a union by parts in its deferred read transaction")
    settings = ReadUnion(
        mode=UnionPart(
            select(
                literal_column("current_setting('transaction_isolation')").label("isolation"),
                literal_column("current_setting('transaction_read_only')").label("read_only"),
            )
        )
    )

    async def run() -> tuple[Any, Any]:
        reads = DirectReads(migrated_db_url, connections=1)
        try:
            one = await reads.run(lambda conn: conn.union(settings, {}), one_statement=True)
            several = await reads.run(lambda conn: conn.union(settings, {}))
            return one["mode"][0], several["mode"][0]
        finally:
            await reads.close()

    one, several = asyncio.run(run())
    assert (one.isolation, one.read_only) == ("read committed", "on")
    assert (several.isolation, several.read_only) == ("repeatable read", "on")


@pytest.mark.spec("HOST-SES-3", "STORE-3")
def test_a_get_session_read_sees_one_committed_state_while_a_writer_commits(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    """Each writer transaction replaces the active Turn, its pending Interaction and the
    title together; every read must see all of one transaction or none of it."""
    _session(sync_engine, "root")
    rounds = 150
    done = threading.Event()

    def write() -> None:
        try:
            for n in range(1, rounds + 1):
                with sync_engine.begin() as connection:
                    connection.execute(
                        update(_T)
                        .where(_T.c.phase == "running")
                        .values(phase="settled", outcome="completed")
                    )
                    connection.execute(
                        update(_I).where(_I.c.status == "pending").values(status="answered")
                    )
                    connection.execute(
                        insert(_T).values(
                            workspace_id="ws-1",
                            session_id="root",
                            turn_id=f"t-{n:04}",
                            phase="running",
                            origin="user",
                            version=1,
                            created_at_unix_ms=n,
                            updated_at_unix_ms=n,
                            result_resolved_empty=False,
                        )
                    )
                    connection.execute(
                        insert(_I).values(
                            workspace_id="ws-1",
                            session_id="root",
                            turn_id=f"t-{n:04}",
                            request_id=f"q-{n:04}",
                            kind="approval",
                            status="pending",
                            actionable=True,
                            version=1,
                            occurred_at_unix_ms=n,
                            created_at_unix_ms=n,
                            updated_at_unix_ms=n,
                        )
                    )
                    connection.execute(
                        update(_S)
                        .where(_S.c.session_id == "root")
                        .values(active_turn_id=f"t-{n:04}", title=f"{n:04}")
                    )
        finally:
            done.set()

    async def read_while_writing() -> list[hot_reads.SessionReadSet]:
        reads = DirectReads(migrated_db_url)  # the backend's own form, as Host runs it
        seen: list[hot_reads.SessionReadSet] = []
        writer = threading.Thread(target=write)
        try:
            writer.start()
            while not done.is_set():
                batch = await asyncio.gather(
                    *(
                        reads.run(
                            lambda conn: hot_reads.session_read_set(conn, "ws-1", "root"),
                            one_statement=True,
                        )
                        for _ in range(4)
                    )
                )
                seen.extend(found for found in batch if found is not None)
        finally:
            writer.join()
            await reads.close()
        return seen

    seen = asyncio.run(read_while_writing())
    states = set()
    for found in seen:
        n = found.session.title
        if n.startswith("title"):  # before the first write
            assert found.active_turn is None
            assert found.pending_interactions == []
            continue
        states.add(n)
        assert found.active_turn is not None
        assert found.active_turn.turn_id == f"t-{n}"
        assert found.latest_turn is not None
        assert found.latest_turn.turn_id == f"t-{n}"
        assert [i.request_id for i in found.pending_interactions] == [f"q-{n}"]
    assert len(states) >= 2, "the reads never overlapped the writer"


def test_a_one_statement_read_on_a_dropped_connection_reconnects(
    migrated_db_url: str, sync_engine: Engine, backend: str
) -> None:
    """An autocommit read whose connection the server dropped (a restart, an idle timeout)
    runs again on a new connection, as a transactional read does (ADR 0023)."""
    if backend != "postgres":
        pytest.skip("a SQLite file has no server to drop the connection")
    _seed_tree(sync_engine)

    def terminate_read_connections() -> None:
        with sync_engine.connect() as admin:
            admin.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE pid <> pg_backend_pid() AND datname = current_database()"
                )
            )

    def read(conn: ReadConnection) -> Any:
        return hot_reads.session_read_set(conn, "ws-1", "root")

    async def run() -> list[Any]:
        reads = DirectReads(migrated_db_url, connections=1)
        try:
            found = [await reads.run(read, one_statement=True)]
            terminate_read_connections()
            found.append(await reads.run(read, one_statement=True))
            return found
        finally:
            await reads.close()

    before, after = asyncio.run(run())
    assert before is not None
    assert before == after
