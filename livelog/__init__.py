"""The per-workspace live log shared by Host replicas and livestream (SCALE-3).

One interface (:class:`~livelog.interface.LiveLog`) with two engines behind it:

* :class:`~livelog.inprocess.InProcessLiveLog` — the single-node default, no server needed;
* :class:`~livelog.jetstream.JetStreamLiveLog` — NATS JetStream, one subject per workspace in
  one bounded stream, for several replicas (imported lazily: ``nats-py`` is an extra).

Publication returns only once the log holds the item (deduplicated by message id); a
subscription yields a workspace's items in log order with their sequence, and says so with a
typed :class:`~livelog.interface.Discontinuity` whenever items may be missing. ADR 0036.
"""

from livelog.interface import (
    Discontinuity,
    DiscontinuityReason,
    InvalidWorkspace,
    LiveLog,
    LiveLogSubscription,
    LiveLogUnavailable,
    LogEntry,
    LogPosition,
    PublishAck,
)

__all__ = [
    "Discontinuity",
    "DiscontinuityReason",
    "InvalidWorkspace",
    "LiveLog",
    "LiveLogSubscription",
    "LiveLogUnavailable",
    "LogEntry",
    "LogPosition",
    "PublishAck",
]
