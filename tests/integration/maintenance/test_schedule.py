"""The automatic schedule and its durable daily marker (MAINT-SCHED-1), on a fake clock.

Host and maintenance are real servers on one store; only maintenance's clock is fake, so the
10-minute start, the 30-minute checks and the 24-hour spacing take no real time.
"""

from __future__ import annotations

import pytest

from agentactivity.maintenance.v1 import maintenance_pb2
from tests.integration.maintenance.stack import Stack, fake_clock
from tests.support.fake_clock import FakeClock
from tests.support.session_trees import add_tree, sessions

MINUTE_MS = 60_000
CHECK_S = 1800
FIRST_S = 600
DAY_S = 24 * 3600


def check_once(clock: FakeClock, seconds: float) -> None:
    """Move time by ``seconds`` and wait until the check due then has finished (the
    scheduler sleeps again, until a later instant)."""
    target = clock.now_ms() + int(seconds * 1000)
    clock.advance(seconds)
    clock.wait_for_sleeper(target + 1)


@pytest.mark.spec("MAINT-SCHED-1")
def test_first_check_ten_minutes_after_readiness_then_every_thirty(stack: Stack) -> None:
    clock = fake_clock()
    stack.tombstone({"early": None})
    ready_at = clock.now_ms()
    m = stack.maintenance(clock)
    clock.wait_for_sleeper(ready_at + FIRST_S * 1000)
    assert m.status().next_check_unix_ms == ready_at + FIRST_S * 1000

    clock.advance(FIRST_S - 1)
    assert "early" in sessions(stack.engine), "nothing runs before the first check"
    assert m.parts.scheduler.checks == 0

    check_once(clock, 1)
    assert m.parts.scheduler.checks == 1
    assert "early" not in sessions(stack.engine)
    status = m.status()
    assert status.last_completed_run_unix_ms == ready_at + FIRST_S * 1000
    assert status.next_check_unix_ms == ready_at + (FIRST_S + CHECK_S) * 1000
    assert status.next_run_eligible_at_unix_ms == status.last_completed_run_unix_ms + DAY_S * 1000
    assert status.last_run.trigger == maintenance_pb2.RUN_TRIGGER_AUTOMATIC
    assert status.last_run.state == maintenance_pb2.MAINTENANCE_RUN_STATE_COMPLETED


@pytest.mark.spec("MAINT-SCHED-1", "MAINT-PREF-1")
def test_completion_at_most_once_per_day_and_restart_adds_no_run(stack: Stack) -> None:
    clock = fake_clock()
    m = stack.maintenance(clock)
    check_once(clock, FIRST_S)
    marker = m.status().last_completed_run_unix_ms
    assert marker == clock.now_ms()

    # Tombstones created after the run wait for the next day, through every check.
    stack.tombstone({"later": None})
    for _ in range(3):
        check_once(clock, CHECK_S)
    assert "later" in sessions(stack.engine)
    assert m.parts.scheduler.checks == 4
    assert m.parts.metrics.runs_automatic == 1

    # A restart inside the 24 hours: the new process reads the marker and does not run.
    m.server.stop()
    restarted = stack.maintenance(clock)
    check_once(clock, FIRST_S)
    assert restarted.parts.scheduler.checks == 1
    assert restarted.parts.metrics.runs_automatic == 0
    assert "later" in sessions(stack.engine)
    assert restarted.status().last_completed_run_unix_ms == marker

    # The first check at or after marker + 24 h runs and moves the marker.
    while clock.now_ms() < marker + DAY_S * 1000:
        check_once(clock, CHECK_S)
    assert restarted.parts.metrics.runs_automatic == 1
    assert "later" not in sessions(stack.engine)
    assert restarted.status().last_completed_run_unix_ms >= marker + DAY_S * 1000


@pytest.mark.spec("MAINT-SCHED-1", "MAINT-IDLE-1")
def test_a_run_interrupted_by_agent_work_writes_no_marker_and_resumes(stack: Stack) -> None:
    clock = fake_clock()
    stack.tombstone({f"t{i}": None for i in range(6)})
    add_tree(stack.engine, {"live": None})

    batches: list[int] = []

    def wrap(host: object) -> object:
        class StartsWorkAfterFirstBatch:
            def __getattr__(self, name: str) -> object:
                return getattr(host, name)

            async def purge_expired(self, *args: object) -> object:
                result = await host.purge_expired(*args)  # type: ignore[attr-defined]
                batches.append(result.trees)
                if len(batches) == 1:
                    stack.start_turn("live", "turn-1")
                return result

        return StartsWorkAfterFirstBatch()

    m = stack.maintenance(clock, wrap=wrap, maintenance_batch_max_trees=2)  # type: ignore[arg-type]
    check_once(clock, FIRST_S)
    status = m.status()
    assert status.last_run.state == maintenance_pb2.MAINTENANCE_RUN_STATE_STOPPED_AGENT_ACTIVE
    assert status.last_run.progress.batches_completed == 1
    assert status.last_run.progress.more_remaining
    assert not status.HasField("last_completed_run_unix_ms"), "an interrupted run writes no marker"
    assert status.paused_by_idle_gate
    assert len([s for s in sessions(stack.engine) if s.startswith("t")]) == 4

    # Still active at the next check: the due run waits, nothing changes.
    check_once(clock, CHECK_S)
    assert len([s for s in sessions(stack.engine) if s.startswith("t")]) == 4
    assert m.status().paused_by_idle_gate

    stack.settle_turns()
    check_once(clock, CHECK_S)
    status = m.status()
    assert status.last_run.state == maintenance_pb2.MAINTENANCE_RUN_STATE_COMPLETED
    assert status.last_completed_run_unix_ms == clock.now_ms()
    assert not status.paused_by_idle_gate
    assert [s for s in sessions(stack.engine) if s.startswith("t")] == []
    assert m.parts.metrics.idle_gate_paused_ms == 2 * CHECK_S * 1000
