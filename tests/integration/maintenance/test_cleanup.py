"""Resource cleanup after purges (MAINT-OUT-1, HOST-CLEAN-1): the three resource classes, the
ownership facts from Host, retries with backoff, and no effect on the purge result."""

from __future__ import annotations

import shutil

import pytest

from agentactivity.maintenance.v1 import maintenance_pb2
from tests.integration.maintenance.stack import Stack, fake_clock
from tests.support.session_trees import add_tree, sessions

RUN = maintenance_pb2
ALL = {"session", "workspace", "agent_lease"}


@pytest.mark.spec("MAINT-OUT-1", "HOST-CLEAN-1")
def test_unowned_session_releases_every_class_and_completes_the_row(stack: Stack) -> None:
    stack.tombstone({"solo": None})
    stack.create_resources("ws-1", "solo")
    worktree = stack.resources.parent / "worktrees" / "ws-1" / "solo"
    worktree.mkdir(parents=True)
    m = stack.maintenance(fake_clock())
    run = m.purge("ws-1").run
    assert (run.cleanup.attempted, run.cleanup.completed, run.cleanup.failed) == (1, 1, 0)
    assert stack.resource_classes("ws-1", "solo") == set()
    assert stack.pending_cleanups() == set()
    assert worktree.is_dir(), "managed worktrees are never touched"


@pytest.mark.spec("MAINT-OUT-1", "HOST-CLEAN-1")
def test_an_id_still_owned_by_a_tombstone_in_another_workspace_keeps_its_resources(
    stack: Stack,
) -> None:
    stack.tombstone({"shared": None}, workspace_id="ws-1")
    stack.tombstone({"shared": None}, workspace_id="ws-2")
    stack.create_resources("ws-1", "shared")
    stack.create_resources("ws-2", "shared")
    m = stack.maintenance(fake_clock())

    m.purge("ws-1")
    # ws-2's tombstone owns the id: Session-keyed files stay; ws-1's scratch goes; the
    # global lease is released (the other owner is not live).
    assert stack.resource_classes("ws-1", "shared") == {"session"}
    assert stack.resource_classes("ws-2", "shared") == ALL - {"agent_lease"}
    assert stack.pending_cleanups() == set()

    # The second workspace row for the same id: now nobody owns it; releasing what is
    # already gone is fine (idempotent).
    m.purge("ws-2")
    assert stack.resource_classes("ws-2", "shared") == set()
    assert stack.resource_classes("ws-1", "shared") == set()
    assert stack.pending_cleanups() == set()


@pytest.mark.spec("MAINT-OUT-1", "HOST-CLEAN-1")
def test_a_live_owner_in_another_workspace_skips_the_global_releaser(stack: Stack) -> None:
    stack.tombstone({"dup": None}, workspace_id="ws-1")
    add_tree(stack.engine, {"dup": None}, workspace_id="ws-2")
    stack.create_resources("ws-1", "dup")
    stack.create_resources("ws-2", "dup")
    m = stack.maintenance(fake_clock())
    run = m.purge("ws-1").run
    assert run.cleanup.completed == 1
    assert stack.resource_classes("ws-1", "dup") == {"session", "agent_lease"}
    assert stack.resource_classes("ws-2", "dup") == ALL
    assert "dup" in sessions(stack.engine, "ws-2")


@pytest.mark.spec("MAINT-OUT-1")
def test_a_cleanup_failing_twice_is_retried_with_backoff_and_the_purge_stands(
    stack: Stack,
) -> None:
    stack.tombstone({"stuck": None, "fine": None})
    stack.create_resources("ws-1", "stuck")
    stack.create_resources("ws-1", "fine")
    # A symlinked Session directory is never followed: that class fails until an operator
    # replaces it with the real directory.
    layout_sessions = stack.resources / "sessions"
    elsewhere = stack.resources.parent / "elsewhere"
    shutil.move(str(layout_sessions / "stuck"), str(elsewhere))
    (layout_sessions / "stuck").symlink_to(elsewhere)
    clock = fake_clock()
    m = stack.maintenance(clock, maintenance_cleanup_backoff_seconds=60)

    first = m.purge("ws-1")
    assert first.run.state == RUN.MAINTENANCE_RUN_STATE_COMPLETED
    assert sorted(first.purged_session_ids) == ["fine", "stuck"]
    assert (first.run.cleanup.completed, first.run.cleanup.failed) == (1, 1)
    assert sessions(stack.engine) == {}, "a failed cleanup does not undo the purge"
    assert stack.pending_cleanups() == {("ws-1", "stuck")}
    status = m.status()
    assert status.cleanup.pending_rows == 1
    assert status.cleanup.failing_rows == 1
    failure = status.cleanup.failing[0]
    assert (failure.session_id, failure.attempts) == ("stuck", 1)
    assert failure.next_attempt_at_unix_ms == clock.now_ms() + 60_000
    assert "stuck" in failure.last_error

    # Before the backoff expires a pass leaves it alone.
    assert m.purge("ws-1").run.cleanup.attempted == 0

    clock.advance(61)
    second = m.purge("ws-1").run
    assert (second.cleanup.attempted, second.cleanup.failed) == (1, 1)
    failure = m.status().cleanup.failing[0]
    assert failure.attempts == 2
    assert failure.next_attempt_at_unix_ms == clock.now_ms() + 120_000
    assert (elsewhere / "sidecar" / "state.json").exists(), "the symlink was not followed"

    (layout_sessions / "stuck").unlink()
    shutil.move(str(elsewhere), str(layout_sessions / "stuck"))
    # The next idle window (a scheduled check) retries it once the backoff has passed.
    clock.advance(600)
    clock.wait_for_sleeper(clock.now_ms() + 1)
    assert stack.pending_cleanups() == set()
    assert stack.resource_classes("ws-1", "stuck") == set()
    status = m.status()
    assert (status.cleanup.pending_rows, status.cleanup.failing_rows) == (0, 0)
    assert m.parts.metrics.cleanup_failures == 2
    assert m.parts.metrics.cleanup_retries == 2
    assert sessions(stack.engine) == {}
