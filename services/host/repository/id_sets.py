"""Statements over sets of ids, shaped for each backend (shared by the deletion repositories).

On Postgres a set of ids travels as one ``text[]`` parameter (``column = ANY(:ids)``): one
statement text whatever the set's size, so psycopg's prepared statements keep a plan that
probes the index per id. A list of separate parameters made the prepared *generic* plan compare
every candidate row with every list element (the purge benchmark once spent most of its Postgres
time there). SQLite keeps ``IN`` lists of a bounded size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Text, any_, literal
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession

__all__ = ["IdSetStatements"]

T = TypeVar("T")


class IdSetStatements:
    """Base of repositories whose statements name sets of ids."""

    def __init__(self, session: AsyncSession) -> None:
        self._db = session

    @property
    def _postgres(self) -> bool:
        return self._db.get_bind().dialect.name == "postgresql"

    def _batched(
        self, values: Sequence[T], *, sqlite_size: int, postgres_size: int
    ) -> Iterator[Sequence[T]]:
        """``values`` in statement-sized slices (larger on Postgres: one array parameter)."""
        size = postgres_size if self._postgres else sqlite_size
        for start in range(0, len(values), size):
            yield values[start : start + size]

    def _among(self, column: Any, ids: list[str]) -> ColumnElement[bool]:
        """``column IN ids``: one ``text[]`` parameter on Postgres, an ``IN`` list on SQLite."""
        if self._postgres:
            return column == any_(literal(ids, postgresql.ARRAY(Text)))  # type: ignore[no-any-return]
        return column.in_(ids)  # type: ignore[no-any-return]
