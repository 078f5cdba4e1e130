"""Migration 0010 numbers an existing activity log per workspace, gap-free (SCALE-1)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import Engine, text

from services.host.repository import unit_of_work
from services.host.repository.activity_events import AppendedRun, NewEventRow
from services.host.repository.unit_of_work import HostTransaction
from store import migrate
from store.database import Database
from store.engine import create_sync_engine_for

BEFORE = "0009_tool_call_repair"


def _legacy_event(connection: object, workspace_id: str) -> int:
    """An event row as the schema before 0010 stored it (no sequence)."""
    found = connection.execute(  # type: ignore[attr-defined]
        text(
            "INSERT INTO activity_events"
            " (workspace_id, session_id, event_type, payload, created_at_unix_ms)"
            " VALUES (:ws, 's', 'turn_update', :payload, 1) RETURNING id"
        ),
        {"ws": workspace_id, "payload": b""},
    )
    return int(found.scalar_one())


def _numbering(engine: Engine) -> dict[str, list[tuple[int, int]]]:
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT workspace_id, id, workspace_seq FROM activity_events ORDER BY id")
        ).all()
    found: dict[str, list[tuple[int, int]]] = {}
    for workspace_id, event_id, seq in rows:
        found.setdefault(str(workspace_id), []).append((int(event_id), int(seq)))
    return found


def _heads(engine: Engine) -> dict[str, int]:
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT workspace_id, last_seq FROM workspace_event_heads"))
        return {str(workspace_id): int(last) for workspace_id, last in rows}


async def _append(url: str, workspace_id: str) -> AppendedRun:
    database = Database(url)
    await database.start()
    try:

        async def command(tx: HostTransaction) -> dict[str, AppendedRun]:
            return await tx.events.append([NewEventRow(workspace_id, "s", "turn_update", b"", 2)])

        return (await unit_of_work.run(database, command))[workspace_id]
    finally:
        await database.stop()


@pytest.mark.spec("SCALE-1", "STORE-1")
def test_the_upgrade_numbers_existing_events_per_workspace_in_id_order(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url, BEFORE)
    engine = create_sync_engine_for(empty_db_url)
    try:
        order = ["a", "b", "a", "c", "a", "b", "a", "doomed", "c", "top"]
        with engine.begin() as connection:
            ids = [_legacy_event(connection, workspace_id) for workspace_id in order]
            # The pruner deleted an older prefix of "a" and recorded it (0006's bookkeeping).
            connection.execute(text("DELETE FROM activity_events WHERE id = :id"), {"id": ids[0]})
            connection.execute(
                text(
                    "INSERT INTO activity_event_retention (workspace_id, pruned_through_event_id,"
                    " counted_through_event_id, retained_count) VALUES ('a', :id, :id, 3)"
                ),
                {"id": ids[0]},
            )
            # The newest event is gone too: its id must never be handed out again.
            connection.execute(text("DELETE FROM activity_events WHERE id = :id"), {"id": ids[-1]})
        migrate.upgrade(empty_db_url)

        numbering = _numbering(engine)
        expected: dict[str, list[tuple[int, int]]] = {}
        for event_id, workspace_id in list(zip(ids, order, strict=True))[1:-1]:
            run = expected.setdefault(workspace_id, [])
            run.append((event_id, len(run) + 1))
        assert numbering == expected
        assert _heads(engine) == {"a": 3, "b": 2, "c": 2, "doomed": 1}
        with engine.connect() as connection:
            retention = connection.execute(
                text(
                    "SELECT workspace_id, pruned_through_event_id, pruned_through_seq"
                    " FROM activity_event_retention"
                )
            ).all()
        assert [tuple(row) for row in retention] == [("a", ids[0], 0)]

        # Appends continue each workspace's sequence without a gap, with a never-used id.
        appended = asyncio.run(_append(empty_db_url, "a"))
        assert appended.previous_seq == 3
        assert appended.ids[0] > ids[-1]
        assert _numbering(engine)["a"][-1] == (appended.ids[0], 4)
        fresh = asyncio.run(_append(empty_db_url, "new"))
        assert fresh.previous_seq == 0
        assert _heads(engine)["new"] == 1
    finally:
        engine.dispose()


@pytest.mark.spec("SCALE-1", "STORE-1")
def test_the_downgrade_restores_the_counting_pruner_schema(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url)
    engine = create_sync_engine_for(empty_db_url)
    try:
        asyncio.run(_append(empty_db_url, "a"))
        asyncio.run(_append(empty_db_url, "a"))
        migrate.downgrade(empty_db_url, BEFORE)
        with engine.begin() as connection:
            assert [
                event_id
                for (event_id,) in connection.execute(
                    text("SELECT id FROM activity_events ORDER BY id")
                )
            ] == [1, 2]
            assert _legacy_event(connection, "a") == 3
        migrate.upgrade(empty_db_url)
        assert _heads(engine) == {"a": 3}
        assert [seq for _, seq in _numbering(engine)["a"]] == [1, 2, 3]
    finally:
        engine.dispose()
