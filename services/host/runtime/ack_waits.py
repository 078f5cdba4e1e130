"""Waiting for a runtime's verdict on an awaited command, on whichever replica (SCALE-2).

Live settings (HOST-SES-6) and activation (HOST-SES-9) write a command and wait for the
runtime's acknowledgement. With the link in this process the wait is the link handle's future
(the fast path, unchanged). With the link on another replica there is no handle here: the wait
is on the durable acknowledgement, woken by that replica's ack signal and read with backoff
(``CommandWakeups.wait_for_ack``), with the same timeout semantics. Either way the caller then
settles a non-acceptance with ``command_outbox.withdraw_awaited``.

The caller waits in the Session's mutation lane (HOST-LANE-1), and the runtime may report on
the Session before it acknowledges; so the wait lends the lane to the Session's reports
(ADR 0046), or the report and the acknowledgement behind it would wait for the timeout.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.host.model.mutation_lanes import SessionKey
from services.host.runtime.registry import AckWait, CommandAck, RuntimeLinkHandle

if TYPE_CHECKING:
    from services.host.context import HostContext

__all__ = ["AwaitedAck", "expect_ack"]


@dataclass(frozen=True)
class AwaitedAck:
    """A registered wait for one command's acknowledgement (before the command's commit)."""

    command_id: str
    session: SessionKey
    """The Session whose lane the waiter holds (lent to its reports while waiting)."""
    link: RuntimeLinkHandle | None
    """The local link, or ``None`` when the runtime is attached to another replica."""
    future: asyncio.Future[CommandAck]
    ctx: HostContext

    async def wait(self, seconds: float) -> AckWait:
        """Wait up to ``seconds`` in the Session's lane, lent to its reports; how it ended."""
        async with self.ctx.lanes.lend_to_reports(*self.session):
            if self.link is not None:
                return await self.link.wait_for_ack(self.command_id, self.future, seconds)
            wakeups = self.ctx.command_wakeups
            assert wakeups is not None  # a remote runtime is only known with the shared bus
            return await wakeups.wait_for_ack(self.command_id, self.future, seconds)


def expect_ack(
    ctx: HostContext, link: RuntimeLinkHandle | None, command_id: str, session: SessionKey
) -> AwaitedAck:
    """Register the wait for ``command_id`` on ``link`` (or, without one, on another replica).

    Call it in the transaction that writes the command, before the commit dispatches it, so
    an early acknowledgement is seen.
    """
    if link is not None:
        return AwaitedAck(command_id, session, link, link.expect_ack(command_id), ctx)
    wakeups = ctx.command_wakeups
    assert wakeups is not None
    return AwaitedAck(command_id, session, None, wakeups.expect_ack(command_id), ctx)
