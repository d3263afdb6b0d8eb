"""Submit -> claim (the task process about to start), on an idle local cluster.

Brings up a private cluster (embedded PostgreSQL in a temporary DET_HOME, or the database
DET_DB_URL names, one reconciler, one agent of the process runtime), then submits N one-trial
experiments one after another, each once the previous run has ended, so that every
submission finds the reconciler and the agent idle, through ``det_user.create_experiment`` (the
function ``det experiment create`` calls) with a shell entrypoint that exits at once. For
each it reads, from the database's own clock, the time from the submitting transaction to
the placement (the placing transaction's start) and to the agent's claim of the allocation
(the moment before it spawns the process), and prints p50 / p95 / max in milliseconds.
Figures only, no assertions.

The agent runs the process runtime even where a Docker engine is up: the figure is det's
path from a submission to its claim, and the engine's image check before a claim (tens of ms
under load) and container start are the engine's (bench/task_start.py measures those).

``--tls`` (root, iproute2, pgbouncer; issue 35) puts the agent on "another host": a network
namespace joined to this one by a veth pair, with an address of its own. It reaches the
embedded server only through det's TLS gateway (``det cluster gateway``, what `det cluster up
--listen` runs), verifying it with det's CA, as det_agent; its tasks through its pooler over
the same link. Submissions still come from this host.

    python bench/submit_latency.py [--n 50] [--tls]
"""

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from private_db import det_process, private_database, stop
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from det.configs import load_experiment_config
from det.db import gateway, passfile, roles

CONFIG = """
name: latency
entrypoint: "true"
searcher: {name: single, metric: loss, max_length: {batches: 1}}
max_restarts: 0
"""

LATENCY = """
SELECT extract(epoch FROM a.started_at - e.start_time) * 1000 AS ms,
       extract(epoch FROM a.assigned_at - e.start_time) * 1000 AS placed
  FROM experiments e JOIN trials t ON t.experiment_id = e.id JOIN allocations a
    ON a.trial_id = t.id WHERE e.id = %s AND a.started_at IS NOT NULL
"""

ENDED = """
SELECT 1 FROM trials t JOIN allocations a ON a.trial_id = t.id
 WHERE t.experiment_id = %s AND a.state = 'TERMINATED'
"""


HOST, REMOTE, PORT = "10.231.7.1", "10.231.7.2", 15434


@contextlib.contextmanager
def other_host() -> Iterator[str]:
    """A network namespace with REMOTE, joined by a veth pair to this host's HOST."""
    ns, tag = "det-bench-host", str(os.getpid() % 100000)
    outside, inside = f"detbo{tag}", f"detbi{tag}"
    steps = [["netns", "add", ns],
             ["link", "add", outside, "type", "veth", "peer", "name", inside],
             ["link", "set", inside, "netns", ns],
             ["addr", "add", f"{HOST}/30", "dev", outside], ["link", "set", outside, "up"],
             ["-n", ns, "addr", "add", f"{REMOTE}/30", "dev", inside],
             ["-n", ns, "link", "set", inside, "up"], ["-n", ns, "link", "set", "lo", "up"]]
    try:
        for step in steps:
            subprocess.run(["ip", *step], check=True)
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns])
        subprocess.run(["ip", "link", "del", outside], stderr=subprocess.DEVNULL)


def remote_agent(home: Path, ns: str) -> subprocess.Popen:
    """``det agent run`` in ``ns`` as det_agent through the gateway, its tasks as det_task."""
    def url(role: str) -> str:
        return gateway.url(home, role, HOST, PORT, passfile.lookup(passfile.path(home), role))

    env = {**os.environ, "DET_HOME": str(home / "remote"), "DET_DB_URL": url(roles.AGENT),
           "DET_TASK_DB_URL": url(roles.TASK)}
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "det.cli.main",
                             "agent", "run", "--id", "remote", "--slot-type", "cpu",
                             "--slots", "2", "--runtime", "process"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50, help="submissions (default 50)")
    ap.add_argument("--tls", action="store_true",
                    help="the agent in another network namespace, over TLS")
    args = ap.parse_args()
    config = load_experiment_config(CONFIG).expanded()
    with private_database(embedded_only=args.tls) as db, \
            (other_host() if args.tls else contextlib.nullcontext()) as ns:
        procs = [det_process(db.url, "reconcile")]
        if args.tls:
            procs += [det_process(db.url, "cluster", "gateway", "--listen", f"{HOST}:{PORT}"),
                      remote_agent(db.home, ns)]
        else:
            procs.append(det_process(db.url, "agent", "run", "--slot-type", "cpu",
                                     "--slots", "2", "--runtime", "process"))
        try:
            with psycopg.connect(db.url, autocommit=True, row_factory=dict_row) as conn:
                while not conn.execute("SELECT 1 FROM agents WHERE state = 'ACTIVE'").fetchone():
                    time.sleep(0.1)
                samples, placed = [], []
                for _ in range(args.n):
                    eid = conn.execute("SELECT det_user.create_experiment(%s, '', NULL) AS id",
                                       (Jsonb(config),)).fetchone()["id"]
                    while (row := conn.execute(LATENCY, (eid,)).fetchone()) is None:
                        time.sleep(0.002)
                    samples.append(float(row["ms"]))
                    placed.append(float(row["placed"]))
                    while conn.execute(ENDED, (eid,)).fetchone() is None:
                        time.sleep(0.002)
        finally:
            stop(procs)
    where = "the agent in another namespace over TLS" if args.tls else "a local agent"
    print(f"{len(samples)} submissions on an idle cluster, {where}:")
    for name, xs in (("submit -> placed", placed), ("submit -> claim", samples)):
        xs.sort()
        p95 = xs[max(0, round(0.95 * len(xs)) - 1)]
        print(f"  {name:17} p50 {statistics.median(xs):6.1f} ms   p95 {p95:6.1f} ms   "
              f"max {xs[-1]:6.1f} ms")


if __name__ == "__main__":
    main()
