"""What proving the primary costs a det serve request on a replicated cluster (issue 35).

On a URL of several hosts, det serve's pool checks each connection before a request with
``det.db.reconnect.confirm_primary`` (a commit that waits for the synchronous replica), where
on one server it sends an empty query (psycopg_pool's ``check_connection``). Brings up
deploy/ha/ha.sh's cluster (two PostgreSQL 15 nodes under Patroni, synchronous replication,
on this machine: the replica's round trip is a loopback one) and times ``--requests`` times
a pooled request (take a connection, ``SELECT 1``, give it back) on the primary's own URL
(checked) and on the cluster's URL (confirmed). Prints p50 and p95 of each. Figures only.

    python bench/confirm_primary.py [--requests 500]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from det.db.reconnect import open_pool, replicated

REPO = Path(__file__).resolve().parent.parent
HA = REPO / "deploy" / "ha" / "ha.sh"
BASE = 23630


def _primary_only(url: str) -> str:
    """The cluster URL narrowed to the node Patroni names primary."""
    params = conninfo_to_dict(url)
    hosts, ports = params["host"].split(","), params["port"].split(",")
    for i, (host, port) in enumerate(zip(hosts, ports, strict=True)):
        try:
            with urlopen(f"http://127.0.0.1:{BASE + 21 + i}/primary", timeout=2):
                return make_conninfo(**{**params, "host": host, "port": port})
        except (URLError, OSError):
            continue
    raise SystemExit("no primary")


def _requests(url: str, n: int) -> list[float]:
    pool = open_pool(url, min_size=1, max_size=1, row_factory=dict_row)
    try:
        times = []
        for _ in range(n):
            t = time.perf_counter()
            with pool.connection() as conn:
                conn.execute("SELECT 1").fetchone()
            times.append((time.perf_counter() - t) * 1000)
        return times
    finally:
        pool.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=500)
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="det-confirm-bench-"))
    env = {**os.environ, "BASE_PORT": str(BASE)}
    try:
        url = subprocess.run([str(HA), "up", str(d)], env=env, check=True, text=True,
                             stdout=subprocess.PIPE).stdout.strip().splitlines()[-1]
        one = _primary_only(url)
        assert replicated(url) and not replicated(one)
        for name, u in (("one server, checked", one), ("cluster URL, confirmed", url)):
            _requests(u, 20)  # warm
            ms = sorted(_requests(u, args.requests))
            print(f"{name:24} n={len(ms)}  p50 {statistics.median(ms):.2f} ms  "
                  f"p95 {ms[int(len(ms) * 0.95)]:.2f} ms", flush=True)
    finally:
        subprocess.run([str(HA), "down", str(d)], env=env, capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
