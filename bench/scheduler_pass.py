"""Time of one scheduling pass (step 8 of a reconciler pass) on a big queue.

Builds, in a private embedded PostgreSQL, a pool of ``--agents`` agents of 8 slots and, for
each queue size N, N queued jobs of one allocation each (1, 2, 4 or 8 slots, priorities
1-99, weights 1-3; rows inserted directly). A first pass under the scheduler fills the
cluster and is committed (its time is printed), and a second one brings the waiting reasons
up to date; then the steady-state pass (cluster full, the rest of the queue
waiting, reasons to refresh) is run ``--repeats`` times, each rolled back, and its median
printed split into read (SQL), decide (the pure scheduler) and write (SQL), with the
benchmark process's peak RSS so far (the reconciler's footprint for such a pool: it holds the
same rows, objects and decision during a pass). With ``--daemons SECONDS``, a real
``det reconcile`` and a process-runtime ``det agent run`` (in a pool of its own, so it is
given none of the bench's jobs) then run that long against the last queue, and their peak
RSS is printed. Figures only.

    python bench/scheduler_pass.py [--agents 1000] [--jobs 1000,2000,5000,10000] [--repeats 5]
                                   [--daemons 15]
"""

import argparse
import resource
import statistics
import time
from pathlib import Path

import psycopg
from private_db import det_process, private_database, stop
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from det.configs.cluster import SchedulerConfig
from det.reconciler.placement import apply, collector_paused, load_pool
from det.reconciler.schedulers import schedule

SCHEDULERS = {"fair_share": {"type": "fair_share"},
              "priority": {"type": "priority", "preemption": True},
              "round_robin": {"type": "round_robin"}}

SETUP = """
TRUNCATE allocation_slots, allocations, jobs, slots, agents CASCADE;
INSERT INTO agents (id, hostname, resource_pool, runtime)
SELECT 'agent-' || lpad(i::text, 5, '0'), 'host' || i, 'default', 'process'
  FROM generate_series(1, %(agents)s) i;
INSERT INTO slots (agent_id, slot_id, type)
SELECT g.id, s, 'cpu' FROM agents g, generate_series(0, 7) s;
INSERT INTO jobs (id, type, resource_pool, priority, weight, queue_position, owner)
SELECT i, 'EXPERIMENT', 'default', 1 + (i * 37) %% 99, 1 + i %% 3, i, 'bench'
  FROM generate_series(1, %(jobs)s) i;
INSERT INTO allocations (job_id, run, resource_pool, slots_needed, spec)
SELECT i, 1, 'default', (ARRAY[1, 1, 2, 4, 8])[1 + i %% 5], '{}'
  FROM generate_series(1, %(jobs)s) i;
"""


def one_pass(conn: psycopg.Connection, config: SchedulerConfig) -> tuple[float, float, float]:
    """(read, decide, write) seconds of one pass over the default pool, as
    :func:`det.reconciler.placement.place` runs it (collector paused)."""
    with collector_paused():
        t0 = time.perf_counter()
        state = load_pool(conn, "default")
        t1 = time.perf_counter()
        decision = schedule(config, state.agents, state.tasks)
        t2 = time.perf_counter()
        apply(conn, decision, set(), set(), state.reasons)
        return t1 - t0, t2 - t1, time.perf_counter() - t2


def peak_rss_mib() -> float:
    """This process's peak resident set size so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def daemons_peak_rss(url: str, seconds: float) -> dict[str, float]:
    """Peak RSS (MiB, VmHWM) of ``det reconcile`` and ``det agent run`` after ``seconds``
    against the queue at ``url``; the agent registers in pool ``rss``, empty of jobs."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO resource_pools (name) VALUES ('rss') ON CONFLICT DO NOTHING")
    procs = {"reconciler": det_process(url, "reconcile", "--interval", "1",
                                       "--agent-timeout", "1000000"),
             "agent": det_process(url, "agent", "run", "--id", "rss", "--resource-pool", "rss",
                                  "--slots", "8", "--runtime", "process")}
    time.sleep(seconds)
    peak = {}
    for name, p in procs.items():
        status = Path(f"/proc/{p.pid}/status").read_text()
        kib = next(line.split()[1] for line in status.splitlines()
                   if line.startswith("VmHWM:"))
        peak[name] = int(kib) / 1024
    stop(list(procs.values()))
    return peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--jobs", default="1000,2000,5000,10000")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--daemons", type=float, default=0,
                   help="seconds to run a reconciler and an agent on the last queue")
    args = p.parse_args()
    print(f"{args.agents} agents x 8 slots; median of {args.repeats} steady-state passes (ms)")
    print(f"{'scheduler':<12} {'jobs':>6} {'first':>8} {'read':>8} {'decide':>8} {'write':>8}"
          f" {'total':>8} {'rss MiB':>8}")
    # Its own embedded server: the bench fills the tables with 100,000s of rows.
    with (private_database(embedded_only=True) as db,
          psycopg.connect(db.url, row_factory=dict_row, autocommit=True) as conn):
        for name, sched in SCHEDULERS.items():
            config = SchedulerConfig.model_validate(sched)
            conn.execute("UPDATE resource_pools SET scheduler = %s WHERE name = 'default'",
                         (Jsonb(config.model_dump()),))
            for n in [int(x) for x in args.jobs.split(",")]:
                with conn.transaction():
                    for stmt in SETUP.split(";")[:-1]:
                        conn.execute(stmt, {"agents": args.agents, "jobs": n})
                conn.execute("ANALYZE")
                with conn.transaction():
                    first = sum(one_pass(conn, config))
                # As autovacuum would soon after: the plans of a steady pass see the slots held
                conn.execute("ANALYZE")
                with conn.transaction():  # the reasons now name the jobs holding slots
                    one_pass(conn, config)
                runs = []
                for _ in range(args.repeats):
                    with conn.transaction(force_rollback=True):
                        runs.append(one_pass(conn, config))
                read, decide, write = (statistics.median(r[i] for r in runs) for i in range(3))
                print(f"{name:<12} {n:>6} {first * 1e3:>8.1f} {read * 1e3:>8.1f} "
                      f"{decide * 1e3:>8.1f} {write * 1e3:>8.1f} "
                      f"{(read + decide + write) * 1e3:>8.1f} {peak_rss_mib():>8.0f}", flush=True)
        if args.daemons:
            peak = daemons_peak_rss(db.url, args.daemons)
            print(f"after {args.daemons:.0f} s on the last queue, peak RSS: reconciler "
                  f"{peak['reconciler']:.0f} MiB, agent {peak['agent']:.0f} MiB")


if __name__ == "__main__":
    main()
