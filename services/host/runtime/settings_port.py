"""The port through which persisted Session settings reach a live runtime (HOST-SES-6).

``UpdateSessionSettings`` persists first, then asks this port to apply the settings to the
Session's live runtime, inside the Session's mutation lane (HOST-LANE-1). The runtime link
implements the port (``services.host.runtime.live_settings.LinkedRuntimeSettings``, installed by
``services.host.app``); :class:`DetachedRuntimeSettings`, the default of a bare
``HostContext``, reports ``not_attached`` (the settings apply at the next start). A failure
is reported in the response, never hidden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from services.host.model.records import Capabilities, SessionSettingsValue

__all__ = [
    "DetachedRuntimeSettings",
    "RuntimeSettingsOutcome",
    "RuntimeSettingsPort",
    "RuntimeSettingsStatus",
]

RuntimeSettingsStatus = Literal["not_attached", "applied", "failed", "deferred"]
"""``deferred``: the runtime cannot change settings live (capability ``live_settings``)."""


@dataclass(frozen=True)
class RuntimeSettingsOutcome:
    """What happened when Host applied settings to the runtime."""

    status: RuntimeSettingsStatus
    failure_message: str | None = None


class RuntimeSettingsPort(Protocol):
    """Applies persisted settings to a Session's live runtime, if one is attached."""

    async def apply_settings(
        self,
        workspace_id: str,
        session_id: str,
        settings: SessionSettingsValue,
        capabilities: Capabilities,
    ) -> RuntimeSettingsOutcome:
        """Apply ``settings``; never raises for a runtime failure (report ``failed``)."""
        ...


class DetachedRuntimeSettings:
    """The port of a host without a runtime link: nothing is ever attached."""

    async def apply_settings(
        self,
        workspace_id: str,
        session_id: str,
        settings: SessionSettingsValue,
        capabilities: Capabilities,
    ) -> RuntimeSettingsOutcome:
        """Report ``not_attached``: the settings apply when a runtime next starts."""
        return RuntimeSettingsOutcome("not_attached")
