"""Ids users type do not jump (issue 39, item 7): experiments, trials and jobs take their ids
from counter rows (det_internal.next_id), not sequences, which PostgreSQL WAL-logs 32 values
ahead, so that every crash of the postmaster skipped ~32 experiment ids."""

import re
import threading

import psutil
import psycopg
from conftest import Det, PrivateServer, private_env
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from test_reconciler import config
from test_schema import CONFIG

from det.db.embedded import data_dir


def _crash(server: PrivateServer) -> None:
    """kill -9 the postmaster and its backends (as the OOM killer or a power cut would: no
    shutdown checkpoint), then start it again (crash recovery replays the WAL)."""
    pid = int((data_dir(server.home) / "postmaster.pid").read_text().split()[0])
    postmaster = psutil.Process(pid)
    procs = [postmaster, *postmaster.children(recursive=True)]
    for p in procs:
        p.kill()
    psutil.wait_procs(procs, timeout=30)
    server.start()


def _create(det: Det, tmp_path) -> int:
    out = det("experiment", "create", str(config(tmp_path, "true")), str(tmp_path / "ctx")).stdout
    return int(re.search(r"Created experiment (\d+)", out).group(1))


def _ids(url: str) -> dict:
    with psycopg.connect(url, row_factory=dict_row) as c:
        return c.execute("SELECT (SELECT array_agg(id ORDER BY id) FROM experiments) AS e, "
                         "(SELECT array_agg(id ORDER BY id) FROM trials) AS t, "
                         "(SELECT array_agg(id ORDER BY id) FROM jobs) AS j").fetchone()


def test_ids_are_consecutive_across_postmaster_crashes(private_pg, det_env, tmp_path) -> None:
    det = Det(private_env(det_env, private_pg.url), tmp_path)
    # A sequence beside them shows the crash is real: it skips what it had WAL-logged ahead.
    with psycopg.connect(private_pg.url, autocommit=True) as c:
        c.execute("CREATE SEQUENCE control CACHE 1")
        c.execute("SELECT nextval('control')")
    got = []
    for _ in range(3):
        got.append(_create(det, tmp_path))
        det("reconcile", "--once")  # creates the experiment's trial
        _crash(private_pg)
    got.append(_create(det, tmp_path))
    det("reconcile", "--once")
    with psycopg.connect(private_pg.url) as c:
        control = c.execute("SELECT nextval('control')").fetchone()[0]
    print(f"\nexperiment ids {got}; a CACHE 1 sequence went 1 -> {control} over 3 crashes")
    assert control > 2
    assert got == [1, 2, 3, 4]
    ids = _ids(private_pg.url)
    assert ids == {"e": [1, 2, 3, 4], "t": [1, 2, 3, 4], "j": [1, 2, 3, 4]}


def test_concurrent_creates_both_succeed_and_a_rollback_leaves_no_gap(db_url, conn) -> None:
    def create(c: psycopg.Connection) -> int:
        return c.execute("SELECT det_user.create_experiment(%s, 'name: x', NULL)",
                         (Jsonb(CONFIG),)).fetchone()[0]

    with psycopg.connect(db_url) as first, psycopg.connect(db_url) as second:
        for first_commits, want in ((True, [1, 2]), (False, [3])):
            mine = create(first)  # its transaction stays open: the counter row is locked
            theirs: list[int] = []
            other = threading.Thread(target=lambda out=theirs: out.append(create(second)))
            other.start()
            other.join(1.0)
            assert other.is_alive(), "the second create waits for the first transaction"
            first.commit() if first_commits else first.rollback()
            other.join(30)
            second.commit()
            # committed: the second takes the next id; rolled back: the id the first had
            assert ([mine] if first_commits else []) + theirs == want
    assert conn.execute("SELECT array_agg(id ORDER BY id) AS e FROM experiments"
                        ).fetchone()["e"] == [1, 2, 3]
    assert conn.execute("SELECT last_value FROM id_counters WHERE name = 'experiments'"
                        ).fetchone()["last_value"] == 3
