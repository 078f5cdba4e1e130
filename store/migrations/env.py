"""Alembic environment of the canonical store.

The database comes from, in order: a connection passed in ``config.attributes["connection"]``,
a URL in ``config.attributes["url"]`` (``store.migrate``), or ``sqlalchemy.url`` from an
``alembic.ini`` (developers). Offline mode (``--sql``) renders SQL for the URL's dialect.
"""

from __future__ import annotations

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
        run_migrations_on(connection, context)
        return
    engine = create_sync_engine_for(_url(), poolclass=NullPool)
    try:
        with engine.connect() as new_connection:
            run_migrations_on(new_connection, context)
    finally:
        engine.dispose()


if context.is_offline_mode():
    _run_offline()
else:
    _run_online()
