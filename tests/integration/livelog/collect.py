"""Reading a subscription in tests: a number of entries under a deadline."""

from __future__ import annotations

import asyncio

from livelog.interface import Discontinuity, LiveLogSubscription, LogEntry

Event = LogEntry[bytes] | Discontinuity


async def take(
    subscription: LiveLogSubscription[bytes], entries: int, deadline_seconds: float = 15.0
) -> list[Event]:
    """Events until ``entries`` entries arrived (discontinuities included in the result)."""
    events: list[Event] = []

    async def run() -> None:
        count = 0
        if entries == 0:
            return
        async for event in subscription:
            events.append(event)
            if isinstance(event, LogEntry):
                count += 1
                if count >= entries:
                    return

    await asyncio.wait_for(run(), deadline_seconds)
    return events


def payloads(events: list[Event]) -> list[bytes]:
    """The items of the entries, in order."""
    return [event.item for event in events if isinstance(event, LogEntry)]
