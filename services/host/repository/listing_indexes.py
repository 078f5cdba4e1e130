"""``sessions`` read through a named listing index on SQLite (``INDEXED BY``, ADR 0024).

A section page and the pinned page must read their page's worth of
``ix_sessions_unpinned_roots`` / ``ix_sessions_pinned_roots`` entries whatever the planner's
statistics say: after an ``ANALYZE``, SQLite's ``sqlite_stat1`` counts NULLs as distinct
values, so it believes ``parent_session_id IS NULL`` matches a handful of rows of
``ix_sessions_parent``, reads the whole workspace through it and sorts. ``INDEXED BY`` pins
the plan (and fails loudly if the index were missing). SQLAlchemy renders no table hints for
SQLite, so each index is an ``Alias`` subclass named ``sessions`` whose SQLite rendering adds
the clause; elsewhere it renders as ``sessions AS sessions`` and the planner, which has real
NULL statistics (Postgres), chooses.

The aliases are distinct classes, so statements through them have distinct cache keys.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Table
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import aliased
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.selectable import Alias

from store.models import Session

__all__ = ["PINNED_ROOTS", "PINNED_ROOTS_TABLE", "UNPINNED_ROOTS", "UNPINNED_ROOTS_TABLE"]


class _IndexedSessions(Alias):
    """``sessions`` under its own name, read through :attr:`index` on SQLite."""

    inherit_cache = True
    index = ""


class _UnpinnedRoots(_IndexedSessions):
    inherit_cache = True
    index = "ix_sessions_unpinned_roots"


class _PinnedRoots(_IndexedSessions):
    inherit_cache = True
    index = "ix_sessions_pinned_roots"


@compiles(_UnpinnedRoots, "sqlite")
@compiles(_PinnedRoots, "sqlite")
def _indexed_by(element: _IndexedSessions, compiler: SQLCompiler, **kw: Any) -> str:
    if kw.get("asfrom"):
        table = compiler.preparer.format_table(cast(Table, element.element))
        return f"{table} INDEXED BY {element.index}"
    return str(compiler.visit_alias(element, **kw))  # type: ignore[no-untyped-call]


_TABLE = cast(Table, Session.__table__)

UNPINNED_ROOTS_TABLE: Any = _UnpinnedRoots._construct(_TABLE, name="sessions")
"""The ``sessions`` table for Core statements of a section page (``ix_sessions_unpinned_roots``)."""
PINNED_ROOTS_TABLE: Any = _PinnedRoots._construct(_TABLE, name="sessions")
"""The ``sessions`` table for Core statements of the pinned page (``ix_sessions_pinned_roots``)."""

UNPINNED_ROOTS: Any = aliased(Session, UNPINNED_ROOTS_TABLE)
"""``Session`` for a section page's unpinned live roots (``ix_sessions_unpinned_roots``)."""
PINNED_ROOTS: Any = aliased(Session, PINNED_ROOTS_TABLE)
"""``Session`` for the pinned page's live roots (``ix_sessions_pinned_roots``)."""
