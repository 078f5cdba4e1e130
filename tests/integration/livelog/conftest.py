"""The live-log engines under one fixture: every interface test runs on both (SCALE-3)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import nats
import pytest

from livelog.codec import BytesCodec
from livelog.inprocess import InProcessLiveLog
from livelog.interface import LiveLog
from livelog.jetstream import JetStreamLiveLog
from livelog.settings import LiveLogSettings

ENGINES = ("inprocess", "jetstream")


def live_log_settings(nats_url: str, **overrides: Any) -> LiveLogSettings:
    """Settings with a stream and subject prefix private to one test."""
    tag = uuid.uuid4().hex[:12]
    values: dict[str, Any] = {
        "nats_url": nats_url,
        "live_log_stream": f"TEST_{tag}",
        "live_log_subject_prefix": f"t{tag}.live",
        "live_log_heartbeat_seconds": 0.25,
        "live_log_publish_timeout_seconds": 2.0,
    }
    values.update(overrides)
    return LiveLogSettings(**values)


@dataclass
class Engine:
    """Opens handles onto one live log: a connection each on JetStream, the same ring in-process."""

    name: str
    settings: LiveLogSettings
    _shared: InProcessLiveLog[bytes] | None = None
    _opened: list[LiveLog[bytes]] = field(default_factory=list)

    async def open(self) -> LiveLog[bytes]:
        """A handle onto the log (a separate NATS connection per call on JetStream)."""
        if self.name == "inprocess":
            if self._shared is None:
                settings = self.settings
                self._shared = InProcessLiveLog(
                    max_msgs=settings.live_log_max_msgs,
                    max_bytes=settings.live_log_max_bytes,
                    max_age_seconds=settings.live_log_max_age_seconds,
                    duplicate_window_seconds=settings.live_log_duplicate_window_seconds,
                )
            return self._shared
        log = await JetStreamLiveLog.connect(self.settings, BytesCodec())
        self._opened.append(log)
        return log

    async def close(self) -> None:
        """Close every handle this engine opened (the test's loop)."""
        for log in self._opened:
            await log.close()
        self._opened.clear()
        if self._shared is not None:
            await self._shared.close()
            self._shared = None


async def delete_stream(url: str, stream: str) -> None:
    """Delete a test's stream (absent is fine)."""
    client = await nats.connect(url)
    try:
        js = client.jetstream()
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(stream)
    finally:
        await client.close()


@pytest.fixture(params=ENGINES)
def make_engine(request: pytest.FixtureRequest, nats_url: str) -> Iterator[Callable[..., Engine]]:
    """``make_engine(**settings)``: the parametrized engine with a private stream."""
    made: list[Engine] = []

    def make(**overrides: Any) -> Engine:
        engine = Engine(request.param, live_log_settings(nats_url, **overrides))
        made.append(engine)
        return engine

    yield make
    for engine in made:
        if engine.name == "jetstream":
            asyncio.run(delete_stream(nats_url, engine.settings.live_log_stream))
