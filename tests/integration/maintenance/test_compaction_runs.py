"""Compaction as a step of a run (MAINT-VAC-1): only an explicit manual sweep asks for it, only
after its final idle batch, only when the database is small and a quarter is reclaimable."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from agentactivity.maintenance.v1 import maintenance_pb2
from tests.integration.maintenance.stack import Stack, fake_clock
from tests.support.session_trees import add_messages, add_tree

RUN = maintenance_pb2
BIG = "x" * 2000


def seed(stack: Stack, count: int = 40) -> list[str]:
    ids = [f"big{i}" for i in range(count)]
    stack.tombstone(dict.fromkeys(ids))
    add_messages(stack.engine, ids, 50, payload='{"text":"' + BIG + '"}')
    return ids


@pytest.mark.spec("MAINT-VAC-1")
def test_a_manual_sweep_with_compact_vacuums_when_both_conditions_hold(
    stack: Stack, backend: str
) -> None:
    seed(stack)
    m = stack.maintenance(fake_clock())
    run = m.purge("ws-1", compact=True).run
    assert run.state == RUN.MAINTENANCE_RUN_STATE_COMPLETED
    if backend == "postgres":
        assert run.compaction.outcome == RUN.COMPACTION_OUTCOME_SKIPPED_UNSUPPORTED_BACKEND
        return
    assert run.compaction.outcome == RUN.COMPACTION_OUTCOME_COMPLETED
    assert run.compaction.reclaimable_fraction_before >= 0.25
    assert run.compaction.size_after_bytes < run.compaction.size_before_bytes
    assert m.status().database.reclaimable_fraction < 0.25


@pytest.mark.spec("MAINT-VAC-1")
@pytest.mark.parametrize(
    ("overrides", "outcome"),
    [
        ({"compaction_max_size_bytes": 4096}, "SKIPPED_DATABASE_TOO_LARGE"),
        ({"compaction_min_reclaimable_fraction": 0.99}, "SKIPPED_TOO_LITTLE_RECLAIMABLE"),
    ],
)
def test_compaction_is_skipped_unless_both_conditions_hold(
    stack: Stack, backend: str, overrides: dict[str, Any], outcome: str
) -> None:
    if backend == "postgres":
        pytest.skip("Postgres never compacts (ADR 0020); covered by the test above")
    seed(stack)
    m = stack.maintenance(fake_clock(), **overrides)
    run = m.purge("ws-1", compact=True).run
    assert run.compaction.outcome == RUN.CompactionOutcome.Value(f"COMPACTION_OUTCOME_{outcome}")
    assert not run.compaction.HasField("size_after_bytes")
    assert m.status().database.reclaimable_fraction >= 0.25, "nothing was compacted"


@pytest.mark.spec("MAINT-VAC-1")
def test_automatic_runs_never_compact(stack: Stack, backend: str) -> None:
    seed(stack)
    clock = fake_clock()
    m = stack.maintenance(clock)
    clock.advance(600)
    clock.wait_for_sleeper(clock.now_ms() + 1)
    last = m.status().last_run
    assert last.trigger == RUN.RUN_TRIGGER_AUTOMATIC
    assert last.progress.sessions_purged == 40
    assert last.compaction.outcome == RUN.COMPACTION_OUTCOME_NOT_REQUESTED
    database = m.status().database
    if backend == "sqlite":
        assert database.compaction_eligible, "it could have compacted, and did not"
        assert database.reclaimable_fraction >= 0.25


@pytest.mark.spec("MAINT-VAC-1", "MAINT-IDLE-1")
def test_compaction_waits_for_a_complete_idle_run(stack: Stack) -> None:
    seed(stack, 4)
    add_tree(stack.engine, {"live": None})

    class StartsWork:
        def __init__(self, host: Any, after: int) -> None:
            self._host, self._after, self.batches = host, after, 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self._host, name)

        async def purge_workspace(self, *args: Any, **kwargs: Any) -> Any:
            result = await self._host.purge_workspace(*args, **kwargs)
            if not kwargs.get("dry_run"):
                self.batches += 1
                if self.batches == self._after:
                    stack.start_turn("live", f"t-{uuid.uuid4().hex}")
            return result

    # Work begins after the first of two batches: the run is incomplete.
    m = stack.maintenance(
        fake_clock(),
        wrap=lambda host: StartsWork(host, 1),
        maintenance_manual_batch_components=2,
    )
    run = m.purge("ws-1", compact=True).run
    assert run.state == RUN.MAINTENANCE_RUN_STATE_STOPPED_AGENT_ACTIVE
    assert run.compaction.outcome == RUN.COMPACTION_OUTCOME_SKIPPED_RUN_INCOMPLETE
    m.server.stop()

    # Work begins right after the final batch: the gate is checked again before compacting.
    stack.settle_turns()
    m = stack.maintenance(
        fake_clock(),
        wrap=lambda host: StartsWork(host, 1),
        maintenance_manual_batch_components=10,
    )
    run = m.purge("ws-1", compact=True).run
    assert run.state == RUN.MAINTENANCE_RUN_STATE_COMPLETED
    assert run.compaction.outcome == RUN.COMPACTION_OUTCOME_SKIPPED_AGENT_ACTIVE
