"""The hop from a trial's validation report to the searcher's answer, with a running reconciler.

Brings up a private embedded PostgreSQL (or the database DET_DB_URL names), one
``det reconcile`` and a registered agent row with many slots but no agent process (the
allocations are claimed by this script, which then plays the task). For each of N one-trial
experiments (searcher ``single``) it waits for the trial's allocation, claims it
(``det_agent.claim``), opens the task's ``DbTransport``, reads its op, and then times, on this
process's clock, from the return of ``complete_op`` (``det_task.complete_op``: the event is queued
and the reconciler's channel NOTIFYed) until the searcher's answer is visible:

- **decided**: ``det_task.current_op`` asked every millisecond on a connection of the script's own
  stops answering ``{"wait": true}``: the reconciler woke, read the event and wrote its
  decision (here: no more work, as ``single`` has one op; a promotion or next rung is the
  same pass writing an op instead);
- **seen by the task**: the harness's own ``current_op()`` (its backoff while the answer is
  ``wait``) returns.

The two are measured on separate hops (alternately), so the millisecond poll does not hold
the lock the reconciler's pass needs. Prints p50 / p95 in milliseconds. Whether the pass is
woken by the NOTIFY shows in the figures: without it the hop would be the reconciler's
``--interval`` (2 s here) or ``lease / 3``. Figures only, no assertions.

    python bench/promotion_hop.py [--n 50]
"""

import argparse
import statistics
import time

import psycopg
from private_db import det_process, private_database, stop
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from det.configs import load_experiment_config
from det.harness.transport import DbTransport

CONFIG = """
name: hop
entrypoint: "true"
searcher: {name: single, metric: loss, max_length: {batches: 1}}
max_restarts: 0
"""

ASSIGNED = """
SELECT a.id FROM allocations a JOIN trials t ON t.id = a.trial_id
 WHERE t.experiment_id = %s AND a.state = 'ASSIGNED'
"""


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, round(q * len(ordered)) - 1)]


def hop(conn: psycopg.Connection, url: str, config: dict, harness: bool) -> float:
    """One experiment's hop in milliseconds (see the module doc)."""
    eid = conn.execute("SELECT det_user.create_experiment(%s, '', NULL) AS id",
                       (Jsonb(config),)).fetchone()["id"]
    while (row := conn.execute(ASSIGNED, (eid,)).fetchone()) is None:
        time.sleep(0.005)
    token = conn.execute("SELECT det_agent.claim('hop', %s) AS t", (row["id"],)).fetchone()["t"]
    task = DbTransport(url, row["id"], token)
    try:
        op = task.current_op()
        assert op is not None, "the single searcher's trial has one op"
        task.complete_op(op.id, 0.5)
        t0 = time.perf_counter()
        if harness:
            task.current_op()
        else:
            while conn.execute("SELECT det_task.current_op(%s) AS op",
                               (token,)).fetchone()["op"] == {"wait": True}:
                time.sleep(0.001)
        ms = (time.perf_counter() - t0) * 1000
    finally:
        task.close()
    conn.execute("SELECT det_agent.report('hop', %s, 'TERMINATED', 0, NULL)", (row["id"],))
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50, help="hops of each kind (default 50)")
    args = ap.parse_args()
    config = load_experiment_config(CONFIG).expanded()
    decided: list[float] = []
    seen: list[float] = []
    with private_database() as db, psycopg.connect(db.url, autocommit=True,
                                                    row_factory=dict_row) as conn:
        conn.execute("SELECT det_agent.register('hop', 'host', 'default', 'process', %s)",
                     (Jsonb([{"slot_id": i, "type": "cpu"} for i in range(4)]),))
        reconciler = det_process(db.url, "reconcile", "--agent-timeout", "3600")
        try:
            for i in range(2 * args.n):
                (seen if i % 2 else decided).append(hop(conn, db.url, config,
                                                        harness=bool(i % 2)))
        finally:
            stop([reconciler])
    print(f"complete_op -> searcher's answer, {args.n} hops each, reconciler --interval 2, "
          "milliseconds:")
    for name, s in (("decided (1 ms poll)", decided), ("seen by the task", seen)):
        print(f"  {name:<20} p50 {statistics.median(s):7.1f}   p95 {pct(s, 0.95):7.1f}   "
              f"max {max(s):7.1f}")


if __name__ == "__main__":
    main()
