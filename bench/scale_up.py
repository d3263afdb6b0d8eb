"""Scale-up of an elastic pool (issue 36): a trial queued on an empty ``local`` pool -> the
agent the provisioner started for it running that trial.

Brings up a private cluster (embedded PostgreSQL in a temporary DET_HOME and one reconciler,
which starts the pool's agents as it would under ``det cluster up``), then N times: submits a
one-trial experiment (a shell entrypoint, ``true``) to a pool with ``max_instances: 1`` and
``max_idle_agent_period: 1s``, waits for it to end and for its instance to be gone, so each
submission meets an empty pool. From the database's clock it reads, per submission:

- queued -> instance: the experiment's start to its instance's row (the pass that saw the
  demand);
- queued -> agent: to the agent's registration (process start, imports, slot discovery);
- queued -> running: to the trial's run reporting RUNNING on that agent.

It prints p50 / p95 in milliseconds. Figures only, no assertions.

    python bench/scale_up.py [--n 5]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import yaml
from private_db import private_database, stop
from psycopg.rows import dict_row

TIMES = """
SELECT extract(epoch FROM i.requested_at - e.start_time) * 1000 AS instance,
       extract(epoch FROM g.registered_at - e.start_time) * 1000 AS agent,
       extract(epoch FROM a.running_at - e.start_time) * 1000 AS running
  FROM experiments e JOIN trials t ON t.experiment_id = e.id
  JOIN allocations a ON a.trial_id = t.id AND a.run = 1
  JOIN instances i ON i.agent_id = a.agent_id
  JOIN agents g ON g.id = a.agent_id
 WHERE e.id = %s AND e.state IN ('COMPLETED', 'ERROR', 'CANCELED') AND i.state = 'GONE'
"""

CLUSTER = {"resource_pools": [
    {"name": "default"},
    {"name": "elastic", "provider": {"type": "local", "max_instances": 1,
                                     "max_idle_agent_period": "1s"}}]}
EXPERIMENT = {"name": "scale-up", "entrypoint": "true", "max_restarts": 0,
              "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}},
              "resources": {"resource_pool": "elastic"}}


def det(*args: str) -> None:
    """``det ARGS`` against the private cluster (DET_HOME), to completion."""
    subprocess.run([sys.executable, "-m", "det.cli.main", *args], check=True,
                   capture_output=True, text=True)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, round(q * len(ordered)) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5, help="submissions (default 5)")
    args = ap.parse_args()
    samples: dict[str, list[float]] = {"instance": [], "agent": [], "running": []}
    with private_database(embedded_only=True) as db, tempfile.TemporaryDirectory() as tmp:
        os.environ.pop("DET_DB_URL", None)  # agents and tasks connect as under det cluster up
        # as `det cluster up --runtime process`: the figure is det's, not a container start's
        os.environ["DET_AGENT_RUNTIME"] = "process"
        cluster, exp, ctx = Path(tmp) / "cluster.yaml", Path(tmp) / "exp.yaml", Path(tmp) / "c"
        cluster.write_text(yaml.safe_dump(CLUSTER))
        exp.write_text(yaml.safe_dump(EXPERIMENT))
        ctx.mkdir()
        det("cluster", "config", "apply", str(cluster))
        reconciler = subprocess.Popen(
            [sys.executable, "-m", "det.cli.main", "reconcile", "--interval", "0.2"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            with psycopg.connect(db.url, autocommit=True, row_factory=dict_row) as conn:
                for _ in range(args.n):
                    det("experiment", "create", str(exp), str(ctx))
                    eid = conn.execute("SELECT max(id) AS id FROM experiments").fetchone()["id"]
                    deadline = time.monotonic() + 300
                    while (row := conn.execute(TIMES, (eid,)).fetchone()) is None:
                        if time.monotonic() > deadline:
                            raise SystemExit(f"experiment {eid} did not end with its instance")
                        time.sleep(0.1)
                    for key in samples:
                        samples[key].append(float(row[key]))
        finally:
            stop([reconciler])
    print(f"{args.n} submissions, each to an empty local pool, milliseconds (p50 / p95):")
    for key, label in (("instance", "queued -> instance requested"),
                       ("agent", "queued -> agent registered"),
                       ("running", "queued -> trial running")):
        print(f"{label:<30} {statistics.median(samples[key]):8.0f} / "
              f"{pct(samples[key], 0.95):6.0f}")


if __name__ == "__main__":
    main()
