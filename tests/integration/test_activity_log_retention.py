"""Per-workspace retention of the activity event log, on SQLite and Postgres (HOST-OBS-2).

Each workspace keeps its newest ``max_rows`` events younger than the retention age and always
its newest event; a cursor expires only when its own workspace lost an event after it
(ADR 0015 §10). The pruner runs through ``ActivityFeed.prune`` with a fake clock; events are
written straight into the log.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest
from sqlalchemy import Engine, delete, event, insert, select

from agentactivity.host.v1 import host_pb2
from domainerrors import OutOfRange
from services.host.activity.feed import ActivityFeed, FeedSettings, WatchReady, watch_activity
from services.host.repository import unit_of_work
from services.host.repository.unit_of_work import HostTransaction
from services.host.wire.activity_codec import ProtoEventCodec
from store import migrate
from store.database import Database
from store.engine import create_sync_engine_for
from store.models import ActivityEvent, ActivityEventRetention, WorkspaceEventHead
from tests.integration.host_activity import DEVICE, TARGET_ID, WS, error_reason, start_host
from tests.support.activity_watch import Watcher
from tests.support.polling import eventually
from tests.support.servers import LiveServer, auth_metadata

NOW = 10_000_000
DAY_MS = 24 * 3600 * 1000


def _append(
    engine: Engine, workspace_id: str, created_at: int, count: int = 1, *, numbered: bool = True
) -> list[int]:
    """Write events straight into the log, numbered as an append numbers them.

    ``numbered=False`` writes rows of a schema from before the per-workspace sequence.
    """
    ids = []
    with engine.begin() as connection:
        last = 0
        if numbered:
            last = int(
                connection.execute(
                    select(WorkspaceEventHead.last_seq).where(
                        WorkspaceEventHead.workspace_id == workspace_id
                    )
                ).scalar_one_or_none()
                or 0
            )
        for index in range(count):
            values: dict[str, Any] = {
                "workspace_id": workspace_id,
                "session_id": "s",
                "event_type": "session_reconcile_required",
                "payload": b"",
                "created_at_unix_ms": created_at,
            }
            if numbered:
                values["workspace_seq"] = last + 1 + index
            new_id = connection.execute(
                insert(ActivityEvent).values(values).returning(ActivityEvent.id)
            ).scalar_one()
            ids.append(int(new_id))
        if numbered:
            connection.execute(
                delete(WorkspaceEventHead).where(WorkspaceEventHead.workspace_id == workspace_id)
            )
            connection.execute(
                insert(WorkspaceEventHead).values(workspace_id=workspace_id, last_seq=last + count)
            )
    return ids


def _retained_counts(engine: Engine) -> dict[str, int]:
    """Per workspace, ``last_seq - pruned_through_seq``: what the pruner takes as its count."""
    with engine.connect() as connection:
        heads = dict(
            connection.execute(
                select(WorkspaceEventHead.workspace_id, WorkspaceEventHead.last_seq)
            ).all()
        )
        pruned = dict(
            connection.execute(
                select(
                    ActivityEventRetention.workspace_id, ActivityEventRetention.pruned_through_seq
                )
            ).all()
        )
    return {ws: int(last) - int(pruned.get(ws, 0)) for ws, last in heads.items()}


def _retained(engine: Engine) -> dict[str, list[int]]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(ActivityEvent.workspace_id, ActivityEvent.id).order_by(ActivityEvent.id)
        ).all()
    found: dict[str, list[int]] = {}
    for workspace_id, event_id in rows:
        found.setdefault(str(workspace_id), []).append(int(event_id))
    return found


def _feed(*, max_rows: int = 1_000_000, retention_days: float = 7.0) -> ActivityFeed:
    return ActivityFeed(
        lambda: NOW,
        settings=FeedSettings(max_rows=max_rows, retention_seconds=retention_days * 24 * 3600),
    )


async def _prune(url: str, feed: ActivityFeed) -> int:
    database = Database(url)
    await database.start()
    try:
        return await feed.prune(database)
    finally:
        await database.stop()


async def _watch(
    url: str, feed: ActivityFeed, workspace_id: str, cursor: int, count: int
) -> tuple[WatchReady, list[int]]:
    """The ready marker and the first ``count`` replayed ids (raises ``OutOfRange``)."""
    database = Database(url)
    await database.start()
    stream = watch_activity(feed, database, workspace_id, cursor)
    try:
        ready = await anext(stream)
        assert isinstance(ready, WatchReady)
        ids = []
        for _ in range(count):
            item = await anext(stream)
            ids.append(int(item.event_id))  # type: ignore[union-attr]
        return ready, ids
    finally:
        await stream.aclose()
        await database.stop()


def _eventually(condition: Callable[[], bool]) -> bool:
    return eventually(condition, timeout=30.0)


def _expired(url: str, feed: ActivityFeed, workspace_id: str, cursor: int) -> bool:
    try:
        asyncio.run(_watch(url, feed, workspace_id, cursor, 0))
    except OutOfRange as error:
        return error.reason == "EVENT_CURSOR_EXPIRED"
    return False


@pytest.mark.spec("HOST-OBS-2")
def test_a_busy_workspace_never_expires_a_quiet_workspaces_cursor(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    busy = _append(sync_engine, "busy", NOW - 900, 20)
    quiet = _append(sync_engine, "quiet", NOW - 800, 3)
    busy += _append(sync_engine, "busy", NOW - 500, 30)
    feed = _feed(max_rows=10)

    assert asyncio.run(_prune(migrated_db_url, feed)) == 40
    # A global trim to 10 rows would have taken every quiet event.
    assert _retained(sync_engine) == {"quiet": quiet, "busy": busy[-10:]}
    # Nothing of "quiet" was pruned: even 0 (below its first id) replays it all.
    ready, replayed = asyncio.run(_watch(migrated_db_url, feed, "quiet", 0, 3))
    assert replayed == quiet
    assert ready.oldest_retained_event_id == 1
    assert not _expired(migrated_db_url, feed, "quiet", quiet[0] - 1)
    # The busy workspace's own cursors expire exactly below its last pruned event.
    last_pruned = busy[-11]
    ready, replayed = asyncio.run(_watch(migrated_db_url, feed, "busy", last_pruned, 10))
    assert replayed == busy[-10:]
    assert ready.oldest_retained_event_id == last_pruned + 1
    assert _expired(migrated_db_url, feed, "busy", last_pruned - 1)
    assert _expired(migrated_db_url, feed, "busy", 0)


@pytest.mark.spec("HOST-OBS-2")
def test_the_age_bound_applies_to_each_workspace_on_its_own(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    old, young = NOW - 8 * DAY_MS, NOW - DAY_MS
    mixed_old = _append(sync_engine, "mixed", old, 3)
    stale = _append(sync_engine, "stale", old, 4)
    fresh = _append(sync_engine, "fresh", young, 2)
    mixed_young = _append(sync_engine, "mixed", young, 2)
    feed = _feed()

    assert asyncio.run(_prune(migrated_db_url, feed)) == 3 + 3
    assert _retained(sync_engine) == {
        "mixed": mixed_young,
        "stale": stale[-1:],  # older than the bound, but a workspace's newest event stays
        "fresh": fresh,
    }
    assert _expired(migrated_db_url, feed, "mixed", mixed_old[-1] - 1)
    assert not _expired(migrated_db_url, feed, "mixed", mixed_old[-1])
    assert not _expired(migrated_db_url, feed, "fresh", 0)
    # Pruning again changes nothing.
    assert asyncio.run(_prune(migrated_db_url, feed)) == 0


@pytest.mark.spec("HOST-OBS-2")
def test_each_workspace_keeps_its_newest_event_and_an_empty_feed_is_not_expired(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    old = NOW - 30 * DAY_MS
    one = _append(sync_engine, "one", old)
    two = _append(sync_engine, "two", old, 2)
    five = _append(sync_engine, "five", old, 5)
    feed = _feed(max_rows=1)

    asyncio.run(_prune(migrated_db_url, feed))

    assert _retained(sync_engine) == {"one": one, "two": two[-1:], "five": five[-1:]}
    ready, _ = asyncio.run(_watch(migrated_db_url, feed, "five", five[-1], 0))
    assert ready.head_event_id == five[-1]  # the head stays defined
    assert ready.oldest_retained_event_id == five[-2] + 1
    assert not _expired(migrated_db_url, feed, "five", five[-2])
    assert _expired(migrated_db_url, feed, "five", five[-2] - 1)
    assert not _expired(migrated_db_url, feed, "one", 0)
    ready, _ = asyncio.run(_watch(migrated_db_url, feed, "none", 0, 0))
    assert ready.head_event_id == 0  # a workspace without events: empty, not expired


def _model_prune(
    retained: dict[str, list[tuple[int, int]]], cutoff: int, keep: int
) -> dict[str, list[tuple[int, int]]]:
    """ADR 0015 §10 over ``workspace -> [(id, created_at)]``, from first principles."""
    after: dict[str, list[tuple[int, int]]] = {}
    for workspace_id, events in retained.items():
        ids = [event_id for event_id, _ in events]
        by_age = max((i for i, created in events[:-1] if created < cutoff), default=0)
        by_count = ids[len(ids) - keep - 1] if len(ids) > keep else 0
        through = max(by_age, by_count)
        after[workspace_id] = [(i, created) for i, created in events if i > through]
    return after


@pytest.mark.spec("HOST-OBS-2")
def test_incremental_counts_match_a_full_recount_over_many_prunes(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    rng = random.Random(20261205)
    workspaces = [f"ws-{n}" for n in range(6)]
    model: dict[str, list[tuple[int, int]]] = {}
    clock = [NOW]
    keep = 7
    feed = ActivityFeed(
        lambda: clock[0], settings=FeedSettings(max_rows=keep, retention_seconds=50.0)
    )
    for _ in range(25):
        for _ in range(rng.randrange(0, 30)):
            workspace_id = rng.choice(workspaces[: rng.randrange(1, len(workspaces) + 1)])
            created = clock[0] - rng.randrange(0, 5_000)
            (new_id,) = _append(sync_engine, workspace_id, created)
            model.setdefault(workspace_id, []).append((new_id, created))
        clock[0] += rng.randrange(0, 40_000)
        asyncio.run(_prune(migrated_db_url, feed))
        model = _model_prune(model, clock[0] - 50_000, keep)
        expected = {ws: [i for i, _ in events] for ws, events in model.items() if events}
        assert _retained(sync_engine) == expected
        counts = {ws: n for ws, n in _retained_counts(sync_engine).items() if n}
        assert counts == {ws: len(ids) for ws, ids in expected.items()}


@contextmanager
def _statements(database: Database) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(*args: Any) -> None:
        seen.append(str(args[2]))

    event.listen(database.engine.sync_engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(database.engine.sync_engine, "before_cursor_execute", count)


async def _counted_prune(url: str, feed: ActivityFeed) -> tuple[int, int]:
    database = Database(url)
    await database.start()
    try:
        with _statements(database) as seen:
            deleted = await feed.prune(database)
        return deleted, len(seen)
    finally:
        await database.stop()


def _seed_workspaces(engine: Engine, prefix: str, workspaces: int) -> None:
    """Per workspace two events past the age bound and a fresh one."""
    rows = [
        {
            "workspace_id": f"{prefix}-{n:04d}",
            "session_id": "s",
            "event_type": "session_reconcile_required",
            "payload": b"",
            "created_at_unix_ms": created,
            "workspace_seq": seq,
        }
        for seq, created in enumerate((NOW - 9 * DAY_MS, NOW - 8 * DAY_MS, NOW), start=1)
        for n in range(workspaces)
    ]
    heads = [{"workspace_id": f"{prefix}-{n:04d}", "last_seq": 3} for n in range(workspaces)]
    with engine.begin() as connection:
        connection.execute(insert(ActivityEvent), rows)
        connection.execute(insert(WorkspaceEventHead), heads)


@pytest.mark.spec("HOST-OBS-2")
def test_a_prune_costs_the_same_statements_for_any_number_of_workspaces(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    feed = _feed()
    _seed_workspaces(sync_engine, "few", 3)
    few = asyncio.run(_counted_prune(migrated_db_url, feed))
    _seed_workspaces(sync_engine, "many", 600)
    many = asyncio.run(_counted_prune(migrated_db_url, feed))
    # Count, age bounds, bookkeeping, delete ...: set-based, one statement each.
    assert few == (2 * 3, few[1])
    assert many == (2 * 600, few[1])
    assert all(len(ids) == 1 for ids in _retained(sync_engine).values())


@pytest.mark.spec("HOST-OBS-2", "STORE-1")
def test_an_existing_log_is_counted_by_the_first_prune_after_the_upgrade(
    empty_db_url: str,
) -> None:
    migrate.upgrade(empty_db_url, "0005_runtime_outbox_lookups")
    engine = create_sync_engine_for(empty_db_url)
    try:
        busy = _append(engine, "busy", NOW, 12, numbered=False)
        quiet = _append(engine, "quiet", NOW, 2, numbered=False)
        migrate.upgrade(empty_db_url)
        assert asyncio.run(_prune(empty_db_url, _feed(max_rows=5))) == 7
        assert _retained(engine) == {"busy": busy[-5:], "quiet": quiet}
        assert _retained_counts(engine) == {"busy": 5, "quiet": 2}
    finally:
        engine.dispose()


@pytest.mark.spec("HOST-OBS-2")
def test_over_the_wire_a_quiet_workspace_keeps_its_cursor_while_a_busy_one_is_pruned(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(
        live_server,
        migrated_db_url,
        activity_event_max_rows=2,
        activity_event_prune_interval_seconds=0.05,
    )
    quiet = Watcher(host.server.channel, workspace_id="ws-2", after_event_id=0)
    quiet.wait_ready()
    host.stub.CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id="ws-2",
            agent_target_id=TARGET_ID,
            session_id="q1",
            title="quiet",
            cwd="/nonexistent/workspace",
        ),
        metadata=auth_metadata("ws2-device"),
    )
    quiet_events = quiet.wait_for(lambda events: len(events) >= 1)
    quiet.cancel()
    for index in range(6):
        host.stub.RenameSession(
            host_pb2.RenameSessionRequest(workspace_id=WS, session_id="s1", title=f"t{index}"),
            metadata=DEVICE,
        )
    engine = create_sync_engine_for(migrated_db_url)
    try:
        assert _eventually(lambda: len(_retained(engine).get(WS, [])) <= 2), "never pruned"
        assert _retained(engine)["ws-2"] == [e.event_id for e in quiet_events]
    finally:
        engine.dispose()
    again = Watcher(host.server.channel, workspace_id="ws-2", after_event_id=0)
    replayed = again.wait_for(lambda events: len(events) >= len(quiet_events))
    again.cancel()
    assert [e.event_id for e in replayed] == [e.event_id for e in quiet_events]
    busy = Watcher(host.server.channel, workspace_id=WS, after_event_id=0)
    busy.wait_done()
    assert busy.error is not None
    assert busy.error.code() == grpc.StatusCode.OUT_OF_RANGE
    assert error_reason(busy.error) == "EVENT_CURSOR_EXPIRED"


@pytest.mark.spec("HOST-OBS-2")
def test_a_prune_during_the_catch_up_ends_the_watch_out_of_range_instead_of_skipping(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    """The cursor was valid when checked; a prune then removes events the catch-up has not
    read yet. The next page read sees the new bound and refuses instead of skipping them."""
    ids = _append(sync_engine, "ws-race", NOW - 900, 10)
    feed = ActivityFeed(
        lambda: NOW, settings=FeedSettings(page_size=2, max_rows=3, retention_seconds=7 * 86400)
    )

    async def scenario() -> tuple[list[int], OutOfRange]:
        database = Database(migrated_db_url)
        await database.start()
        stream = watch_activity(feed, database, "ws-race", 0)
        try:
            assert isinstance(await anext(stream), WatchReady)
            seen = [int((await anext(stream)).event_id) for _ in range(2)]  # type: ignore[union-attr]
            assert await feed.prune(database) == 7  # keeps the newest 3
            with pytest.raises(OutOfRange) as refused:
                await anext(stream)  # the next page: without the check, ids[7:] (a silent gap)
            return seen, refused.value
        finally:
            await stream.aclose()
            await database.stop()

    seen, error = asyncio.run(scenario())
    assert seen == ids[:2], "nothing after the pruned gap was streamed"
    assert error.reason == "EVENT_CURSOR_EXPIRED"


@pytest.mark.spec("HOST-OBS-2")
def test_a_prune_inside_a_live_gap_names_the_oldest_retained_event_like_the_catch_up(
    migrated_db_url: str, sync_engine: Engine
) -> None:
    """A live stream reading a gap by sequence finds it pruned: its expiry carries the same
    ``oldest_retained_event_id`` as a catch-up expiry, plus the sequence cursor."""
    _append(sync_engine, "ws-live", NOW - 900)
    feed = ActivityFeed(
        lambda: NOW, ProtoEventCodec(), FeedSettings(max_rows=1, idle_check_seconds=600.0)
    )

    async def scenario() -> tuple[list[int], OutOfRange]:
        database = Database(migrated_db_url)
        await database.start()
        stream = watch_activity(feed, database, "ws-live", None)
        try:
            ready = await anext(stream)
            assert isinstance(ready, WatchReady)
            assert ready.head_workspace_seq == 1
            live = asyncio.ensure_future(anext(stream))
            # Another writer's events (not published here), then all but the newest pruned.
            gap = _append(sync_engine, "ws-live", NOW - 800, 3)
            assert await feed.prune(database) == 3

            async def local(tx: HostTransaction) -> None:
                tx.session_rows.request_reconcile("ws-live", "local")

            await unit_of_work.run(database, local, outbox=feed.log)  # past the gap
            with pytest.raises(OutOfRange) as refused:
                async with asyncio.timeout(30):
                    await live
            return gap, refused.value
        finally:
            await stream.aclose()
            await database.stop()

    gap, error = asyncio.run(scenario())
    assert error.reason == "EVENT_CURSOR_EXPIRED"
    assert error.metadata["after_workspace_seq"] == "1"
    assert error.metadata["oldest_retained_event_id"] == str(gap[1] + 1) == str(gap[2])
