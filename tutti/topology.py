"""What ``tutti up`` runs: one process per service, or several replicas (SCALE-6, ADR 0040).

The single node (the default) is one process per service on the store ``TUTTI_DATABASE_URL``
names (SQLite by default) with the in-process live log. ``--replicas N --store postgres --bus
nats`` runs N Host and N livestream replicas and two maintenance replicas (their worker lease
makes that safe, SCALE-5) on one Postgres database, with the project's nats-server as the
cross-replica live log. :func:`plan_topology` checks a command line and says what it runs,
before anything is created; a combination that cannot work is a :class:`TopologyRefused`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from tutti.nats_server import NatsServerUnavailable, find_nats_server, server_version

__all__ = [
    "DEFAULT_POSTGRES_URL",
    "MAX_REPLICAS",
    "NATS_PORT_OFFSET",
    "REPLICATED",
    "REPLICA_PORT_STRIDE",
    "Topology",
    "TopologyRefused",
    "plan_topology",
]

Store = Literal["sqlite", "postgres"]
Bus = Literal["inprocess", "nats"]

DEFAULT_POSTGRES_URL: Final = "postgresql+psycopg://postgres@127.0.0.1:5432/tutti"
"""``--store postgres`` without ``--database-url`` or ``TUTTI_DATABASE_URL``: database ``tutti``
on the local server, created when missing and migrated to the newest schema."""

MAX_REPLICAS: Final = 9
"""More replicas than this on one machine only compete for its cores."""

REPLICATED: Final = ("host", "livestream", "maintenance")
"""The services that can run as several processes; the others stay one each."""

REPLICA_PORT_STRIDE: Final = 10
"""Replica i of a service listens ``10 * (i - 1)`` above replica 1 (host-2 on 50061)."""

NATS_PORT_OFFSET: Final = 9
"""nats-server listens this far above Host's port (50060 beside the default 50051)."""

MAINTENANCE_REPLICAS: Final = 2
"""Maintenance replicas with several Host replicas: a worker and a standby, as in production."""


class TopologyRefused(Exception):
    """A command line ``tutti up`` will not run; the message says why and what to do instead."""


@dataclass(frozen=True)
class Topology:
    """The processes and shared systems of one ``tutti up``."""

    replicas: int
    """Host and livestream processes (1: the single node)."""

    database_url: str
    """SQLAlchemy URL of the one store every process uses."""

    store: Store
    """``sqlite`` or ``postgres``, as the URL says."""

    nats_server: Path | None = None
    """The nats-server binary ``tutti up`` starts, or ``None`` for the in-process live log."""

    create_database: bool = False
    """Create the Postgres database when missing (``--store postgres``)."""

    @property
    def maintenance_replicas(self) -> int:
        """Maintenance processes: two beside several Host replicas, otherwise one."""
        return MAINTENANCE_REPLICAS if self.replicas > 1 else 1

    def count(self, service: str) -> int:
        """How many processes run ``service``."""
        if service == "maintenance":
            return self.maintenance_replicas
        return self.replicas if service in REPLICATED else 1

    def process_names(self, service: str) -> tuple[str, ...]:
        """``service`` itself when it runs once, else ``service-1`` ... ``service-N``."""
        count = self.count(service)
        if count == 1:
            return (service,)
        return tuple(f"{service}-{index}" for index in range(1, count + 1))


def _store_of(url: str) -> Store | None:
    scheme = url.partition("://")[0].partition("+")[0].lower()
    if scheme == "sqlite":
        return "sqlite"
    if scheme in ("postgresql", "postgres"):
        return "postgres"
    return None


def _nats_server() -> Path:
    try:
        binary = find_nats_server()
        server_version(binary)
    except NatsServerUnavailable as error:
        raise TopologyRefused(f"--bus nats: {error}") from None
    if importlib.util.find_spec("nats") is None:
        raise TopologyRefused(
            "--bus nats: the NATS client (nats-py) is not installed: scripts/install --replicas"
        )
    return binary


def plan_topology(
    *,
    replicas: int,
    store: Store | None,
    bus: Bus | None,
    database_url: str | None,
    configured_url: str | None,
    sqlite_url: str,
) -> Topology:
    """Check a ``tutti up`` command line and say what it runs.

    Args:
        replicas: ``--replicas``.
        store: ``--store``; ``None`` takes it from the database URL.
        bus: ``--bus``; ``None`` is the in-process live log, as a single node always had.
        database_url: ``--database-url``.
        configured_url: ``TUTTI_DATABASE_URL``, if set.
        sqlite_url: The default SQLite store in the data directory.

    Raises:
        TopologyRefused: the combination cannot work (several replicas on SQLite or without the
            cross-replica bus, a URL of another store, nats-server or its client missing).
    """
    if not 1 <= replicas <= MAX_REPLICAS:
        raise TopologyRefused(f"--replicas must be between 1 and {MAX_REPLICAS}, not {replicas}")
    if store == "postgres":
        url = database_url or configured_url or DEFAULT_POSTGRES_URL
    else:
        url = database_url or configured_url or sqlite_url
    actual = _store_of(url)
    if actual is None:
        raise TopologyRefused(f"the database URL is neither SQLite nor Postgres: {_scheme(url)}")
    if store is not None and actual != store:
        source = "--database-url" if database_url else "TUTTI_DATABASE_URL"
        raise TopologyRefused(f"--store {store}, but {source} is a {actual} URL ({_scheme(url)})")
    if replicas > 1 and actual == "sqlite":
        raise TopologyRefused(
            f"--replicas {replicas} needs --store postgres: SQLite is one node (one writer "
            "process, one machine)"
        )
    if replicas > 1 and bus != "nats":
        raise TopologyRefused(
            f"--replicas {replicas} needs --bus nats: the replicas share live deltas and wake-ups "
            "through NATS JetStream, the in-process live log reaches one process only"
        )
    return Topology(
        replicas=replicas,
        database_url=url,
        store=actual,
        nats_server=_nats_server() if bus == "nats" else None,
        create_database=store == "postgres",
    )


def _scheme(url: str) -> str:
    return url.partition("://")[0] + "://..."
