"""Settings of the appcenter service process (environment variables `TUTTI_*`, OPS-1)."""

from __future__ import annotations

from grpcserver.settings import DEFAULT_PORTS, ServerSettings


class Settings(ServerSettings):
    """Settings of the appcenter service; see :class:`~grpcserver.settings.ServerSettings`."""

    listen_address: str = f"127.0.0.1:{DEFAULT_PORTS['appcenter']}"
    """``host:port`` to listen on (``TUTTI_LISTEN_ADDRESS``)."""
