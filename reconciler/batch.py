"""A pass's writes to many objects, gathered and sent as one set-based statement per kind.

A busy pass settles and searches hundreds of objects (1,000 one-trial experiments
are 1,000 runs to settle and 2,000 searcher steps). Writing each object's rows with a
statement of its own cost the server a statement, and the statement triggers of
``experiments``, ``trials``, ``allocations`` and ``task_logs`` (det serve's events) a firing,
per object; the same rows as arrays (``unnest``) cost one of each per pass.

:func:`det.reconciler.isolation.isolated_each` flushes a :class:`Writes` inside the
savepoint of the objects that filled it, so a failing object still rolls back alone.
"""

import functools
import re
from collections.abc import Iterable
from typing import Any

import psycopg


class Writes:
    """Rows for a fixed list of set-based statements, sent in that list's order.

    Each statement takes one array parameter per column (``%(name)s::type[]``, the same
    names for every row, unnested WITH ORDINALITY where row order matters). The list's order
    is the order of dependencies (trials created before their ops), whatever the order in
    which the rows came.
    """

    def __init__(self, statements: Iterable[str]) -> None:
        self._order = tuple(statements)
        self._known = frozenset(self._order)
        self._rows: dict[str, list[dict[str, Any]]] = {}

    def add(self, statement: str, **row: Any) -> None:
        """Queue one row of ``statement`` (one of this batch's statements).

        Raises:
            ValueError: ``statement`` is not one of this batch's.
        """
        if statement not in self._known:
            raise ValueError("a statement this batch does not send")
        self._rows.setdefault(statement, []).append(row)

    def clear(self) -> None:
        """Drop the queued rows (their objects' work is being done again)."""
        self._rows = {}

    def flush(self, conn: psycopg.Connection) -> None:
        """Send every queued row, one statement per kind in the batch's order, and clear.

        The arrays go in binary (:func:`_binary`)."""
        rows, self._rows = self._rows, {}
        for statement in self._order:
            batch = rows.get(statement)
            if batch:
                conn.execute(_binary(statement), {k: [r[k] for r in batch] for k in batch[0]})


@functools.cache
def _binary(statement: str) -> str:
    """``statement`` with its parameters (``%(name)s``) sent in binary (``%(name)b``): in
    text, psycopg quotes and escapes every element of an array with a regular expression,
    ~0.2 ms of the reconciler's CPU a trivial task for the JSON ones."""
    return re.sub(r"%\((\w+)\)s", r"%(\1)b", statement)
