"""Applying persisted Session settings to a connected runtime (HOST-SES-6, HOST-RT-1).

:class:`LinkedRuntimeSettings` is the runtime link's implementation of
``services.host.runtime.settings_port.RuntimeSettingsPort``. ``UpdateSessionSettings`` calls it
inside the Session's mutation lane after the settings are committed, so the runtime sees
the updates of one Session in lane order and never between a stop and its commit.

* no connected runtime serves the Session's target and provider: ``not_attached`` (the
  settings go out with the next ``start_turn``);
* the target or the runtime does not advertise ``live_settings``: ``deferred``;
* otherwise an ``apply_settings`` command is written to the durable outbox and Host waits
  up to ``runtime_command_timeout_seconds`` for the runtime's acknowledgement:
  ``accepted`` is ``applied``; a rejection, a failure, a timeout or a link that closes is
  ``failed`` with a message (reported, never hidden; the settings stay persisted and go out
  with the next ``start_turn``).

``failed`` is final for the command (ADR 0013 §11): before reporting it Host settles the
outbox row in a transaction that races the acknowledgement fairly (both lock the row). If an
acceptance committed first the report is ``applied`` after all; if a rejection did, ``failed``
with its reason; otherwise the row is withdrawn, so the command is never re-sent — not on a
reconnect, not with the Session's next dispatch — and a late acknowledgement is ignored. What
Host cannot recall is a copy the runtime already received; the message says so when the
command had been handed to the link.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from services.host.context import HostContext
from services.host.model.records import Capabilities, SessionSettingsValue
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.ack_waits import AwaitedAck, expect_ack
from services.host.runtime.commands import ApplySettings
from services.host.runtime.presence import serving_identity
from services.host.runtime.registry import CommandAck
from services.host.runtime.settings_port import RuntimeSettingsOutcome, RuntimeSettingsStatus
from services.host.turns import command_outbox

__all__ = ["LinkedRuntimeSettings"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Sent:
    """An ``apply_settings`` command written to the outbox and its awaited ack."""

    runtime_id: str
    command_id: str
    ack: AwaitedAck


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

        async def enqueue(repos: HostTransaction) -> _Sent | RuntimeSettingsStatus:
            # Locked: commands of one Session are enqueued in commit order on every replica.
            session = await repos.session_rows.lock_with_root(workspace_id, session_id)
            if session is None:
                return "not_attached"
            route = (workspace_id, session.agent_target_id, session.provider)
            link = ctx.runtimes.link_for(*route)
            # SCALE-2: without a link here, a runtime attached to another replica serves it.
            runtime = link.identity if link is not None else await serving_identity(ctx, *route)
            if runtime is None:
                return "not_attached"
            if not (capabilities.live_settings and runtime.capabilities.get("live_settings")):
                return "deferred"
            command_id = command_outbox.enqueue(repos, ctx, session, ApplySettings(settings))
            # Registered before the commit dispatches the command, so an early ack is seen.
            ack = expect_ack(ctx, link, command_id, (workspace_id, session_id))
            return _Sent(runtime.runtime_id, command_id, ack)

        sent = await ctx.transact(enqueue)
        if not isinstance(sent, _Sent):
            return RuntimeSettingsOutcome(sent)
        command_id = sent.command_id
        timeout = ctx.runtime_command_timeout_seconds
        waited = await sent.ack.wait(timeout)
        verdict = waited.verdict
        if waited.accepted:
            return RuntimeSettingsOutcome("applied")
        if waited.timed_out:
            cause = f"the runtime did not acknowledge the settings within {timeout:g} s"
        elif verdict is None:
            cause = "the runtime disconnected before acknowledging the settings"
        else:
            detail = verdict.message or verdict.reason or verdict.status
            cause = f"the runtime {verdict.status} the settings: {detail}"
        return await self._settle(sent.runtime_id, command_id, cause, verdict)

    async def _settle(
        self,
        runtime_id: str,
        command_id: str,
        cause: str,
        verdict: CommandAck | None,
    ) -> RuntimeSettingsOutcome:
        """Make ``failed`` final: withdraw the command unless a verdict committed first."""

        async def withdraw(repos: HostTransaction) -> command_outbox.Withdrawal:
            return await command_outbox.withdraw_awaited(repos, command_id)

        try:
            settled = await self._ctx.transact(withdraw)
        except Exception:  # noqa: BLE001 - the report must still be made, and be true
            _log.exception("could not withdraw apply_settings %s", command_id)
            return RuntimeSettingsOutcome(
                "failed",
                f"{cause}; Host could not withdraw the command, so the runtime may still "
                "apply the settings later (they stay saved)",
            )
        if settled.outcome == "accepted":
            return RuntimeSettingsOutcome("applied")  # the acceptance won the race
        if settled.outcome == "rejected":
            if verdict is None or verdict.status != "rejected":
                cause = f"the runtime rejected the settings: {settled.detail or 'rejected'}"
            _log.info("runtime %s refused settings: %s", runtime_id, cause)
            return RuntimeSettingsOutcome("failed", f"{cause} (they stay saved)")
        in_flight = (
            "; a copy the runtime already received may still be applied"
            if settled.in_flight
            else ""
        )
        return RuntimeSettingsOutcome(
            "failed",
            f"{cause}; Host withdrew the command and will not send it again{in_flight} "
            "(the settings stay saved and apply from the next Turn)",
        )
