"""One activity append on both write paths (``activity_events.append_events``, ADR 0034/0037).

The append is a synchronous function of a write transaction. A direct write runs it on the
writer thread's driver connection; ``EventLogRepository.append`` runs the same function on the
ORM transaction's connection. Interleaved on the same workspaces, both continue one gap-free
sequence per workspace, return the ids in row order, and roll back with their transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.ext.asyncio import AsyncSession

from services.host.repository.activity_events import (
    AppendedRun,
    EventLogRepository,
    NewEventRow,
    append_events,
)
from store.direct_writes import DirectWrites, WriteConnection
from store.engine import create_async_engine_for
from store.models import ActivityEvent, WorkspaceEventHead


def _rows(tag: str, workspaces: Sequence[str]) -> list[NewEventRow]:
    return [
        NewEventRow(
            workspace_id=ws,
            session_id=f"s-{tag}",
            event_type="session_reconcile_required",
            payload=f"{tag}-{index}".encode(),
            created_at_unix_ms=index,
        )
        for index, ws in enumerate(workspaces)
    ]


def _stored(engine: Engine) -> list[tuple[int, str, int, bytes]]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(
                ActivityEvent.id,
                ActivityEvent.workspace_id,
                ActivityEvent.workspace_seq,
                ActivityEvent.payload,
            ).order_by(ActivityEvent.id)
        ).all()
    return [(int(r[0]), str(r[1]), int(r[2]), bytes(r[3])) for r in rows]


def _heads(engine: Engine) -> dict[str, int]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(WorkspaceEventHead.workspace_id, WorkspaceEventHead.last_seq)
        )
    return {str(ws): int(last) for ws, last in rows}


def _check(appended: dict[str, AppendedRun], rows: Sequence[NewEventRow], engine: Engine) -> None:
    """Every appended id holds its row, numbered ``previous_seq + 1 …`` per workspace."""
    stored = {event_id: (ws, seq, payload) for event_id, ws, seq, payload in _stored(engine)}
    for ws, run in appended.items():
        mine = [row for row in rows if row.workspace_id == ws]
        assert len(run.ids) == len(mine)
        assert run.ids == sorted(run.ids)
        for offset, (event_id, row) in enumerate(zip(run.ids, mine, strict=True)):
            assert stored[event_id] == (ws, run.previous_seq + 1 + offset, row.payload)


@pytest.mark.spec("SCALE-1", "HOST-OBS-1")
def test_direct_and_orm_appends_continue_one_gap_free_sequence_per_workspace(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    async def scenario() -> None:
        engine = create_async_engine_for(migrated_db_url)
        writes = DirectWrites(migrated_db_url, engine)
        try:
            first = _rows("orm-1", ["ws-b", "ws-a", "ws-b", "ws-a", "ws-a"])
            async with AsyncSession(engine) as db, db.begin():
                orm_run = await EventLogRepository(db).append(first)
            _check(orm_run, first, sync_engine)
            assert {ws: run.previous_seq for ws, run in orm_run.items()} == {"ws-a": 0, "ws-b": 0}

            second = _rows("direct", ["ws-a", "ws-c", "ws-b", "ws-a"])

            def direct(conn: WriteConnection) -> dict[str, AppendedRun]:
                return append_events(conn, second)

            direct_run = await writes.run(direct)
            _check(direct_run, second, sync_engine)
            assert {ws: run.previous_seq for ws, run in direct_run.items()} == {
                "ws-a": 3,
                "ws-b": 2,
                "ws-c": 0,
            }

            def refused(conn: WriteConnection) -> None:
                append_events(conn, _rows("lost", ["ws-a", "ws-c"]))
                raise LookupError("the command refused after its append")

            with pytest.raises(LookupError):
                await writes.run(refused)

            async def orm_refused() -> None:
                async with AsyncSession(engine) as db, db.begin():
                    await EventLogRepository(db).append(_rows("lost", ["ws-b"]))
                    raise LookupError("the command refused after its append")

            with pytest.raises(LookupError):
                await orm_refused()

            third = _rows("orm-2", ["ws-c", "ws-a"])
            async with AsyncSession(engine) as db, db.begin():
                last_run = await EventLogRepository(db).append(third)
            _check(last_run, third, sync_engine)
            assert {ws: run.previous_seq for ws, run in last_run.items()} == {"ws-a": 5, "ws-c": 1}
            assert await writes.run(lambda conn: append_events(conn, [])) == {}
        finally:
            await writes.close()
            await engine.dispose()

    asyncio.run(scenario())
    stored = _stored(sync_engine)
    assert not [payload for _, _, _, payload in stored if payload.startswith(b"lost")]
    per_workspace: dict[str, list[int]] = {}
    for _, ws, seq, _ in stored:
        per_workspace.setdefault(ws, []).append(seq)
    # Gap-free and increasing with the id in every workspace, across both paths.
    assert per_workspace == {"ws-a": [1, 2, 3, 4, 5, 6], "ws-b": [1, 2, 3], "ws-c": [1, 2]}
    assert _heads(sync_engine) == {"ws-a": 6, "ws-b": 3, "ws-c": 2}
