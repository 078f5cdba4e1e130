"""Where a subscription starts, from its cursor and the log's retained range (both engines)."""

from __future__ import annotations

from livelog.interface import DiscontinuityReason, LogPosition

__all__ = ["start_after"]


def start_after(
    after: LogPosition | None, *, epoch: str, first_sequence: int, last_sequence: int
) -> tuple[DiscontinuityReason | None, int]:
    """The first sequence to deliver after ``after``, and why items may be missing before it.

    The retained range is ``first_sequence .. last_sequence`` (empty when ``first_sequence >
    last_sequence``). Eviction is FIFO by sequence (the log's bounds are count, bytes and age,
    never per workspace), so when the item after the cursor is still retained nothing after
    the cursor is missing. When it is not, items of the workspace *may* be missing — the log
    cannot tell whose items it evicted — and the answer says so.

    Args:
        after: The subscriber's cursor; None asks for new items only.
        epoch: The log's current epoch.
        first_sequence: The oldest retained sequence (``last_sequence + 1`` when empty).
        last_sequence: The newest sequence the log assigned (0: none yet).

    Returns:
        ``(reason, next_sequence)``: ``reason`` is None when nothing can be missing.
    """
    if after is None:
        return None, last_sequence + 1
    if after.epoch != epoch:
        return DiscontinuityReason.EPOCH_CHANGED, first_sequence
    if after.sequence > last_sequence:
        return DiscontinuityReason.CURSOR_AHEAD, last_sequence + 1
    if after.sequence + 1 < first_sequence:
        return DiscontinuityReason.CURSOR_EVICTED, first_sequence
    return None, after.sequence + 1
