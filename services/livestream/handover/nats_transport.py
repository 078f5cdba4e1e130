"""Publisher hand-over over NATS request/reply (``TUTTI_BUS=nats``, SCALE-4, ADR 0043).

The replica holding a publisher subscribes to ``livepub.handoff.<epoch>`` for its current
epoch, and only it: a request for an epoch nobody holds (its owner crashed) is answered
"no responders" by the server at once. The owner answers a request by publishing the
publisher's state to the request's reply inbox as chunks of at most 1 MiB (or the server's
``max_payload`` if smaller), or one refusal. The asking replica validates every message
(:mod:`services.livestream.handover.state`); anything malformed is refused and logged, and
the device's resume is then rejected, typed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

import nats
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from grpcserver.settings import StartupError
from livelog.interface import LiveLogUnavailable
from livelog.nats_connection import connect_core
from livelog.settings import LiveLogSettings
from services.livestream.handover.port import OwnerLost, StateProvider
from services.livestream.handover.state import (
    MAX_CHUNK_BYTES,
    HandoverRefused,
    HandoverRequest,
    PublisherState,
    Reassembly,
    Refusal,
    decode_request,
    decode_state,
    encode_refusal,
    encode_request,
    encode_state,
    split,
)

__all__ = ["SUBJECT_PREFIX", "NatsHandover", "subject_of"]

log = logging.getLogger(__name__)

SUBJECT_PREFIX: Final = "livepub.handoff"
HEADER_ALLOWANCE: Final = 1024 * 1024
"""Bytes a state may take beyond its replay tail (identity, bindings, positions)."""
_NO_RESPONDERS: Final = "503"


def subject_of(epoch: str) -> str:
    """The request subject of an epoch (the caller checked it is an epoch token)."""
    return f"{SUBJECT_PREFIX}.{epoch}"


class NatsHandover:
    """:class:`~services.livestream.handover.port.HandoverTransport` on one NATS connection."""

    def __init__(self, settings: LiveLogSettings, *, timeout_seconds: float) -> None:
        self._settings = settings
        self._timeout = timeout_seconds
        self._client: NatsClient | None = None
        self._provider: StateProvider | None = None
        self._wanted: set[str] = set()
        self._subscriptions: dict[str, Subscription] = {}
        self._wake = asyncio.Event()
        self._sync: asyncio.Task[None] | None = None

    def bind(self, provider: StateProvider) -> None:
        """Answer requests with ``provider`` (the registry's ``hand_over``)."""
        self._provider = provider

    async def start(self) -> None:
        """Connect (bounded by ``TUTTI_NATS_CONNECT_TIMEOUT_SECONDS``) and start answering.

        Raises:
            StartupError: NATS could not be reached in time.
        """
        try:
            client = await connect_core(self._settings, name="tutti-livestream-handover", log=log)
        except LiveLogUnavailable as err:
            raise StartupError(f"hand-over: {err}") from None
        self._client = client
        self._sync = asyncio.create_task(self._sync_subscriptions(), name="handover-subscriptions")
        self._wake.set()

    async def close(self) -> None:
        """Stop answering and disconnect."""
        if self._sync is not None:
            self._sync.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sync
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.drain()
            self._client = None

    # ---- answering -----------------------------------------------------------------

    def announce(self, epoch: str) -> None:
        """Answer for ``epoch`` (subscribed in the background, in order with withdrawals)."""
        self._wanted.add(epoch)
        self._wake.set()

    def withdraw(self, epoch: str) -> None:
        """Stop answering for ``epoch``."""
        self._wanted.discard(epoch)
        self._wake.set()

    async def _sync_subscriptions(self) -> None:
        """Make the subscriptions follow the wanted epochs (one task, so never out of order)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            client = self._client
            if client is None:
                return
            try:
                for epoch in [e for e in self._subscriptions if e not in self._wanted]:
                    await self._subscriptions.pop(epoch).unsubscribe()
                for epoch in [e for e in self._wanted if e not in self._subscriptions]:
                    self._subscriptions[epoch] = await client.subscribe(
                        subject_of(epoch), cb=self._answer
                    )
            except (nats.errors.Error, OSError) as err:
                log.warning("hand-over: subscriptions not updated (%s); retrying", err)
                await asyncio.sleep(0.5)
                self._wake.set()

    async def _answer(self, msg: Msg) -> None:
        """Answer one hand-over request (never raises: a bad request is refused, logged)."""
        client = self._client
        if client is None or not msg.reply:
            return
        try:
            try:
                request = decode_request(msg.data)
                if subject_of(request.epoch) != msg.subject:
                    raise HandoverRefused("BAD_FORMAT", "the request names another epoch")
                if self._provider is None:
                    raise HandoverRefused("UNKNOWN_EPOCH", "not answering hand-overs")
                state = self._provider(request)
            except HandoverRefused as refused:
                log.warning("hand-over request on %s refused: %s", msg.subject, refused)
                await client.publish(
                    msg.reply, encode_refusal(Refusal(refused.reason, refused.resume_rejected))
                )
                return
            limit = min(MAX_CHUNK_BYTES, client.max_payload or MAX_CHUNK_BYTES)
            # No flush here: the client's flusher sends what is buffered, and concurrent
            # flushes (one answer per subscription task) break nats-py's PONG bookkeeping.
            for chunk in split(encode_state(state), limit):
                await client.publish(msg.reply, chunk)
        except Exception:
            log.exception("hand-over answer on %s failed", msg.subject)

    # ---- asking --------------------------------------------------------------------

    async def request(self, request: HandoverRequest, max_replay_bytes: int) -> PublisherState:
        """Ask the owner of ``request.epoch`` for its publisher (see the module docstring).

        Raises:
            OwnerLost: no responders, no complete answer in time, or no bus.
            HandoverRefused: the owner refused, or the answer is not a valid state.
        """
        client = self._client
        if client is None or not client.is_connected:
            raise OwnerLost("not connected to NATS")
        inbox = client.new_inbox()
        reassembly = Reassembly(max_replay_bytes + HEADER_ALLOWANCE)
        try:
            subscription = await client.subscribe(inbox)
        except (nats.errors.Error, OSError) as err:
            raise OwnerLost(f"bus: {err}") from None
        try:
            await client.publish(subject_of(request.epoch), encode_request(request), reply=inbox)
            while True:
                msg = await subscription.next_msg(timeout=self._timeout)
                if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
                    raise OwnerLost("no responders")
                data = reassembly.add(msg.data)
                if data is not None:
                    return decode_state(data, max_replay_bytes)
        except nats.errors.TimeoutError:
            raise OwnerLost(f"no complete answer within {self._timeout:g} s") from None
        except (nats.errors.Error, OSError) as err:
            raise OwnerLost(f"bus: {err}") from None
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
