"""Checkpoint GC of one experiment with many checkpoints (issue 16): time to decide, and bytes
per second removed from local disk.

Brings up a private database (``private_db``) and builds an ended experiment straight in its
tables: ``--trials`` trials of ``--per-trial`` checkpoints each (10,000 by default), every
other one with a validation of the searcher metric at its step (random values, some tied), and
each checkpoint's files on local disk (shared_fs under a temporary directory: ``--files``
files of ``--bytes`` bytes).

* **Decide**: the keep rule, ``det_user.checkpoints_to_delete`` (one SQL statement), median of
  ``--repeats`` runs, and ``det_internal.checkpoint_gc`` (the same decision plus the UPDATE to
  DELETING) once; the goal is at most 1 s for 10,000 checkpoints.
* **Remove**: a real reconciler pass (in this process) schedules the GC task on agent
  ``bench``; the task's code (``det.harness.checkpoint_gc.GcTask``) runs here with the token
  the claim gives, removing the files and marking rows DELETED in batches. Printed: checkpoints
  and bytes removed per second. Anchor: ``shutil.rmtree`` of as many directories of the same
  size, with no database.

    python bench/checkpoint_gc.py [--trials 100] [--per-trial 100] [--files 2] [--bytes 8192]
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from private_db import private_database
from psycopg.types.json import Jsonb

from det.configs import load_experiment_config
from det.db import connect
from det.harness.checkpoint_gc import GcTask
from det.reconciler.passes import Settings, run_pass

CONFIG = """
name: checkpoint-gc
entrypoint: "true"
searcher: {name: random, metric: loss, max_trials: 100, max_length: {batches: 1}}
"""

# Rows of an ended experiment, built in bulk: trials, one finished run each, checkpoints at
# steps 1..per_trial, a validation at every other step (values rounded to 2 decimals, so
# there are ties).
BUILD = """
WITH t AS (
    INSERT INTO trials (experiment_id, request_id, hparams, seed, state, end_time)
    SELECT %(eid)s, gen_random_uuid(), '{}', 1, 'COMPLETED', now()
      FROM generate_series(1, %(trials)s)
    RETURNING id
), a AS (
    INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec, state,
                             ended_at, exit_code, settled)
    SELECT %(job)s, t.id, 1, 'default', 1, '{}', 'TERMINATED', now(), 0, true FROM t
    RETURNING id, trial_id
), c AS (
    INSERT INTO checkpoints (uuid, trial_id, allocation_id, steps_completed, storage, resources)
    SELECT gen_random_uuid(), a.trial_id, a.id, s, %(storage)s, %(resources)s
      FROM a, generate_series(1, %(per_trial)s) s
    RETURNING uuid
)
INSERT INTO metrics (trial_id, allocation_id, "group", steps_completed, "values")
SELECT a.trial_id, a.id, 'validation', s,
       jsonb_build_object('loss', round(random()::numeric, 2))
  FROM a, generate_series(2, %(per_trial)s, 2) s
"""


def build(url: str, root: Path, trials: int, per_trial: int, files: int,
          size: int) -> tuple[int, int]:
    """The ended experiment and its files; returns (experiment id, bytes on disk)."""
    config = load_experiment_config(CONFIG).expanded()
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(root),
                                    "storage_path": None, "save_experiment_best": 0,
                                    "save_trial_best": 1, "save_trial_latest": 1}
    resources = {f"part{i}.bin": size for i in range(files)}
    with connect(url, autocommit=True) as c:
        c.execute("SELECT det_agent.register('bench', 'localhost', 'default', 'process', %s)",
                  (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
        eid = c.execute("SELECT det_user.create_experiment(%s, '', NULL) AS id",
                        (Jsonb(config),)).fetchone()["id"]
        job = c.execute("SELECT job_id FROM experiments WHERE id = %s", (eid,)).fetchone()
        c.execute(BUILD, {"eid": eid, "job": job["job_id"], "trials": trials,
                          "per_trial": per_trial, "storage": Jsonb(config["checkpoint_storage"]),
                          "resources": Jsonb(resources)})
        c.execute("UPDATE experiments SET state = 'COMPLETED', end_time = now() WHERE id = %s",
                  (eid,))
        c.execute("ANALYZE")
        uuids = [str(r["uuid"]) for r in c.execute("SELECT uuid FROM checkpoints")]
    blob = os.urandom(size)
    for u in uuids:
        d = root / u
        d.mkdir()
        for i in range(files):
            (d / f"part{i}.bin").write_bytes(blob)
    return eid, len(uuids) * files * size


def decide(url: str, eid: int, repeats: int) -> None:
    with connect(url, autocommit=True) as c:
        times, n = [], 0
        for _ in range(repeats):
            start = time.perf_counter()
            n = c.execute("SELECT count(*) AS n FROM det_user.checkpoints_to_delete(%s)",
                          (eid,)).fetchone()["n"]
            times.append(time.perf_counter() - start)
        total = c.execute("SELECT count(*) AS n FROM checkpoints").fetchone()["n"]
        print(f"decide (det_user.checkpoints_to_delete, one statement): {n:,} of {total:,} "
              f"checkpoints to delete; median {statistics.median(times) * 1000:.0f} ms, "
              f"min {min(times) * 1000:.0f} ms over {repeats} runs (goal <= 1000 ms)")
        start = time.perf_counter()
        marked = c.execute("SELECT det_internal.checkpoint_gc(%s) AS n", (eid,)).fetchone()["n"]
        print(f"decide and mark DELETING (det_internal.checkpoint_gc): {marked:,} rows in "
              f"{(time.perf_counter() - start) * 1000:.0f} ms")


def remove(url: str) -> tuple[int, int, float]:
    """A reconciler pass schedules the GC task on agent ``bench``; its code runs here. Returns
    (checkpoints, bytes, seconds)."""
    with connect(url, autocommit=True) as c:
        for _ in range(5):
            run_pass(c, Settings(), "bench")
            row = c.execute("SELECT id FROM allocations WHERE agent_id = 'bench' "
                            "AND spec ->> 'kind' = 'checkpoint_gc'").fetchone()
            if row:
                break
        else:
            raise SystemExit("the reconciler placed no GC task on the bench agent")
        token = c.execute("SELECT det_agent.claim('bench', %s) AS t",
                          (row["id"],)).fetchone()["t"]
    task = GcTask(url, token)
    start = time.perf_counter()
    try:
        count, freed = task.run()
    finally:
        task.close()
    return count, freed, time.perf_counter() - start


def anchor(root: Path, n: int, files: int, size: int) -> float:
    """Seconds ``shutil.rmtree`` takes for ``n`` directories like the checkpoints'."""
    blob = os.urandom(size)
    dirs = []
    for k in range(n):
        d = root / f"anchor-{k}"
        d.mkdir()
        for i in range(files):
            (d / f"part{i}.bin").write_bytes(blob)
        dirs.append(d)
    start = time.perf_counter()
    for d in dirs:
        shutil.rmtree(d)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--per-trial", type=int, default=100)
    parser.add_argument("--files", type=int, default=2, help="files per checkpoint")
    parser.add_argument("--bytes", type=int, default=8192, help="bytes per file")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with private_database() as db, tempfile.TemporaryDirectory(prefix="det-gc-bench-") as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        eid, on_disk = build(db.url, root, args.trials, args.per_trial, args.files, args.bytes)
        print(f"built {args.trials * args.per_trial:,} checkpoints ({on_disk / 2**20:.1f} MiB "
              f"on disk) in {time.perf_counter() - start:.1f} s")
        decide(db.url, eid, args.repeats)
        count, freed, seconds = remove(db.url)
        left = sum(1 for _ in root.iterdir())
        print(f"remove (GC task): {count:,} checkpoints, {freed / 2**20:.1f} MiB in "
              f"{seconds:.2f} s = {count / seconds:,.0f} checkpoints/s, "
              f"{freed / seconds / 2**20:.1f} MiB/s; {left:,} checkpoint directories left")
        plain = anchor(root, count, args.files, args.bytes)
        print(f"anchor (shutil.rmtree, no database): {count:,} directories in {plain:.2f} s = "
              f"{count / plain:,.0f} /s, {freed / plain / 2**20:.1f} MiB/s")


if __name__ == "__main__":
    main()
