"""Time of an idle reconciler pass as the cluster's history grows (issue 11).

A pass looks for live experiments, trials and runs only; what has ended must cost it
nothing. In a private database (embedded PostgreSQL, or the one DET_DB_URL names) this adds,
for each history size H, ended one-trial experiments (each with its job, trial and settled
run, COMPLETED; rows inserted directly, the config a real expanded one) up to H, then runs
``--repeats`` whole passes (:func:`det.reconciler.passes.run_pass`: nothing to do, as on a
quiet cluster) and prints their median and slowest time. With ``--queued N``, N one-trial
experiments are submitted first (no agent, so their runs wait through every measure). The
passes run in a session prepared as the reconciler's (:func:`~det.reconciler.passes.
prepare_session`), or with PostgreSQL's default planner costs with ``--default-costs``.
Figures only.

    python bench/pass_history.py [--history 0,10000,100000] [--repeats 20] [--queued 1000]
                                 [--default-costs]
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
name: history
entrypoint: "true"
searcher: {name: single, metric: loss, max_length: {batches: 1}}
"""

# Ended experiments numbered %(first)s to %(last)s, one statement per table.
ADD_HISTORY = [
    """INSERT INTO jobs (id, type, resource_pool, queue_position, owner)
       SELECT i, 'EXPERIMENT', 'default', i, 'bench'
         FROM generate_series(%(first)s::integer, %(last)s) i""",
    """INSERT INTO experiments (id, job_id, name, config, original_config, owner, state,
                               end_time)
       SELECT i, i, 'history', %(config)s, '', 'bench', 'COMPLETED', now()
         FROM generate_series(%(first)s::integer, %(last)s) i""",
    """INSERT INTO trials (id, experiment_id, request_id, hparams, seed, state, closed,
                          end_time)
       SELECT i, i, gen_random_uuid(), '{}', i, 'COMPLETED', true, now()
         FROM generate_series(%(first)s::integer, %(last)s) i""",
    """INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec,
                               state, exit_code, settled, ended_at)
       SELECT i, i, 1, 'default', 1, '{"kind": "trial"}', 'TERMINATED', 0, true, now()
         FROM generate_series(%(first)s::integer, %(last)s) i""",
]


def queue(conn: psycopg.Connection, config: Jsonb, n: int) -> None:
    """Submit ``n`` one-trial experiments, numbered past any history, and run passes until
    their runs wait."""
    if n == 0:
        return
    conn.execute("UPDATE id_counters SET last_value = 10000000 "
                 "WHERE name IN ('jobs', 'experiments', 'trials')")
    with conn.transaction():
        for _ in range(n):
            conn.execute("SELECT det_user.create_experiment(%s, '', NULL)", (config,))
    while run_pass(conn, Settings(), "bench:pass-history").changes:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", default="0,10000,100000",
                        help="ended experiments before each measure, comma-separated")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--queued", type=int, default=0, help="runs waiting (default 0)")
    parser.add_argument("--default-costs", action="store_true",
                        help="PostgreSQL's planner costs, not the reconciler's")
    args = parser.parse_args()
    config = Jsonb(load_experiment_config(CONFIG).expanded())
    with private_database() as db, \
            psycopg.connect(db.url, autocommit=True, row_factory=dict_row) as conn:
        if not args.default_costs:
            prepare_session(conn)
        queue(conn, config, args.queued)
        have = 0
        for size in (int(h) for h in args.history.split(",")):
            if size > have:
                with conn.transaction():
                    for statement in ADD_HISTORY:
                        conn.execute(statement, {"first": have + 1, "last": size,
                                                 "config": config})
                conn.execute("VACUUM ANALYZE")
                have = size
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                run_pass(conn, Settings(), "bench:pass-history")
                times.append((time.perf_counter() - start) * 1000)
            print(f"{have:>7} ended experiments, {args.queued} queued: idle pass median "
                  f"{statistics.median(times):6.1f} ms, slowest {max(times):6.1f} ms")


if __name__ == "__main__":
    main()
