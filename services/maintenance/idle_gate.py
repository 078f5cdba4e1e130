"""The idle gate: maintenance works only while no Turn is active anywhere (MAINT-IDLE-1).

The gate asks Host (``GetActivityState`` across every workspace) each time it is observed:
before a run, between its batches and before compaction. It fails closed: when Host cannot
be asked, the gate is not open.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from services.maintenance.clock import Clock
from services.maintenance.host_port import HostPort, HostUnavailable

__all__ = ["GateObservation", "GateState", "IdleGate"]


class GateState(enum.Enum):
    """What the gate saw (the proto ``IdleGateState`` without its prefix)."""

    OPEN = "OPEN"
    AGENT_ACTIVE = "AGENT_ACTIVE"
    ACTIVITY_STATE_UNAVAILABLE = "ACTIVITY_STATE_UNAVAILABLE"


@dataclass(frozen=True)
class GateObservation:
    """One observation of the gate.

    Attributes:
        state: Open, closed by agent work, or closed because Host could not be asked.
        active_workspaces: Workspace id -> active Turn count (closed by agent work only).
        observed_at_unix_ms: When it was observed.
        detail: Why Host could not be asked (``ACTIVITY_STATE_UNAVAILABLE`` only).
    """

    state: GateState
    observed_at_unix_ms: int
    active_workspaces: dict[str, int] = field(default_factory=dict)
    detail: str = ""

    @property
    def open(self) -> bool:
        """Whether maintenance may work now."""
        return self.state is GateState.OPEN


class IdleGate:
    """Observes Host's activity state; remembers the last observation for status reads."""

    def __init__(self, host: HostPort, clock: Clock) -> None:
        self._host = host
        self._clock = clock
        self.last: GateObservation | None = None

    async def observe(self) -> GateObservation:
        """Ask Host now; never raises (an unreachable Host closes the gate)."""
        try:
            state = await self._host.activity_state()
        except HostUnavailable as error:
            observation = GateObservation(
                GateState.ACTIVITY_STATE_UNAVAILABLE, self._clock.now_ms(), detail=str(error)
            )
        else:
            observation = GateObservation(
                GateState.AGENT_ACTIVE if state.any_turn_active else GateState.OPEN,
                self._clock.now_ms(),
                active_workspaces=dict(state.workspaces),
            )
        self.last = observation
        return observation
