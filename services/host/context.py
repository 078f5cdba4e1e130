"""What every Host component shares inside one host process."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.host.lanes import MutationLanes
from store.database import Database


def wall_clock_ms() -> int:
    """Current Unix time in milliseconds."""
    return time.time_ns() // 1_000_000


@dataclass
class HostContext:
    """Dependencies of the Host domain, built once by ``services.host.app``.

    Attributes:
        database: The canonical store (started by the server's start hook).
        clock: Unix-millisecond clock; tests inject a fake.
        lanes: Per-Session mutation lanes (HOST-LANE-1).
    """

    database: Database
    clock: Callable[[], int] = wall_clock_ms
    lanes: MutationLanes = field(default_factory=MutationLanes)
