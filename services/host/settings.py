"""Settings of the host service process (environment variables `TUTTI_*`, OPS-1)."""

from __future__ import annotations

from grpcserver.settings import DEFAULT_PORTS, ServerSettings


class Settings(ServerSettings):
    """Settings of the host service; see :class:`~grpcserver.settings.ServerSettings`."""

    listen_address: str = f"127.0.0.1:{DEFAULT_PORTS['host']}"
    """``host:port`` to listen on (``TUTTI_LISTEN_ADDRESS``)."""

    runtime_loss_grace_seconds: float = 30.0
    """How long a runtime may stay disconnected before Host confirms its provider sessions
    dead: their active Turns settle ``interrupted`` and their pending and resolving
    Interactions become ``superseded`` (``TUTTI_RUNTIME_LOSS_GRACE_SECONDS``, HOST-RT-1)."""

    runtime_command_timeout_seconds: float = 10.0
    """How long Host waits for a runtime to acknowledge a command it awaits, for example
    live settings (``TUTTI_RUNTIME_COMMAND_TIMEOUT_SECONDS``)."""
