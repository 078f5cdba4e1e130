"""Settings of the issuemanager service process (environment variables `TUTTI_*`, OPS-1)."""

from __future__ import annotations

from grpcserver.settings import DEFAULT_PORTS, ServerSettings


class Settings(ServerSettings):
    """Settings of the issuemanager service; see :class:`~grpcserver.settings.ServerSettings`."""

    listen_address: str = f"127.0.0.1:{DEFAULT_PORTS['issuemanager']}"
    """``host:port`` to listen on (``TUTTI_LISTEN_ADDRESS``)."""
