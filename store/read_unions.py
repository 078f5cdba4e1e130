"""Several row sets of one hot read as one SQL statement (``UNION ALL``), decoded by part.

On Postgres every statement of a read is a client-server round trip, and a multi-statement
read also needs ``BEGIN`` and ``COMMIT`` for one snapshot; psycopg's client work per round
trip is what put ``GetSession`` ~0.3 ms of host CPU above SQLite (ADR 0033). A single
statement needs neither: in autocommit it runs in its own transaction and, even at
``READ COMMITTED``, sees one snapshot as a whole (scalar subqueries included).

:class:`ReadUnion` takes the parts of such a read — named Core ``select()`` s, each with its
own ordering and limit — and builds one statement::

    SELECT part, ord, <slots> FROM (<part 0>) UNION ALL SELECT ... ORDER BY part, ord

``part`` tags each row with its part; ``ord`` is the row's place in its part's order
(``row_number()`` over the part's ``ORDER BY``), so the outer ``ORDER BY`` returns every
part in its own order. Parts that select the same columns (the Session and its tree; two
Turns) share column slots; every other slot of a row is a ``NULL`` cast to the slot's type,
so both dialects resolve the union's column types. The statement is compiled once per
dialect, like :class:`store.direct_reads.ReadQuery`, and :meth:`ReadConnection.union
<store.direct_reads.ReadConnection.union>` hands back each part's rows as named tuples with
the part's own column keys — the same rows the part's statement alone would return.
"""

from __future__ import annotations

import threading
from collections import namedtuple
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from sqlalchemy import Boolean, Integer, cast, func, literal_column, null, select, union_all
from sqlalchemy.sql import ColumnElement, Select
from sqlalchemy.sql.elements import BindParameter

from store.direct_reads import CompiledSql, ReadQuery

__all__ = ["ReadUnion", "UnionPart"]

AnySelect: TypeAlias = Select[*tuple[Any, ...]]
"""A ``select()`` of any number of columns."""

_PART: Final = "union_part"
_ORD: Final = "union_ord"


@dataclass(frozen=True)
class UnionPart:
    """One row set of a :class:`ReadUnion`.

    Attributes:
        statement: the part's ``select()`` without ``ORDER BY`` or ``LIMIT`` (give them
            here, so the union can keep the part's order).
        order_by: the part's order; empty for a point read (at most one row).
        limit: a fixed ``LIMIT`` or a ``bindparam``; ``None`` for every row.
    """

    statement: AnySelect
    order_by: Sequence[ColumnElement[Any]] = field(default_factory=tuple)
    limit: int | BindParameter[Any] | None = None


def _ordered(part: UnionPart) -> AnySelect:
    statement = part.statement.order_by(*part.order_by)
    return statement if part.limit is None else statement.limit(part.limit)


def _signature(statement: AnySelect) -> tuple[tuple[str | None, str], ...]:
    # Parts with the same columns (name and type) can share slots.
    return tuple((c.key, repr(c.type)) for c in statement.selected_columns)


class _CompiledUnion(CompiledSql):
    """A :class:`ReadUnion` compiled for one dialect, with its row decoder."""

    __slots__ = ("decode",)

    def __init__(self, statement: Any, backend: str, decode: Callable[[Any], Any]) -> None:
        super().__init__(statement, backend)
        self.decode = decode


class ReadUnion:
    """Named parts read by one ``UNION ALL`` statement, compiled once per backend.

    Args:
        parts: the parts by name; :meth:`ReadConnection.union` returns a list of rows for
            each name (empty when the part found nothing).

    A part's ``WHERE`` may use scalar subqueries and shared named ``bindparam`` s; the whole
    statement is one snapshot, so parts may depend on each other through SQL.
    """

    def __init__(self, **parts: UnionPart) -> None:
        if not parts:
            raise ValueError("a read union needs at least one part")
        self.names: tuple[str, ...] = tuple(parts)
        self.statement = self._build(list(parts.values()))
        self.part_queries: tuple[ReadQuery, ...] = tuple(
            ReadQuery(_ordered(part)) for part in parts.values()
        )
        """Each part as a statement of its own (for backends that read a union by parts)."""
        self._compiled: dict[str, _CompiledUnion] = {}
        self._lock = threading.Lock()

    def _build(self, parts: list[UnionPart]) -> Any:
        # Slot groups: one run of columns per distinct column signature, in part order.
        groups: dict[tuple[tuple[str | None, str], ...], int] = {}
        layout: list[list[ColumnElement[Any]]] = []
        for part in parts:
            signature = _signature(part.statement)
            if signature not in groups:
                groups[signature] = len(layout)
                layout.append(list(part.statement.selected_columns))
        self._slices: list[tuple[int, int]] = []
        self._row_types: list[Callable[[Any], Any]] = []
        self._booleans: list[list[int]] = []
        starts = []
        position = 2  # after union_part and union_ord
        for columns in layout:
            starts.append(position)
            position += len(columns)
        branches = []
        for tag, part in enumerate(parts):
            group = groups[_signature(part.statement)]
            columns = list(part.statement.selected_columns)
            self._slices.append((starts[group], starts[group] + len(columns)))
            row_type = namedtuple("Row", [c.key for c in columns])  # type: ignore[misc]
            self._row_types.append(row_type._make)
            self._booleans.append([i for i, c in enumerate(columns) if isinstance(c.type, Boolean)])
            inner = part.statement
            if part.order_by:
                ordinal = func.row_number().over(order_by=list(part.order_by))
                inner = inner.add_columns(ordinal.label(_ORD)).order_by(*part.order_by)
            else:
                inner = inner.add_columns(literal_column("1", Integer).label(_ORD))
            if part.limit is not None:
                inner = inner.limit(part.limit)
            # Every part is a subquery: SQLite allows no ORDER BY or LIMIT on a union member.
            sub = inner.subquery(f"part_{tag}")
            sub_columns = list(sub.c)
            slots: list[ColumnElement[Any]] = []
            for index, group_columns in enumerate(layout):
                if index == group:
                    slots.extend(sub_columns[: len(columns)])
                else:
                    slots.extend(cast(null(), c.type) for c in group_columns)
            branches.append(
                select(
                    literal_column(str(tag), Integer).label(_PART),
                    sub.c[_ORD],
                    *slots,
                )
            )
        statement = union_all(*branches) if len(branches) > 1 else branches[0]
        return statement.order_by(literal_column(_PART), literal_column(_ORD))

    def compiled(self, backend: str) -> _CompiledUnion:
        """The statement and its decoder for ``backend`` (``"sqlite"`` or ``"postgresql"``)."""
        found = self._compiled.get(backend)
        if found is None:
            with self._lock:
                found = self._compiled.get(backend)
                if found is None:
                    found = self._compiled[backend] = _CompiledUnion(
                        self.statement, backend, self._decoder(backend)
                    )
        return found

    def _decoder(self, backend: str) -> Callable[[Any], dict[str, list[Any]]]:
        names = self.names
        slices = self._slices
        makers = self._row_types
        # sqlite3 returns the stored 0/1; the schema's Boolean columns read as bool.
        booleans = self._booleans if backend == "sqlite" else [[] for _ in names]

        def decode(rows: Any) -> dict[str, list[Any]]:
            found: list[list[Any]] = [[] for _ in names]
            for row in rows:
                tag = row[0]
                start, end = slices[tag]
                values = row[start:end]
                if booleans[tag]:
                    fields = list(values)
                    for index in booleans[tag]:
                        if fields[index] is not None:
                            fields[index] = bool(fields[index])
                    values = fields
                found[tag].append(makers[tag](values))
            return dict(zip(names, found, strict=True))

        return decode
