"""One retry layer (issue 39, item 1): every connection a det process opens goes through
``det.db.reconnect`` (its timeout, and ``det.db.retry``'s idea of a loss), and a task written
against ``determined.core`` rides out a database that refuses it at start as det's own
harness does.
"""

import re
import subprocess
import sys
from pathlib import Path

import psycopg
from conftest import REPO, PrivateServer
from psycopg.rows import dict_row
from test_harness_db_faults import claim_allocation

RETRY_LAYER = {"db/reconnect.py"}
"""The modules that may open a connection themselves."""

NOT_DET = {"tests", "bench", "build", ".venv", "examples", "docs", ".git"}
"""Top-level directories whose code no det process runs."""

BARE_CONNECT = re.compile(r"\bpsycopg\.connect\(|\bAsyncConnection\.connect\(|"
                          r"\bpsycopg\.Connection\.connect\(|\b(Async)?ConnectionPool\(")


def bare_connects(root: Path) -> list[str]:
    """``file:line`` of every connect outside the retry layer in det's source under
    ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in NOT_DET or rel.as_posix() in RETRY_LAYER:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if BARE_CONNECT.search(line.split("#", 1)[0]):
                found.append(f"{rel}:{n}")
    return found


def test_no_connection_is_opened_outside_the_retry_layer() -> None:
    assert bare_connects(REPO) == [], (
        "open connections with det.db.reconnect.open_connection / Reconnecting "
        "(det.db.retry), not psycopg's connect")


def test_the_scan_finds_a_bare_connect(tmp_path: Path) -> None:
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "reconnect.py").write_text("psycopg.connect(url)\n")
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "x.py").write_text(
        "a = 1\nc = psycopg.connect(url)  # here\n# psycopg.connect( in a comment\n"
        "async with await psycopg.AsyncConnection.connect(url) as c:\n"
        "pool = ConnectionPool(url, min_size=2)\n")
    assert bare_connects(tmp_path) == ["agent/x.py:2", "agent/x.py:4", "agent/x.py:5"]


COMPAT_TASK = """
import determined as det
from determined import core
from det.harness import cluster_info
info = det.get_cluster_info()
opened = cluster_info._unclaimed
with core.init() as ctx:  # takes over the transport get_cluster_info opened
    assert ctx.info is info and ctx.transport is opened
    ctx.train.report_training_metrics(1, {"loss": 0.5})
print("TRIAL", info.trial.trial_id, flush=True)
"""


def test_a_determined_core_task_started_while_the_database_is_down_completes(
        private_pg: PrivateServer, tmp_path: Path) -> None:
    """The postmaster is stopped as the task starts and comes back once the task was refused:
    the task waits for it (before issue 39, get_cluster_info's bare connect failed at once:
    the trial ERRORed with max_restarts 0), with one server connection (the compat and
    native paths share the task's DbTransport)."""
    alloc = claim_allocation(private_pg.url, tmp_path / "storage")
    (tmp_path / "task.py").write_text(COMPAT_TASK)
    private_pg.stop()
    proc = subprocess.Popen([sys.executable, str(tmp_path / "task.py")],
                            env=alloc.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stderr is not None
    first = proc.stderr.readline()  # its first try was refused: a warning, or a traceback
    assert "database unavailable" in first, first + proc.communicate()[1]
    private_pg.start()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert f"TRIAL {alloc.trial_id}" in out
    with psycopg.connect(private_pg.url, row_factory=dict_row) as c:
        assert c.execute("SELECT steps_completed FROM metrics WHERE trial_id = %s",
                         (alloc.trial_id,)).fetchall() == [{"steps_completed": 1}]
