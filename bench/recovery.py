"""How fast det's control plane recovers: a frozen leader replaced, a database restart ridden.

Brings up a private embedded PostgreSQL in a temporary DET_HOME and real ``det reconcile``
processes, then measures, from the database's own clock:

* **takeover**: a leader is frozen with SIGSTOP while a standby waits; seconds until the
  standby has run a pass as leader (expected: about ``--lease`` + one poll of 1 s);
* **restart**: the server is stopped (fast shutdown), kept down ``--down`` seconds and started
  again; seconds from the moment it accepts connections until the reconciler has run a pass
  again (its reconnect backoff plus one pass).

Prints each sample and the median / max. Figures only, no assertions.

    python bench/recovery.py [--repeats 3] [--lease 5] [--down 1]
"""

import argparse
import signal
import statistics
import subprocess
import time
from pathlib import Path

import psycopg
from private_db import det_process, private_database

from det.db import embedded

LAST_PASS = "SELECT holder, extract(epoch FROM last_pass) AS t FROM reconciler_leader"


def _reconciler(url: str, lease: float) -> subprocess.Popen:
    return det_process(url, "reconcile", "--interval", "0.5", "--lease", str(lease))


def _leader(url: str) -> tuple[str, float] | None:
    """(holder, last pass as epoch seconds), or None while the database is away."""
    try:
        with psycopg.connect(url, connect_timeout=2) as c:
            row = c.execute(LAST_PASS).fetchone()
    except psycopg.OperationalError:
        return None
    return (row[0], float(row[1])) if row else None


def _until(predicate, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise SystemExit("timed out: the control plane did not recover")


def _db_now(url: str) -> float:
    with psycopg.connect(url) as c:
        return float(c.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])


def takeover(url: str, lease: float) -> float:
    """Seconds from SIGSTOP of the leader until the standby has run a pass as leader."""
    first = _reconciler(url, lease)
    _until(lambda: (x := _leader(url)) and x[0].endswith(f":{first.pid}"))
    second = _reconciler(url, lease)
    try:
        time.sleep(2.0)  # the second is waiting as a standby by now
        first.send_signal(signal.SIGSTOP)
        frozen_at = _db_now(url)
        t = _until(lambda: (x := _leader(url)) and x[0].endswith(f":{second.pid}") and x[1])
        return t - frozen_at
    finally:
        first.send_signal(signal.SIGCONT)
        for p in (first, second):
            p.kill()
            p.wait()


def restart(url: str, home: Path, down: float) -> float:
    """Seconds from the server's return until the reconciler has run a pass again."""
    rec = _reconciler(url, 10.0)
    try:
        _until(lambda: _leader(url))
        embedded.stop_fast(home)
        time.sleep(down)
        embedded.ensure_running(home)
        back = _db_now(url)
        t = _until(lambda: (x := _leader(url)) and x[1] > back and x[1])
        assert rec.poll() is None, "the reconciler died with the database"
        return t - back
    finally:
        rec.kill()
        rec.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lease", type=float, default=5.0, help="leader lease, seconds")
    ap.add_argument("--down", type=float, default=1.0, help="database downtime, seconds")
    args = ap.parse_args()
    with private_database(embedded_only=True) as db:  # it restarts the server
        for name, run in (("takeover", lambda: takeover(db.url, args.lease)),
                          ("restart", lambda: restart(db.url, db.home, args.down))):
            samples = [run() for _ in range(args.repeats)]
            print(f"{name}: " + ", ".join(f"{s:.2f}" for s in samples)
                  + f" s; median {statistics.median(samples):.2f} s, max {max(samples):.2f} s")


if __name__ == "__main__":
    main()
