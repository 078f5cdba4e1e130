"""A fake wall clock for maintenance tests (MAINT-SCHED-1): time moves only when told.

The server under test runs on its own event loop in a background thread; the test thread
moves time with :meth:`FakeClock.advance`, which wakes every sleeper whose instant has come
(thread-safely, on the sleeper's loop).
"""

from __future__ import annotations

import asyncio
import threading
import time

__all__ = ["FakeClock"]


class FakeClock:
    """Implements ``services.maintenance.clock.Clock``."""

    def __init__(self, start_unix_ms: int) -> None:
        self._now = start_unix_ms
        self._lock = threading.Lock()
        self._sleepers: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def now_ms(self) -> int:
        """The fake now."""
        with self._lock:
            return self._now

    async def sleep_until(self, unix_ms: int) -> None:
        """Wait until the fake clock reaches ``unix_ms``."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if unix_ms <= self._now:
                return
            entry = (unix_ms, loop, future)
            self._sleepers.append(entry)
        try:
            await future
        finally:
            with self._lock:
                if entry in self._sleepers:
                    self._sleepers.remove(entry)

    def advance(self, seconds: float) -> None:
        """Move time forward and wake the sleepers that are due."""
        with self._lock:
            self._now += int(seconds * 1000)
            due = [entry for entry in self._sleepers if entry[0] <= self._now]
            for entry in due:
                self._sleepers.remove(entry)
        for _, loop, future in due:
            loop.call_soon_threadsafe(_wake, future)

    def sleepers(self) -> list[int]:
        """Instants the sleepers wait for."""
        with self._lock:
            return sorted(entry[0] for entry in self._sleepers)

    def wait_for_sleeper(self, at_least_unix_ms: int, timeout: float = 30.0) -> None:
        """Block until someone sleeps until ``at_least_unix_ms`` or later (a check finished
        and planned the next one)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(at >= at_least_unix_ms for at in self.sleepers()):
                return
            time.sleep(0.01)
        raise AssertionError(f"no sleeper until >= {at_least_unix_ms}: {self.sleepers()}")


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
