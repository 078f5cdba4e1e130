"""Acknowledgements a commit waits for (HOST-RT-2 across replicas, SCALE-3).

A committed confirmation must never overtake the deltas it confirms on any replica. Items
published on different connections are ordered only by when the log stored them, so the
publisher of the deltas sends them pipelined (:meth:`~livelog.LiveLog.send`) and, before the
transaction that confirms them commits, waits for their acknowledgements here. Whatever
then publishes the commit, on whatever connection, lands after them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from livelog.interface import LiveLog, LiveLogUnavailable, PublishAck

__all__ = ["AckBarrier", "Settled"]

T = TypeVar("T")


@dataclass(frozen=True)
class Settled:
    """The outcome of the sends a key waited for.

    Attributes:
        acknowledged: Items the log holds.
        failed: Items the log may not hold (no acknowledgement). Their workspace is marked:
            the log's next publication there carries a ``PUBLISH_FAILED`` gap record.
    """

    acknowledged: int
    failed: int


class AckBarrier(Generic[T]):
    """Pending acknowledgements per key (a Session), awaited before its next commit."""

    def __init__(self, log: LiveLog[T]) -> None:
        self._log = log
        self._pending: dict[Hashable, list[Awaitable[PublishAck]]] = {}

    async def send(self, key: Hashable, workspace_id: str, item: T, msg_id: str) -> None:
        """Send an item now and remember its acknowledgement under ``key``.

        Raises:
            LiveLogUnavailable: the item could not be sent (nothing is remembered).
        """
        ack = await self._log.send(workspace_id, item, msg_id)
        self._pending.setdefault(key, []).append(ack)

    def pending(self, key: Hashable) -> int:
        """Acknowledgements still remembered under ``key``."""
        return len(self._pending.get(key, ()))

    async def settle(self, key: Hashable) -> Settled:
        """Wait for every acknowledgement remembered under ``key`` and forget them."""
        acks = self._pending.pop(key, [])
        if not acks:
            return Settled(0, 0)
        # One after the other, not gathered: they complete on their own, so this waits
        # about as long as the slowest, and an acknowledgement already in costs no task.
        failed = 0
        for ack in acks:
            try:
                await ack
            except LiveLogUnavailable:
                failed += 1
        return Settled(len(acks) - failed, failed)
