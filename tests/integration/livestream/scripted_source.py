"""A scripted Host for the livestream server: the narrow ``ActivitySource`` interface, fed
from the test thread, so upstream drops, expired cursors, late deltas and oversized
events can be produced on demand (real Host never sends some of them)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import activity_pb2
from services.livestream.app import build as build_livestream
from services.livestream.source import (
    Baseline,
    CursorExpired,
    SessionNotFound,
    SourceUnavailable,
    WatchItem,
)

_DROP = object()
_EXPIRE = object()


class ScriptedSource:
    """Events pushed by the test; ``watch`` calls are recorded with their cursors."""

    def __init__(self) -> None:
        self.watches: list[tuple[str, int | None]] = []
        self.baselines: dict[tuple[str, str], Baseline] = {}
        self.head = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[str, asyncio.Queue[Any]] = {}
        self._watching = threading.Condition()
        self.expire_next_watch = False

    def build(self, settings: Any) -> Any:
        """``live_server("livestream", build=source.build)``."""
        return build_livestream(settings, source=self)

    async def watch(
        self, workspace_id: str, after_event_id: int | None
    ) -> AsyncIterator[WatchItem]:
        self._loop = asyncio.get_running_loop()
        if self.expire_next_watch and after_event_id is not None:
            self.expire_next_watch = False
            raise CursorExpired("scripted expiry")
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._queues[workspace_id] = queue
        with self._watching:
            self.watches.append((workspace_id, after_event_id))
            self._watching.notify_all()
        yield activity_pb2.ActivityStreamReady(workspace_id=workspace_id, head_event_id=self.head)
        while True:
            item = await queue.get()
            if item is _DROP:
                raise SourceUnavailable("scripted drop")
            if item is _EXPIRE:
                raise CursorExpired("scripted expiry")
            for event in item:  # what was pushed together is read together
                yield event

    async def read_baseline(self, workspace_id: str, session_id: str) -> Baseline:
        baseline = self.baselines.get((workspace_id, session_id))
        if baseline is None:
            raise SessionNotFound(session_id)
        return baseline

    async def close(self) -> None:
        return None

    def wait_watches(self, count: int, timeout: float = 30) -> None:
        """Block until ``watch`` was called ``count`` times."""
        with self._watching:
            assert self._watching.wait_for(lambda: len(self.watches) >= count, timeout), (
                self.watches
            )

    def _put(self, workspace_id: str, *items: Any) -> None:
        assert self._loop is not None, "no watch yet"
        queue = self._queues[workspace_id]
        for item in items:
            self._loop.call_soon_threadsafe(queue.put_nowait, item)

    def push(self, *events: activity_pb2.ActivityEvent, workspace_id: str = "ws-1") -> None:
        """Send events, read by the feed together (durable ones should carry increasing
        ``event_id``)."""
        self._put(workspace_id, tuple(events))

    def drop(self, workspace_id: str = "ws-1") -> None:
        """End the current watch as a transport loss."""
        self._put(workspace_id, _DROP)

    def expire(self, workspace_id: str = "ws-1") -> None:
        """End the current watch with an expired cursor."""
        self._put(workspace_id, _EXPIRE)


def delta_event(
    text: str,
    *,
    turn_id: str = "t1",
    message_id: str = "m1",
    target: int = canonical_pb2.DELTA_TARGET_TEXT,
    operation: int = canonical_pb2.DELTA_OPERATION_APPEND_TEXT,
    offset: int | None = None,
    workspace_id: str = "ws-1",
    session_id: str = "s1",
) -> activity_pb2.ActivityEvent:
    """A ``message_delta`` event."""
    delta = canonical_pb2.MessageDelta(
        workspace_id=workspace_id,
        session_id=session_id,
        turn_id=turn_id,
        message_id=message_id,
        target=target,  # type: ignore[arg-type]
        operation=operation,  # type: ignore[arg-type]
        text=text,
    )
    if offset is not None:
        delta.offset_bytes = offset
    return activity_pb2.ActivityEvent(
        workspace_id=workspace_id,
        message_delta=activity_pb2.MessageDeltaEvent(delta=delta),
    )


def turn_event(
    event_id: int,
    turn_id: str = "t1",
    phase: int = canonical_pb2.TURN_PHASE_RUNNING,
    *,
    version: int = 1,
    workspace_id: str = "ws-1",
    session_id: str = "s1",
) -> activity_pb2.ActivityEvent:
    """A durable ``turn_update`` event."""
    turn = canonical_pb2.Turn(
        workspace_id=workspace_id,
        session_id=session_id,
        turn_id=turn_id,
        phase=phase,  # type: ignore[arg-type]
        version=version,
    )
    update = activity_pb2.TurnUpdateEvent(turn=turn)
    if phase != canonical_pb2.TURN_PHASE_SETTLED:
        update.active_turn_id = turn_id
    return activity_pb2.ActivityEvent(
        event_id=event_id, workspace_id=workspace_id, turn_update=update
    )
