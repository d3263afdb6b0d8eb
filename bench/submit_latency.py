"""Submit -> task process started, on an idle local cluster.

Brings up a private cluster (embedded PostgreSQL in a temporary DET_HOME, or the database
DET_DB_URL names, one reconciler, one agent), then submits N one-trial experiments one after
another, each waiting for the previous task to start, through ``det_create_experiment`` (the
function ``det experiment create`` calls) with a shell entrypoint that exits at once. For
each it reads, from the database's own clock, the time from the submitting transaction to
the agent's claim of the allocation (the moment before it spawns the process), and prints
p50 / p95 / max in milliseconds. Figures only, no assertions.

    python bench/submit_latency.py [--n 50]
"""

import argparse
import statistics
import time

import psycopg
from private_db import det_process, private_database, stop
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from det.configs import load_experiment_config

CONFIG = """
name: latency
entrypoint: "true"
searcher: {name: single, metric: loss, max_length: {batches: 1}}
max_restarts: 0
"""

LATENCY = """
SELECT extract(epoch FROM a.started_at - e.start_time) * 1000 AS ms
  FROM experiments e JOIN trials t ON t.experiment_id = e.id JOIN allocations a
    ON a.trial_id = t.id WHERE e.id = %s AND a.started_at IS NOT NULL
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50, help="submissions (default 50)")
    args = ap.parse_args()
    config = load_experiment_config(CONFIG).expanded()
    with private_database() as db:
        procs = [det_process(db.url, "reconcile"),
                 det_process(db.url, "agent", "run", "--slot-type", "cpu", "--slots", "2")]
        try:
            with psycopg.connect(db.url, autocommit=True, row_factory=dict_row) as conn:
                while not conn.execute("SELECT 1 FROM agents WHERE state = 'ACTIVE'").fetchone():
                    time.sleep(0.1)
                samples = []
                for _ in range(args.n):
                    eid = conn.execute("SELECT det_create_experiment(%s, '', NULL) AS id",
                                       (Jsonb(config),)).fetchone()["id"]
                    while (row := conn.execute(LATENCY, (eid,)).fetchone()) is None:
                        time.sleep(0.002)
                    samples.append(float(row["ms"]))
        finally:
            stop(procs)
    samples.sort()
    p95 = samples[max(0, round(0.95 * len(samples)) - 1)]
    print(f"submit -> task process started, {len(samples)} submissions on an idle cluster:")
    print(f"  p50 {statistics.median(samples):.1f} ms   p95 {p95:.1f} ms   "
          f"max {samples[-1]:.1f} ms")


if __name__ == "__main__":
    main()
