"""Cumulative snapshots -> ``set`` / ``append_text`` operations (HOST-RT-2).

Text and reasoning: the first snapshot of a message is ``set``; a later snapshot that has the
previous value as exact prefix is ``append_text`` carrying only the suffix; a duplicate emits
nothing; anything else (a rewrite or backtrack) is ``set``.

Tool output uses the exact message id of its tool-call message (the anchor): the first output is
``set``, later ones ``append_text`` with ``offset_bytes`` equal to the UTF-8 length emitted so
far. Output that arrives before its anchor (a provider notification racing ahead of the call's
start) is held in a bounded pre-anchor buffer and emitted as one ``set`` right after the anchor
is announced; output the budget cannot hold is dropped (counted in :attr:`DeltaNormalizer.dropped`)
and never creates a row.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["DeltaNormalizer", "DeltaOp", "PreAnchorBudget"]

TEXT_TARGETS = frozenset({"text", "reasoning"})


@dataclass(frozen=True)
class DeltaOp:
    """One live operation on a message.

    Attributes:
        message_id: The message (for tool output, the tool-call message id).
        target: ``text``, ``reasoning`` or ``tool_output``.
        operation: ``set`` or ``append_text``.
        text: The whole value (``set``) or the suffix (``append_text``).
        offset_bytes: For tool-output ``append_text``: the UTF-8 length before it.
    """

    message_id: str
    target: str
    operation: str
    text: str
    offset_bytes: int | None = None


@dataclass(frozen=True)
class PreAnchorBudget:
    """Bounds of the pre-anchor buffer: how many tool calls and bytes it may hold in total."""

    max_calls: int = 16
    max_bytes: int = 256 * 1024


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


class DeltaNormalizer:
    """Per-runtime normalizer state (one instance per provider session is typical)."""

    def __init__(self, budget: PreAnchorBudget | None = None) -> None:
        self.budget = budget or PreAnchorBudget()
        self._texts: dict[tuple[str, str], str] = {}
        self._outputs: dict[str, str] = {}
        self._anchored: set[str] = set()
        self._pending: OrderedDict[str, str] = OrderedDict()
        self.dropped: list[str] = []
        """Diagnostics: ids of tool calls whose pre-anchor output was dropped."""

    # ------------------------------------------------------------------ text / reasoning

    def text(self, message_id: str, snapshot: str, *, target: str = "text") -> list[DeltaOp]:
        """Operations for a cumulative text or reasoning snapshot."""
        if target not in TEXT_TARGETS:
            raise ValueError(f"not a text target: {target!r}")
        key = (message_id, target)
        previous = self._texts.get(key)
        self._texts[key] = snapshot
        if previous is None:
            return [DeltaOp(message_id, target, "set", snapshot)]
        if snapshot == previous:
            return []
        if snapshot.startswith(previous):
            return [DeltaOp(message_id, target, "append_text", snapshot[len(previous) :])]
        return [DeltaOp(message_id, target, "set", snapshot)]

    # ------------------------------------------------------------------------ tool output

    def anchor(self, message_id: str) -> list[DeltaOp]:
        """The tool-call message now exists (its snapshot was reported): release held output.

        The caller reports the anchor *before* sending the returned operations.
        """
        self._anchored.add(message_id)
        held = self._pending.pop(message_id, None)
        if held is None:
            return []
        return self._emit_output(message_id, held)

    def tool_output(self, message_id: str, snapshot: str) -> list[DeltaOp]:
        """Operations for a cumulative tool-output snapshot of an anchored (or future) call."""
        if message_id not in self._anchored:
            self._hold(message_id, snapshot)
            return []
        return self._emit_output(message_id, snapshot)

    def tool_output_chunk(self, message_id: str, chunk: str) -> list[DeltaOp]:
        """Operations for an explicit ordered output delta (a chunk to append)."""
        if message_id not in self._anchored:
            self._hold(message_id, self._pending.get(message_id, "") + chunk)
            return []
        return self._emit_output(message_id, self._outputs.get(message_id, "") + chunk)

    def forget(self, message_id: str) -> None:
        """Drop the state of a finished message (its terminal snapshot went out)."""
        self._outputs.pop(message_id, None)
        self._pending.pop(message_id, None)
        self._anchored.discard(message_id)
        for key in [key for key in self._texts if key[0] == message_id]:
            del self._texts[key]

    def _emit_output(self, message_id: str, snapshot: str) -> list[DeltaOp]:
        previous = self._outputs.get(message_id)
        self._outputs[message_id] = snapshot
        if previous is None:
            return [DeltaOp(message_id, "tool_output", "set", snapshot)]
        if snapshot == previous:
            return []
        if snapshot.startswith(previous):
            return [
                DeltaOp(
                    message_id,
                    "tool_output",
                    "append_text",
                    snapshot[len(previous) :],
                    offset_bytes=_utf8_len(previous),
                )
            ]
        return [DeltaOp(message_id, "tool_output", "set", snapshot)]

    def _hold(self, message_id: str, value: str) -> None:
        if message_id in self.dropped:
            return  # its prefix is already lost; the canonical snapshot will carry it
        self._pending.pop(message_id, None)
        held = sum(_utf8_len(text) for text in self._pending.values())
        if len(self._pending) >= self.budget.max_calls or held + _utf8_len(value) > (
            self.budget.max_bytes
        ):
            self.dropped.append(message_id)
            return
        self._pending[message_id] = value

    def pending_bytes(self) -> int:
        """Bytes held in the pre-anchor buffer."""
        return sum(_utf8_len(text) for text in self._pending.values())


def replay(ops: list[DeltaOp], start: str | None = None) -> str:
    """Apply operations to a value (what a consumer does); used by tests and adapters' checks."""
    value = start or ""
    for op in ops:
        if op.operation == "set":
            value = op.text
        else:
            if op.offset_bytes is not None and op.offset_bytes != _utf8_len(value):
                raise ValueError("offset mismatch")
            value += op.text
    return value
