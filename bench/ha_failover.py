"""How long det stalls when its database's primary is lost (issue 35).

Brings up deploy/ha/ha.sh's cluster (etcd, two PostgreSQL 15 nodes under Patroni,
synchronous replication, ttl 10 s, loop_wait 2 s) in a temporary directory, a reconciler and
an agent on its multi-host URL, and a long digits trial (a training metrics row every 10
batches). Then, ``--repeats`` times: kill -9 the primary's postmaster (or, with ``--host``,
its Patroni too: the whole database host lost; with ``--freeze``, SIGSTOP its Patroni, its
postmaster and backends for 60 s: a frozen host, whose kernel still acknowledges) and
measure, from the moment of the kill (or the freeze):

* **promoted**: until Patroni's REST API names the other node primary (Patroni's share);
* **pass**: until the reconciler's next pass on the new primary (reconciler_leader.last_pass);
* **metric**: until the task's next metrics row (metrics.reported_at).

det's share is pass/metric minus promoted. Each round waits for the old node to rejoin as
the synchronous replica first. Prints each sample and the median. Figures only.

    python bench/ha_failover.py [--repeats 5] [--host | --freeze]
"""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

import psycopg
import yaml

REPO = Path(__file__).resolve().parent.parent
HA = REPO / "deploy" / "ha" / "ha.sh"
BASE = 23430
FROZEN_SECONDS = 60


def _ok(node: int, what: str) -> bool:
    try:
        with urlopen(f"http://127.0.0.1:{BASE + 20 + node}/{what}", timeout=1):
            return True
    except (URLError, OSError):
        return False


def _primary() -> int | None:
    return next((n for n in (1, 2) if _ok(n, "primary")), None)


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def _first_after(url: str, query: str, t0: float) -> float | None:
    try:
        with psycopg.connect(url, connect_timeout=2) as c:
            row = c.execute(query, (t0,)).fetchone()
            return None if row is None or row[0] is None else float(row[0])
    except psycopg.OperationalError:
        return None


def _round(d: Path, url: str, env: dict[str, str], host: bool,
           freeze: bool) -> tuple[float, float, float]:
    """One failover: (promoted, next pass, next metric) in seconds from the kill."""
    _wait(lambda: _first_after(url, "SELECT max(extract(epoch FROM reported_at)) FROM "
                                    "metrics WHERE reported_at > to_timestamp(%s)",
                               time.time() - 1), 300, "metrics flowing")
    old = _wait(_primary, 60, "a primary")
    _wait(lambda: _ok(3 - old, "sync"), 300, "a synchronous replica")
    pid = int((d / f"node{old}" / "data" / "postmaster.pid").read_text().split()[0])
    patroni = int((d / f"node{old}" / "patroni.pid").read_text())
    frozen = [patroni, pid] + [int(p) for p in subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout.split()]
    t0 = time.time()
    if freeze:
        for p in frozen:
            os.kill(p, signal.SIGSTOP)
    else:
        if host:
            os.kill(patroni, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
    _wait(lambda: _ok(3 - old, "primary"), 120, "the promotion")
    promoted = time.time() - t0
    passed = _wait(lambda: _first_after(
        url, "SELECT extract(epoch FROM last_pass) FROM reconciler_leader "
             "WHERE last_pass > to_timestamp(%s)", t0), 120, "a pass") - t0
    metric = _wait(lambda: _first_after(
        url, "SELECT min(extract(epoch FROM reported_at)) FROM metrics "
             "WHERE reported_at > to_timestamp(%s)", t0), 120, "a metric") - t0
    if host:  # the lost host comes back: its Patroni rejoins it as a replica
        subprocess.run([str(HA), "up", str(d)], env=env, check=True, capture_output=True)
    if freeze:  # it resumes: Patroni demotes it and rejoins it as a replica
        time.sleep(max(0.0, t0 + FROZEN_SECONDS - time.time()))
        for p in frozen:
            os.kill(p, signal.SIGCONT)
    return promoted, passed, metric


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--host", action="store_true",
                     help="kill the primary's Patroni too (the host lost), not its postmaster "
                          "only")
    how.add_argument("--freeze", action="store_true",
                     help=f"SIGSTOP the primary's Patroni and PostgreSQL for {FROZEN_SECONDS} s")
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="det-ha-bench-"))
    env = {**os.environ, "BASE_PORT": str(BASE), "DET_HOME": str(d / "home"),
           "DET_USER": "bench", "DET_AGENT_RUNTIME": "process", "PYTHONUNBUFFERED": "1"}
    procs: list[subprocess.Popen] = []
    try:
        url = subprocess.run([str(HA), "up", str(d)], env=env, check=True, text=True,
                             stdout=subprocess.PIPE).stdout.strip().splitlines()[-1]
        env["DET_DB_URL"] = url
        det = [sys.executable, "-m", "det.cli.main"]
        # frozen: the agent must beat again within its lease (tests/test_ha_failover)
        timeout = ["--agent-timeout", "45"] if args.freeze else []
        for name, argv in (("reconciler", ["reconcile", "--interval", "0.5", *timeout]),
                           ("agent", ["agent", "run", "--slots", "1"])):
            procs.append(subprocess.Popen(det + argv, env=env, cwd=REPO,
                                          stdout=open(d / f"{name}.log", "w"),  # noqa: SIM115
                                          stderr=subprocess.STDOUT))
        cfg = yaml.safe_load((REPO / "examples/digits/const.yaml").read_text())
        cfg.update({"searcher": {**cfg["searcher"], "max_length": {"batches": 10**6}},
                    "min_validation_period": {"batches": 10**6}, "scheduling_unit": 10})
        (d / "exp.yaml").write_text(yaml.safe_dump(cfg))
        subprocess.run(det + ["experiment", "create", str(d / "exp.yaml"),
                              str(REPO / "examples/digits")], env=env, cwd=REPO, check=True,
                       capture_output=True)
        rows = []
        for _ in range(args.repeats):
            rows.append(_round(d, url, env, args.host, args.freeze))
            print("promoted {:6.2f} s   next pass {:6.2f} s   next metric {:6.2f} s"
                  .format(*rows[-1]), flush=True)
        for i, name in enumerate(("promoted", "next pass", "next metric")):
            print(f"{name}: p50 {statistics.median(r[i] for r in rows):.2f} s, "
                  f"max {max(r[i] for r in rows):.2f} s")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        subprocess.run([str(HA), "down", str(d)], env=env)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
