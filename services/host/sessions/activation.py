"""``ActivateSession``: resume an existing Session without starting a Turn (HOST-SES-9).

Inside the Session's mutation lane (HOST-LANE-1) one transaction checks the Session is live,
that a connected runtime serves its target, and writes a ``resume_session`` command carrying the
stored provider resume identity to the durable outbox (HOST-RT-5); the commit dispatches it.
Host then waits up to ``runtime_command_timeout_seconds`` (default 10 s) for the runtime's
acknowledgement, the same awaited-command machinery as live settings
(``services.host.runtime.live_settings``):

* ``accepted``: the activation is recorded in ``host_operations`` (kind ``activate_session``,
  keyed by ``activation_id``) and the call returns the complete ``GetSession`` aggregate;
* ``rejected``: ``FAILED_PRECONDITION RESUME_REJECTED``;
* no verdict in time, a ``failed`` delivery or a closed link: the command is withdrawn (never
  re-sent, ``command_outbox.withdraw_awaited``) and the call fails ``UNAVAILABLE
  RESUME_NOT_ACKNOWLEDGED`` with RetryInfo, unless a verdict committed first. Nothing is recorded,
  so a retry with the same ``activation_id`` sends the command again.

A replay of a recorded ``activation_id`` sends nothing and returns the current aggregate. Without
a runtime the call fails ``UNAVAILABLE RUNTIME_UNAVAILABLE`` and writes nothing; a tombstoned
Session is ``NOT_FOUND``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from domainerrors import FailedPrecondition, InvalidArgument, Unavailable
from services.host.context import HostContext
from services.host.model.session_rules import (
    session_deleted,
    session_id_violation,
    session_not_found,
    validate_session_id,
)
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.ack_waits import AwaitedAck, expect_ack
from services.host.runtime.commands import ResumeSession
from services.host.runtime.presence import serving_identity
from services.host.sessions.commands import SessionDetail, get_session
from services.host.turns import command_outbox
from services.host.turns.submission import (
    RUNTIME_RETRY_SECONDS,
    runtime_unavailable,
    session_context,
)

__all__ = ["ACTIVATION_KIND", "Activation", "activate_session"]

ACTIVATION_KIND = "activate_session"
"""``host_operations.kind`` of a recorded activation."""


@dataclass(frozen=True)
class Activation:
    """The Session's detail aggregate after an activation, and whether it was a replay."""

    detail: SessionDetail
    replayed: bool


@dataclass(frozen=True)
class _Sent:
    """A ``resume_session`` written to the outbox and its awaited acknowledgement."""

    command_id: str
    ack: AwaitedAck


def _validate(session_id: str, activation_id: str) -> None:
    validate_session_id(session_id)
    if (violation := session_id_violation(activation_id, "activation_id")) is not None:
        raise InvalidArgument(
            f"invalid ActivateSession: activation_id {violation.description}",
            field_violations=[violation],
        )


async def activate_session(
    ctx: HostContext, workspace_id: str, session_id: str, activation_id: str
) -> Activation:
    """Resume the Session's provider session and return its detail aggregate (HOST-SES-9).

    Raises:
        InvalidArgument: a missing or malformed ``session_id`` or ``activation_id``.
        NotFound: ``SESSION_NOT_FOUND`` or ``SESSION_DELETED``.
        Unavailable: ``RUNTIME_UNAVAILABLE`` (nothing written) or ``RESUME_NOT_ACKNOWLEDGED``.
        FailedPrecondition: ``RESUME_REJECTED``.
    """
    _validate(session_id, activation_id)

    async def enqueue(repos: HostTransaction) -> _Sent | None:
        session = await repos.session_rows.lock_with_root(workspace_id, session_id)
        if session is None:
            raise session_not_found(workspace_id, session_id)
        if session.deleted_at_unix_ms is not None:
            raise session_deleted(session_id)
        recorded = await repos.host_operations.find(
            workspace_id, session_id, ACTIVATION_KIND, activation_id
        )
        if recorded is not None:
            return None
        link = ctx.runtimes.link_for(workspace_id, session.agent_target_id, session.provider)
        # SCALE-2: without a link here, a runtime attached to another replica serves it.
        if link is None and (
            await serving_identity(ctx, workspace_id, session.agent_target_id, session.provider)
            is None
        ):
            raise runtime_unavailable(session)
        command = ResumeSession(await session_context(repos, session))
        command_id = command_outbox.enqueue(repos, ctx, session, command)
        # Registered before the commit dispatches the command, so an early ack is seen.
        return _Sent(command_id, expect_ack(ctx, link, command_id, (workspace_id, session_id)))

    async with ctx.lanes.hold(workspace_id, session_id):
        sent = await ctx.transact(enqueue)
        if sent is not None:
            await _await_acceptance(ctx, sent)
            await _record(ctx, workspace_id, session_id, activation_id, sent.command_id)
        detail = await get_session(ctx, workspace_id, session_id)
    return Activation(detail, replayed=sent is None)


async def _await_acceptance(ctx: HostContext, sent: _Sent) -> None:
    """Wait for the runtime's verdict; anything but an acceptance raises.

    Reports of the Session may apply while Host waits (the lane is lent to them).

    Raises:
        FailedPrecondition: ``RESUME_REJECTED``.
        Unavailable: ``RESUME_NOT_ACKNOWLEDGED``: no verdict in time, a ``failed`` delivery or a
            closed link; the command is withdrawn first.
    """
    command_id = sent.command_id
    timeout = ctx.runtime_command_timeout_seconds
    waited = await sent.ack.wait(timeout)
    verdict = waited.verdict
    if waited.accepted:
        return

    async def withdraw(repos: HostTransaction) -> command_outbox.Withdrawal:
        return await command_outbox.withdraw_awaited(repos, command_id)

    # Final either way: a rejected row is cleared, an unanswered one is never re-sent.
    settled = await ctx.transact(withdraw)
    if settled.outcome == "accepted":
        return  # the acceptance committed before the withdrawal
    if settled.outcome == "rejected":
        detail = settled.detail or (verdict.message if verdict is not None else None)
        raise FailedPrecondition(
            f"the runtime rejected the resume: {detail or 'rejected'}",
            reason="RESUME_REJECTED",
            metadata={"command_id": command_id},
        )
    if waited.timed_out:
        cause = f"the runtime did not acknowledge the resume within {timeout:g} s"
    elif verdict is None:
        cause = "the runtime disconnected before acknowledging the resume"
    else:
        cause = f"the runtime could not deliver the resume: {verdict.message or verdict.reason}"
    raise Unavailable(
        f"{cause}; retry with the same activation_id",
        reason="RESUME_NOT_ACKNOWLEDGED",
        metadata={"command_id": command_id},
        retry_after_seconds=RUNTIME_RETRY_SECONDS,
    )


async def _record(
    ctx: HostContext, workspace_id: str, session_id: str, activation_id: str, command_id: str
) -> None:
    """Record the accepted activation, so a replay of ``activation_id`` sends nothing."""

    async def run(repos: HostTransaction) -> None:
        # Locked: another Host process activating with the same id records it only once.
        await repos.session_rows.get(workspace_id, session_id, lock=True)
        if await repos.host_operations.find(
            workspace_id, session_id, ACTIVATION_KIND, activation_id
        ):
            return
        now = ctx.clock()
        repos.host_operations.add(
            workspace_id=workspace_id,
            operation_id=f"op-{uuid.uuid4()}",
            session_id=session_id,
            kind=ACTIVATION_KIND,
            client_op_id=activation_id,
            request_fingerprint=ACTIVATION_KIND,
            request_json=json.dumps({"activation_id": activation_id}),
            state="committed",
            checkpoint=None,
            result_json=json.dumps({"command_id": command_id}),
            created_at_unix_ms=now,
            updated_at_unix_ms=now,
        )

    await ctx.transact(run)
