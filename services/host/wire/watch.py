"""``WatchActivity``: the workspace activity feed for internal consumers (HOST-OBS-2)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agentactivity.host.v1 import activity_pb2, host_pb2
from domainerrors import InvalidArgument
from services.host.activity.feed import WatchDelta, WatchReady, watch_activity
from services.host.context import HostContext
from services.host.model.cursor_bounds import checked_cursor
from services.host.wire.activity_codec import fill_delta, stored_to_proto

CURSOR_BOUND = 2**53 - 1


class WatchRpcs:
    """Serves ``WatchActivity``."""

    ctx: HostContext

    async def WatchActivity(
        self, request: host_pb2.WatchActivityRequest, context: Any
    ) -> AsyncIterator[host_pb2.WatchActivityResponse]:
        """Stream a workspace's feed: ready marker, durable catch-up, then live events.

        Auth (declared in ``services/host/authorization.py``, enforced by the interceptor):
        ``service`` or ``admin`` with access to the workspace (livestream is the consumer).
        Errors: INVALID_ARGUMENT (missing workspace, cursor above 2^53-1), OUT_OF_RANGE
        ``EVENT_CURSOR_EXPIRED``, RESOURCE_EXHAUSTED ``WATCH_CONSUMER_TOO_SLOW``.
        """
        after = request.after_event_id if request.HasField("after_event_id") else None
        if after is not None and not 0 <= after <= CURSOR_BOUND:
            raise InvalidArgument.for_field(
                "after_event_id", "after_event_id must be within [0, 2^53-1]"
            )
        async for item in watch_activity(
            self.ctx.activity, self.ctx.database, request.workspace_id, after
        ):
            if isinstance(item, WatchReady):
                yield host_pb2.WatchActivityResponse(
                    ready=activity_pb2.ActivityStreamReady(
                        workspace_id=item.workspace_id,
                        head_event_id=checked_cursor(item.head_event_id, field="head_event_id"),
                        oldest_retained_event_id=checked_cursor(
                            item.oldest_retained_event_id, field="oldest_retained_event_id"
                        ),
                    )
                )
            elif isinstance(item, WatchDelta):
                response = host_pb2.WatchActivityResponse()
                event = response.event
                event.event_id = item.after_event_id
                event.workspace_id = item.delta.workspace_id
                event.occurred_at_unix_ms = item.received_at_unix_ms
                fill_delta(event.message_delta.delta, item.delta)
                yield response
            else:
                yield host_pb2.WatchActivityResponse(event=stored_to_proto(item))
