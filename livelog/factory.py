"""Open the live log the settings name (``TUTTI_BUS``)."""

from __future__ import annotations

from typing import TypeVar

from livelog.codec import Codec
from livelog.inprocess import InProcessLiveLog
from livelog.interface import LiveLog
from livelog.settings import LiveLogSettings

__all__ = ["open_live_log"]

T = TypeVar("T")


async def open_live_log(settings: LiveLogSettings, codec: Codec[T]) -> LiveLog[T]:
    """The in-process log (default) or the JetStream log, connected and with its stream.

    Args:
        settings: ``TUTTI_BUS`` and the stream's name and bounds.
        codec: How items become bytes on the bus (unused by the in-process log).

    Raises:
        LiveLogUnavailable: ``bus=nats`` and the server cannot be reached.
    """
    if settings.bus == "nats":
        # Imported here: nats-py is the ``scale`` extra, not needed by a single node.
        from livelog.jetstream import JetStreamLiveLog

        return await JetStreamLiveLog.connect(settings, codec)
    return InProcessLiveLog(
        max_msgs=settings.live_log_max_msgs,
        max_bytes=settings.live_log_max_bytes,
        max_age_seconds=settings.live_log_max_age_seconds,
        duplicate_window_seconds=settings.live_log_duplicate_window_seconds,
    )
