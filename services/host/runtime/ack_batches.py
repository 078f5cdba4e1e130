"""A link's command acknowledgements, applied in order, consecutive ones in one transaction.

Every command a runtime receives is acknowledged once (HOST-RT-5), so under load a link
carries a stream of acknowledgements back to back. Applied one by one, each costs a write
transaction and a thread hop, and the link's reader waits for each before reading the next
frame. :class:`AckBatches` takes them as they arrive and applies what has gathered in one
transaction (``command_outbox.record_acks``), still in arrival order; the reader goes on
reading meanwhile.

Order with the rest of the link is kept: before the reader applies a report or deltas it
waits until every acknowledgement read before them has been applied (:meth:`settled`), so no
frame's effect overtakes an earlier acknowledgement's. A failed application is handed to the
link's outgoing queue, which ends the link as a failed acknowledgement did before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from services.host.runtime import link
from services.host.runtime.registry import CommandAck, RuntimeLinkHandle

if TYPE_CHECKING:
    from services.host.context import HostContext

__all__ = ["MAX_ACKS_PER_TRANSACTION", "AckBatches"]

MAX_ACKS_PER_TRANSACTION: Final = 64
"""Acknowledgements applied in one write transaction at most (bounds its locks and length)."""


class AckBatches:
    """Applies one link's acknowledgements in order, gathering those that arrive meanwhile.

    Args:
        ctx: the Host context.
        handle: the link the acknowledgements came on.
        failed: called with the error when an application fails (the link then ends).
    """

    def __init__(
        self,
        ctx: HostContext,
        handle: RuntimeLinkHandle,
        failed: Callable[[BaseException], None],
    ) -> None:
        self._ctx = ctx
        self._handle = handle
        self._failed = failed
        self._waiting: list[CommandAck] = []
        self._task: asyncio.Task[None] | None = None

    def add(self, ack: CommandAck) -> None:
        """Queue ``ack``; it is applied after every acknowledgement queued before it."""
        self._waiting.append(ack)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._apply_waiting())

    async def settled(self) -> None:
        """Wait until every queued acknowledgement is applied (or its application failed)."""
        task = self._task
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    async def close(self) -> None:
        """Stop applying (the link is gone): an unapplied command is delivered again."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _apply_waiting(self) -> None:
        try:
            while self._waiting:
                batch = self._waiting[:MAX_ACKS_PER_TRANSACTION]
                del self._waiting[: len(batch)]
                await link.apply_acks(self._ctx, self._handle, batch)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - handed to the link, which ends
            self._waiting.clear()
            self._failed(error)
