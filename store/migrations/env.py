"""Alembic environment of the canonical store.

The database comes from, in order: a connection passed in ``config.attributes["connection"]``,
a URL in ``config.attributes["url"]`` (``store.migrate``), or ``sqlalchemy.url`` from an
``alembic.ini`` (developers). Offline mode (``--sql``) renders SQL for the URL's dialect.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.pool import NullPool

from store.engine import create_sync_engine_for, sync_url
from store.migrate import context_options, run_migrations_on


def _url() -> str:
    url = context.config.attributes.get("url") or context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: pass one to store.migrate or set sqlalchemy.url")
    return str(url)


def _run_offline() -> None:
    context.configure(url=sync_url(_url()), literal_binds=True, **context_options())
    with context.begin_transaction():
        context.run_migrations()


def _run_online() -> None:
    connection = context.config.attributes.get("connection")
    if isinstance(connection, Connection):
        run_migrations_on(connection)
        return
    engine = create_sync_engine_for(_url(), poolclass=NullPool)
    try:
        with engine.connect() as new_connection:
            run_migrations_on(new_connection)
    finally:
        engine.dispose()


# Only the developer alembic.ini configures logging; code callers keep their own logging setup.
if context.config.config_file_name is not None:
    fileConfig(context.config.config_file_name, disable_existing_loggers=False)

if context.is_offline_mode():
    _run_offline()
else:
    _run_online()
