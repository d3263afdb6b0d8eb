"""The issue-11 toy search: a 200-trial adaptive ASHA search of a Core API script (27 steps at
most, 16 trials at once) on a private one-agent cluster, timed from submit to the end.

Brings up a private cluster (embedded PostgreSQL in a temporary DET_HOME, or the database
DET_DB_URL names; one ``det reconcile``; one process-runtime agent with ``--slots 16``),
submits ``toy_search/`` with ``det experiment create`` and waits for the experiment to end.
Printed: wall seconds, trials, runs (allocations) and per run p50 of the stages the database
clocked (placed, claimed, launched, ran), then the time between a run's end and the next run's
start on the same trial (the promotion hop). With ``--profile DIR`` both daemons
run under cProfile and their top functions are printed. Figures only.

    python bench/toy_search.py [--trials 200] [--concurrent 16] [--profile /tmp/prof]
                               [--agent-args=--no-task-pooler]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import yaml
from private_db import (
    busy_cpu,
    det_process,
    own_cpu,
    pooler_cpu,
    postgres_cpu,
    private_database,
    stop,
    tasks_cpu,
)
from psycopg.rows import dict_row
from task_throughput import STAGES, _print_profile

HERE = Path(__file__).parent / "toy_search"

HOP = """
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY gap) * 1000 AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY gap) * 1000 AS p95, count(*) AS n
  FROM (SELECT extract(epoch FROM a.running_at - lag(a.ended_at) OVER w) AS gap
          FROM allocations a WINDOW w AS (PARTITION BY a.trial_id ORDER BY a.id)) g
 WHERE gap IS NOT NULL
"""


def config(trials: int, concurrent: int, entrypoint: str) -> dict:
    return {"name": "toy-search", "entrypoint": entrypoint,
            "hyperparameters": {"x": {"type": "double", "minval": -1.0, "maxval": 1.0},
                                "y": {"type": "double", "minval": -1.0, "maxval": 1.0}},
            "searcher": {"name": "adaptive_asha", "metric": "loss", "smaller_is_better": True,
                         "max_trials": trials, "max_concurrent_trials": concurrent,
                         "max_length": {"batches": 27}, "divisor": 3, "mode": "standard"},
            "max_restarts": 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--concurrent", type=int, default=16)
    ap.add_argument("--entrypoint", default="python3 train.py",
                    help="e.g. 'python3 -m cProfile -o /tmp/task.prof train.py'")
    ap.add_argument("--agent-args", default="", help="extra `det agent run` arguments")
    ap.add_argument("--profile", type=Path, help="run both daemons under cProfile, into DIR")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)

    def profile(name: str) -> Path | None:
        return None if args.profile is None else args.profile / f"{name}.prof"

    # `python3 train.py` in the tasks is this interpreter (its venv has det)
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    with private_database() as db, tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "toy.yaml"
        cfg.write_text(yaml.safe_dump(config(args.trials, args.concurrent, args.entrypoint)))
        procs = [det_process(db.url, "reconcile", profile=profile("reconciler")),
                 det_process(db.url, "agent", "run", "--id", "bench", "--slot-type", "cpu",
                             "--slots", str(args.concurrent), "--runtime", "process",
                             *args.agent_args.split(), profile=profile("agent"))]
        env = {**os.environ, "DET_DB_URL": db.url}
        try:
            with psycopg.connect(db.url, autocommit=True, row_factory=dict_row) as conn:
                while not conn.execute("SELECT 1 FROM agents WHERE state = 'ACTIVE'").fetchone():
                    time.sleep(0.1)
                t0 = time.monotonic()
                cpu0 = (busy_cpu(), postgres_cpu(db.home), *map(own_cpu, procs),
                        tasks_cpu(procs[1]), pooler_cpu(procs[1]))
                subprocess.run([sys.executable, "-m", "det.cli.main", "experiment", "create",
                                str(cfg), str(HERE)], env=env, check=True,
                               stdout=subprocess.DEVNULL)
                while conn.execute("SELECT count(*) AS n FROM experiments WHERE state IN "
                                   "('COMPLETED', 'ERROR', 'CANCELED')").fetchone()["n"] < 1:
                    time.sleep(0.05)
                wall = time.monotonic() - t0
                cpu = [b - a for a, b in zip(cpu0, (busy_cpu(), postgres_cpu(db.home),
                                                     *map(own_cpu, procs), tasks_cpu(procs[1]),
                                                     pooler_cpu(procs[1])),
                                             strict=True)]
                exp = conn.execute("SELECT state, (SELECT count(*) FROM trials) AS trials, "
                                   "(SELECT count(*) FROM allocations) AS runs, "
                                   "(SELECT count(*) FROM trials WHERE state <> 'COMPLETED') "
                                   "AS bad FROM experiments").fetchone()
                stages = conn.execute(STAGES).fetchone()
                hop = conn.execute(HOP).fetchone()
                tail = [r["line"] for r in conn.execute(
                    "SELECT line FROM task_logs WHERE trial_id = (SELECT min(id) FROM trials "
                    "WHERE state <> 'COMPLETED') ORDER BY id DESC LIMIT 12").fetchall()]
        finally:
            stop(procs)
    print(f"toy search: {exp['trials']} trials, {exp['runs']} runs, experiment {exp['state']}, "
          f"{exp['bad']} trial(s) not COMPLETED; {args.concurrent} slots")
    if exp["bad"]:
        print("  the first such trial's last log lines:", *reversed(tail), sep="\n    ")
    print(f"  submit -> experiment ended {wall:.1f} s")
    print(f"  CPU seconds: postgres {cpu[1]:.1f}, reconciler {cpu[2]:.1f}, agent {cpu[3]:.1f}, "
          f"tasks {cpu[4]:.1f}" + (f", task pooler {cpu[5]:.1f}" if cpu[5] else "")
          + f"; the whole machine {cpu[0]:.1f}")
    print("  per run, p50 ms: " + "  ".join(
        f"{k} {stages[k]:.0f}" for k in ("placed", "claimed", "launched", "ran")))
    if hop["n"]:
        print(f"  next run of the same trial after the last ended: p50 {hop['p50']:.0f} ms, "
              f"p95 {hop['p95']:.0f} ms ({hop['n']} hops)")
    if args.profile is not None:
        for name in ("reconciler", "agent"):
            _print_profile(args.profile / f"{name}.prof", name, args.top)


if __name__ == "__main__":
    main()
