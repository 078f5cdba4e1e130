"""A commit published on another connection never overtakes the deltas it confirms (SCALE-3,
HOST-RT-2): the deltas' publisher waits for their acknowledgements before the commit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from livelog.barrier import AckBarrier, Settled
from livelog.interface import LogEntry
from tests.integration.livelog.collect import take
from tests.integration.livelog.conftest import Engine

pytestmark = [pytest.mark.spec("SCALE-3", "HOST-RT-2")]

TURNS = 10
DELTAS = 40


def test_a_commit_from_another_replica_lands_after_the_acknowledged_deltas(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine()

    async def scenario() -> None:
        delta_replica = await engine.open()  # holds the runtime stream
        commit_replica = await engine.open()  # publishes the committed event (or a relay)
        device = await (await engine.open()).subscribe("ws", None)
        barrier = AckBarrier(delta_replica)
        for turn in range(TURNS):
            for index in range(DELTAS):
                await barrier.send(
                    "session-1", "ws", f"delta {turn}.{index}".encode(), f"d:{turn}:{index}"
                )
            assert barrier.pending("session-1") == DELTAS
            assert await barrier.settle("session-1") == Settled(DELTAS, 0)
            assert barrier.pending("session-1") == 0
            # ... the confirming transaction commits here, then its event is published:
            await commit_replica.publish("ws", f"commit {turn}".encode(), f"ev:ws:{turn}")

        events = await take(device, TURNS * (DELTAS + 1), deadline_seconds=30)
        items = [event.item for event in events if isinstance(event, LogEntry)]
        assert len(items) == TURNS * (DELTAS + 1)
        for turn in range(TURNS):
            commit_at = items.index(f"commit {turn}".encode())
            deltas_at = [items.index(f"delta {turn}.{n}".encode()) for n in range(DELTAS)]
            assert deltas_at == sorted(deltas_at), "one connection keeps its order"
            assert max(deltas_at) < commit_at, f"turn {turn}: a delta came after its commit"
        assert await barrier.settle("nothing pending") == Settled(0, 0)
        await engine.close()

    asyncio.run(scenario())
