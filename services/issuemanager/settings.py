"""Settings of the issuemanager service process (environment variables `TUTTI_*`, OPS-1)."""

from __future__ import annotations

from grpcserver.settings import DEFAULT_PORTS, ServerSettings


class Settings(ServerSettings):
    """Settings of the issuemanager service; see :class:`~grpcserver.settings.ServerSettings`."""

    listen_address: str = f"127.0.0.1:{DEFAULT_PORTS['issuemanager']}"
    """``host:port`` to listen on (``TUTTI_LISTEN_ADDRESS``)."""

    issuemanager_detail_max_outputs: int = 10_000
    """Most latest outputs ``GetIssueDetail`` returns before it reports truncation
    (``TUTTI_ISSUEMANAGER_DETAIL_MAX_OUTPUTS``)."""

    issuemanager_load_max_issues: int = 10_000
    """Most issues one ``LoadTopics`` request may carry (``TUTTI_ISSUEMANAGER_LOAD_MAX_ISSUES``)."""

    issuemanager_load_max_outputs: int = 100_000
    """Most outputs one ``LoadTopics`` request may carry
    (``TUTTI_ISSUEMANAGER_LOAD_MAX_OUTPUTS``)."""
