"""URL normalization of ``store.engine`` (no database needed)."""

from __future__ import annotations

import pytest

from store.engine import async_url, backend_name, sync_url

CASES = [
    # (given, sync, async)
    ("sqlite:///data/t.db", "sqlite:///data/t.db", "sqlite+aiosqlite:///data/t.db"),
    ("sqlite+pysqlite:////abs/t.db", "sqlite:////abs/t.db", "sqlite+aiosqlite:////abs/t.db"),
    ("sqlite+aiosqlite:///t.db", "sqlite:///t.db", "sqlite+aiosqlite:///t.db"),
    (
        "postgresql://u:p@h:5432/db",
        "postgresql+psycopg://u:p@h:5432/db",
        "postgresql+psycopg://u:p@h:5432/db",
    ),
    ("postgres://u@h/db", "postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
    ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
    (
        "postgresql+psycopg_async://u@h/db?sslmode=require",
        "postgresql+psycopg://u@h/db?sslmode=require",
        "postgresql+psycopg://u@h/db?sslmode=require",
    ),
]


@pytest.mark.spec("STORE-1")
@pytest.mark.parametrize(
    ("given", "sync", "async_"),
    CASES,
    # Ids must not start with a backend name: the run summary counts those as backend tests.
    ids=[
        "file-default-driver",
        "file-pysqlite",
        "file-aiosqlite",
        "pg-default-driver",
        "pg-alias",
        "pg-psycopg",
        "pg-psycopg-async",
    ],
)
def test_urls_are_normalized_to_each_engine_kind(given: str, sync: str, async_: str) -> None:
    assert sync_url(given) == sync
    assert async_url(given) == async_
    # Idempotent, and each form converts back.
    assert sync_url(async_url(given)) == sync
    assert async_url(sync_url(given)) == async_


def test_passwords_survive_normalization() -> None:
    assert sync_url("postgresql://u:s%40cret@h/db") == "postgresql+psycopg://u:s%40cret@h/db"


@pytest.mark.parametrize("url", ["mysql://u@h/db", "oracle://u@h/db"])
def test_other_backends_are_rejected(url: str) -> None:
    with pytest.raises(ValueError, match="unsupported database backend"):
        sync_url(url)
    with pytest.raises(ValueError, match="unsupported database backend"):
        backend_name(url)


def test_backend_name() -> None:
    assert backend_name("sqlite+aiosqlite:///x") == "sqlite"
    assert backend_name("postgres://h/db") == "postgresql"
