"""Trivial tasks started and completed per second on 32 slots (issue 11).

Brings up a private cluster (embedded PostgreSQL in a temporary DET_HOME, or the database
DET_DB_URL names; one ``det reconcile``; one process-runtime agent with ``--slots 32``), then
submits N one-trial experiments at once (``det_user.create_experiment``, the function
``det experiment create`` calls; searcher ``single``, entrypoint ``true``, 1 slot each) and
waits until every experiment has ended. Each task is its own job, as in the issue's anchor
(Slurm: N ``sbatch`` jobs of ``true``); an experiment with N trials would measure the same
path plus one searcher's bookkeeping.

From the database's own clock (``allocations``) it prints:

- started per second: (N - 1) / (last ``started_at`` - first ``started_at``), the agent's
  claims; the same for ``running_at`` (process forked and reported RUNNING);
- completed per second: (N - 1) / (last ``ended_at`` - first ``ended_at``);
- per task, p50 of: created -> assigned (the reconciler's placement), assigned -> started
  (the agent's wake-up and claim), started -> running (context, fork/exec, report),
  running -> ended (the task's own run, its output drained, the end reported), and
  ended -> the experiment's end (the settle and the experiment's finish); and per slot, p50
  of freed -> assigned again (a run's end reported -> the next run on its slot placed: the
  reconciler's wake-up and pass; ``assigned_at`` is the placing pass's start, so a pass that
  began before the end was reported, and still saw it, gives a negative figure);
- CPU milliseconds per task of PostgreSQL (embedded only), the reconciler, the agent and the
  tasks (with their wrappers), and of the whole machine, from submission to the last end:
  on a shared machine, what each part costs, whatever the load.

With ``--profile DIR`` the reconciler and the agent run under cProfile (stopped by SIGTERM, so
the profiles are written): the number of reconciler passes and their mean time, the agent's
main steps (its sync, claim + launch, report of ends, waits for a NOTIFY) and the top
functions by cumulative time are printed. Profiled runs are slower; they show where the time
goes. Figures only, no assertions.

    python bench/task_throughput.py [--n 1000] [--slots 32] [--profile /tmp/prof]
"""

import argparse
import pstats
import time
from pathlib import Path

import psycopg
from private_db import (
    busy_cpu,
    det_process,
    own_cpu,
    postgres_cpu,
    private_database,
    stop,
    tasks_cpu,
)
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from det.configs import load_experiment_config

CONFIG = """
name: throughput
entrypoint: "true"
searcher: {name: single, metric: loss, max_length: {batches: 1}}
max_restarts: 0
"""

RATES = """
SELECT count(*) AS n,
       (count(*) - 1) / nullif(extract(epoch FROM max(started_at) - min(started_at)), 0) AS started,
       (count(*) - 1) / nullif(extract(epoch FROM max(running_at) - min(running_at)), 0) AS running,
       (count(*) - 1) / nullif(extract(epoch FROM max(ended_at) - min(ended_at)), 0) AS ended,
       extract(epoch FROM max(ended_at) - min(created_at)) AS span
  FROM allocations
"""

STAGES = """
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.assigned_at - a.created_at))
         * 1000 AS placed,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.started_at - a.assigned_at))
         * 1000 AS claimed,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.running_at - a.started_at))
         * 1000 AS launched,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.ended_at - a.running_at))
         * 1000 AS ran,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM e.end_time - a.ended_at))
         * 1000 AS settled
  FROM allocations a JOIN trials t ON t.id = a.trial_id JOIN experiments e
    ON e.id = t.experiment_id
"""

# Each slot's runs in the order they were placed on it (allocation_slots keeps released
# rows): the previous one's end -> the next one's placement.
REUSE = """
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM a.assigned_at - p.ended_at))
         * 1000 AS reused
  FROM (SELECT h.allocation_id, lag(h.allocation_id) OVER (
                 PARTITION BY h.agent_id, h.slot_id ORDER BY a.assigned_at) AS prev
          FROM allocation_slots h JOIN allocations a ON a.id = h.allocation_id) h
  JOIN allocations a ON a.id = h.allocation_id JOIN allocations p ON p.id = h.prev
"""

# (module file, function) of the steps summed up from the profiles.
STEPS = {"reconciler": [("passes.py", "run_pass"), ("passes.py", "_settle"),
                        ("passes.py", "_search"), ("placement.py", "place")],
         "agent": [("daemon.py", "_sync"), ("daemon.py", "reconcile"), ("daemon.py", "_launch"),
                   ("daemon.py", "_prepare_dir"), ("process.py", "launch"),
                   ("daemon.py", "_report"), ("daemon.py", "_report_ends"),
                   ("daemon.py", "_tend"), ("cursor.py", "notifies"),
                   ("connection.py", "notifies")]}


def _print_profile(path: Path, name: str, top: int) -> None:
    stats = pstats.Stats(str(path)).strip_dirs()
    print(f"\n== {name}: calls, cumulative s, ms per call ==")
    for (file, _, func), (_, calls, _, cum, _) in sorted(stats.stats.items()):  # type: ignore
        if (file, func) in STEPS[name]:
            print(f"  {file}:{func:<14} {calls:7d} {cum:8.2f} s {1000 * cum / calls:8.2f} ms")
    print(f"== {name}: top {top} by cumulative time ==")
    stats.sort_stats("cumulative").print_stats(top)


def cpu(home: Path | None, reconciler, agent) -> list[float]:
    """CPU seconds so far: postgres, reconciler, agent, tasks, the whole machine."""
    return [postgres_cpu(home), own_cpu(reconciler), own_cpu(agent), tasks_cpu(agent),
            busy_cpu()]


def run(url: str, config: dict, n: int, home: Path | None,
        procs: list) -> tuple[dict, dict, int, float, list[float]]:
    """Submit ``n`` one-trial experiments in one transaction once the agent is up, wait for
    all to end; returns (rates, stages, experiments not COMPLETED, wall seconds, CPU seconds
    of :func:`cpu` spent meanwhile)."""
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        while not conn.execute("SELECT 1 FROM agents WHERE state = 'ACTIVE'").fetchone():
            time.sleep(0.1)
        cpu0 = cpu(home, *procs)
        t0 = time.monotonic()
        with conn.transaction():
            for _ in range(n):
                conn.execute("SELECT det_user.create_experiment(%s, '', NULL)",
                             (Jsonb(config),))
        while conn.execute("SELECT count(*) AS n FROM experiments WHERE state IN "
                           "('COMPLETED', 'ERROR', 'CANCELED')").fetchone()["n"] < n:
            time.sleep(0.2)
        wall = time.monotonic() - t0
        spent = [b - a for a, b in zip(cpu0, cpu(home, *procs), strict=True)]
        return (conn.execute(RATES).fetchone(),
                {**conn.execute(STAGES).fetchone(), **conn.execute(REUSE).fetchone()},
                conn.execute("SELECT count(*) AS n FROM experiments "
                             "WHERE state <> 'COMPLETED'").fetchone()["n"], wall, spent)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="tasks (default 1000)")
    ap.add_argument("--slots", type=int, default=32, help="slots of the one agent (default 32)")
    ap.add_argument("--interval", type=float, default=2.0, help="reconciler --interval")
    ap.add_argument("--profile", type=Path, help="run both daemons under cProfile, into DIR")
    ap.add_argument("--top", type=int, default=25, help="profile lines printed per daemon")
    args = ap.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    config = load_experiment_config(CONFIG).expanded()

    def profile(name: str) -> Path | None:
        return None if args.profile is None else args.profile / f"{name}.prof"

    with private_database() as db:
        procs = [det_process(db.url, "reconcile", "--interval", str(args.interval),
                             profile=profile("reconciler")),
                 det_process(db.url, "agent", "run", "--id", "bench", "--slot-type", "cpu",
                             "--slots", str(args.slots), "--runtime", "process",
                             profile=profile("agent"))]
        try:
            rates, stages, failed, wall, spent = run(db.url, config, args.n, db.home, procs)
        finally:
            stop(procs)
    print(f"{rates['n']} trivial tasks (entrypoint true), {args.slots} slots, one agent; "
          f"{failed} experiment(s) not COMPLETED")
    print(f"  started (claimed)  {rates['started']:7.1f} /s")
    print(f"  running (forked)   {rates['running']:7.1f} /s")
    print(f"  completed (ended)  {rates['ended']:7.1f} /s")
    print(f"  submit -> all ended {wall:.1f} s (database span {rates['span']:.1f} s)")
    print("  per task, p50 ms: " + "  ".join(
        f"{k} {stages[k]:.0f}" for k in ("placed", "claimed", "launched", "ran", "settled")))
    print(f"  per slot, p50 ms: freed -> assigned again {stages['reused']:.0f}")
    print("  CPU ms per task: " + ", ".join(
        f"{name} {1000 * s / args.n:.2f}" for name, s in zip(
            ("postgres", "reconciler", "agent", "tasks", "machine"), spent, strict=True)))
    if args.profile is not None:
        for name in ("reconciler", "agent"):
            _print_profile(args.profile / f"{name}.prof", name, args.top)


if __name__ == "__main__":
    main()
