"""``WatchActivity``: the workspace activity feed for internal consumers (HOST-OBS-2).

Responses are written with ``context.write`` (the handler is a coroutine, not a generator):
a write that races the consumer's close then ends the stream as a cancellation instead of
an error gRPC would log (``stream_writes``), and each message skips the two generator hops
(the interceptor's and gRPC's) a yielded response takes.
"""

from __future__ import annotations

import contextlib
from typing import Any

from agentactivity.host.v1 import activity_pb2, host_pb2
from domainerrors import InvalidArgument
from services.host.activity.feed import WatchDelta, WatchItem, WatchReady, watch_activity
from services.host.context import HostContext
from services.host.model.cursor_bounds import checked_cursor
from services.host.wire.activity_codec import fill_delta, stored_to_proto
from services.host.wire.stream_writes import write_or_cancelled

CURSOR_BOUND = 2**53 - 1


class WatchRpcs:
    """Serves ``WatchActivity``."""

    ctx: HostContext

    def WatchActivity(self, request: host_pb2.WatchActivityRequest, context: Any) -> Any:
        """Stream a workspace's feed: ready marker, durable catch-up, then live events.

        Returns the coroutine that writes the stream (see the module docstring; the generated
        servicer types a server-stream handler as an iterator, hence ``Any``).

        Auth (declared in ``services/host/authorization.py``, enforced by the interceptor):
        ``service`` or ``admin`` with access to the workspace (livestream is the consumer).
        Errors: INVALID_ARGUMENT (missing workspace, cursor above 2^53-1), OUT_OF_RANGE
        ``EVENT_CURSOR_EXPIRED``, RESOURCE_EXHAUSTED ``WATCH_CONSUMER_TOO_SLOW``.
        """
        return self._watch_activity(request, context)

    async def _watch_activity(self, request: host_pb2.WatchActivityRequest, context: Any) -> None:
        after = request.after_event_id if request.HasField("after_event_id") else None
        if after is not None and not 0 <= after <= CURSOR_BOUND:
            raise InvalidArgument.for_field(
                "after_event_id", "after_event_id must be within [0, 2^53-1]"
            )
        items = watch_activity(self.ctx.activity, self.ctx.database, request.workspace_id, after)
        async with contextlib.aclosing(items):
            async for item in items:
                await write_or_cancelled(context, _response(item))


def _response(item: WatchItem) -> host_pb2.WatchActivityResponse:
    """The contract form of one stream item."""
    if isinstance(item, WatchReady):
        return host_pb2.WatchActivityResponse(
            ready=activity_pb2.ActivityStreamReady(
                workspace_id=item.workspace_id,
                head_event_id=checked_cursor(item.head_event_id, field="head_event_id"),
                oldest_retained_event_id=checked_cursor(
                    item.oldest_retained_event_id, field="oldest_retained_event_id"
                ),
                head_workspace_sequence=item.head_workspace_seq,
            )
        )
    if isinstance(item, WatchDelta):
        response = host_pb2.WatchActivityResponse()
        event = response.event
        event.event_id = item.after_event_id
        event.workspace_sequence = item.after_workspace_seq
        event.workspace_id = item.delta.workspace_id
        event.occurred_at_unix_ms = item.received_at_unix_ms
        fill_delta(event.message_delta.delta, item.delta)
        return response
    return host_pb2.WatchActivityResponse(event=stored_to_proto(item))
