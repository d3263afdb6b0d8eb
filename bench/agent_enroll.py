"""Enrollment of an agent on another host (issue 35): ``det agent enroll`` with a fresh token
-> the enrolled agent's first heartbeat.

Against a private embedded cluster (no reconciler needed: an agent registers by itself), N
times: a ClusterAdmin makes a token (``det agent token create``, not timed), then, from a det
home of its own (another host's), the clock starts, ``det agent enroll --master URL --token T``
runs and ``det agent run --slots 1`` starts; the clock stops when the agent's row appears
(its registration, which is its first heartbeat), polled every 10 ms. It prints p50 / p95 in
milliseconds of the enrollment alone and of the whole, and the CPU time (user + system) the
two processes spent meanwhile: on a busy host the wall time is mostly waiting for a core,
while the CPU time is what an idle host would take, less the waits on the database. Figures
only, no assertions.

    python bench/agent_enroll.py [--n 5]
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import psycopg
from private_db import private_database, stop


def det(*args: str, **env: str) -> str:
    return subprocess.run([sys.executable, "-m", "det.cli.main", *args], check=True,
                          capture_output=True, text=True,
                          env={**os.environ, **env}).stdout.strip()


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's ended children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, round(q * len(ordered)) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5, help="enrollments (default 5)")
    args = ap.parse_args()
    samples: dict[str, list[float]] = {"enroll": [], "first heartbeat": [], "enroll CPU": [],
                                       "agent CPU": [], "both CPU": []}
    with private_database(embedded_only=True) as db, tempfile.TemporaryDirectory() as tmp, \
            psycopg.connect(db.url, autocommit=True) as conn:
        for i in range(args.n):
            agent_id = f"bench-{os.getpid()}-{i}"
            token = det("agent", "token", "create")
            home = str(Path(tmp) / agent_id)
            cpu = _children_cpu()
            begun = time.monotonic()
            det("agent", "enroll", "--master", db.url, "--token", token, "--id", agent_id,
                DET_HOME=home)
            samples["enroll"].append((time.monotonic() - begun) * 1000)
            samples["enroll CPU"].append((_children_cpu() - cpu) * 1000)
            agent = subprocess.Popen(
                [sys.executable, "-m", "det.cli.main", "agent", "run", "--slots", "1",
                 "--runtime", "process", "--no-task-pooler"],
                env={**os.environ, "DET_HOME": home}, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            try:
                while not conn.execute("SELECT 1 FROM agents WHERE id = %s",
                                       (agent_id,)).fetchone():
                    if agent.poll() is not None:
                        raise SystemExit(f"agent {agent_id} exited {agent.returncode}")
                    time.sleep(0.01)
                samples["first heartbeat"].append((time.monotonic() - begun) * 1000)
                times = psutil.Process(agent.pid).cpu_times()
                samples["agent CPU"].append((times.user + times.system) * 1000)
                samples["both CPU"].append(samples["enroll CPU"][-1] + samples["agent CPU"][-1])
            finally:
                stop([agent])
    for name, xs in samples.items():
        print(f"{name:16} p50 {statistics.median(xs):7.0f} ms   p95 {pct(xs, 0.95):7.0f} ms"
              f"   (n={len(xs)})")


if __name__ == "__main__":
    main()
