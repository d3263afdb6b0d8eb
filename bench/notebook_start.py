"""``det notebook start`` to JupyterLab answering ``/api/status`` through det serve's proxy
(issue 33), with the process runtime: p50 of N on an idle cluster.

Brings up a private embedded PostgreSQL (or ``DET_DB_URL``'s server), one reconciler, one
process-runtime agent and ``det serve``; then N times, one after another: submit a notebook
as ``det notebook start`` does (det.submission, through ``POST /api/v1/notebooks``), poll
``GET /proxy/<id>/api/status`` every 50 ms until JupyterLab answers 200 through the proxy,
then kill it and wait for its run to end. From the database's clock it splits each start:

- submit -> RUNNING: the submitting transaction to the agent's RUNNING report (placement,
  the agent's claim, the process started);
- RUNNING -> answering through the proxy: the task's harness reading its secrets, Jupyter
  starting until it answers (det_task.ready records allocations.address), the next poll.

Goal (the issue): <= 3 s p50 with the process runtime. Figures only.

    python bench/notebook_start.py [--n 10]
"""

import argparse
import statistics
import time

import httpx
import psycopg
from private_db import det_process, private_database, stop
from proxy import PASSWORD, free_port, wait_http
from psycopg.rows import dict_row

from det.cli.users import password_verifier


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10, help="notebooks, one at a time (default 10)")
    args = ap.parse_args()
    totals, running = [], []
    with private_database() as db, \
            psycopg.connect(db.url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("SELECT det_user.user_create('bench', %s, true)",
                     (password_verifier(conn, "bench", PASSWORD),))
        port = free_port()
        procs = [det_process(db.url, "reconcile", "--interval", "0.2"),
                 det_process(db.url, "agent", "run", "--id", "bench", "--slot-type", "cpu",
                             "--slots", "1", "--runtime", "process"),
                 det_process(db.url, "serve", "--port", str(port))]
        try:
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/api/v1/openapi.json", procs[2], "det serve")
            while not conn.execute("SELECT 1 FROM agents WHERE id = 'bench' "
                                   "AND state = 'ACTIVE'").fetchone():
                time.sleep(0.1)
            token = httpx.post(f"{base}/api/v1/auth/login", json={
                "username": "bench", "password": PASSWORD}).json()["token"]
            with httpx.Client(base_url=base, timeout=30,
                              headers={"Authorization": f"Bearer {token}"}) as api:
                for i in range(args.n + 1):  # the first warms the agent's zygote
                    t0 = time.perf_counter()
                    job = api.post("/api/v1/notebooks", json={}).json()["id"]
                    while api.get(f"/proxy/{job}/api/status").status_code != 200:
                        if time.perf_counter() - t0 > 120:
                            raise SystemExit(f"notebook {job} did not answer in 120 s")
                        time.sleep(0.05)
                    total = time.perf_counter() - t0
                    row = conn.execute(
                        "SELECT extract(epoch FROM a.running_at - j.submitted_at) AS r "
                        "FROM jobs j JOIN allocations a ON a.job_id = j.id "
                        "WHERE j.id = %s", (job,)).fetchone()
                    if i > 0:
                        totals.append(total)
                        running.append(float(row["r"]))
                    api.post(f"/api/v1/tasks/{job}/kill")
                    while conn.execute("SELECT 1 FROM allocations WHERE job_id = %s AND "
                                       "state <> 'TERMINATED'", (job,)).fetchone():
                        time.sleep(0.1)
        finally:
            stop(procs)
    rest = [t - r for t, r in zip(totals, running, strict=True)]
    print(f"{args.n} notebooks, one at a time, process runtime, seconds (p50 / max):")
    print(f"  submit -> JupyterLab answering /api/status through the proxy: "
          f"{statistics.median(totals):.2f} / {max(totals):.2f}")
    print(f"  submit -> run RUNNING (placed, claimed, process started):       "
          f"{statistics.median(running):.2f} / {max(running):.2f}")
    print(f"  RUNNING -> answering through the proxy (Jupyter's start):       "
          f"{statistics.median(rest):.2f} / {max(rest):.2f}")


if __name__ == "__main__":
    main()
