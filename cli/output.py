"""Printing results: tables through tabulate, or JSON with ``--json``."""

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import typer
from tabulate import tabulate


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def print_table(
    rows: Sequence[dict], columns: Sequence[str], headers: Sequence[str] | None = None
) -> None:
    """Print ``rows`` (dicts) as a table of ``columns``, titled by ``headers`` (default: the
    column names)."""
    body = [[_format(r.get(c)) for c in columns] for r in rows]
    typer.echo(tabulate(body, headers=list(headers or columns), tablefmt="simple"))


def duration(span: timedelta) -> str:
    """A span as a person reads it: ``45s``, ``12m 5s``, ``3h 2m``, ``2d 4h`` (seconds
    dropped past an hour, minutes past a day; a negative span, from clocks that differ a
    little, is ``0s``)."""
    seconds = max(0, int(span.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {seconds}s" if minutes else f"{seconds}s"


def _format(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict | list):
        return json.dumps(v, separators=(",", ":"))
    return "" if v is None else v
