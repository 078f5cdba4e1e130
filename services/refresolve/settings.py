"""Settings of the refresolve service process (environment variables `TUTTI_*`, OPS-1).

The backends are found at ``appcenter_address`` / ``issuemanager_address`` and called
with ``service_token`` (both inherited from :class:`~grpcserver.settings.ServerSettings`).
"""

from __future__ import annotations

from grpcserver.settings import DEFAULT_PORTS, ServerSettings


class Settings(ServerSettings):
    """Settings of the refresolve service; see :class:`~grpcserver.settings.ServerSettings`."""

    listen_address: str = f"127.0.0.1:{DEFAULT_PORTS['refresolve']}"
    """``host:port`` to listen on (``TUTTI_LISTEN_ADDRESS``)."""

    refresolve_timeout_seconds: float = 30.0
    """Longest one resolution may take when the caller's deadline is later or unset
    (``TUTTI_REFRESOLVE_TIMEOUT_SECONDS``); backend calls get the time left."""

    refresolve_max_depth: int = 16
    """Deepest group nesting walked below the requested container (REF-BOUND-1,
    ``TUTTI_REFRESOLVE_MAX_DEPTH``)."""

    refresolve_max_groups: int = 10_000
    """Most distinct groups one resolution visits (``TUTTI_REFRESOLVE_MAX_GROUPS``)."""

    refresolve_max_pages: int = 2_000
    """Most backend pages one resolution reads (``TUTTI_REFRESOLVE_MAX_PAGES``)."""

    refresolve_backend_concurrency: int = 8
    """Containers fetched at once while walking an app
    (``TUTTI_REFRESOLVE_BACKEND_CONCURRENCY``)."""

    refresolve_backend_page_size: int = 100
    """``page_size`` asked of the backends (``TUTTI_REFRESOLVE_BACKEND_PAGE_SIZE``)."""
