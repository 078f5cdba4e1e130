"""The automatic run's claim: two workers deciding the same day run it once (SCALE-5).

The lease keeps one worker at a time, but a worker that lost its lease may still be between
its decision and its first batch while another takes over. The store closes that gap: the
decision and the claim are one transaction, so of any number of racing deciders exactly one
runs the day. Both backends; the deciders use separate engines, as separate replicas do.
"""

from __future__ import annotations

import asyncio
import functools
import threading

import pytest

from services.maintenance.lease import SingleNodeLease
from services.maintenance.records import CompletionMarkers
from store.database import Database
from tests.integration.maintenance.stack import Stack, fake_clock
from tests.support.fake_clock import FakeClock
from tests.support.polling import eventually
from tests.support.session_trees import sessions

DAY_MS = 24 * 3600 * 1000
CLAIM_MS = 600_000
FIRST_S = 600


async def _markers_on(url: str, replicas: int) -> list[tuple[Database, CompletionMarkers]]:
    started = []
    for _ in range(replicas):
        database = Database(url)
        await database.start()
        started.append((database, CompletionMarkers(database)))
    return started


@pytest.mark.spec("SCALE-5", "MAINT-SCHED-1")
def test_racing_deciders_claim_the_day_once(migrated_db_url: str) -> None:
    asyncio.run(_racing_deciders(migrated_db_url))


async def _racing_deciders(migrated_db_url: str) -> None:
    replicas = await _markers_on(migrated_db_url, 2)
    try:
        now = 1_000 * DAY_MS
        deciders = [markers for _, markers in replicas for _ in range(4)]
        tokens = await asyncio.gather(
            *(markers.claim_automatic(now, DAY_MS, CLAIM_MS) for markers in deciders)
        )
        won = [token for token in tokens if token is not None]
        assert len(won) == 1, tokens
        first, second = replicas[0][1], replicas[1][1]

        # A live claim keeps everyone else out; a stopped run frees it for the next check
        # without writing the daily marker.
        assert await second.claim_automatic(now + 1, DAY_MS, CLAIM_MS) is None
        renewed = await first.renew_claim(won[0], now + 2, CLAIM_MS)
        assert renewed is not None
        assert renewed > won[0]
        assert await first.renew_claim(won[0], now + 3, CLAIM_MS) is None, "a stale token"
        await first.finish_claim(renewed, now + 4, completed=False)
        assert await first.get() is None

        # The next decision races again; the completed run moves the marker and closes the
        # day for every decider, racing or late.
        tokens = await asyncio.gather(
            *(markers.claim_automatic(now + 5, DAY_MS, CLAIM_MS) for markers in deciders)
        )
        won = [token for token in tokens if token is not None]
        assert len(won) == 1, tokens
        await second.finish_claim(won[0], now + 6, completed=True)
        assert await first.get() == now + 6
        late = await asyncio.gather(
            *(markers.claim_automatic(now + DAY_MS, DAY_MS, CLAIM_MS) for markers in deciders)
        )
        assert late == [None] * len(deciders)

        # A claim whose worker died (never finished) frees the day once it expires.
        due = now + 6 + DAY_MS
        orphan = await first.claim_automatic(due, DAY_MS, CLAIM_MS)
        assert orphan is not None
        assert await second.claim_automatic(due + CLAIM_MS - 1, DAY_MS, CLAIM_MS) is None
        taken = await second.claim_automatic(due + CLAIM_MS, DAY_MS, CLAIM_MS)
        assert taken is not None
        assert taken > orphan
        # The dead worker's late finish touches neither the new claim nor the marker.
        await first.finish_claim(orphan, due + CLAIM_MS + 1, completed=True)
        assert await first.get() == now + 6
        assert await second.renew_claim(taken, due + CLAIM_MS + 2, CLAIM_MS) is not None
    finally:
        for database, _ in replicas:
            await database.stop()


def both_sleep(clock: FakeClock, at_least_unix_ms: int) -> bool:
    """Both schedulers sleep until ``at_least_unix_ms`` or later (their checks finished)."""
    return len([at for at in clock.sleepers() if at >= at_least_unix_ms]) >= 2


@pytest.mark.spec("SCALE-5", "MAINT-SCHED-1")
def test_two_workers_at_the_same_check_run_the_day_once(stack: Stack) -> None:
    """Two replicas that both believe they are the worker (the overlap a lost lease can
    leave) wake at the same check, on separate threads and engines: one run per day."""
    clock = fake_clock()
    ready_at = clock.now_ms()
    workers = [stack.maintenance(clock, lease=SingleNodeLease()) for _ in range(2)]
    for day in range(3):
        stack.tombstone({f"day{day}": None})
        target = ready_at + FIRST_S * 1000 + day * DAY_MS
        assert eventually(lambda: both_sleep(clock, ready_at + FIRST_S * 1000), timeout=30)
        clock.advance((target - clock.now_ms()) / 1000)
        # Both schedulers check now; then both sleep again, past the target.
        assert eventually(functools.partial(both_sleep, clock, target + 1), timeout=30)
        assert all(worker.parts.scheduler.checks >= day + 1 for worker in workers)
        runs = sum(worker.parts.metrics.runs_automatic for worker in workers)
        assert runs == day + 1, f"day {day}: {runs} automatic runs"
        assert f"day{day}" not in sessions(stack.engine)
        assert workers[0].status().last_completed_run_unix_ms == target


@pytest.mark.spec("SCALE-5")
def test_claim_holds_across_threads(migrated_db_url: str) -> None:
    """Deciders on separate threads and event loops (true parallelism toward the store)."""
    results: list[int | None] = []
    barrier = threading.Barrier(4)
    lock = threading.Lock()

    def decide() -> None:
        async def main() -> int | None:
            database = Database(migrated_db_url)
            await database.start()
            try:
                barrier.wait(timeout=30)
                return await CompletionMarkers(database).claim_automatic(
                    5 * DAY_MS, DAY_MS, CLAIM_MS
                )
            finally:
                await database.stop()

        token = asyncio.run(main())
        with lock:
            results.append(token)

    threads = [threading.Thread(target=decide) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 4
    assert len([token for token in results if token is not None]) == 1, results
