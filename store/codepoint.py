"""Unicode code point ordering of text columns on every backend.

Listing contracts order identifiers and paths "in Unicode code point order". SQLite's
default ``BINARY`` collation compares UTF-8 bytes, which is code point order. Postgres
compares with the database collation (often a locale such as ``en_US.UTF-8``), so there
the expression is wrapped in ``COLLATE "C"`` (byte order of UTF-8, again code point
order). Use :func:`codepoint` both in ``ORDER BY`` and in keyset comparisons so paging
and ordering agree.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import String
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

__all__ = ["codepoint"]


class codepoint(FunctionElement[str]):  # noqa: N801 - reads like a SQL function in queries
    """``codepoint(expr)``: ``expr`` compared in Unicode code point order."""

    type = String()
    inherit_cache = True


@compiles(codepoint)
def _compile_default(element: codepoint, compiler: SQLCompiler, **kw: Any) -> str:
    return str(compiler.process(element.clauses, **kw))


@compiles(codepoint, "postgresql")
def _compile_postgres(element: codepoint, compiler: SQLCompiler, **kw: Any) -> str:
    return f'({compiler.process(element.clauses, **kw)}) COLLATE "C"'
