"""Printing results: tables through tabulate, or JSON with ``--json``; every figure in them by
det.figures's one formatting rule (re-exported here for the CLI's modules)."""

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import typer
from tabulate import tabulate

from det.figures import duration, flatten, number, size

__all__ = ["cell", "duration", "flatten", "number", "print_json", "print_table", "size"]


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def print_table(
    rows: Sequence[Mapping], columns: Sequence[str], headers: Sequence[str] | None = None
) -> None:
    """Print ``rows`` (mappings) as a table of ``columns``, titled by ``headers`` (default:
    the column names). Each cell by :func:`cell`; a column named ``*_bytes`` is a size; a
    column of numbers only is aligned right."""
    body = [[cell(r.get(c), size_=c.endswith("_bytes")) for c in columns] for r in rows]
    align = ["right" if any(_numeric(r.get(c)) for r in rows)
             and all(r.get(c) is None or _numeric(r.get(c)) for r in rows) else "left"
             for c in columns]
    # The cells are already formatted: tabulate must not parse them back into numbers (it
    # would print 1.235e+4 as 12350).
    typer.echo(tabulate(body, headers=list(headers or columns), tablefmt="simple",
                        disable_numparse=True, colalign=align))


def cell(v: Any, size_: bool = False) -> str:
    """One table cell: numbers, booleans and (with ``size_``) sizes by det.figures's rules,
    times to the second, a span as a duration, a mapping as ``key=value`` pairs (nested keys
    flattened, in name order as the tables' columns), a list as its items, each formatted
    so."""
    if v is None:
        return ""
    if isinstance(v, bool | int | float):
        return size(v) if size_ and not isinstance(v, bool) else number(v)
    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, timedelta):
        return duration(v)
    if isinstance(v, Mapping):
        return ", ".join(f"{k}={cell(x)}" for k, x in sorted(flatten(v).items()))
    if isinstance(v, list | tuple):
        return ", ".join(cell(x) for x in v)
    return str(v)


def _numeric(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


