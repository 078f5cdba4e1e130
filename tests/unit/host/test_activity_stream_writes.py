"""``write_or_cancelled``: a write that raced the peer's close ends as a cancellation."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from services.host.wire import stream_writes
from services.host.wire.stream_writes import write_or_cancelled


class _Context:
    """A servicer context whose writes succeed, or fail like a batch on a closed call."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.written: list[Any] = []
        self.write_failed = asyncio.Event()

    async def write(self, message: Any) -> None:
        if self.fail:
            self.write_failed.set()
            raise grpc.aio.InternalError("batch failed")
        self.written.append(message)


def test_a_write_that_succeeds_is_written() -> None:
    context = _Context(fail=False)
    asyncio.run(write_or_cancelled(context, "m"))  # type: ignore[arg-type]
    assert context.written == ["m"]


def test_a_failed_write_waits_for_the_close_notice_and_ends_cancelled() -> None:
    async def scenario() -> None:
        context = _Context(fail=True)
        task = asyncio.create_task(write_or_cancelled(context, "m"))  # type: ignore[arg-type]
        await context.write_failed.wait()
        await asyncio.sleep(0.05)
        assert not task.done(), "a failed write must wait for the peer's close notice"
        task.cancel()  # what gRPC does when the notice arrives
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


def test_a_failed_write_without_a_close_notice_is_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stream_writes, "CLOSE_NOTICE_SECONDS", 0.01)
    with pytest.raises(grpc.aio.InternalError):
        asyncio.run(write_or_cancelled(_Context(fail=True), "m"))  # type: ignore[arg-type]
