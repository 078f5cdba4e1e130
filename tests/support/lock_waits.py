"""Observe a Postgres backend blocked on a lock (tests that show a write waits for a holder).

A sleep before ``assert not done()`` passes without exercising the lock when the writer has
not reached it yet; waiting until the server reports the writer blocked makes the check real.
"""

from __future__ import annotations

from sqlalchemy import Engine, text

from tests.support.polling import eventually

__all__ = ["wait_for_lock_waiter"]

_WAITERS = text(
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
)


def wait_for_lock_waiter(engine: Engine, timeout_seconds: float) -> None:
    """Return once a backend of the engine's database waits for a lock.

    Raises:
        AssertionError: none did within ``timeout_seconds``.
    """

    def blocked() -> bool:
        with engine.connect() as connection:
            return bool(connection.execute(_WAITERS).scalar_one())

    assert eventually(blocked, timeout_seconds), "no backend waited for a lock"
