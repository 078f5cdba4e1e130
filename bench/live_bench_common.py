"""What the processes of ``bench.live_bench`` agree on: ids, the delta text, the tally.

Every source delta's text is one fixed-width *op*: its send time (``time.perf_counter_ns``,
CLOCK_MONOTONIC, so it compares across processes of this machine), its index in the
producer's sequence, and padding to ``width`` characters. The livestream coalesces adjacent
appends (LIVE-COAL-1), so a delivered text is one or more whole ops; a receiver counts ops,
checks that their indexes continue exactly where the last delivery stopped, and (when asked)
takes one latency sample per op.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from agentactivity.canonical.v1 import canonical_pb2

__all__ = [
    "MIN_WIDTH",
    "SESSION",
    "WORKSPACE",
    "Tally",
    "op_text",
    "ops_text",
]

WORKSPACE = "ws-bench"
SESSION = "s-bench"
TARGET = "bench-target"
MESSAGE = "m-bench"


def text_delta(turn_id: str, text: str) -> canonical_pb2.MessageDelta:
    """One append-text delta of the bench Turn's message (the producers' unit of traffic)."""
    return canonical_pb2.MessageDelta(
        workspace_id=WORKSPACE,
        session_id=SESSION,
        turn_id=turn_id,
        message_id=MESSAGE,
        target=canonical_pb2.DELTA_TARGET_TEXT,
        operation=canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
        text=text,
    )


_STAMP = 19
_INDEX = 10
MIN_WIDTH = _STAMP + _INDEX
"""The smallest op: the send time and the index, no padding."""


def op_text(index: int, width: int, sent_ns: int | None = None) -> str:
    """One op's text (see the module docstring)."""
    stamp = time.perf_counter_ns() if sent_ns is None else sent_ns
    return f"{stamp:019d}{index:010d}".ljust(width, "x")


def ops_text(first: int, count: int, width: int) -> str:
    """``count`` consecutive ops in one text (what a coalesced delivery carries)."""
    now = time.perf_counter_ns()
    return "".join(op_text(first + k, width, now) for k in range(count))


@dataclass
class Tally:
    """What one receiving link counted since it was armed (see the module docstring)."""

    width: int
    next_index: int | None = None
    """The op index the next delivery must start with (``None``: take the first seen)."""
    deliveries: int = 0
    ops: int = 0
    text_bytes: int = 0
    frames: int = 0
    other_deliveries: int = 0
    target_index: int | None = None
    done_at_ns: int | None = None
    first_at_ns: int | None = None
    latencies_ms: list[float] | None = None
    problems: list[str] = field(default_factory=list)

    def arm(self, target_index: int, latencies: bool) -> None:
        """Reset the counters; done once op ``target_index`` has arrived."""
        self.deliveries = self.ops = self.text_bytes = self.frames = self.other_deliveries = 0
        self.target_index = target_index
        self.done_at_ns = self.first_at_ns = None
        self.latencies_ms = [] if latencies else None
        if self.next_index is not None and self.next_index > target_index:
            self.done_at_ns = time.perf_counter_ns()

    @property
    def done(self) -> bool:
        """Whether the armed target has arrived."""
        return self.done_at_ns is not None

    def problem(self, text: str) -> None:
        """Record a continuity problem (kept to the first few)."""
        if len(self.problems) < 20:
            self.problems.append(text)

    def account(self, text: str, now_ns: int) -> bool:
        """Count one delivered text; returns whether this made the link done."""
        width = self.width
        count, rest = divmod(len(text), width)
        if rest or not count:
            self.problem(f"text of {len(text)} characters is not whole ops of {width}")
            return False
        first = int(text[_STAMP:MIN_WIDTH])
        last = int(text[(count - 1) * width + _STAMP : (count - 1) * width + MIN_WIDTH])
        if self.next_index is not None and first != self.next_index:
            self.problem(f"ops {first}..{last} arrived, expected {self.next_index} next")
        if last != first + count - 1:
            self.problem(f"ops {first}..{last} in a text of {count} ops")
        self.next_index = last + 1
        self.deliveries += 1
        self.ops += count
        self.text_bytes += len(text)
        if self.first_at_ns is None:
            self.first_at_ns = now_ns
        samples = self.latencies_ms
        if samples is not None:
            for k in range(count):
                start = k * width
                samples.append((now_ns - int(text[start : start + _STAMP])) / 1e6)
        if (
            self.done_at_ns is None
            and self.target_index is not None
            and self.next_index > self.target_index
        ):
            self.done_at_ns = now_ns
            return True
        return False

    def report(self) -> dict[str, object]:
        """The counters, for the parent process."""
        return {
            "deliveries": self.deliveries,
            "ops": self.ops,
            "text_bytes": self.text_bytes,
            "frames": self.frames,
            "other_deliveries": self.other_deliveries,
            "done_at_ns": self.done_at_ns,
            "first_at_ns": self.first_at_ns,
            "next_index": self.next_index,
            "problems": list(self.problems),
        }
