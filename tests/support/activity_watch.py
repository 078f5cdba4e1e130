"""A ``WatchActivity`` consumer running in a thread, for tests (HOST-OBS-2)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from agentactivity.host.v1 import activity_pb2, host_pb2, host_pb2_grpc
from tests.support.servers import auth_metadata


class Watcher:
    """Collects a ``WatchActivity`` stream; ``ready`` is set once the marker arrived."""

    def __init__(
        self,
        channel: grpc.Channel,
        workspace_id: str = "ws-1",
        after_event_id: int | None = None,
        principal: str = "service",
    ) -> None:
        request = host_pb2.WatchActivityRequest(workspace_id=workspace_id)
        if after_event_id is not None:
            request.after_event_id = after_event_id
        stub = host_pb2_grpc.HostServiceStub(channel)
        self._call = stub.WatchActivity(request, metadata=auth_metadata(principal))
        self.items: queue.Queue[Any] = queue.Queue()
        self.events: list[activity_pb2.ActivityEvent] = []
        self.ready: activity_pb2.ActivityStreamReady | None = None
        self.error: grpc.RpcError | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for response in self._call:
                if response.WhichOneof("item") == "ready":
                    self.ready = response.ready
                    self._ready.set()
                else:
                    self.events.append(response.event)
                    self.items.put(response.event)
        except grpc.RpcError as error:
            self.error = error
        finally:
            self._ready.set()

    def wait_ready(self, timeout: float = 30) -> activity_pb2.ActivityStreamReady:
        """Block until the ready marker (or fail with the stream's error)."""
        assert self._ready.wait(timeout), "no ready marker"
        if self.ready is None:
            raise AssertionError(f"stream failed before ready: {self.error}")
        return self.ready

    def wait_for(
        self, predicate: Callable[[list[activity_pb2.ActivityEvent]], bool], timeout: float = 30
    ) -> list[activity_pb2.ActivityEvent]:
        """Poll until ``predicate(events)`` holds; return the events so far."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(list(self.events)):
                return list(self.events)
            if self.error is not None:
                raise AssertionError(f"stream failed: {self.error}")
            time.sleep(0.01)
        raise AssertionError(f"timed out; got {[kind(e) for e in self.events]}")

    def durable(self) -> list[activity_pb2.ActivityEvent]:
        """The durable events received so far."""
        return [e for e in self.events if e.WhichOneof("event") != "message_delta"]

    def wait_done(self, timeout: float = 30) -> None:
        """Wait for the stream to end (after an error); fail if it does not."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream did not end"

    def cancel(self) -> None:
        """Stop watching; fail if the stream does not end."""
        self._call.cancel()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the stream did not end after cancel"


def kind(event: activity_pb2.ActivityEvent) -> str:
    """The event's oneof kind."""
    return str(event.WhichOneof("event"))
