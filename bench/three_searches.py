"""Issue 34's scheduling scenario: three small searches on two slots, run together, against
the same three run alone back to back. Figures: runs preempted at 0 batches (goal 0) and
the total wall of the three together over the back-to-back total (goal <= 1.15).

Brings up a private cluster (embedded PostgreSQL in a temporary DET_HOME, or the database
DET_DB_URL names; one ``det reconcile``; one process-runtime agent with two slots) with the
scheduler given (``--scheduler fair_share``, the default, or ``priority`` with preemption,
where the third search is submitted at priority 10), and ``scheduler.min_run_time``. Each
search is ``three_searches/train.py`` (no torch: each run sleeps ``--start-time`` before its
first batch, as a real trial imports and loads data, and each batch ``--step-time``) under a
random searcher, one slot per trial, two trials at once. First each search alone, waiting for
it to end before the next; then all three at once. Printed per phase: wall seconds, runs,
runs det preempted, those preempted before they trained a batch (no checkpoint and no
metrics of their own), and the "why it ended" of every preempted run, counted.

    python bench/three_searches.py [--trials 4] [--batches 40] [--start-time 3]
        [--step-time 0.05]
        [--checkpoint-every 10] [--min-run-time 60] [--scheduler fair_share|priority]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psycopg
import yaml
from private_db import det_process, private_database, stop
from psycopg.rows import dict_row

HERE = Path(__file__).parent / "three_searches"

# Runs of the experiments ``ids``: how many, how many det preempted, and how many of those
# trained nothing (a run that trained a batch checkpoints before it exits, and reports).
RUNS = """
SELECT count(*) AS runs,
       count(*) FILTER (WHERE det_user.run_status(a.id) = 'preempted') AS preempted,
       count(*) FILTER (WHERE det_user.run_status(a.id) = 'preempted'
                          AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.allocation_id = a.id)
                          AND NOT EXISTS (SELECT 1 FROM metrics m WHERE m.allocation_id = a.id))
           AS at_zero,
       count(*) FILTER (WHERE a.state = 'TERMINATED' AND det_user.run_end_reason(a.id) IS NULL)
           AS no_reason
  FROM allocations a JOIN trials t ON t.id = a.trial_id
 WHERE t.experiment_id = ANY (%(ids)s)
"""

WHY = """
SELECT det_user.run_end_reason(a.id) AS why FROM allocations a JOIN trials t ON t.id = a.trial_id
 WHERE t.experiment_id = ANY (%(ids)s) AND det_user.run_status(a.id) = 'preempted'
"""


def search(name: str, args: argparse.Namespace, priority: int | None) -> dict:
    """One search's experiment config."""
    cfg = {"name": name, "entrypoint": f"{sys.executable} train.py",
           "hyperparameters": {"x": {"type": "double", "minval": -1.0, "maxval": 1.0},
                               "start_time": {"type": "const", "val": args.start_time},
                               "step_time": {"type": "const", "val": args.step_time},
                               "checkpoint_every": {"type": "const",
                                                    "val": args.checkpoint_every}},
           "searcher": {"name": "random", "metric": "loss", "smaller_is_better": True,
                        "max_trials": args.trials, "max_concurrent_trials": 2,
                        "max_length": {"batches": args.batches}},
           "min_validation_period": {"batches": args.batches},
           "min_checkpoint_period": {"batches": args.checkpoint_every},
           "max_restarts": 0}
    if priority is not None:
        cfg["resources"] = {"priority": priority}
    return cfg


def cluster_config(args: argparse.Namespace) -> dict:
    scheduler = {"type": args.scheduler, "min_run_time": args.min_run_time}
    if args.scheduler == "priority":
        scheduler["preemption"] = True
    return {"resource_manager": {"scheduler": scheduler}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4, help="trials per search")
    ap.add_argument("--batches", type=int, default=40, help="batches per trial")
    ap.add_argument("--start-time", type=float, default=3.0,
                    help="seconds each run spends before its first batch (imports, data)")
    ap.add_argument("--step-time", type=float, default=0.05, help="seconds per batch")
    ap.add_argument("--checkpoint-every", type=int, default=10, help="batches")
    ap.add_argument("--min-run-time", type=float, default=60.0, help="seconds")
    ap.add_argument("--scheduler", choices=["fair_share", "priority"], default="fair_share")
    args = ap.parse_args()
    priorities = [None, None, 10] if args.scheduler == "priority" else [None] * 3
    with private_database() as db, tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "DET_DB_URL": db.url}

        def det(*argv: str) -> None:
            subprocess.run([sys.executable, "-m", "det.cli.main", *argv], env=env, check=True,
                           stdout=subprocess.DEVNULL)

        cluster = Path(tmp) / "cluster.yaml"
        cluster.write_text(yaml.safe_dump(cluster_config(args)))
        det("cluster", "config", "apply", str(cluster))
        files = []
        for i, prio in enumerate(priorities):
            f = Path(tmp) / f"s{i}.yaml"
            f.write_text(yaml.safe_dump(search(f"search-{i}", args, prio)))
            files.append(f)
        procs = [det_process(db.url, "reconcile", "--interval", "0.5"),
                 det_process(db.url, "agent", "run", "--id", "bench", "--slot-type", "cpu",
                             "--slots", "2", "--runtime", "process")]
        try:
            with psycopg.connect(db.url, autocommit=True, row_factory=dict_row) as conn:
                while not conn.execute("SELECT 1 FROM agents WHERE state = 'ACTIVE'").fetchone():
                    time.sleep(0.1)

                def ended(ids: list[int]) -> bool:
                    return conn.execute(
                        "SELECT count(*) AS n FROM experiments WHERE id = ANY (%s) AND state IN "
                        "('COMPLETED', 'ERROR', 'CANCELED')", (ids,)).fetchone()["n"] == len(ids)

                def last_id() -> int:
                    return conn.execute("SELECT max(id) AS id FROM experiments").fetchone()["id"]

                alone = []
                t0 = time.monotonic()
                for f in files:
                    t = time.monotonic()
                    det("experiment", "create", str(f), str(HERE))
                    eid = last_id()
                    while not ended([eid]):
                        time.sleep(0.1)
                    alone.append((eid, time.monotonic() - t))
                back_to_back = time.monotonic() - t0
                t0 = time.monotonic()
                for f in files:
                    det("experiment", "create", str(f), str(HERE))
                together_ids = [last_id() - 2, last_id() - 1, last_id()]
                while not ended(together_ids):
                    time.sleep(0.1)
                together = time.monotonic() - t0
                figures = {name: conn.execute(RUNS, {"ids": ids}).fetchone()
                           for name, ids in (("alone", [e for e, _ in alone]),
                                             ("together", together_ids))}
                why = Counter(r["why"] for r in conn.execute(WHY, {"ids": together_ids}))
                states = [r["state"] for r in conn.execute(
                    "SELECT state::text FROM experiments ORDER BY id").fetchall()]
        finally:
            stop(procs)
    print(f"three searches on two slots ({args.scheduler}, min_run_time {args.min_run_time:g} s):"
          f" {args.trials} trials x {args.batches} batches x {args.step_time:g} s each "
          f"after {args.start_time:g} s, "
          f"checkpoint every {args.checkpoint_every}; experiments {', '.join(states)}")
    print(f"  alone, back to back: {back_to_back:.1f} s "
          f"({', '.join(f'{w:.1f}' for _, w in alone)})")
    print(f"  together:            {together:.1f} s = {together / back_to_back:.2f} x")
    for name, f in figures.items():
        print(f"  {name}: {f['runs']} runs, {f['preempted']} preempted, {f['at_zero']} of them "
              f"at 0 batches, {f['no_reason']} ended without a reason")
    for line, n in why.most_common():
        print(f"    {n} x {line}")


if __name__ == "__main__":
    main()
