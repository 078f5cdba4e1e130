"""The live log's interface: positions, entries, discontinuities, errors (SCALE-3).

A live log is a bounded, ordered log of items per workspace. Every item gets a position
``(epoch, sequence)``: the sequence grows with every item of the log (across workspaces, so a
workspace's sequences are increasing but not dense) and the epoch names one incarnation of the
log — when the log is recreated (a restarted process, a recreated stream) sequences start
again under a new epoch, so a cursor can never point into the wrong history.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

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
    "SubscriptionEvent",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True, order=True)
class LogPosition:
    """Where an item sits in the log.

    Attributes:
        epoch: The log incarnation; positions of different epochs are not comparable.
        sequence: The item's sequence within the epoch (starting at 1; 0 is "before the
            first item").
    """

    epoch: str
    sequence: int


@dataclass(frozen=True)
class PublishAck:
    """The log's acknowledgement of one publication.

    Attributes:
        position: Where the item is stored (for a duplicate: where the first copy is).
        duplicate: The message id was already published within the duplicate window; the
            log kept the first copy only.
    """

    position: LogPosition
    duplicate: bool


@dataclass(frozen=True)
class LogEntry(Generic[T_co]):
    """One item of a workspace, in log order.

    Attributes:
        workspace_id: The workspace the item was published to.
        position: The item's position.
        msg_id: The message id it was published with.
        item: The item itself.
    """

    workspace_id: str
    position: LogPosition
    msg_id: str
    item: T_co


class DiscontinuityReason(enum.StrEnum):
    """Why items of a workspace may be missing between two entries."""

    CURSOR_EVICTED = "cursor_evicted"
    """The requested start is no longer retained (the log's bounds evicted it)."""

    EPOCH_CHANGED = "epoch_changed"
    """The log was recreated: the cursor belongs to an older incarnation."""

    CURSOR_AHEAD = "cursor_ahead"
    """The cursor is beyond the log's head: the log lost items it had acknowledged."""

    CURSOR_REWRITTEN = "cursor_rewritten"
    """The item at the cursor is not the one the subscriber saw: the log lost and reused it."""

    PUBLISH_FAILED = "publish_failed"
    """A publisher failed to publish items of this workspace before this point."""


@dataclass(frozen=True)
class Discontinuity:
    """Items of the workspace may be missing here; never silent (SCALE-3).

    Attributes:
        workspace_id: The workspace concerned (the discontinuity is scoped to it).
        reason: Why items may be missing.
        after: The last position the subscriber had (None: it asked for new items only).
        position: For ``PUBLISH_FAILED``, the position of the log's gap record; otherwise
            None (the next entry continues after the gap).
    """

    workspace_id: str
    reason: DiscontinuityReason
    after: LogPosition | None
    position: LogPosition | None = None


SubscriptionEvent = LogEntry[T] | Discontinuity
"""What a subscription yields: an entry, or the notice that entries may be missing."""


class LiveLogUnavailable(Exception):
    """The log cannot take or serve items now (the bus is unreachable or timed out).

    A publication that raised this may or may not be stored; republishing it with the same
    message id is safe within the duplicate window.
    """


class InvalidWorkspace(ValueError):
    """A workspace id the log cannot address (empty)."""


class LiveLogSubscription(Protocol[T_co]):
    """An established subscription to one workspace's items.

    Iterating yields :class:`LogEntry` and :class:`Discontinuity` in log order, without end,
    until :meth:`close`.
    """

    workspace_id: str

    def __aiter__(self) -> AsyncIterator[LogEntry[T_co] | Discontinuity]:
        """Iterate over the workspace's entries and discontinuities."""
        ...

    async def close(self) -> None:
        """Stop the subscription; iteration ends."""
        ...


class LiveLog(Protocol[T]):
    """A bounded per-workspace log of items (the interface Host and livestream use)."""

    async def publish(self, workspace_id: str, item: T, msg_id: str) -> PublishAck:
        """Append ``item`` to the workspace's log and return once the log holds it.

        A second publication with the same ``msg_id`` within the duplicate window stores
        nothing and acknowledges the first copy's position.

        Raises:
            LiveLogUnavailable: the log is unreachable or did not acknowledge in time.
            InvalidWorkspace: the workspace id cannot be addressed.
        """
        ...

    async def send(self, workspace_id: str, item: T, msg_id: str) -> Awaitable[PublishAck]:
        """Send ``item`` now and return its acknowledgement to await later (pipelining).

        Sends and publications of one handle reach the log in call order; awaiting the
        returned acknowledgement gives what :meth:`publish` returns, or raises
        ``LiveLogUnavailable``. A caller that must know an item is held before it does
        something else (HOST-RT-2: a delta before the commit that confirms it) awaits it
        first; :class:`~livelog.barrier.AckBarrier` keeps them per key.

        Raises:
            LiveLogUnavailable: the item could not even be sent.
            InvalidWorkspace: the workspace id cannot be addressed.
        """
        ...

    async def subscribe(
        self, workspace_id: str, after: LogPosition | None
    ) -> LiveLogSubscription[T]:
        """Subscribe to the workspace's items after ``after`` (None: new items only).

        The subscription is established when this returns: every item published afterwards
        is delivered. A start that is not retained (or of another epoch, or ahead of the log)
        first yields a :class:`Discontinuity`, then the oldest retained items.

        Raises:
            LiveLogUnavailable: the log is unreachable.
            InvalidWorkspace: the workspace id cannot be addressed.
        """
        ...

    async def close(self) -> None:
        """Release the log's resources; open subscriptions end."""
        ...
