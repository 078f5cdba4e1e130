"""The relay republishes committed events whose post-commit publication was lost (SCALE-3).

Host's gap-free per-workspace event sequence is built elsewhere; here a fake durable log
stands in for it (same interface), and the live log is real (both engines).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import pytest

from livelog.interface import (
    LiveLog,
    LiveLogSubscription,
    LiveLogUnavailable,
    LogEntry,
    LogPosition,
    PublishAck,
)
from livelog.relay import CommittedRelay, DurableEvent
from tests.integration.livelog.collect import take
from tests.integration.livelog.conftest import Engine

pytestmark = [pytest.mark.spec("SCALE-3")]

MakeEngine = Callable[..., Engine]


class FakeDurableLog:
    """Committed events per workspace, by gap-free sequence (Host's event table stands here)."""

    def __init__(self) -> None:
        self.events: dict[str, list[DurableEvent[bytes]]] = {}
        self.reads = 0

    def commit(self, workspace_id: str, count: int) -> list[DurableEvent[bytes]]:
        events = self.events.setdefault(workspace_id, [])
        added = []
        for _ in range(count):
            sequence = len(events) + 1
            event = DurableEvent(
                sequence, f"ev:{workspace_id}:{sequence}", f"event {sequence}".encode()
            )
            events.append(event)
            added.append(event)
        return added

    async def read_after(
        self, workspace_id: str, sequence: int, limit: int
    ) -> Sequence[DurableEvent[bytes]]:
        self.reads += 1
        return [e for e in self.events.get(workspace_id, []) if e.sequence > sequence][:limit]


class MemoryCursors:
    def __init__(self) -> None:
        self.through: dict[str, int] = {}

    async def load(self, workspace_id: str) -> int:
        return self.through.get(workspace_id, 0)

    async def save(self, workspace_id: str, sequence: int) -> None:
        self.through[workspace_id] = sequence


def test_the_relay_republishes_lost_commits_once_and_the_log_drops_the_rest(
    make_engine: MakeEngine,
) -> None:
    engine = make_engine()

    async def scenario() -> None:
        log = await engine.open()
        reader = await engine.open()
        durable = FakeDurableLog()
        start = LogPosition((await log.publish("ws", b"start", "start")).position.epoch, 0)

        # Events 1-4 were published after their commit; 5-7 committed, then the process died
        # before publishing them (the post-commit publish is lost).
        for event in durable.commit("ws", 7)[:4]:
            await log.publish("ws", event.item, event.msg_id)

        cursors = MemoryCursors()
        relay = CommittedRelay(log, durable, cursors, batch_size=3)
        run = await relay.run_once("ws")
        assert (run.published, run.duplicates, run.through) == (3, 4, 7)
        assert cursors.through == {"ws": 7}

        subscription = await reader.subscribe("ws", start)
        events = await take(subscription, 8)
        entries = [event for event in events if isinstance(event, LogEntry)]
        assert [entry.msg_id for entry in entries] == ["start"] + [
            f"ev:ws:{n}" for n in range(1, 8)
        ]

        # A second pass has nothing to do; newly committed events go out once.
        assert await relay.run_once("ws") == type(run)(0, 0, 7)
        durable.commit("ws", 2)
        assert await relay.run_once("ws") == type(run)(2, 0, 9)
        more = await take(subscription, 2)
        assert [e.msg_id for e in more if isinstance(e, LogEntry)] == ["ev:ws:8", "ev:ws:9"]
        await engine.close()

    asyncio.run(scenario())


class FailingAfter:
    """A live log that fails after ``allowed`` publications (the bus went away)."""

    def __init__(self, log: LiveLog[bytes], allowed: int) -> None:
        self._log = log
        self.allowed = allowed

    async def publish(self, workspace_id: str, item: bytes, msg_id: str) -> PublishAck:
        if self.allowed <= 0:
            raise LiveLogUnavailable("bus down")
        self.allowed -= 1
        return await self._log.publish(workspace_id, item, msg_id)

    async def send(self, workspace_id: str, item: bytes, msg_id: str) -> Awaitable[PublishAck]:
        if self.allowed <= 0:
            raise LiveLogUnavailable("bus down")
        self.allowed -= 1
        return await self._log.send(workspace_id, item, msg_id)

    async def subscribe(
        self, workspace_id: str, after: LogPosition | None
    ) -> LiveLogSubscription[bytes]:
        return await self._log.subscribe(workspace_id, after)

    async def close(self) -> None:
        await self._log.close()


def test_a_relay_that_fails_keeps_its_cursor_at_the_last_acknowledged_event(
    make_engine: MakeEngine,
) -> None:
    engine = make_engine()

    async def scenario() -> None:
        log = await engine.open()
        durable = FakeDurableLog()
        durable.commit("ws", 5)
        cursors = MemoryCursors()
        flaky = FailingAfter(log, allowed=2)
        with pytest.raises(LiveLogUnavailable):
            await CommittedRelay(flaky, durable, cursors, batch_size=10).run_once("ws")
        assert cursors.through == {"ws": 2}

        flaky.allowed = 100
        run = await CommittedRelay(flaky, durable, cursors).run_once("ws")
        assert (run.published, run.duplicates, run.through) == (3, 0, 5)
        await engine.close()

    asyncio.run(scenario())
