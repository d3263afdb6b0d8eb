"""Submit -> task running -> first training batch, for the docker runtime vs. the process runtime.

Brings up a private cluster (embedded PostgreSQL in a temporary DET_HOME, or the database
DET_DB_URL names, and one reconciler), then for each runtime starts one agent with it and
submits N one-trial digits experiments one after another through ``det experiment create``,
each training one batch (``scheduling_unit: 1``), waiting for each to end before the next. From
the database's own clock it reads, per submission:

- submit -> running: the submitting transaction to the agent's RUNNING report (process or
  container started);
- submit -> first batch: to the first training metrics row (one batch trained);
- start overhead: the agent's claim of the allocation to its RUNNING report, i.e. what the
  runtime itself costs to start a task (container creation and start, or a fork and exec).

It prints p50 / p95 in milliseconds. The docker runtime needs a Docker engine and det's task
image (``det image build --offline``); without them only the process runtime is measured.
``process-hook`` is the process runtime with a one-line ``startup-hook.sh`` in the context:
such a task starts cold (a shell, then a fresh interpreter in its task environment), where
the plain one is forked warm by the agent's zygote (det.agent.zygote, det.agent.taskenv).
Figures only, no assertions.

    python bench/task_start.py [--n 20] [--runtimes process,process-hook,docker]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import yaml
from private_db import det_process, private_database, stop
from psycopg.rows import dict_row

REPO = Path(__file__).resolve().parent.parent
DIGITS = REPO / "examples" / "digits"

TIMES = """
SELECT extract(epoch FROM a.running_at - e.start_time) * 1000 AS running,
       extract(epoch FROM m.reported_at - e.start_time) * 1000 AS first_batch,
       extract(epoch FROM a.running_at - a.started_at) * 1000 AS overhead
  FROM experiments e JOIN trials t ON t.experiment_id = e.id
  JOIN allocations a ON a.trial_id = t.id AND a.run = 1
  JOIN LATERAL (SELECT min(reported_at) AS reported_at FROM metrics
                 WHERE trial_id = t.id AND "group" = 'training') m ON true
 WHERE e.id = %s AND e.state IN ('COMPLETED', 'ERROR', 'CANCELED')
"""


def det(url: str, *args: str) -> None:
    """``det ARGS`` against ``url``, to completion."""
    subprocess.run([sys.executable, "-m", "det.cli.main", *args], check=True,
                   env={**os.environ, "DET_DB_URL": url}, capture_output=True, text=True)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, round(q * len(ordered)) - 1)]


def measure(runtime: str, n: int, conn, url: str, config: Path,
            context: Path) -> dict[str, list]:
    agent = det_process(url, "agent", "run", "--id", f"bench-{runtime}", "--slot-type", "cpu",
                        "--slots", "1", "--runtime", runtime.removesuffix("-hook"))
    try:
        while not conn.execute("SELECT 1 FROM agents WHERE id = %s AND state = 'ACTIVE'",
                               (f"bench-{runtime}",)).fetchone():
            if agent.poll() is not None:
                raise SystemExit(f"the {runtime} agent exited with {agent.returncode}")
            time.sleep(0.1)
        samples: dict[str, list] = {"running": [], "first_batch": [], "overhead": []}
        for _ in range(n):
            det(url, "experiment", "create", str(config), str(context))
            eid = conn.execute("SELECT max(id) AS id FROM experiments").fetchone()["id"]
            while (row := conn.execute(TIMES, (eid,)).fetchone()) is None:
                time.sleep(0.05)
            for key in samples:
                samples[key].append(float(row[key]))
        return samples
    finally:
        stop([agent])
        det(url, "agent", "disable", f"bench-{runtime}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20, help="submissions per runtime (default 20)")
    ap.add_argument("--runtimes", default="process,docker")
    args = ap.parse_args()
    cfg = yaml.safe_load((DIGITS / "const.yaml").read_text())
    cfg.update(name="task-start", scheduling_unit=1, max_restarts=0,
               min_validation_period={"batches": 1})
    cfg["searcher"]["max_length"] = {"batches": 1}
    results = {}
    with private_database() as db, tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "task-start.yaml"
        config.write_text(yaml.safe_dump(cfg))
        hooked = Path(tmp) / "digits-hooked"
        shutil.copytree(DIGITS, hooked)
        (hooked / "startup-hook.sh").write_text("export DET_BENCH_HOOK=1\n")
        reconciler = det_process(db.url, "reconcile", "--interval", "0.2")
        try:
            with psycopg.connect(db.url, autocommit=True, row_factory=dict_row) as conn:
                for runtime in args.runtimes.split(","):
                    context = hooked if runtime.endswith("-hook") else DIGITS
                    results[runtime] = measure(runtime, args.n, conn, db.url, config, context)
        finally:
            stop([reconciler])
    print(f"{args.n} one-batch digits trials per runtime, one at a time, milliseconds:")
    print(f"{'runtime':<12} {'-> running p50/p95':>20} {'-> first batch p50/p95':>24} "
          f"{'start overhead p50/p95':>24}")
    for runtime, s in results.items():
        cells = [f"{statistics.median(s[k]):8.0f} / {pct(s[k], 0.95):6.0f}"
                 for k in ("running", "first_batch", "overhead")]
        print(f"{runtime:<12} {cells[0]:>20} {cells[1]:>24} {cells[2]:>24}")


if __name__ == "__main__":
    main()
