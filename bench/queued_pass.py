"""Time of an idle reconciler pass with many runs queued (issue 11).

A pass that has nothing to do should cost what it finds, not the queue's length: with a
thousand runs waiting and every slot busy, each pass of bench/task_throughput.py runs again
and again over the same waiting runs. In a private database (embedded PostgreSQL, or the one
DET_DB_URL names) this submits Q one-trial experiments (``det_user.create_experiment``, as
``det experiment create``; no agent, so their runs wait), runs passes until nothing changes,
then times ``--repeats`` idle passes twice:

- *as planned at submission*: the pass's prepared statements were planned from the
  statistics the tables had before the burst (as in a new cluster, for a minute);
- *analyzed*: after ``ANALYZE`` (what :mod:`det.reconciler.statistics` does after a burst).

It prints the median and slowest pass in ms and, where the server has pg_stat_statements
(not the embedded one), the statements that took longest on average. Figures only.

    python bench/queued_pass.py [--queued 1000,10000] [--repeats 20]
"""

import argparse
import statistics
import time

import psycopg
from private_db import private_database
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from det.configs import load_experiment_config
from det.reconciler.passes import Settings, prepare_session, run_pass

CONFIG = """
name: queued
entrypoint: "true"
searcher: {name: single, metric: loss, max_length: {batches: 1}}
"""

TOP_STATEMENTS = """
SELECT calls, mean_exec_time AS ms, left(regexp_replace(query, '\\s+', ' ', 'g'), 88) AS query
  FROM pg_stat_statements
 WHERE toplevel AND calls >= %(calls)s AND dbid = (SELECT oid FROM pg_database
                                                  WHERE datname = current_database())
 ORDER BY mean_exec_time DESC LIMIT 8
"""


def timed_passes(conn: psycopg.Connection, repeats: int) -> list[float]:
    """``repeats`` passes on ``conn``, each one's time in ms."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run_pass(conn, Settings(), "bench")
        times.append(1000 * (time.perf_counter() - t0))
    return times


def top_statements(conn: psycopg.Connection, repeats: int) -> None:
    """Print the slowest statements since the last reset, where pg_stat_statements is."""
    rows = conn.execute(TOP_STATEMENTS, {"calls": repeats}).fetchall()
    for r in rows:
        print(f"      {r['ms']:6.2f} ms  {r['query']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", default="1000,10000",
                        help="queued runs at each measure (cumulative), comma-separated")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    config = Jsonb(load_experiment_config(CONFIG).expanded())
    with private_database() as db, \
            psycopg.connect(db.url, autocommit=True, row_factory=dict_row) as conn:
        prepare_session(conn)  # as the reconciler's session
        stats = conn.execute("SELECT 1 FROM pg_extension "
                             "WHERE extname = 'pg_stat_statements'").fetchone() is not None
        have = 0
        for queued in (int(q) for q in args.queued.split(",")):
            with conn.transaction():
                for _ in range(queued - have):
                    conn.execute("SELECT det_user.create_experiment(%s, '', NULL)", (config,))
            have = queued
            while run_pass(conn, Settings(), "bench").changes:
                pass
            print(f"{queued} runs queued:")
            for label in ("as planned at submission", "analyzed"):
                if label == "analyzed":
                    conn.execute("ANALYZE")
                if stats:
                    conn.execute("SELECT pg_stat_statements_reset()")
                times = timed_passes(conn, args.repeats)
                print(f"  {label:<26} median {statistics.median(times):7.1f} ms, "
                      f"slowest {max(times):7.1f} ms")
                if stats:
                    top_statements(conn, args.repeats)


if __name__ == "__main__":
    main()
