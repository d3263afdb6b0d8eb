"""The agent's task pooler (``det.agent.pooler``, on unless ``det agent run
--no-task-pooler``): tasks get warm server processes through a session-mode PgBouncer of their
agent's, which is started again when it dies and never makes a session wait; without it tasks
connect directly. The PgBouncer tests need it installed (.ci/run installs
Debian's)."""

import os
import shutil
import signal
from pathlib import Path

import psycopg
import pytest
from conftest import task_url, wait_for
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from det.agent.guard import Guard
from det.agent.pooler import PORT, RESET_QUERY, TaskPooler, config, pooled_url, pooler_dir
from det.errors import DetError

needs_pgbouncer = pytest.mark.skipif(
    shutil.which("pgbouncer") is None and not os.path.exists("/usr/sbin/pgbouncer"),
    reason="pgbouncer is not installed (apt-get install pgbouncer)")


def test_the_pooler_keeps_the_tasks_role_and_database() -> None:
    url = "postgresql://det_task:p%27w%22d@/det?host=/run/det%20db&application_name=x"
    ini, users = config(url, Path("/tmp/det-pooler-x"), 8)
    assert "det = host='/run/det db' dbname=det\n" in ini
    assert "pool_mode = session\n" in ini and f"server_reset_query = {RESET_QUERY}\n" in ini
    assert "listen_addr =\n" in ini  # the socket only, no TCP
    assert "default_pool_size = 100\n" in ini and "max_client_conn = 100\n" in ini
    assert users == '"det_task" "p\'w""d"\n'
    pooled = conninfo_to_dict(pooled_url(url, Path("/tmp/det-pooler-x")))
    assert pooled == {"user": "det_task", "password": "p'w\"d", "dbname": "det",
                      "host": "/tmp/det-pooler-x", "port": str(PORT), "application_name": "x"}
    with pytest.raises(DetError, match="must name a user and a database"):
        config("host=/run/db", Path("/tmp/x"), 1)


def test_without_pgbouncer_tasks_connect_directly(db_url) -> None:
    url = task_url(db_url)
    unusable = TaskPooler(url, Path("/dev/null/pooler"), 2, os.environ)  # cannot be made
    assert unusable.url() == url
    assert unusable.url() == url  # said once, then not tried again


@needs_pgbouncer
def test_the_pooler_hands_out_warm_server_processes_and_comes_back_after_a_kill(
        db_url) -> None:
    url = task_url(db_url)
    guard = Guard()
    pooler = TaskPooler(url, pooler_dir(url, "a"), 2, {**os.environ, **guard.env})
    try:
        pooled = pooler.url()
        assert conninfo_to_dict(pooled)["host"] == str(pooler_dir(url, "a"))

        def session() -> dict:
            with psycopg.connect(pooled, autocommit=True, row_factory=dict_row) as c:
                c.execute("LISTEN a_channel")
                c.execute("SET statement_timeout = '7s'")
                c.execute("PREPARE a_statement AS SELECT 1")
                c.execute("CREATE TEMP TABLE a_table (x int)")
                c.execute("SELECT pg_advisory_lock(7)")
                return c.execute("SELECT pg_backend_pid() AS pid, current_user AS role, "
                                 "current_setting('statement_timeout') AS timeout, "
                                 "(SELECT count(*) FROM pg_listening_channels()) AS listening"
                                 ).fetchone()

        first, second = session(), session()
        assert first["role"] == second["role"] == "det_task"
        assert second["pid"] == first["pid"], "the second task gets the first one's process"
        # ... reset in between: what the first session set, listened to, prepared, created or
        # locked is gone
        with psycopg.connect(pooled, autocommit=True) as c:
            assert c.execute("SELECT current_setting('statement_timeout'), "
                             "(SELECT count(*) FROM pg_listening_channels()), "
                             "(SELECT count(*) FROM pg_prepared_statements), "
                             "to_regclass('pg_temp.a_table') IS NULL, "
                             "(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory')"
                             ).fetchone() == ("0", 0, 0, True, 0)

        killed = pooler._proc
        os.kill(killed.pid, signal.SIGKILL)
        wait_for(lambda: pooler._proc is not killed and pooler._proc.poll() is None, 10,
                 "the pooler started again")
        assert session()["role"] == "det_task"  # on the same socket
        assert pooler.url() == pooled
    finally:
        pooler.close()
        guard.close()
        shutil.rmtree(pooler_dir(url, "a"), ignore_errors=True)


@needs_pgbouncer
def test_a_password_from_the_password_file_logs_the_pooler_in(db_url, tmp_path) -> None:
    """det's embedded server's URLs name a password file rather than a password: the pooler
    logs in to the server with what libpq finds there (it had logged in with none, and every
    task retried for ever)."""
    params = conninfo_to_dict(task_url(db_url))
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:{params['user']}:{params.pop('password')}\n")
    passfile.chmod(0o600)
    url = make_conninfo(**params, passfile=str(passfile))
    guard = Guard()
    pooler = TaskPooler(url, pooler_dir(url, "a"), 1, {**os.environ, **guard.env})
    try:
        with psycopg.connect(pooler.url(), autocommit=True, connect_timeout=5) as c:
            assert c.execute("SELECT current_user").fetchone()[0] == "det_task"
    finally:
        pooler.close()
        guard.close()
        shutil.rmtree(pooler_dir(url, "a"), ignore_errors=True)


@needs_pgbouncer
def test_two_agents_of_a_host_have_poolers_of_their_own(db_url) -> None:
    """Agents a and b of one host, with the same task URL: each has its own socket, and b's
    tasks go on connecting when a's pooler is gone. Many sessions at once never wait for a
    server process, whatever the expected pool size."""
    url = task_url(db_url)
    guard = Guard()
    a = TaskPooler(url, pooler_dir(url, "a"), 1, {**os.environ, **guard.env})
    b = TaskPooler(url, pooler_dir(url, "b"), 1, {**os.environ, **guard.env})
    try:
        assert a.url() != b.url()
        sessions = [psycopg.connect(b.url(), autocommit=True, connect_timeout=5)
                    for _ in range(4)]
        try:
            pids = {c.execute("SELECT pg_backend_pid()").fetchone()[0] for c in sessions}
            assert len(pids) == 4  # four at once, with a pool expected to hold one
        finally:
            for c in sessions:
                c.close()
        a.close()
        with psycopg.connect(b.url(), autocommit=True, connect_timeout=5) as c:
            assert c.execute("SELECT current_user").fetchone()[0] == "det_task"
    finally:
        a.close()
        b.close()
        guard.close()
        for agent in "ab":
            shutil.rmtree(pooler_dir(url, agent), ignore_errors=True)


TRAIN = """
import os
import psycopg
from det.harness import core

with psycopg.connect(os.environ["DET_DB_URL"]) as c:
    print("server", c.info.host, c.execute("SELECT pg_backend_pid()").fetchone()[0])
with core.init() as ctx:
    for op in ctx.searcher.operations():
        ctx.train.report_validation_metrics(steps_completed=op.length, metrics={"loss": 0.5})
        op.report_completed(0.5)
"""


@needs_pgbouncer
def test_an_agent_runs_a_search_through_its_task_pooler(det, conn, db_url, tmp_path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "train.py").write_text(TRAIN)
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("name: pooled\nentrypoint: python3 train.py\nmax_restarts: 0\n"
                   "searcher: {name: random, metric: loss, max_trials: 4, "
                   "max_concurrent_trials: 1, max_length: {batches: 1}}\n"
                   "hyperparameters: {x: {type: double, minval: 0, maxval: 1}}\n")
    det("experiment", "create", str(cfg), str(ctx))
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--id", "pooled", "--slots", "1", "--runtime",
              "process")  # the pooler is the default
    try:
        assert det("experiment", "wait", "1", check=False, timeout=180).returncode == 0, \
            det.log("agent")
        states = [r["s"] for r in conn.execute("SELECT state::text AS s FROM trials")]
        lines = [r["line"].split() for r in conn.execute(
            "SELECT line FROM task_logs WHERE line LIKE 'server %%' ORDER BY id")]
    finally:
        det.stop_all()
        shutil.rmtree(pooler_dir(task_url(db_url), "pooled"), ignore_errors=True)
    assert states == ["COMPLETED"] * 4
    assert len(lines) == 4
    assert {host for _, host, _ in lines} == {str(pooler_dir(task_url(db_url), "pooled"))}
    pids = [pid for _, _, pid in lines]
    assert len(set(pids)) < len(pids), "server processes were handed from task to task"
