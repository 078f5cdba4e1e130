"""Server-stream writes that end quietly when the peer has gone (HOST-OBS-2).

A write can race the peer's cancellation: gRPC core fails the write batch
(``ExecuteBatchError``, a ``grpc.aio.InternalError``) before the call's close notice has
reached Python. gRPC treats a servicer that fails that way as unexpected and logs it, although
nothing went wrong but the peer leaving. The close notice follows within moments and cancels
the handler's task, which gRPC records quietly; so after a failed write the handler waits for
it (bounded) instead of failing at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

__all__ = ["CLOSE_NOTICE_SECONDS", "write_or_cancelled"]

CLOSE_NOTICE_SECONDS = 2.0
"""How long a failed write waits for the peer's close notice before it counts as a failure."""


async def write_or_cancelled(context: grpc.aio.ServicerContext[Any, Any], message: Any) -> None:
    """Write ``message`` to the stream; a write that raced the peer's close ends as a cancel.

    Raises:
        asyncio.CancelledError: the peer closed the stream (the usual end of a failed write).
        grpc.aio.InternalError: the write failed and no close notice came within
            :data:`CLOSE_NOTICE_SECONDS` (a real failure, which gRPC then reports).
    """
    try:
        await context.write(message)
    except grpc.aio.InternalError:
        # The batch failed because the call is over; its close notice cancels this task.
        await asyncio.sleep(CLOSE_NOTICE_SECONDS)
        raise
