"""The device-side live ``Subscriber`` library (LIVE-SUB-1).

A device (phone app, remote client, ``tutti live watch``) keeps one resumable
``DeviceLink`` to the livestream service::

    from services.livestream.subscriber import (
        Delivered, FileStateStore, Reconcile, Subscriber, Terminated,
    )

    async with Subscriber(
        target="127.0.0.1:50053",
        token=token,
        device_id="phone-1",
        workspace_ids=["ws-1"],
        store=FileStateStore("live-state.json"),
    ) as sub:
        await sub.attach("screen", "ws-1", "s-1")
        async for event in sub.events():
            if isinstance(event, Delivered):
                apply(event.delivery)                # message_delta, turn_update, ...
            elif isinstance(event, Reconcile):
                reread_from_host(event.keys)         # the lane cannot vouch for these
            elif isinstance(event, Terminated):
                break                                # refused for good

What the library guarantees:

* frames are checked for epoch/sequence continuity by the pure
  :class:`~services.livestream.subscriber.continuity.ContinuityMachine`: the application
  never sees a duplicate, and any gap, lost tail or protocol error becomes a
  :class:`Reconcile` (the cursor is then dropped and the next call starts a fresh epoch);
* the resume cursor, the attachment projection and the per-binding revisions are
  persisted together after every accepted frame (:mod:`.state`), so a restarted app
  resumes exactly where it was, a binding stays "not caught up" across a resume until
  its barrier arrives, and revisions never go backwards;
* calls that end for a curable reason (draining, transport loss, slow consumer,
  deadline) are resumed with capped, jittered backoff, honouring ``RetryInfo``;
  refusals that would repeat end the stream with :class:`Terminated`;
* attachments are re-sent with fresh revisions whenever a new epoch begins;
* :meth:`Subscriber.open_generation` closes the app's current local generation: events
  queued under it are dropped when read (e.g. after the app was backgrounded).
"""

from __future__ import annotations

from services.livestream.subscriber.client import (
    CHANNEL_OPTIONS,
    TERMINAL_CODES,
    TERMINAL_REASONS,
    Backoff,
    Connecting,
    LinkEnd,
    Reconnecting,
    Subscriber,
    SubscriberEvent,
    Terminated,
    link_end,
)
from services.livestream.subscriber.continuity import (
    PROTOCOL_REVISION,
    AttachmentCaughtUp,
    AttachmentDetached,
    AttachmentRejected,
    AttachmentStarted,
    ContinuityEvent,
    ContinuityMachine,
    Delivered,
    Ready,
    Reconcile,
    ReconcileKey,
    ReconcileReason,
    ResumeRejected,
)
from services.livestream.subscriber.state import (
    Attachment,
    Cursor,
    DesiredAttachment,
    DeviceState,
    FileStateStore,
    MemoryStateStore,
    StateCorruptError,
    StateStore,
)

__all__ = [
    "CHANNEL_OPTIONS",
    "PROTOCOL_REVISION",
    "TERMINAL_CODES",
    "TERMINAL_REASONS",
    "Attachment",
    "AttachmentCaughtUp",
    "AttachmentDetached",
    "AttachmentRejected",
    "AttachmentStarted",
    "Backoff",
    "Connecting",
    "ContinuityEvent",
    "ContinuityMachine",
    "Cursor",
    "Delivered",
    "DesiredAttachment",
    "DeviceState",
    "FileStateStore",
    "LinkEnd",
    "MemoryStateStore",
    "Ready",
    "Reconcile",
    "ReconcileKey",
    "ReconcileReason",
    "Reconnecting",
    "ResumeRejected",
    "StateCorruptError",
    "StateStore",
    "Subscriber",
    "SubscriberEvent",
    "Terminated",
    "link_end",
]
