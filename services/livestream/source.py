"""The one narrow interface through which livestream reads Host (ADR 0019).

:class:`ActivitySource` is all a workspace feed and an attachment baseline need: watch a
workspace's activity from an event id, and read a Session's baseline. The scale-out issue
puts a cross-replica log behind the same interface without touching framing, replay or
attachments. :class:`HostActivitySource` implements it over Host's generated client;
livestream imports nothing else of Host.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import activity_pb2, host_pb2, host_pb2_grpc
from grpcserver.call_errors import call_error
from grpcserver.channels import aio_channel
from grpcserver.settings import ServerSettings

__all__ = [
    "ActivitySource",
    "Baseline",
    "CursorExpired",
    "HostActivitySource",
    "SessionNotFound",
    "SourceUnavailable",
    "WatchItem",
    "interaction_root",
]

WatchItem = activity_pb2.ActivityStreamReady | activity_pb2.ActivityEvent

MAX_HOST_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest message read from Host: one event may carry a large tool output or a message
batch; livestream re-expresses or replaces it, so it must first be able to read it."""

BASELINE_READ_SECONDS = 30.0
"""Deadline of each Host read of a baseline."""


class SourceUnavailable(Exception):
    """Host could not be read now (transport loss, drain, or a refusal); retry later.

    ``code`` is the gRPC status name Host answered ("UNAVAILABLE" for a transport loss); a
    refusal such as ``PERMISSION_DENIED`` means this process is misconfigured.
    """

    def __init__(self, message: str, code: str = "UNAVAILABLE") -> None:
        super().__init__(message)
        self.code = code


class CursorExpired(Exception):
    """Host no longer holds the events after the cursor (LIVE-UP-1)."""


class SessionNotFound(Exception):
    """No live Session with that id exists in the workspace."""


@dataclass(frozen=True)
class Baseline:
    """A Session's canonical baseline, read fresh from Host (LIVE-ATT-1).

    Attributes:
        session: The canonical Session.
        turns: Every effective Turn of the Session, oldest first.
        root_turn_id: The current interaction root: the active Turn, or the root Turn it
            works for; ``None`` when no Turn is active.
        interactions: The Session's pending Interactions under that root.
    """

    session: canonical_pb2.Session
    turns: Sequence[canonical_pb2.Turn]
    root_turn_id: str | None
    interactions: Sequence[canonical_pb2.Interaction] = field(default_factory=tuple)


class ActivitySource(Protocol):
    """What livestream needs of Host."""

    def watch(self, workspace_id: str, after_event_id: int | None) -> AsyncIterator[WatchItem]:
        """The workspace's activity: first the ready marker, then events.

        Raises (from the iterator):
            CursorExpired: ``after_event_id`` is no longer (or not yet) held.
            SourceUnavailable: the stream could not be opened or dropped.
        """
        ...

    async def read_baseline(self, workspace_id: str, session_id: str) -> Baseline:
        """Read a Session's baseline.

        Raises:
            SessionNotFound: no live Session with that id in the workspace.
            SourceUnavailable: Host could not be read.
        """
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


def interaction_root(
    session: canonical_pb2.Session, turns: Sequence[canonical_pb2.Turn]
) -> str | None:
    """The current interaction root Turn of a Session.

    Its active Turn, or the root Turn that Turn works for (a child Session's Turn); ``None``
    without an active Turn.
    """
    if not session.HasField("active_turn_id"):
        return None
    for turn in turns:
        if turn.turn_id == session.active_turn_id:
            return turn.root_turn_id if turn.HasField("root_turn_id") else turn.turn_id
    return session.active_turn_id


def _reason(error: grpc.aio.AioRpcError) -> str:
    return call_error(error).reason


class HostActivitySource:
    """:class:`ActivitySource` over Host's gRPC API, authenticated with the service token."""

    def __init__(self, settings: ServerSettings) -> None:
        self._settings = settings
        token = settings.service_token.get_secret_value() if settings.service_token else None
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel: grpc.aio.Channel | None = None

    def _stub(self) -> Any:  # the generated stubs are typed for sync channels
        if self._channel is None:
            self._channel = aio_channel(
                self._settings.host_address,
                self._settings,
                options=[("grpc.max_receive_message_length", MAX_HOST_MESSAGE_BYTES)],
            )
        return host_pb2_grpc.HostServiceStub(self._channel)

    async def watch(
        self, workspace_id: str, after_event_id: int | None
    ) -> AsyncIterator[WatchItem]:
        """Watch a workspace's activity on Host, after ``after_event_id`` or from the head.

        Yields:
            The ``ready`` marker once the subscription is registered, and each event.

        Raises:
            CursorExpired: Host no longer holds ``after_event_id``.
            SourceUnavailable: The stream ended or failed for any other reason.
        """
        request = host_pb2.WatchActivityRequest(workspace_id=workspace_id)
        if after_event_id is not None:
            request.after_event_id = after_event_id
        call = self._stub().WatchActivity(request, metadata=self._metadata)
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    raise SourceUnavailable("Host ended the activity stream")
                if response.WhichOneof("item") == "ready":
                    yield response.ready
                else:
                    yield response.event
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.OUT_OF_RANGE and (
                _reason(error) == "EVENT_CURSOR_EXPIRED"
            ):
                raise CursorExpired(error.details() or "cursor expired") from None
            raise SourceUnavailable(
                f"{error.code().name}: {error.details()}", error.code().name
            ) from None
        finally:
            call.cancel()

    async def read_baseline(self, workspace_id: str, session_id: str) -> Baseline:
        """Read a Session, all its Turns and its interaction root's pending interactions.

        Raises:
            SessionNotFound: The Session does not exist, is deleted or cannot exist.
            SourceUnavailable: Host failed the read otherwise.
        """
        stub = self._stub()
        try:
            detail = await stub.GetSession(
                host_pb2.GetSessionRequest(workspace_id=workspace_id, session_id=session_id),
                metadata=self._metadata,
                timeout=BASELINE_READ_SECONDS,
            )
            if detail.session.HasField("tombstone"):
                raise SessionNotFound(session_id)
            turns: list[canonical_pb2.Turn] = []
            cursor = ""
            while True:
                page = await stub.ListSessionTurns(
                    host_pb2.ListSessionTurnsRequest(
                        workspace_id=workspace_id, session_id=session_id, cursor=cursor, limit=1000
                    ),
                    metadata=self._metadata,
                    timeout=BASELINE_READ_SECONDS,
                )
                turns.extend(page.turns)
                cursor = page.next_cursor
                if not cursor:
                    break
        except grpc.aio.AioRpcError as error:
            if error.code() in (
                grpc.StatusCode.NOT_FOUND,
                grpc.StatusCode.FAILED_PRECONDITION,
                # Host refuses an id no Session can have (NUL, too long): none exists.
                grpc.StatusCode.INVALID_ARGUMENT,
            ):
                raise SessionNotFound(session_id) from None
            raise SourceUnavailable(
                f"{error.code().name}: {error.details()}", error.code().name
            ) from None
        root = interaction_root(detail.session, turns)
        roots = {
            t.turn_id: (t.root_turn_id if t.HasField("root_turn_id") else t.turn_id) for t in turns
        }
        interactions = [
            i
            for i in detail.pending_interactions
            if root is not None and roots.get(i.turn_id) == root
        ]
        return Baseline(detail.session, turns, root, interactions)

    async def close(self) -> None:
        """Close the channel to Host (a later call opens a new one)."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
