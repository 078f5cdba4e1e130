"""One bounded first connection to NATS for the core-NATS clients (SCALE-2, SCALE-4).

Host's wake-up signals and livestream's publisher hand-over each hold a plain NATS
connection (no JetStream). Both reconnect without end after the first connection, so that
first connection is bounded here by ``TUTTI_NATS_CONNECT_TIMEOUT_SECONDS``: past it the
caller fails to start and its orchestrator restarts it. The JetStream live log connects on
its own (it needs its stream check and reconnect callbacks inside the same bound).
Imported lazily (``nats-py`` is the ``scale`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import nats.errors
from nats.aio.client import Client as NatsClient

from livelog.interface import LiveLogUnavailable
from livelog.settings import LiveLogSettings

__all__ = ["connect_core"]


async def connect_core(settings: LiveLogSettings, *, name: str, log: logging.Logger) -> NatsClient:
    """A connected client to ``settings.nats_url`` that reconnects without end.

    Args:
        settings: the bus settings (URL list, first-connection bound).
        name: the client name the server shows.
        log: where the client's transport errors go (debug: reconnects are routine).

    Raises:
        LiveLogUnavailable: the server could not be reached within the bound.
    """
    client = NatsClient()

    async def error(err: Exception) -> None:
        log.debug("%s: NATS error: %s", name, err)

    bound = settings.nats_connect_timeout_seconds
    try:
        async with asyncio.timeout(bound):
            await client.connect(
                servers=[url.strip() for url in settings.nats_url.split(",") if url.strip()],
                name=name,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                # nats-py annotates this int but sleeps for it as seconds (a float).
                reconnect_time_wait=0.25,  # type: ignore[arg-type]
                connect_timeout=2,
                error_cb=error,
            )
    except (TimeoutError, OSError, nats.errors.Error) as err:
        with contextlib.suppress(Exception):
            await client.close()
        raise LiveLogUnavailable(
            f"NATS at {settings.nats_url} unreachable within {bound:g} s: {err!r}"
        ) from err
    except BaseException:
        with contextlib.suppress(Exception):
            await client.close()
        raise
    return client
