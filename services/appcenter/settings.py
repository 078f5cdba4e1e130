"""Settings of the appcenter service process (environment variables `TUTTI_*`, OPS-1)."""

from __future__ import annotations

from grpcserver.settings import DEFAULT_PORTS, ServerSettings


class Settings(ServerSettings):
    """Settings of the appcenter service; see :class:`~grpcserver.settings.ServerSettings`."""

    listen_address: str = f"127.0.0.1:{DEFAULT_PORTS['appcenter']}"
    """``host:port`` to listen on (``TUTTI_LISTEN_ADDRESS``)."""

    appcenter_load_max_depth: int = 32
    """Deepest group nesting one ``LoadApps`` accepts (``TUTTI_APPCENTER_LOAD_MAX_DEPTH``)."""

    appcenter_load_max_groups: int = 10_000
    """Most groups one ``LoadApps`` request may carry (``TUTTI_APPCENTER_LOAD_MAX_GROUPS``)."""

    appcenter_load_max_artifacts: int = 100_000
    """Most artifacts one ``LoadApps`` request may carry
    (``TUTTI_APPCENTER_LOAD_MAX_ARTIFACTS``)."""
