"""How ``tutti up`` and its children stay one unit (OPS-3).

Supervisor side: :class:`StopSignals` installs the supervisor's own SIGINT, SIGTERM and
SIGHUP handlers whatever dispositions it inherited (a background job of a non-interactive
shell, ``nohup`` and ``cmd &`` in a script all start it with SIGINT ignored). The first
signal asks for a graceful stop, a second one for an immediate kill.

Child side: :func:`follow_supervisor` runs first in every ``tutti serve`` started by the
supervisor. It arms the Linux parent-death signal, so even ``kill -9`` of the supervisor
sends the child SIGTERM and it drains and exits; where that is not available a watcher
thread notices the re-parenting instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Final

__all__ = ["SUPERVISOR_PID_ENV", "StopRequested", "StopSignals", "follow_supervisor"]

SUPERVISOR_PID_ENV: Final = "TUTTI_SUPERVISOR_PID"
"""Set by the supervisor in each child's environment: the pid the child must outlive never."""

_PR_SET_PDEATHSIG: Final = 1
_WATCH_INTERVAL_SECONDS: Final = 0.5

_log = logging.getLogger(__name__)


class StopRequested(Exception):
    """A stop signal arrived while the suite was starting."""


class StopSignals:
    """The supervisor's signal handlers (install them before starting anything)."""

    HANDLED: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.forced = threading.Event()
        self.received: str | None = None

    def install(self) -> None:
        """Handle SIGINT, SIGTERM and SIGHUP here, overriding inherited dispositions."""
        for signum in self.HANDLED:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.requested.is_set():
            self.forced.set()
        self.received = signal.Signals(signum).name
        self.requested.set()

    def check(self) -> None:
        """Raise :class:`StopRequested` once a stop was asked for."""
        if self.requested.is_set():
            raise StopRequested(self.received or "stop")


def follow_supervisor(signum: int = signal.SIGTERM) -> None:
    """Make this process receive ``signum`` when its supervisor dies (no-op unsupervised).

    Raises:
        SystemExit: the supervisor was already gone when this process started.
    """
    raw = os.environ.get(SUPERVISOR_PID_ENV)
    if not raw:
        return
    supervisor = int(raw)
    if not _arm_parent_death_signal(signum):
        threading.Thread(
            target=_watch_parent, args=(supervisor, signum), name="supervisor-watch", daemon=True
        ).start()
    # Armed after the fork: a supervisor that died in between is seen here instead.
    if os.getppid() != supervisor:
        raise SystemExit(f"supervisor {supervisor} exited before this service started")


def _arm_parent_death_signal(signum: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(supervisor: int, signum: int) -> None:
    stop = threading.Event()
    while not stop.wait(_WATCH_INTERVAL_SECONDS):
        if os.getppid() != supervisor:
            _log.warning("supervisor %d is gone; stopping", supervisor)
            os.kill(os.getpid(), signum)
            return
