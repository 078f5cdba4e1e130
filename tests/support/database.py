"""Database backend fixtures: every store test runs on SQLite **and** Postgres (STORE-1).

Fixtures:

* ``backend`` — ``"sqlite"`` or ``"postgres"``; parametrized (test ids ``[sqlite]`` /
  ``[postgres]``) over ``TUTTI_TEST_BACKENDS`` (default ``sqlite,postgres``).
* ``migrated_db_url`` — sync URL of a fresh database migrated to head, private to the test.
* ``empty_db_url`` — sync URL of a fresh, empty database (no tables), private to the test.
* ``sync_engine`` — a ``store.engine`` sync engine on ``migrated_db_url``; disposed afterwards.
* ``postgres_admin_url`` (session) — the admin URL from ``TUTTI_TEST_POSTGRES_URL``
  (default ``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``).

Fresh databases are cheap: SQLite copies a migrated template file made once per session;
Postgres migrates a template database once per session and clones it per test with
``CREATE DATABASE … TEMPLATE …``, dropping the clone ``WITH (FORCE)`` afterwards.

When Postgres is requested but unreachable the tests **fail** (they are never skipped), so a CI
run cannot silently lose the Postgres half. Run SQLite only with ``TUTTI_TEST_BACKENDS=sqlite``.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from store import migrate
from store.engine import create_sync_engine_for

__all__ = [
    "DEFAULT_POSTGRES_ADMIN_URL",
    "KNOWN_BACKENDS",
    "PostgresDatabases",
    "requested_backends",
]

DEFAULT_POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
KNOWN_BACKENDS = ("sqlite", "postgres")


def requested_backends() -> tuple[str, ...]:
    """Backends named by ``TUTTI_TEST_BACKENDS`` (comma-separated), in canonical order."""
    raw = os.environ.get("TUTTI_TEST_BACKENDS", ",".join(KNOWN_BACKENDS))
    names = {name.strip().lower() for name in raw.split(",") if name.strip()}
    unknown = names - set(KNOWN_BACKENDS)
    if unknown:
        raise pytest.UsageError(
            f"TUTTI_TEST_BACKENDS names unknown backends {sorted(unknown)}; "
            f"choose from {list(KNOWN_BACKENDS)}"
        )
    if not names:
        raise pytest.UsageError("TUTTI_TEST_BACKENDS is empty")
    return tuple(name for name in KNOWN_BACKENDS if name in names)


def _backend_params() -> list[object]:
    return [
        pytest.param(name, id=name, marks=[pytest.mark.postgres] if name == "postgres" else [])
        for name in requested_backends()
    ]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip tests marked ``postgres`` (outside the ``backend`` parametrization) when excluded."""
    if "postgres" in requested_backends():
        return
    skip = pytest.mark.skip(reason="TUTTI_TEST_BACKENDS excludes postgres")
    for item in items:
        if item.get_closest_marker("postgres") is not None:
            item.add_marker(skip)


@pytest.fixture(params=_backend_params())
def backend(request: pytest.FixtureRequest) -> str:
    """The store backend of this test: ``"sqlite"`` or ``"postgres"``."""
    return str(request.param)


class PostgresDatabases:
    """Creates and drops throwaway databases on the Postgres server of the admin URL."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self._engine = create_engine(
            make_url(admin_url).set(drivername="postgresql+psycopg"),
            isolation_level="AUTOCOMMIT",
            poolclass=NullPool,
        )

    def url_for(self, database: str) -> str:
        """The sync URL of ``database`` on the same server."""
        return (
            make_url(self.admin_url)
            .set(drivername="postgresql+psycopg", database=database)
            .render_as_string(hide_password=False)
        )

    def ping(self) -> None:
        """Connect once; raises when the server is unreachable."""
        with self._engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    def create(self, name: str, *, template: str = "template0") -> str:
        """Create database ``name`` from ``template`` and return its URL."""
        with self._engine.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return self.url_for(name)

    def drop(self, name: str) -> None:
        """Drop database ``name``, terminating leftover connections."""
        with self._engine.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        """Release the admin engine."""
        self._engine.dispose()


def _unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    """Admin connection URL used to create test databases (``TUTTI_TEST_POSTGRES_URL``)."""
    return os.environ.get("TUTTI_TEST_POSTGRES_URL", DEFAULT_POSTGRES_ADMIN_URL)


@pytest.fixture(scope="session")
def postgres_databases(postgres_admin_url: str) -> Iterator[PostgresDatabases]:
    """The Postgres test server; fails (never skips) when it cannot be reached."""
    databases = PostgresDatabases(postgres_admin_url)
    try:
        databases.ping()
    except Exception as error:  # noqa: BLE001 - any connection failure must fail loudly
        databases.close()
        pytest.fail(
            f"Postgres backend requested but unreachable at {postgres_admin_url!r}: {error}. "
            "Start Postgres, point TUTTI_TEST_POSTGRES_URL at it, or set "
            "TUTTI_TEST_BACKENDS=sqlite to run without it.",
            pytrace=False,
        )
    yield databases
    databases.close()


@pytest.fixture(scope="session")
def postgres_template(postgres_databases: PostgresDatabases) -> Iterator[str]:
    """Name of a Postgres database migrated to head once per session, cloned per test."""
    name = _unique_name("tutti_test_tpl")
    url = postgres_databases.create(name)
    try:
        migrate.upgrade(url)
        yield name
    finally:
        postgres_databases.drop(name)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per session, copied per test."""
    path = tmp_path_factory.mktemp("sqlite-template") / "template.sqlite3"
    migrate.upgrade(f"sqlite:///{path}")
    # The migration engine is disposed, so WAL is checkpointed into the main file.
    leftovers = [p for p in path.parent.iterdir() if p != path]
    assert not leftovers, f"template not checkpointed: {leftovers}"
    return path


@pytest.fixture
def empty_db_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Sync URL of a fresh database with no tables at all."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.sqlite3'}"
        return
    databases: PostgresDatabases = request.getfixturevalue("postgres_databases")
    name = _unique_name("tutti_test_empty")
    url = databases.create(name)
    try:
        yield url
    finally:
        databases.drop(name)


@pytest.fixture
def migrated_db_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Sync URL of a fresh database migrated to head."""
    if backend == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "store.sqlite3"
        shutil.copyfile(template, path)
        yield f"sqlite:///{path}"
        return
    databases: PostgresDatabases = request.getfixturevalue("postgres_databases")
    template_name: str = request.getfixturevalue("postgres_template")
    name = _unique_name("tutti_test")
    url = databases.create(name, template=template_name)
    try:
        yield url
    finally:
        databases.drop(name)


@pytest.fixture
def sync_engine(migrated_db_url: str) -> Iterator[Engine]:
    """A configured sync engine (``store.engine``) on the test's migrated database."""
    engine = create_sync_engine_for(migrated_db_url)
    try:
        yield engine
    finally:
        engine.dispose()
