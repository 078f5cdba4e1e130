"""Inserting a row that may already exist, without a read first."""

from __future__ import annotations

from sqlalchemy import Insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

__all__ = ["insert_if_absent"]


async def insert_if_absent(session: AsyncSession, statement: Insert) -> bool:
    """Run ``statement`` in a savepoint; ``False`` when a unique key already holds the row.

    The savepoint keeps the surrounding transaction usable after the violation, so the
    caller can answer ``ALREADY_EXISTS`` (or treat the row as its idempotent retry).
    """
    try:
        async with session.begin_nested():
            await session.execute(statement)
    except IntegrityError:
        return False
    return True
