"""Settings shared by every service process (OPS-1).

Each service subclasses :class:`ServerSettings` once (``HostSettings`` and so on) to set
its own default port and add its own fields; nothing else reads ``os.environ``.
Every field is read from an environment variable with the ``TUTTI_`` prefix, e.g.
``TUTTI_LISTEN_ADDRESS`` or ``TUTTI_GRACE_PERIOD_SECONDS``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_PORTS: dict[str, int] = {
    "host": 50051,
    "refresolve": 50052,
    "livestream": 50053,
    "maintenance": 50054,
    "appcenter": 50055,
    "issuemanager": 50056,
}
"""Default gRPC port of each service (also used by ``deploy/`` and ``tutti up``)."""


class StartupError(Exception):
    """The settings cannot be put in force (an unreadable TLS file, a port in use).

    The message is one line naming the setting or address; ``tutti serve`` prints it and
    exits non-zero, without a traceback.
    """


def default_data_dir() -> Path:
    """Return the per-user data directory used when ``TUTTI_DATA_DIR`` is unset."""
    return Path.home() / ".local" / "share" / "tutti"


class ServerSettings(BaseSettings):
    """Settings of one service process; every field maps to ``TUTTI_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="TUTTI_", extra="ignore", frozen=True)

    listen_address: str = "127.0.0.1:0"
    """``host:port`` to listen on; port 0 picks a free port (tests)."""

    data_dir: Path = Field(default_factory=default_data_dir)
    """Where the default SQLite database and the local auth files live."""

    resources_dir: Path | None = None
    """Root of the per-Session runtime resources (sidecar state, copied attachments, scratch
    directories, agent leases; ``session_resources``) that runtimes create and maintenance
    releases after a purge; unset means ``<data_dir>/resources``."""

    database_url: str | None = None
    """SQLAlchemy URL of the canonical store; unset means SQLite in ``data_dir``."""

    sqlite_write_queue_seconds: float = Field(default=30.0, gt=0)
    """On SQLite, how long a write waits in this process's first-come-first-served write
    queue before ``UNAVAILABLE`` ``STORE_BUSY`` (with ``RetryInfo``); ignored on Postgres."""

    sqlite_group_commit: bool | None = None
    """On SQLite, concurrent write transactions of this process share one commit, each in its
    own savepoint and with its own outcome (``store.write_queue``); off, each commits alone
    (``TUTTI_SQLITE_GROUP_COMMIT``). Unset: on exactly with ``sqlite_synchronous=FULL``, where
    a commit waits for an ``fsync``; with ``NORMAL`` a commit costs microseconds and sharing it
    only adds hand-offs (ADR 0025). Ignored on Postgres."""

    sqlite_synchronous: Literal["NORMAL", "FULL"] = "NORMAL"
    """On SQLite, ``PRAGMA synchronous`` in WAL mode (``TUTTI_SQLITE_SYNCHRONOUS``): ``NORMAL``
    keeps every commit atomic and may lose the newest commits on a power loss; ``FULL`` keeps
    every acknowledged commit, at an ``fsync`` per commit that group commit shares (ADR 0025).
    Ignored on Postgres."""

    auth_tokens_file: Path | None = None
    """YAML/JSON bearer-token registry (see docs/auth.md); unset means
    ``<data_dir>/auth/tokens.yaml`` when it exists, otherwise every call is refused."""

    service_token: SecretStr | None = None
    """Bearer token this process presents when it calls another service."""

    grace_period_seconds: float = 20.0
    """How long SIGTERM waits for in-flight RPCs before cancelling them."""

    drain_delay_seconds: float = 2.0
    """After SIGTERM, keep answering (health NOT_SERVING) this long so load balancers
    stop routing here before new RPCs are refused; counted within the grace period."""

    reflection: bool = True
    """Serve gRPC server reflection (without a token, like health)."""

    log_level: str = "INFO"
    """Root log level."""

    log_format: Literal["json", "text"] = "json"
    """``json`` (one object per line) for production, ``text`` for a terminal."""

    otel_exporter: Literal["none", "otlp", "console"] = "none"
    """Trace and metric exporter; ``none`` keeps telemetry in-process only."""

    otel_endpoint: str | None = None
    """OTLP endpoint when ``otel_exporter`` is ``otlp``."""

    metrics_port: int = 0
    """Port of the Prometheus scrape endpoint; 0 disables it."""

    tls_cert_file: Path | None = None
    """PEM server certificate; with ``tls_key_file`` the port serves TLS."""

    tls_key_file: Path | None = None
    """PEM private key of ``tls_cert_file``."""

    tls_client_ca_file: Path | None = None
    """PEM CA bundle; when set, clients must present a certificate (mTLS)."""

    tls_ca_file: Path | None = None
    """PEM CA bundle that verifies the servers this process calls; when set, every
    outgoing channel (to backends, to Host, from the CLI) speaks TLS."""

    tls_client_cert_file: Path | None = None
    """PEM client certificate that outgoing channels present (mTLS); needs ``tls_ca_file``."""

    tls_client_key_file: Path | None = None
    """PEM private key of ``tls_client_cert_file``."""

    host_address: str = f"127.0.0.1:{DEFAULT_PORTS['host']}"
    """Where the host service listens, for services that call it."""

    appcenter_address: str = f"127.0.0.1:{DEFAULT_PORTS['appcenter']}"
    """Where the AppCenter backend listens."""

    issuemanager_address: str = f"127.0.0.1:{DEFAULT_PORTS['issuemanager']}"
    """Where the IssueManager backend listens."""

    @model_validator(mode="after")
    def _check_tls(self) -> ServerSettings:
        """Refuse half a TLS configuration instead of silently serving plaintext."""
        pairs = (
            ("tls_cert_file", "tls_key_file"),
            ("tls_client_cert_file", "tls_client_key_file"),
        )
        for first, second in pairs:
            if (getattr(self, first) is None) != (getattr(self, second) is None):
                raise ValueError(
                    f"TUTTI_{first.upper()} and TUTTI_{second.upper()} must be set together"
                )
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("TUTTI_TLS_CLIENT_CA_FILE needs TUTTI_TLS_CERT_FILE (a TLS port)")
        if self.tls_client_cert_file is not None and self.tls_ca_file is None:
            raise ValueError("TUTTI_TLS_CLIENT_CERT_FILE needs TUTTI_TLS_CA_FILE (a TLS channel)")
        return self

    def resolved_database_url(self) -> str:
        """Return the store URL, defaulting to SQLite inside ``data_dir``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'tutti.db').resolve()}"

    def resolved_resources_dir(self) -> Path:
        """Return the resource root, defaulting to ``resources`` inside ``data_dir``."""
        if self.resources_dir is not None:
            return self.resources_dir
        return self.data_dir / "resources"

    def resolved_tokens_file(self) -> Path | None:
        """Return the token registry to load, or ``None`` to refuse every call."""
        if self.auth_tokens_file is not None:
            return self.auth_tokens_file
        candidate = self.data_dir / "auth" / "tokens.yaml"
        return candidate if candidate.exists() else None
