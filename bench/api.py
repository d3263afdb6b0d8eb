"""det serve's figures (issue 15): the experiment list with 10,000 experiments, a metric series
of 1,000,000 points downsampled to 2,000, the delay from a metric's report to its event on an
SSE stream, and the requests per second one server process sustains on the list.

Brings up a private embedded PostgreSQL (or uses ``DET_DB_URL``'s server), fills it with rows
inserted directly (10,000 experiments with 2 trials each, one trial with 1,000,000 training
metrics rows), starts ``det serve`` as a subprocess and measures it over HTTP:

- list: ``GET /api/v1/experiments`` (first page of 100, newest first; then filtered by name)
  sequentially, p50 / p95 of the server's own time (its ``Server-Timing`` header) and of the
  client's round trip;
- series: ``GET /api/v1/trials/T/metrics?max_points=2000`` over the 1,000,000 rows;
- SSE: a client follows ``/api/v1/events/trials/T`` while this process reports one metric
  every 0.3 s through ``det_task.report_metrics`` (the harness's function); the delay is from the
  report's commit to the row's arrival on the stream;
- throughput: ``--clients`` threads call the list endpoint for ``--seconds``.

Goals: list p95 <= 50 ms server time; series p95 <= 200 ms; SSE p95 <= 250 ms. Figures only.

    python bench/api.py [--experiments 10000] [--points 1000000] [--requests 200]
                        [--clients 16] [--seconds 10]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import psycopg
from private_db import private_database
from psycopg.types.json import Jsonb

from det.cli.users import password_verifier
from det.configs import load_experiment_config

PASSWORD = "the bench's password"
"""The ClusterAdmin 'bench' seed() creates, whom the bench logs in as."""

CONFIG = """
name: bench
entrypoint: model_def:MyTrial
hyperparameters: {lr: 0.1}
searcher: {name: single, metric: loss, max_length: {batches: 1000}}
"""


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summary(name: str, server: list[float], client: list[float]) -> None:
    print(f"{name:<42} server p50 {pct(server, 50):7.2f} ms  p95 {pct(server, 95):7.2f} ms   "
          f"client p50 {pct(client, 50):7.2f} ms  p95 {pct(client, 95):7.2f} ms  (n={len(server)})")


def seed(url: str, experiments: int, points: int) -> tuple[int, str]:
    """Rows straight into the tables; returns (the big trial's id, its run's token)."""
    cfg = load_experiment_config(CONFIG, "bench").expanded()
    with psycopg.connect(url, autocommit=True) as conn:
        t0 = time.perf_counter()
        conn.execute("""
            WITH j AS (
                INSERT INTO jobs (type, resource_pool, queue_position, owner)
                SELECT 'EXPERIMENT', 'default', g, 'bench' FROM generate_series(1, %(n)s) g
                RETURNING id)
            INSERT INTO experiments (job_id, name, config, original_config, owner, state,
                                     end_time, progress)
            SELECT id, 'exp-' || id, %(cfg)s, '', 'bench',
                   CASE WHEN id %% 10 = 0 THEN 'ACTIVE' ELSE 'COMPLETED' END::experiment_state,
                   CASE WHEN id %% 10 = 0 THEN NULL ELSE now() END,
                   CASE WHEN id %% 10 = 0 THEN 0.5 ELSE 1 END
              FROM j""", {"n": experiments, "cfg": Jsonb(cfg)})
        conn.execute("""
            INSERT INTO trials (experiment_id, request_id, hparams, seed, best_validation)
            SELECT e.id, gen_random_uuid(), '{"lr": 0.1}', 0, random()
              FROM experiments e, generate_series(1, 2)""")
        conn.execute("SELECT det_agent.register('bench', 'host', 'default', 'process', %s)",
                     (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
        trial = conn.execute("SELECT max(id) FROM trials").fetchone()[0]
        alloc = conn.execute(
            "INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, "
            "spec, state, agent_id) SELECT e.job_id, t.id, 1, 'default', 1, '{}', 'ASSIGNED', "
            "'bench' FROM trials t JOIN experiments e ON e.id = t.experiment_id "
            "WHERE t.id = %s RETURNING id", (trial,)).fetchone()[0]
        token = conn.execute("SELECT det_agent.claim('bench', %s)", (alloc,)).fetchone()[0]
        conn.execute("SELECT det_task.info(%s)", (token,))
        conn.execute("""
            INSERT INTO metrics (trial_id, allocation_id, "group", steps_completed, "values")
            SELECT %(t)s, %(a)s, 'training', g,
                   jsonb_build_object('loss', 1.0 / g, 'accuracy', 1 - 1.0 / g)
              FROM generate_series(1, %(n)s) g""", {"t": trial, "a": alloc, "n": points})
        # det serve logs in with PostgreSQL's password check: the user is a real role
        conn.execute("SELECT det_user.user_create('bench', %s, true)",
                     (password_verifier(conn, "bench", PASSWORD),))
        conn.execute("ANALYZE")
        print(f"seeded {experiments} experiments, {2 * experiments} trials, {points} metrics "
              f"rows in {time.perf_counter() - t0:.1f} s")
    return trial, token


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(url: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "DET_DB_URL": url, "DET_USER": "bench"}
    proc = subprocess.Popen([sys.executable, "-m", "det.cli.main", "serve", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{base}/api/v1/openapi.json", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            time.sleep(0.1)
    raise SystemExit("det serve did not start")


def timed(client: httpx.Client, path: str, n: int) -> tuple[list[float], list[float]]:
    server, wall = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.get(path)
        wall.append((time.perf_counter() - t0) * 1000)
        r.raise_for_status()
        server.append(float(r.headers["server-timing"].split("dur=")[1]))
    return server, wall


def sse_delays(base: str, token: str, report_token: str, url: str, trial: int,
               samples: int) -> list[float]:
    arrived: dict[int, float] = {}
    ready = threading.Event()

    def follow() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(timeout=None) as c, \
                c.stream("GET", f"{base}/api/v1/events/trials/{trial}", headers=headers) as r:
            name = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    if name == "ready":
                        ready.set()
                    elif name == "metrics":
                        now = time.perf_counter()
                        for row in json.loads(line[6:]):
                            arrived.setdefault(row["steps_completed"], now)
                    if len(arrived) >= samples:
                        return

    threading.Thread(target=follow, daemon=True).start()
    ready.wait(30)
    sent: dict[int, float] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(samples):
            step = 10_000_000 + i
            conn.execute("SELECT det_task.report_metrics(%s, 'training', %s, %s)",
                         (report_token, step, Jsonb({"loss": 0.1})))
            sent[step] = time.perf_counter()
            time.sleep(0.3)
    deadline = time.monotonic() + 10
    while len(arrived) < samples and time.monotonic() < deadline:
        time.sleep(0.05)
    return [(arrived[s] - sent[s]) * 1000 for s in sent if s in arrived]


def throughput(base: str, token: str, clients: int, seconds: float) -> tuple[int, int]:
    done = [0] * clients
    errors = [0] * clients
    stop = time.monotonic() + seconds

    def work(i: int) -> None:
        with httpx.Client(base_url=base, timeout=30,
                          headers={"Authorization": f"Bearer {token}"}) as c:
            while time.monotonic() < stop:
                r = c.get("/api/v1/experiments?limit=100")
                if r.status_code == 200:
                    done[i] += 1
                else:
                    errors[i] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done), sum(errors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", type=int, default=10_000)
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--sse-samples", type=int, default=50)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    with private_database() as db:
        trial, report_token = seed(db.url, args.experiments, args.points)
        proc, base = start_server(db.url)
        try:
            token = httpx.post(f"{base}/api/v1/auth/login",
                               json={"username": "bench", "password": PASSWORD}).json()["token"]
            with httpx.Client(base_url=base, timeout=60,
                              headers={"Authorization": f"Bearer {token}"}) as client:
                timed(client, "/api/v1/experiments", 20)  # warm-up
                summary(f"list, {args.experiments} experiments, page of 100",
                        *timed(client, "/api/v1/experiments?limit=100", args.requests))
                summary("list, name filter + state, page of 100",
                        *timed(client, "/api/v1/experiments?limit=100&name=exp-1&state=ACTIVE",
                               args.requests))
                summary("list, sorted by best_validation",
                        *timed(client, "/api/v1/experiments?limit=100&sort=-best_validation",
                               max(20, args.requests // 10)))
                path = f"/api/v1/trials/{trial}/metrics?max_points=2000"
                rows = client.get(path).json()["rows"]
                page = client.get("/api/v1/experiments?limit=100")
                print(f"(a page of 100 experiments is {len(page.content)} bytes of JSON)")
                summary(f"series, {args.points} points -> {len(rows)}",
                        *timed(client, path, max(30, args.requests // 4)))
            delays = sse_delays(base, token, report_token, db.url, trial, args.sse_samples)
            print(f"{'SSE, metric report -> event':<42} p50 {pct(delays, 50):7.1f} ms  "
                  f"p95 {pct(delays, 95):7.1f} ms  max {max(delays):7.1f} ms  "
                  f"(n={len(delays)} of {args.sse_samples})")
            ok, failed = throughput(base, token, args.clients, args.seconds)
            print(f"{'throughput, list (page of 100)':<42} {ok / args.seconds:7.1f} req/s with "
                  f"{args.clients} clients, one server process ({failed} failed)")
        finally:
            proc.terminate()
            proc.wait(20)


if __name__ == "__main__":
    main()
