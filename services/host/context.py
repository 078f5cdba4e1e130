"""What every Host component shares inside one host process."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.host.activity.feed import ActivityFeed
from services.host.model.mutation_lanes import MutationLanes
from services.host.runtime.registry import RuntimeRegistry
from services.host.runtime.settings_port import DetachedRuntimeSettings, RuntimeSettingsPort
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
        runtimes: Connected runtimes and their links (HOST-RT-1).
        runtime_loss_grace_seconds: How long a disconnected runtime may stay away before
            its Turns are interrupted (``TUTTI_RUNTIME_LOSS_GRACE_SECONDS``).
        runtime_command_timeout_seconds: How long an awaited runtime command may take.
        runtime_settings: Applies persisted Session settings to a live runtime (HOST-SES-6);
            ``app.build`` installs the runtime link's ``LinkedRuntimeSettings`` in place of
            the detached default.
        activity: The activity feed: durable event log, live and delta lanes, pruning
            (HOST-OBS-1/2, HOST-RT-2). The default records no events (no codec);
            ``app.build`` passes the wire codec.
    """

    database: Database
    clock: Callable[[], int] = wall_clock_ms
    lanes: MutationLanes = field(default_factory=MutationLanes)
    runtimes: RuntimeRegistry = field(default_factory=RuntimeRegistry)
    runtime_loss_grace_seconds: float = 30.0
    runtime_command_timeout_seconds: float = 10.0
    runtime_settings: RuntimeSettingsPort = field(default_factory=DetachedRuntimeSettings)
    activity: ActivityFeed = field(default_factory=lambda: ActivityFeed(wall_clock_ms))
