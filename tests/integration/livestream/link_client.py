"""A raw DeviceLink client for tests: sends requests from the test thread and collects
frames on a reader thread, so a test checks exactly what the server put on the wire."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from agentactivity.livestream.v1 import livestream_pb2, livestream_pb2_grpc
from services.livestream.link import CURRENT_REVISION
from tests.support.servers import LiveServer, auth_metadata, token_for

REVISION = CURRENT_REVISION
WAIT_SECONDS = 30.0
_END = object()

Delivery = livestream_pb2.Delivery


def hello(
    device_id: str = "phone-1",
    workspaces: tuple[str, ...] = ("ws-1",),
    cursor: tuple[str, int] | None = None,
    revision: int = REVISION,
) -> livestream_pb2.DeviceLinkRequest:
    """A hello request."""
    message = livestream_pb2.ClientHello(
        protocol_revision=revision,  # type: ignore[arg-type]
        device_id=device_id,
        workspace_ids=list(workspaces),
    )
    if cursor is not None:
        message.resume_cursor.epoch, message.resume_cursor.last_sequence = cursor
    return livestream_pb2.DeviceLinkRequest(hello=message)


def attach_request(
    binding_id: str, revision: int, session_id: str, workspace_id: str = "ws-1", **extra: Any
) -> livestream_pb2.DeviceLinkRequest:
    """An attach request."""
    return livestream_pb2.DeviceLinkRequest(
        attach=livestream_pb2.ClientAttach(
            binding_id=binding_id,
            revision=revision,
            workspace_id=workspace_id,
            session_id=session_id,
            **extra,
        )
    )


class Link:
    """One DeviceLink call."""

    def __init__(
        self,
        channel: grpc.Channel,
        first: livestream_pb2.DeviceLinkRequest | None,
        principal: str = "ws1-device",
    ) -> None:
        self._requests: queue.Queue[Any] = queue.Queue()
        if first is not None:
            self._requests.put(first)
        self.frames: queue.Queue[livestream_pb2.DeviceLinkResponse] = queue.Queue()
        self.error: grpc.RpcError | None = None
        self.done = threading.Event()
        stub = livestream_pb2_grpc.DeviceLinkServiceStub(channel)
        self._call = stub.DeviceLink(self._iterate(), metadata=auth_metadata(principal))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.deliveries: list[Delivery] = []
        self.epoch = ""
        self.ready: livestream_pb2.StreamReady | None = None

    def _iterate(self) -> Iterator[livestream_pb2.DeviceLinkRequest]:
        while True:
            item = self._requests.get()
            if item is _END:
                return
            yield item

    def _read(self) -> None:
        try:
            for frame in self._call:
                self.frames.put(frame)
        except grpc.RpcError as error:
            self.error = error
        finally:
            self.done.set()

    def send(self, request: livestream_pb2.DeviceLinkRequest) -> None:
        """Send one request."""
        self._requests.put(request)

    def next_frame(self, timeout: float = WAIT_SECONDS) -> livestream_pb2.DeviceLinkResponse:
        """The next frame; fails when the call ended first."""
        while True:
            try:
                return self.frames.get(timeout=0.05 if self.done.is_set() else timeout)
            except queue.Empty:
                if self.done.is_set():
                    raise AssertionError(f"the call ended: {self.error}") from None
                raise

    def pump(self, frame: livestream_pb2.DeviceLinkResponse) -> None:
        kind = frame.WhichOneof("kind")
        if kind == "deliveries":
            self.epoch = frame.deliveries.epoch
            self.deliveries.extend(frame.deliveries.deliveries)
        elif kind == "stream_ready":
            self.ready = frame.stream_ready
            self.epoch = frame.stream_ready.epoch

    def wait_ready(self, timeout: float = WAIT_SECONDS) -> livestream_pb2.StreamReady:
        """Read frames until ``stream_ready``; deliveries before it are kept."""
        while self.ready is None:
            self.pump(self.next_frame(timeout))
        return self.ready

    def wait_for(
        self, predicate: Callable[[Delivery], bool], timeout: float = WAIT_SECONDS
    ) -> Delivery:
        """Read frames until a delivery matches (or fail)."""
        for delivery in self.deliveries:
            if predicate(delivery):
                return delivery
        while True:
            frame = self.next_frame(timeout)
            before = len(self.deliveries)
            self.pump(frame)
            for delivery in self.deliveries[before:]:
                if predicate(delivery):
                    return delivery

    def wait_error(self, timeout: float = WAIT_SECONDS) -> grpc.RpcError:
        """Wait for the call to fail; return its error."""
        assert self.done.wait(timeout), "the call did not end"
        assert self.error is not None, "the call ended without an error"
        return self.error

    @property
    def last_sequence(self) -> int:
        return self.deliveries[-1].sequence if self.deliveries else 0

    def close(self) -> None:
        """Half-close and let the call end."""
        self._requests.put(_END)

    def cancel(self) -> None:
        """Drop the call abruptly."""
        self._call.cancel()
        self.done.wait(10)


def kinds(deliveries: list[Delivery]) -> list[str]:
    """The kind of each delivery."""
    return [d.WhichOneof("kind") or "" for d in deliveries]


@dataclass
class LiveSuite:
    """A Host and a livestream server wired to it."""

    host: LiveServer
    livestream: LiveServer

    def link(self, first: livestream_pb2.DeviceLinkRequest | None = None, **kwargs: Any) -> Link:
        return Link(self.livestream.channel, first if first is not None else hello(), **kwargs)


def start_livestream(
    live_server: Callable[..., LiveServer], host: LiveServer, **overrides: Any
) -> LiveServer:
    """A livestream server reading ``host`` with the service principal's token."""
    return live_server(
        "livestream", host_address=host.address, service_token=token_for("service"), **overrides
    )
