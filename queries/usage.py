"""Cluster historical usage: slot-hours per UTC day and per workspace, user,
experiment label or resource pool, as ``det cluster usage``, GET /api/v1/cluster/usage and the
WebUI's Usage page show it. The rule (which runs count, from when to when, how labels split)
is det_user.cluster_usage in schema.sql, over the view reporting.slot_hours."""

import csv
import io
from collections.abc import Iterable, Mapping
from datetime import date, timedelta

import psycopg

from det.errors import DetError
from det.sql import named

Q = named("queries")

GROUPS = ("workspace", "user", "label", "pool")
"""What usage can be grouped by (det_user.cluster_usage's p_group_by)."""

DEFAULT_DAYS = 14
"""Days a period without a start covers, its end included (Determined's page shows two
weeks)."""

MAX_DAYS = 3660
"""The longest period asked at once, in days: ten years, far beyond any cluster's history,
but a bound on the rows one request makes."""


def period(start: date | None, end: date | None, today: date) -> tuple[date, date]:
    """The days (first, last; both included) a usage report covers: ``end`` defaults to
    ``today`` (UTC), ``start`` to :data:`DEFAULT_DAYS` days ending at ``end``.

    Raises:
        DetError: ``end`` before ``start``, or a period over :data:`MAX_DAYS` days.
    """
    end = end or today
    start = start or end - timedelta(days=DEFAULT_DAYS - 1)
    if end < start:
        raise DetError(f"end: {end} is before start {start}")
    if (end - start).days + 1 > MAX_DAYS:
        raise DetError(f"start: a period of at most {MAX_DAYS} days, got "
                       f"{(end - start).days + 1} ({start} to {end})")
    return start, end


def usage(conn: psycopg.Connection, start: date, end: date, group_by: str) -> list[dict]:
    """Rows ``{day, group, slot_hours}`` from ``start`` to ``end`` (both included), as the
    connection's user may see them (row-level security); days and groups without usage have
    none. ``group`` is None for runs without a label when grouped by label.

    Raises:
        DetError: ``group_by`` is not one of :data:`GROUPS` (named by det_user.cluster_usage).
    """
    return conn.execute(Q.usage, {"start": start, "end": end, "group_by": group_by}).fetchall()


def totals(rows: Iterable[Mapping]) -> dict[str | None, float]:
    """Slot-hours per group over the whole period, largest first."""
    out: dict[str | None, float] = {}
    for r in rows:
        out[r["group"]] = out.get(r["group"], 0.0) + r["slot_hours"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def to_csv(rows: Iterable[Mapping], group_by: str) -> str:
    """The rows as CSV: a header ``day,<group_by>,slot_hours``, one line per row, days as
    ISO dates, slot-hours unrounded (a spreadsheet sums them), no group as an empty field."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["day", group_by, "slot_hours"])
    for r in rows:
        w.writerow([r["day"].isoformat(), r["group"] or "", repr(float(r["slot_hours"]))])
    return buf.getvalue()
