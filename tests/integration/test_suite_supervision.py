"""``tutti up`` owns its children: it always stops, and none outlives it (OPS-3)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.suite_process import process_alive, running_suite
from tutti.suite import COMPANIONS, SUITE

pytestmark = pytest.mark.slow

EVERY_PROCESS = {*SUITE, *COMPANIONS}


def _wait_gone(pids: dict[str, int], timeout: float) -> set[str]:
    """Names whose process is still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {name for name in alive if process_alive(pids[name])}
        time.sleep(0.05)
    return alive


@pytest.mark.spec("OPS-3")
def test_sigint_stops_the_suite_even_when_started_with_sigint_ignored(tmp_path: Path) -> None:
    """A background job of a script inherits SIGINT ignored; tutti up still stops on it."""
    with running_suite(tmp_path, ignore_sigint=True) as suite:
        suite.wait_ready()
        pids = suite.child_pids()
        assert set(pids) == EVERY_PROCESS
        signalled = time.monotonic()
        suite.signal(signal.SIGINT)
        assert suite.wait_exit(timeout=30) == 0, suite.output
        # The default grace is 10 s; a clean drain of idle servers takes far less.
        assert time.monotonic() - signalled < 10, suite.output
        assert _wait_gone(pids, timeout=1) == set(), suite.output
        assert "stopping (SIGINT)" in suite.output
        assert suite.output.rstrip().endswith("stopped"), suite.output


@pytest.mark.spec("OPS-3")
def test_kill_9_of_tutti_up_leaves_no_server_running(tmp_path: Path) -> None:
    """The children's parent-death signal drains and ends each of them."""
    with running_suite(tmp_path) as suite:
        suite.wait_ready()
        pids = suite.child_pids()
        assert set(pids) == EVERY_PROCESS
        os.kill(suite.process.pid, signal.SIGKILL)
        suite.wait_exit(timeout=10)
        # Each child drains within its own grace (the supervisor's grace minus 2 s).
        leftovers = _wait_gone(pids, timeout=20)
        assert leftovers == set(), f"orphans outlived tutti up: {leftovers}\n{suite.output}"


@pytest.mark.spec("OPS-3")
def test_a_child_that_does_not_stop_is_killed_after_the_grace(tmp_path: Path) -> None:
    """A wedged server (stopped, so it cannot handle SIGTERM) is killed at the grace's end."""
    grace = 3.0
    with running_suite(tmp_path, args=("--grace", str(grace))) as suite:
        suite.wait_ready()
        pids = suite.child_pids()
        os.kill(pids["refresolve"], signal.SIGSTOP)
        signalled = time.monotonic()
        suite.signal(signal.SIGTERM)
        code = suite.wait_exit(timeout=grace + 15)
        elapsed = time.monotonic() - signalled
        assert code == 1, suite.output
        assert grace <= elapsed < grace + 10, (elapsed, suite.output)
        assert "killed refresolve after 3 s" in suite.output
        assert _wait_gone(pids, timeout=1) == set(), suite.output


@pytest.mark.spec("OPS-3")
def test_a_second_signal_kills_at_once(tmp_path: Path) -> None:
    """Impatient Ctrl-C twice: the wedged server is killed without waiting out the grace."""
    grace = 30.0
    with running_suite(tmp_path, args=("--grace", str(grace))) as suite:
        suite.wait_ready()
        pids = suite.child_pids()
        os.kill(pids["maintenance"], signal.SIGSTOP)
        suite.signal(signal.SIGINT)
        suite.wait_for("stopping (SIGINT)", timeout=10)
        signalled = time.monotonic()
        suite.signal(signal.SIGINT)
        assert suite.wait_exit(timeout=15) == 1, suite.output
        assert time.monotonic() - signalled < 10
        killed = next(line for line in suite.lines if line.startswith("killed "))
        assert "maintenance" in killed, suite.output
        assert killed.rstrip().endswith("at once"), suite.output
        assert _wait_gone(pids, timeout=1) == set(), suite.output
