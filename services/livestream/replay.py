"""Replay buffers of encoded deliveries, bounded per publisher and across them (LIVE-RESUME-1).

A :class:`ReplayBuffer` keeps a publisher's latest encoded deliveries up to its budget
(8 MiB by default), oldest evicted first. Every buffer also draws on one process-wide
:class:`ReplayMemory`: when the total would pass its cap, the largest buffer gives up its
oldest deliveries first (LIVE-FLOW-1: 1,000 full buffers must not become 8 GiB).
"""

from __future__ import annotations

__all__ = ["ReplayBuffer", "ReplayMemory"]


class ReplayMemory:
    """The process-wide bound on replay bytes."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self.used_bytes = 0
        self._buffers: set[ReplayBuffer] = set()

    def register(self, buffer: ReplayBuffer) -> None:
        """Account for ``buffer`` (its bytes count against the cap)."""
        self._buffers.add(buffer)

    def release(self, buffer: ReplayBuffer) -> None:
        """Forget ``buffer`` and the bytes it held."""
        if buffer in self._buffers:
            self._buffers.discard(buffer)
            buffer.clear()

    def make_room(self, needed: int, taker: ReplayBuffer) -> None:
        """Evict from the largest buffers until ``needed`` more bytes fit under the cap.

        Each time the cap is reached, the largest buffer gives up its oldest deliveries
        down to 1/32 of the cap below it, so the scan for the largest buffer runs once per
        that many appended bytes, not once per append.
        """
        if self.used_bytes + needed <= self.cap_bytes:
            return
        target = self.cap_bytes - max(needed, self.cap_bytes // 32)
        while self.used_bytes > target:
            victim = max(self._buffers, key=lambda b: b.bytes, default=None)
            if victim is None or not victim.held:
                return
            floor = max(0, victim.bytes - (self.used_bytes - target))
            while victim.held and victim.bytes > floor:
                victim._evict_oldest()


class ReplayBuffer:
    """One publisher's sequence of encoded deliveries since its epoch began.

    ``latest_sequence`` counts every delivery ever appended in the epoch; the buffer holds
    the contiguous tail ``oldest_sequence .. latest_sequence`` that fits the budget. The
    tail lives in a list with a moving head (compacted now and then), so reading the
    deliveries after a cursor costs what is read, and a call's lag in bytes is one
    subtraction of running totals.
    """

    def __init__(self, budget_bytes: int, memory: ReplayMemory) -> None:
        self.budget_bytes = budget_bytes
        self.bytes = 0
        self.latest_sequence = 0
        self._memory = memory
        self._entries: list[bytes] = []
        self._ends: list[int] = []  # running total of appended bytes through each entry
        self._head = 0
        self._appended_bytes = 0
        memory.register(self)

    @property
    def held(self) -> int:
        """How many deliveries the buffer holds."""
        return len(self._entries) - self._head

    @property
    def oldest_sequence(self) -> int | None:
        """The lowest sequence still held, or ``None`` when the buffer is empty."""
        if not self.held:
            return None
        return self.latest_sequence - self.held + 1

    def append(self, encoded: bytes) -> int:
        """Keep ``encoded`` as the next delivery; returns its sequence."""
        size = len(encoded)
        while self.held and self.bytes + size > self.budget_bytes:
            self._evict_oldest()
        self._memory.make_room(size, self)
        self._entries.append(encoded)
        self._appended_bytes += size
        self._ends.append(self._appended_bytes)
        self.bytes += size
        self._memory.used_bytes += size
        self.latest_sequence += 1
        return self.latest_sequence

    def restore(self, first_sequence: int, entries: tuple[bytes, ...] | list[bytes]) -> None:
        """Hold ``entries`` as deliveries ``first_sequence ..`` of an empty buffer (a hand-over).

        Room for all of them is made under the process-wide cap first (the largest other
        buffers give up their oldest deliveries, as for any append), so adopting a
        publisher keeps the process within its cap.

        Raises:
            ValueError: the buffer is not empty, or the entries exceed its budget or the cap.
        """
        total = sum(len(entry) for entry in entries)
        if self.held or self.latest_sequence:
            raise ValueError("restore needs an empty buffer")
        if total > self.budget_bytes or total > self._memory.cap_bytes:
            raise ValueError(f"{total} replay bytes exceed the budget or the process cap")
        self._memory.make_room(total, self)
        self.latest_sequence = first_sequence - 1
        for entry in entries:
            self.append(entry)
        if not self.holds_after(first_sequence - 1):
            raise ValueError("the process cap could not hold the restored deliveries")

    def holds_after(self, sequence: int) -> bool:
        """Whether every delivery after ``sequence`` is still held (replayable)."""
        if sequence >= self.latest_sequence:
            return True
        oldest = self.oldest_sequence
        return oldest is not None and sequence >= oldest - 1

    def _index(self, sequence: int) -> int:
        """List index of ``sequence`` (which must be held)."""
        return self._head + sequence - (self.latest_sequence - self.held + 1)

    def after(self, sequence: int, limit: int | None = None) -> list[bytes]:
        """The held deliveries after ``sequence`` in order (at most ``limit``)."""
        oldest = self.oldest_sequence
        if oldest is None or sequence >= self.latest_sequence:
            return []
        start = self._index(max(sequence + 1, oldest))
        end = len(self._entries) if limit is None else min(len(self._entries), start + limit)
        return self._entries[start:end]

    def bytes_after(self, sequence: int) -> int:
        """Encoded bytes of the held deliveries after ``sequence`` (a call's lag)."""
        oldest = self.oldest_sequence
        if oldest is None or sequence >= self.latest_sequence:
            return 0
        if sequence < oldest:
            return self.bytes
        return self._appended_bytes - self._ends[self._index(sequence)]

    def _evict_oldest(self) -> None:
        size = len(self._entries[self._head])
        self._head += 1
        self.bytes -= size
        self._memory.used_bytes -= size
        if self._head > 1024 and self._head * 2 > len(self._entries):
            del self._entries[: self._head]
            del self._ends[: self._head]
            self._head = 0

    def clear(self) -> None:
        """Drop every held delivery (its bytes return to the process-wide bound)."""
        self._memory.used_bytes -= self.bytes
        self.bytes = 0
        self._entries.clear()
        self._ends.clear()
        self._head = 0
