"""The time source of maintenance: wall-clock milliseconds and sleeping until an instant.

Everything time-dependent in maintenance (the schedule, the daily marker, the retention
cutoff, cleanup backoff) reads this one clock, so tests drive it with a fake clock instead
of waiting minutes (MAINT-SCHED-1).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """A wall clock that can be slept on."""

    def now_ms(self) -> int:
        """Unix milliseconds now."""
        ...

    async def sleep_until(self, unix_ms: int) -> None:
        """Return at or after ``unix_ms`` (at once when it has passed)."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        """Unix milliseconds now."""
        return time.time_ns() // 1_000_000

    async def sleep_until(self, unix_ms: int) -> None:
        """Sleep until ``unix_ms`` of the wall clock.

        asyncio sleeps on the monotonic clock, so the wall clock is read again after each
        sleep.
        """
        while (remaining := unix_ms - self.now_ms()) > 0:  # noqa: ASYNC110 - a deadline, not an event
            await asyncio.sleep(remaining / 1000)
