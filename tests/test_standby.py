"""`det cluster up` runs a standby reconciler beside the leader, and the supervisor restarts a
killed child at once (issue 39, item 7): killing the leader leaves no gap beyond the standby's
takeover. With only the supervisor restarting a killed reconciler, leaderless gaps grew
2.9 -> 17.7 s (a doubling backoff)."""

import os
import signal
import time
from pathlib import Path

import psutil
import psycopg
from conftest import wait_for
from psycopg.rows import dict_row
from test_cluster_up import local  # noqa: F401 (the fixture)

from det.cli.supervisor import QUICK_SECONDS, STEADY_SECONDS, read_pid, restart_delay
from det.db import embedded
from det.reconciler import leader


def test_a_killed_child_restarts_at_once_a_crash_loop_backs_off() -> None:
    # killed by a signal after it came up: at once, and its count of failures is not grown
    assert restart_delay(-signal.SIGKILL, QUICK_SECONDS + 1, 0) == (0, 0.0)
    assert restart_delay(-signal.SIGTERM, QUICK_SECONDS + 1, 2) == (2, 0.0)
    # exiting on its own, quickly, again and again: 0.5 s doubling
    failures, delays = 0, []
    for _ in range(4):
        failures, delay = restart_delay(1, 1.0, failures)
        delays.append(delay)
    assert delays == [0.5, 1.0, 2.0, 4.0]
    # killed again and again right after its start is a crash loop too
    assert restart_delay(-signal.SIGKILL, 0.5, 4) == (5, 8.0)
    # a child that ran steadily starts its count again
    assert restart_delay(1, STEADY_SECONDS, 4) == (0, 0.0)


def _leader(conn) -> tuple[int, bool] | None:
    row = leader.current(conn)
    return (int(row["holder"].rsplit(":", 1)[1]), row["alive"]) if row else None


def test_killing_the_leader_hands_over_to_the_standby(local, tmp_path: Path) -> None:  # noqa: F811
    run = tmp_path / "home" / "run"
    local("cluster", "up", "--runtime", "process", "--slots", "1", "--web-port", "0")
    url = embedded.running_url(tmp_path / "home")
    names = ("reconciler", "reconciler2")
    gaps = []
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        for _ in range(4):
            # both reconcilers up, one leading, the other waiting as its standby
            wait_for(lambda: _standby_waits(conn, run, names), 90,
                     "a leader and a waiting standby")
            pids = {read_pid(run, n) for n in names}
            old, _ = _leader(conn)
            # A child killed within QUICK_SECONDS of its start counts as a crash loop (on a
            # loaded machine the standby may lead 3 s after its start): kill one that came up.
            age = time.time() - psutil.Process(old).create_time()
            time.sleep(max(0.0, QUICK_SECONDS + 0.5 - age))
            os.kill(old, signal.SIGKILL)
            killed_at = time.monotonic()
            wait_for(lambda old=old: (_leader(conn) or (old,))[0] != old and _leader(conn)[1],
                     30, "another reconciler to lead", interval=0.05)
            gaps.append(time.monotonic() - killed_at)
            new, _ = _leader(conn)
            assert new in pids - {old}, "the standby that was already running took over"
    print(f"\nleaderless gaps after kill -9 of the leader (s): "
          f"{', '.join(f'{g:.2f}' for g in gaps)}")
    # the supervisor sees each death at its next check and restarts a killed child at once
    def four_kills_seen() -> str | None:
        text = (run / "supervisor.log").read_text()
        return text if text.count("exited with code -9") >= 4 else None
    log = wait_for(four_kills_seen, 10, "the supervisor to see the fourth kill")
    restarts = [ln for ln in log.splitlines() if "exited with code -9" in ln]
    assert all(ln.endswith("restarting in 0.0 s") for ln in restarts), restarts


def _standby_waits(conn, run: Path, names: tuple[str, ...]) -> bool:
    """A supervised reconciler leads, and the other one's session polls for its lock."""
    pids = {n: read_pid(run, n) for n in names}
    leading = _leader(conn)
    if not (leading and leading[1] and leading[0] in pids.values() and all(pids.values())):
        return False
    other = next(n for n, pid in pids.items() if pid != leading[0])
    return conn.execute("SELECT 1 FROM pg_stat_activity WHERE application_name = %s "
                        "AND query LIKE '%%pg_try_advisory_lock%%'",
                        (f"det-{other}",)).fetchone() is not None
