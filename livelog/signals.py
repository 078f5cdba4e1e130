"""Fire-and-forget wake-up signals between replicas on core NATS (SCALE-2, ADR 0042).

A signal is a hint that durable state changed (a command row to dispatch, an acknowledgement
recorded): it is not stored, not acknowledged and may be lost, so every receiver also polls
the store on its own schedule. Core NATS fits that exactly: no stream, no consumer, a
publication is one buffered write. Subjects are ``<signal_subject_prefix>.<name>``, outside
the live log's stream. Imported lazily (``nats-py`` is the ``scale`` extra).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from livelog.nats_connection import connect_core
from livelog.settings import LiveLogSettings

__all__ = ["NatsSignals"]

_log = logging.getLogger(__name__)


class NatsSignals:
    """One core-NATS connection for publishing and receiving named signals."""

    def __init__(self, settings: LiveLogSettings, client: NatsClient) -> None:
        self._prefix = settings.signal_subject_prefix
        self._nc = client

    @classmethod
    async def connect(cls, settings: LiveLogSettings, *, name: str) -> NatsSignals:
        """Connect to ``settings.nats_url`` within ``nats_connect_timeout_seconds``.

        Raises:
            LiveLogUnavailable: the server cannot be reached in time.
        """
        return cls(settings, await connect_core(settings, name=name, log=_log))

    def subject(self, name: str) -> str:
        """The subject of signal ``name``."""
        return f"{self._prefix}.{name}"

    async def publish(self, name: str, payload: bytes) -> bool:
        """Publish one signal; ``False`` when it could not be handed to the connection.

        Never raises for a bus failure: a lost signal costs the receiver one poll interval.
        """
        try:
            await self._nc.publish(self.subject(name), payload)
        except (OSError, nats.errors.Error) as err:
            _log.info("signal %s not published: %s", name, err)
            return False
        return True

    async def subscribe(self, name: str, receive: Callable[[bytes], None]) -> None:
        """Call ``receive`` with the payload of every signal ``name`` (this process's too)."""

        async def deliver(message: Msg) -> None:
            try:
                receive(message.data)
            except Exception:  # noqa: BLE001 - one bad signal must not end the subscription
                _log.warning("signal %s could not be handled", name, exc_info=True)

        await self._nc.subscribe(self.subject(name), cb=deliver)

    async def close(self) -> None:
        """Close the connection (idempotent)."""
        with contextlib.suppress(Exception):
            await self._nc.close()
