"""Printing a task's or trial's log lines (``task_logs``), optionally until it ends."""

import time
from collections.abc import Callable

import psycopg
import typer
from psycopg.rows import dict_row

from det.db import database_url
from det.db.reconnect import Reconnecting
from det.queries.trials import log_text

ReadAfter = Callable[[psycopg.Connection, int], list[dict]]
"""``read(conn, after)``: the next log rows (``id``, ``ts``, ``stream``, ``line``; a trial's
also ``run`` and ``rank``, an experiment's ``trial_id``) with id > after."""


def stream_log_rows(what: str, read: ReadAfter,
                    ended: Callable[[psycopg.Connection], bool] | None,
                    interval: float, split: bool = False, timestamps: bool = False,
                    after: int = 0, head: int | None = None) -> None:
    """Print the rows ``read`` gives (each after its
    :func:`det.queries.trials.log_text`) on stdout, or with ``split`` the task's stderr
    lines on stderr (a command's output kept apart, as it wrote it), each after its time
    with ``timestamps`` (UTC, ISO 8601): those after row id ``after``, at most ``head`` of
    them, all there are when ``ended`` is None, else until ``ended(conn)`` says the writer is
    done, polling every ``interval`` seconds. Rides out database restarts: rows are read by
    id after the last one printed, so none is printed twice or skipped. ``what`` names the
    read in a retry's message."""
    printed = 0

    def next_rows(conn: psycopg.Connection) -> list[dict]:
        return read(conn, after)

    with Reconnecting(database_url(), row_factory=dict_row) as session:
        while True:
            rows = session.run(what, next_rows)
            for r in rows:
                if head is not None and printed >= head:
                    return
                typer.echo(log_text(r, timestamps), err=split and r["stream"] == "stderr")
                after = r["id"]
                printed += 1
            if rows:
                continue
            if ended is None or session.run(what, ended):
                # One more read: lines flushed between the last read and the end's check.
                if not session.run(what, next_rows):
                    return
                continue
            time.sleep(interval)
