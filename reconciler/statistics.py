"""Planner statistics of the tables a pass reads, refreshed after a burst of changes.

The pass's statements are prepared (psycopg prepares a statement on its fifth execution),
and the server plans a prepared statement once, from the statistics of that moment. In a
new cluster, or after a burst (a thousand experiments submitted at once), those statistics
still describe nearly empty tables, and autovacuum refreshes them only after its naptime
(60 s by default) and then only at its own thresholds. Until then each pass ran plans made for
empty tables: nested loops of index probes over what were a thousand rows, an idle pass at
1,000 queued runs taking 45-53 ms instead of 22-31 (the same database once analyzed,
bench/queued_pass.py).

So the leader checks, at most every ``CHECK_EVERY`` seconds and between passes (never inside
one), whether a table changed by more than half its rows since it was last analyzed, and
analyzes those. ``SKIP_LOCKED``: a table autovacuum is working on is left to it. A table that
grows slowly is analyzed by autovacuum first (it acts at a tenth), so this acts on bursts.
"""

import logging
import time

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from det.sql import named

log = logging.getLogger("det.reconciler")
Q = named("reconciler")

CHECK_EVERY = 1.0
"""Seconds between checks (the server's activity counters lag by up to a second anyway)."""

TABLES = ("experiments", "trials", "searcher_ops", "searcher_events", "jobs", "allocations",
          "allocation_slots", "agents", "slots", "checkpoints")


class Statistics:
    """When the next check is due; ``refresh`` is called between passes."""

    def __init__(self) -> None:
        self.due = 0.0

    def refresh(self, conn: psycopg.Connection) -> list[str]:
        """Analyze the stale tables on ``conn`` (autocommit, the leader's) if a check is due;
        returns the tables analyzed. Raises psycopg errors as the pass's statements do."""
        now = time.monotonic()
        if now < self.due:
            return []
        self.due = now + CHECK_EVERY
        cur = conn.cursor(row_factory=tuple_row)
        stale = [r[0] for r in cur.execute(Q.stale_tables, {"tables": list(TABLES)}).fetchall()]
        if stale:
            conn.execute(sql.SQL(Q.analyze_tables).format(
                sql.SQL(", ").join(map(sql.Identifier, stale))))
            log.info("analyzed %s after a burst of changes", ", ".join(stale))
        return stale
