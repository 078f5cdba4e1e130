"""The Postgres database of a local multi-replica suite: created when missing (SCALE-6)."""

from __future__ import annotations

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, ProgrammingError

__all__ = ["DatabaseUnavailable", "ensure_database"]


class DatabaseUnavailable(Exception):
    """The Postgres server does not answer, or refuses to create the database."""


def ensure_database(url: str) -> bool:
    """Create the database ``url`` names on its server unless it exists.

    Connects to the server's ``postgres`` database with the same credentials.

    Returns:
        True when this call created it.

    Raises:
        DatabaseUnavailable: the server cannot be reached or refused (one line, no password).
    """
    target = make_url(url)
    name = target.database
    if not name:
        raise DatabaseUnavailable(f"{target.render_as_string()} names no database")
    engine = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            exists = connection.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name}
            ).scalar()
            if exists:
                return False
            quoted = engine.dialect.identifier_preparer.quote(name)
            try:
                connection.exec_driver_sql(f"CREATE DATABASE {quoted}")
            except ProgrammingError as error:
                # Another `tutti up` created it meanwhile: the same outcome.
                if "already exists" not in str(error.orig):
                    raise
                return False
            return True
    except DBAPIError as error:
        where = f"{target.host or 'localhost'}:{target.port or 5432}"
        reason = str(error.orig).strip().splitlines()[0] if error.orig else type(error).__name__
        raise DatabaseUnavailable(f"Postgres at {where}: {reason}") from None
    finally:
        engine.dispose()
