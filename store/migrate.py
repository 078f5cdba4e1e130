"""Apply and verify the store's Alembic migrations from code (and from ``tutti migrate``).

Alembic is configured programmatically: the script directory is ``store/migrations`` inside the
installed package, so no ``alembic.ini`` is needed at run time. (The repository root has one for
developers who want the ``alembic`` command, e.g. ``alembic revision --autogenerate``.)

Each run is one transaction on both backends (SQLite runs DDL transactionally because
``store.engine`` begins SQLite transactions itself), so a failed migration leaves the database at
the revision it started from. On Postgres a transaction-level advisory lock serializes concurrent
runs; on SQLite foreign-key enforcement is paused while tables are rebuilt by batch operations and
``PRAGMA foreign_key_check`` must come back empty before the run commits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from alembic import command, context
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import SchemaItem

from store.engine import create_sync_engine_for
from store.models import Base

__all__ = [
    "MIGRATIONS_DIR",
    "MigrationError",
    "SchemaDriftError",
    "alembic_config",
    "check",
    "compare",
    "current",
    "downgrade",
    "head",
    "upgrade",
]

MIGRATIONS_DIR: Final = Path(__file__).resolve().parent / "migrations"
"""The Alembic script directory shipped inside the ``store`` package."""

_POSTGRES_MIGRATION_LOCK_KEY: Final = 0x7475_7474_6900  # "tutti\0"; any fixed bigint works


class MigrationError(RuntimeError):
    """A migration could not be applied or verified."""


@dataclass(frozen=True)
class SchemaDriftError(MigrationError):
    """The migrated database differs from ``store.models`` (what ``alembic check`` reports).

    Attributes:
        diffs: Alembic's autogenerate differences (empty when the database is not at head).
        detail: a one-line description.
    """

    diffs: tuple[Any, ...]
    detail: str

    def __str__(self) -> str:
        return self.detail


def _include_object(
    _obj: SchemaItem,
    name: str | None,
    type_: Literal[
        "schema", "table", "column", "index", "unique_constraint", "foreign_key_constraint"
    ],
    reflected: bool,
    _compare_to: SchemaItem | None,
) -> bool:
    # Tables that are not in the models (e.g. created by an operator) are not ours to drop.
    return not (type_ == "table" and reflected and name not in Base.metadata.tables)


def context_options() -> dict[str, Any]:
    """Options shared by migration runs and drift comparison, so both see the same schema."""
    return {
        "target_metadata": Base.metadata,
        "render_as_batch": True,
        "compare_type": True,
        "compare_server_default": True,
        "include_object": _include_object,
    }


def alembic_config(url: str | None = None) -> Config:
    """Build an Alembic ``Config`` pointing at the packaged migrations.

    Args:
        url: database URL for the run; also readable by ``env.py`` as ``attributes["url"]``.

    Returns:
        A ``Config`` usable with ``alembic.command`` functions.
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        config.attributes["url"] = url
    return config


def _sqlite_foreign_keys(connection: Connection, *, enabled: bool) -> None:
    # The pragma is a no-op inside a transaction, so issue it on the DBAPI connection directly.
    dbapi_connection = connection.connection.dbapi_connection
    if dbapi_connection is None:  # pragma: no cover - a checked-out connection always has one
        raise MigrationError("connection has no DBAPI connection")
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA foreign_keys={'ON' if enabled else 'OFF'}")
    finally:
        cursor.close()


def run_migrations_on(connection: Connection) -> None:
    """Run the pending migrations on ``connection`` in one transaction (called by ``env.py``).

    Uses the environment context of the running Alembic command (``alembic.context``).

    Args:
        connection: a connection not yet in a transaction (an external transaction is joined).

    Raises:
        MigrationError: on SQLite, the migrated data violates a foreign key.
    """
    sqlite = connection.dialect.name == "sqlite"
    external = connection.in_transaction()
    if sqlite and not external:
        _sqlite_foreign_keys(connection, enabled=False)
    try:
        context.configure(connection=connection, transactional_ddl=True, **context_options())
        with context.begin_transaction():
            if connection.dialect.name == "postgresql":
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"),
                    {"key": _POSTGRES_MIGRATION_LOCK_KEY},
                )
            context.run_migrations()
            if sqlite:
                violations = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if violations:
                    raise MigrationError(f"foreign key violations after migration: {violations}")
    finally:
        if sqlite and not external:
            _sqlite_foreign_keys(connection, enabled=True)


@contextmanager
def _connect(url: str) -> Iterator[Connection]:
    engine = create_sync_engine_for(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            yield connection
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision`` (default: the newest).

    Args:
        url: any URL accepted by :mod:`store.engine`.
        revision: target revision id or ``"head"``.
    """
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Migrate the database at ``url`` down to ``revision`` (``"base"`` removes the schema).

    Args:
        url: any URL accepted by :mod:`store.engine`.
        revision: target revision id, relative step (``"-1"``) or ``"base"``.
    """
    command.downgrade(alembic_config(url), revision)


def head() -> str:
    """Return the newest revision id of the packaged migrations.

    Raises:
        MigrationError: the script directory has several heads.
    """
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise MigrationError(f"expected one migration head, found {heads}")
    return heads[0]


def current(url: str) -> str | None:
    """Return the revision the database at ``url`` is at, or ``None`` if it was never migrated."""
    with _connect(url) as connection:
        return MigrationContext.configure(connection).get_current_revision()


def compare(url: str) -> list[Any]:
    """Return Alembic's autogenerate differences between the database and ``store.models``."""
    with _connect(url) as connection:
        options = context_options()
        target_metadata = options.pop("target_metadata")
        migration_context = MigrationContext.configure(connection, opts=options)
        return list(compare_metadata(migration_context, target_metadata))


def check(url: str) -> None:
    """Verify the database at ``url`` is at head and matches the models (``alembic check``).

    Raises:
        SchemaDriftError: the database is behind head, or autogenerate finds differences.
    """
    at, newest = current(url), head()
    if at != newest:
        raise SchemaDriftError((), f"database is at revision {at!r}, expected head {newest!r}")
    diffs = compare(url)
    if diffs:
        raise SchemaDriftError(tuple(diffs), f"schema drift: {diffs!r}")
