"""The log follower: events committed by another process reach this process's watchers (SCALE-1).

"Another process" is a second ``Database`` whose commits never pass through this feed's
broker: exactly what another Host replica's commits look like from here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

import pytest

from services.host.activity.events import SessionReconcileRequired
from services.host.activity.feed import (
    ActivityFeed,
    FeedSettings,
    WatchItem,
    WatchReady,
    watch_activity,
)
from services.host.repository import unit_of_work
from services.host.repository.activity_events import NewEventRow, StoredEvent
from services.host.repository.unit_of_work import HostTransaction
from services.host.wire.activity_codec import ProtoEventCodec
from store.database import Database


class RecordingHints:
    """A wake-hint source that records what the follower asks of it."""

    def __init__(self) -> None:
        self.wake: Callable[[str], None] | None = None
        self.watched: list[str] = []
        self.unwatched: list[str] = []
        self.stopped = False

    async def start(self, wake: Callable[[str], None]) -> None:
        self.wake = wake

    def watch(self, workspace_id: str) -> None:
        self.watched.append(workspace_id)

    def unwatch(self, workspace_id: str) -> None:
        self.unwatched.append(workspace_id)

    async def stop(self) -> None:
        self.stopped = True


async def _append_elsewhere(database: Database, workspace_id: str, sessions: list[str]) -> None:
    """Commit events without publishing them to any broker (another replica's commit)."""
    codec = ProtoEventCodec()

    async def command(tx: HostTransaction) -> None:
        await tx.events.append(
            [
                NewEventRow(
                    workspace_id,
                    session_id,
                    "session_reconcile_required",
                    codec.encode(workspace_id, 1, SessionReconcileRequired(session_id)),
                    1,
                )
                for session_id in sessions
            ]
        )

    await unit_of_work.run(database, command)


async def _next_stored(stream: AsyncGenerator[WatchItem, None], seconds: float) -> StoredEvent:
    async with asyncio.timeout(seconds):
        item = await anext(stream)
    assert isinstance(item, StoredEvent)
    return item


@pytest.mark.spec("SCALE-1", "HOST-OBS-2")
def test_a_wake_hint_brings_another_process_events_at_once_in_sequence(
    migrated_db_url: str,
) -> None:
    async def scenario() -> None:
        here, elsewhere = Database(migrated_db_url), Database(migrated_db_url)
        await here.start()
        await elsewhere.start()
        hints = RecordingHints()
        # A follow interval far beyond the test: only the hint can bring the events in time.
        feed = ActivityFeed(
            lambda: 1,
            ProtoEventCodec(),
            FeedSettings(idle_check_seconds=600.0),
            wake_hints=hints,
        )
        await feed.start(here)
        await _append_elsewhere(elsewhere, "ws-1", ["before"])
        stream = watch_activity(feed, here, "ws-1", None)
        ready = await anext(stream)
        assert isinstance(ready, WatchReady)
        assert ready.head_workspace_seq == 1
        assert hints.watched == ["ws-1"]

        await _append_elsewhere(elsewhere, "ws-1", ["a", "b"])
        await _append_elsewhere(elsewhere, "ws-2", ["other"])
        pending = asyncio.ensure_future(_next_stored(stream, 30))
        await asyncio.sleep(0.5)
        assert not pending.done()  # nothing polls this soon and nothing was published here
        assert hints.wake is not None
        hints.wake("ws-1")
        first = await pending
        second = await _next_stored(stream, 5)
        assert [(e.workspace_seq, e.session_id) for e in (first, second)] == [(2, "a"), (3, "b")]

        # This process's own commit streams at once and continues the same sequence.
        async def local(tx: HostTransaction) -> None:
            tx.session_rows.request_reconcile("ws-1", "mine")

        await unit_of_work.run(here, local, outbox=feed.log)
        mine = await _next_stored(stream, 5)
        assert (mine.workspace_seq, mine.session_id) == (4, "mine")

        await stream.aclose()
        assert hints.unwatched == ["ws-1"]
        assert feed.follower.watched() == {}
        await feed.stop(here)
        assert hints.stopped
        await here.stop()
        await elsewhere.stop()

    asyncio.run(scenario())


@pytest.mark.spec("SCALE-1", "HOST-OBS-2")
def test_the_bounded_poll_alone_delivers_interleaved_local_and_remote_commits_once(
    migrated_db_url: str,
) -> None:
    async def scenario() -> None:
        here, elsewhere = Database(migrated_db_url), Database(migrated_db_url)
        await here.start()
        await elsewhere.start()
        feed = ActivityFeed(lambda: 1, ProtoEventCodec(), FeedSettings(idle_check_seconds=0.05))
        await feed.start(here)
        stream = watch_activity(feed, here, "ws-1", None)
        assert isinstance(await anext(stream), WatchReady)

        async def local(tx: HostTransaction) -> None:
            tx.session_rows.request_reconcile("ws-1", "local")

        for round_index in range(10):
            await _append_elsewhere(elsewhere, "ws-1", [f"remote-{round_index}"])
            await unit_of_work.run(here, local, outbox=feed.log)
        seen = [await _next_stored(stream, 10) for _ in range(20)]
        assert [e.workspace_seq for e in seen] == list(range(1, 21))
        assert len({e.event_id for e in seen}) == 20
        # Nothing more: no event is delivered twice by the two paths.
        with pytest.raises(TimeoutError):
            await _next_stored(stream, 0.5)
        await stream.aclose()
        await feed.stop(here)
        await here.stop()
        await elsewhere.stop()

    asyncio.run(scenario())
