"""Waiting for an observable condition with a deadline (never a sleep that decides order)."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["eventually"]


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``condition`` every 20 ms until it holds (True) or ``timeout`` passes (False).

    For effects that arrive without a reply to wait on: a fire-and-forget acknowledgement's
    transaction, a background prune.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
