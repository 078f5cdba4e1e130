"""Applying persisted Session settings to a connected runtime (HOST-SES-6, HOST-RT-1).

:class:`LinkedRuntimeSettings` is the runtime link's implementation of
``services.host.runtime_settings.RuntimeSettingsPort``. ``UpdateSessionSettings`` calls it
inside the Session's mutation lane after the settings are committed, so the runtime sees
the updates of one Session in lane order and never between a stop and its commit.

* no connected runtime serves the Session's target and provider: ``not_attached`` (the
  settings go out with the next ``start_turn``);
* the target or the runtime does not advertise ``live_settings``: ``deferred``;
* otherwise an ``apply_settings`` command is written to the durable outbox and Host waits
  up to ``runtime_command_timeout_seconds`` for the runtime's acknowledgement:
  ``accepted`` is ``applied``; a rejection, a failure, a timeout or a link that closes is
  ``failed`` with a message (reported, never hidden; the settings stay persisted and an
  unacknowledged command is re-sent when the runtime reconnects).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from services.host import runtime_commands
from services.host.activity_store import ActivityRepositories, activity_runner
from services.host.context import HostContext
from services.host.records import Capabilities, SessionSettingsValue
from services.host.runtime_registry import CommandAck, LinkClosed, RuntimeLinkHandle
from services.host.runtime_settings import RuntimeSettingsOutcome, RuntimeSettingsStatus
from services.host.submission import settings_to_json

__all__ = ["LinkedRuntimeSettings"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Sent:
    """An ``apply_settings`` command written to the outbox and its awaited ack."""

    link: RuntimeLinkHandle
    command_id: str
    ack: asyncio.Future[CommandAck]


class LinkedRuntimeSettings:
    """Sends ``apply_settings`` to the runtime serving the Session and awaits its ack."""

    def __init__(self, ctx: HostContext) -> None:
        self._ctx = ctx

    async def apply_settings(
        self,
        workspace_id: str,
        session_id: str,
        settings: SessionSettingsValue,
        capabilities: Capabilities,
    ) -> RuntimeSettingsOutcome:
        """Apply ``settings`` live; a runtime failure is returned as ``failed``, not raised."""
        ctx = self._ctx

        async def enqueue(repos: ActivityRepositories) -> _Sent | RuntimeSettingsStatus:
            session = await repos.sessions.get(workspace_id, session_id)
            link = (
                ctx.runtimes.link_for(workspace_id, session.agent_target_id, session.provider)
                if session is not None
                else None
            )
            if session is None or link is None:
                return "not_attached"
            if not (capabilities.live_settings and link.identity.capabilities.get("live_settings")):
                return "deferred"
            command_id = runtime_commands.enqueue(
                repos, ctx, session, "apply_settings", {"settings": settings_to_json(settings)}
            )
            # Registered before the commit dispatches the command, so an early ack is seen.
            return _Sent(link, command_id, link.expect_ack(command_id))

        sent = await activity_runner(ctx.database.engine).run(enqueue)
        if not isinstance(sent, _Sent):
            return RuntimeSettingsOutcome(sent)
        link, command_id, ack = sent.link, sent.command_id, sent.ack
        timeout = ctx.runtime_command_timeout_seconds
        try:
            verdict = await asyncio.wait_for(ack, timeout)
        except TimeoutError:
            link.forget_ack(command_id)
            return RuntimeSettingsOutcome(
                "failed", f"the runtime did not acknowledge the settings within {timeout:g} s"
            )
        except LinkClosed:
            return RuntimeSettingsOutcome(
                "failed", "the runtime disconnected before acknowledging the settings"
            )
        if verdict.status == "accepted":
            return RuntimeSettingsOutcome("applied")
        detail = verdict.message or verdict.reason or verdict.status
        _log.info("runtime %s refused settings: %s", link.identity.runtime_id, detail)
        return RuntimeSettingsOutcome(
            "failed", f"the runtime {verdict.status} the settings: {detail}"
        )
