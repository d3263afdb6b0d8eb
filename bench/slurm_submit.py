"""Submit -> RUNNING through a slurm pool (issue 36), against Slurm's own sbatch of the same
job script, on a single-host Slurm (deploy/slurm/slurm.sh; root, slurm-wlm installed).

Brings up a private cluster (embedded PostgreSQL, one reconciler) and a Slurm, then N times:

- det: submits a one-trial experiment (entrypoint ``true``) to a slurm pool, whose run is
  one Slurm job, and waits for that job to be gone (it ends with its run); from the
  database's clock: queued -> sbatch (instance launched), -> the job's agent registered,
  -> trial RUNNING;
- sbatch: submits the same script (:func:`det.reconciler.slurm_provider.job_script`, a
  one-shot agent) with ``sbatch`` directly, under another agent id, and times sbatch's start
  -> that agent registered; then cancels it.

Prints p50 / p95 in milliseconds, taken in the same minutes, alternating. Figures only.

    python bench/slurm_submit.py [--n 5]
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

from det.reconciler.slurm_provider import job_script

REPO = Path(__file__).resolve().parents[1]
TIMES = """
SELECT extract(epoch FROM i.launched_at - e.start_time) * 1000 AS sbatch,
       extract(epoch FROM g.registered_at - e.start_time) * 1000 AS agent,
       extract(epoch FROM a.running_at - e.start_time) * 1000 AS running
  FROM experiments e JOIN trials t ON t.experiment_id = e.id
  JOIN allocations a ON a.trial_id = t.id AND a.run = 1
  JOIN instances i ON i.agent_id = a.agent_id
  JOIN agents g ON g.id = a.agent_id
 WHERE e.id = %s AND e.state IN ('COMPLETED', 'ERROR', 'CANCELED') AND i.state = 'GONE'
"""
CLUSTER = {"resource_pools": [
    {"name": "default"}, {"name": "direct"},
    {"name": "hpc", "provider": {"type": "slurm", "max_instances": 1}}]}
EXPERIMENT = {"name": "slurm", "entrypoint": "true", "max_restarts": 0,
              "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}},
              "resources": {"resource_pool": "hpc"}}


def det(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "det.cli.main", *args], check=True,
                   capture_output=True, text=True)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, round(q * len(ordered)) - 1)]


def wait(conn, sql: str, args: tuple, what: str):
    deadline = time.monotonic() + 300
    while (row := conn.execute(sql, args).fetchone()) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)
    return row


def direct(conn, i: int, tmp: Path) -> float:
    """Slurm's own sbatch of the job script -> its agent registered, milliseconds."""
    name = f"bench-direct-{i}"
    begun = conn.execute("SELECT now() AS t").fetchone()["t"]
    out = subprocess.run(["sbatch", "--parsable", "--job-name", name, "--nodes", "1",
                          "--ntasks-per-node", "1", "--output", str(tmp / f"{name}.log")],
                         input=job_script(name, "direct", 1, None), text=True,
                         capture_output=True, check=True).stdout.strip()
    row = wait(conn, "SELECT extract(epoch FROM registered_at - %s) * 1000 AS ms FROM agents "
               "WHERE id = %s", (begun, name), f"agent {name}")
    subprocess.run(["scancel", out], check=True)
    deadline = time.monotonic() + 60
    while out in subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                                check=True).stdout.split():
        if time.monotonic() > deadline:
            raise SystemExit(f"job {out} did not end")
        time.sleep(0.1)
    return float(row["ms"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5, help="submissions of each (default 5)")
    args = ap.parse_args()
    samples: dict[str, list[float]] = {"sbatch": [], "agent": [], "running": [], "direct": []}
    with private_database(embedded_only=True) as db, tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        slurm_sh = REPO / "deploy" / "slurm" / "slurm.sh"
        subprocess.run([str(slurm_sh), "start", str(tmp / "slurm"), "4"], check=True)
        os.environ["SLURM_CONF"] = str(tmp / "slurm" / "slurm.conf")
        os.environ.pop("DET_DB_URL", None)  # agents and tasks connect as under det cluster up
        os.environ["DET_AGENT_RUNTIME"] = "process"  # the jobs' agents: no task image needed
        (tmp / "cluster.yaml").write_text(yaml.safe_dump(CLUSTER))
        (tmp / "exp.yaml").write_text(yaml.safe_dump(EXPERIMENT))
        (tmp / "ctx").mkdir()
        det("cluster", "config", "apply", str(tmp / "cluster.yaml"))
        reconciler = subprocess.Popen(
            [sys.executable, "-m", "det.cli.main", "reconcile", "--interval", "0.2"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            with psycopg.connect(db.url, autocommit=True, row_factory=dict_row) as conn:
                for i in range(args.n):
                    det("experiment", "create", str(tmp / "exp.yaml"), str(tmp / "ctx"))
                    eid = conn.execute("SELECT max(id) AS id FROM experiments").fetchone()["id"]
                    row = wait(conn, TIMES, (eid,), f"experiment {eid} and its instance")
                    if row["running"] is None:
                        raise SystemExit(f"experiment {eid}: its run never ran: {row}")
                    for key in ("sbatch", "agent", "running"):
                        samples[key].append(float(row[key]))
                    samples["direct"].append(direct(conn, i, tmp))
        finally:
            stop([reconciler])
            subprocess.run([str(slurm_sh), "stop", str(tmp / "slurm")])
    print(f"{args.n} submissions of each, alternated, milliseconds (p50 / p95):")
    for key, label in (("sbatch", "det: queued -> sbatch"),
                       ("agent", "det: queued -> agent registered"),
                       ("running", "det: queued -> trial running"),
                       ("direct", "sbatch -> agent registered")):
        print(f"{label:<34} {statistics.median(samples[key]):8.0f} / "
              f"{pct(samples[key], 0.95):6.0f}")


if __name__ == "__main__":
    main()
