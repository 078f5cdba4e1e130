"""A DeviceLink client of raw bytes, for checking the live protocol on the wire.

Requests are sent as the exact bytes given (fixtures, hostile input); every frame is
kept as the exact bytes the server wrote, with its decoded form next to it. A reader
thread collects frames, so the test thread sends and waits with deadlines.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from agentactivity.livestream.v1 import livestream_pb2

__all__ = ["DEVICE_LINK", "RawFrame", "RawLink"]

DEVICE_LINK = "/agentactivity.livestream.v1.DeviceLinkService/DeviceLink"
_END = object()


@dataclass(frozen=True)
class RawFrame:
    """One frame as written (``data``) and decoded (``frame``)."""

    data: bytes
    frame: livestream_pb2.DeviceLinkResponse

    @property
    def kind(self) -> str:
        return self.frame.WhichOneof("kind") or ""


class RawLink:
    """One DeviceLink call sending and receiving raw bytes."""

    def __init__(
        self,
        channel: grpc.Channel,
        metadata: Sequence[tuple[str, str]],
        requests: Sequence[bytes] = (),
        *,
        timeout: float | None = None,
    ) -> None:
        self._requests: queue.Queue[Any] = queue.Queue()
        for request in requests:
            self._requests.put(request)
        self.frames: list[RawFrame] = []
        self._arrived = threading.Condition()
        self.error: grpc.RpcError | None = None
        self.done = threading.Event()
        call: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(
            DEVICE_LINK, request_serializer=None, response_deserializer=None
        )
        self._call = call(self._iterate(), metadata=tuple(metadata), timeout=timeout)
        self._reader = threading.Thread(target=self._read, daemon=True, name="raw-link")
        self._reader.start()

    def _iterate(self) -> Iterator[bytes]:
        while True:
            item = self._requests.get()
            if item is _END:
                return
            yield item

    def _read(self) -> None:
        try:
            for data in self._call:
                frame = livestream_pb2.DeviceLinkResponse.FromString(data)
                with self._arrived:
                    self.frames.append(RawFrame(data, frame))
                    self._arrived.notify_all()
        except grpc.RpcError as error:
            self.error = error
        finally:
            self.done.set()
            with self._arrived:
                self._arrived.notify_all()

    def send(self, data: bytes) -> None:
        """Send one request's bytes."""
        self._requests.put(data)

    def wait(self, predicate: Callable[[list[RawFrame]], bool], timeout: float = 30.0) -> bool:
        """Wait until ``predicate(frames)`` holds (``True``) or the call ended (``False``)."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while not predicate(self.frames):
                remaining = deadline - time.monotonic()
                if self.done.is_set():
                    return predicate(self.frames)
                assert remaining > 0, f"timed out; frames: {[f.kind for f in self.frames]}"
                self._arrived.wait(remaining)
            return True

    def wait_kind(self, kind: str, count: int = 1, timeout: float = 30.0) -> RawFrame:
        """The ``count``-th frame of ``kind`` (fails when the call ends first)."""
        reached = self.wait(lambda fs: sum(f.kind == kind for f in fs) >= count, timeout)
        assert reached, f"the call ended before {count} {kind} frame(s): {self.error}"
        return [f for f in self.frames if f.kind == kind][count - 1]

    def wait_quiet(self, seconds: float, ignore: str = "heartbeat") -> None:
        """Wait until no frame but ``ignore`` arrived for ``seconds``."""
        while True:
            before = sum(f.kind != ignore for f in self.frames)
            time.sleep(seconds)
            if sum(f.kind != ignore for f in self.frames) == before or self.done.is_set():
                return

    def wait_error(self, timeout: float = 30.0) -> grpc.RpcError:
        """The error that ended the call (fails when it does not end in time)."""
        assert self.done.wait(timeout), "the call did not end"
        assert self.error is not None, "the call ended without an error"
        return self.error

    @property
    def deliveries(self) -> list[livestream_pb2.Delivery]:
        """Every delivery received so far, in order."""
        return [
            d for f in self.frames if f.kind == "deliveries" for d in f.frame.deliveries.deliveries
        ]

    def cancel(self) -> None:
        """Drop the call (a half-close does not end a DeviceLink; cancelling does)."""
        self._requests.put(_END)
        self._call.cancel()
        self.done.wait(10)
