"""`det cluster up` as a user runs it: the embedded database, a supervisor that restarts a
crashed reconciler, agent or database, and the truth in `det cluster status` (issue 10)."""

import getpass
import json
import os
import signal
import socket
from pathlib import Path

import psutil
import pytest
from conftest import Det, wait_for
from test_reconciler import config

from det.cli.supervisor import read_pid


@pytest.fixture
def local(tmp_path: Path) -> Det:
    """A Det runner with its own DET_HOME and no DET_DB_URL: det runs its embedded database.
    No XDG_RUNTIME_DIR either, as in a fresh login without systemd's session."""
    env = {k: v for k, v in os.environ.items() if k not in ("DET_DB_URL", "XDG_RUNTIME_DIR")}
    env.update(DET_HOME=str(tmp_path / "home"), DET_USER="tester", PYTHONUNBUFFERED="1")
    d = Det(env, tmp_path)
    yield d
    d("cluster", "down", check=False, timeout=120)


def _status(det: Det) -> dict:
    return json.loads(det("cluster", "status", "--json").stdout)


def test_commands_before_cluster_up_say_how_to_start_one(local, tmp_path) -> None:
    r = local("experiment", "list", check=False)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "det cluster up" in r.stderr
    assert not (tmp_path / "home" / "postgres").exists()  # nothing was started


def test_supervisor_restarts_what_dies(local, tmp_path) -> None:
    run = tmp_path / "home" / "run"
    out = local("cluster", "up", "--runtime", "process", "--slots", "1").stdout
    assert "supervisor: started" in out
    wait_for(lambda: _status(local)["leader"] and _status(local)["leader"]["alive"], 60,
             "the reconciler to lead")
    assert "already running" in local("cluster", "up").stdout

    reconciler = read_pid(run, "reconciler")
    # the agents it starts for elastic and Slurm pools run tasks as `up --runtime` asked
    assert psutil.Process(reconciler).environ().get("DET_AGENT_RUNTIME") == "process"
    os.kill(reconciler, signal.SIGKILL)
    wait_for(lambda: read_pid(run, "reconciler") not in (None, reconciler), 30,
             "the supervisor to start a new reconciler")

    # The embedded server crashes: the supervisor starts it again, and everyone reconnects.
    postmaster = int((tmp_path / "home" / "postgres" / "postmaster.pid").read_text().split()[0])
    psutil.Process(postmaster).kill()
    wait_for(lambda: local("cluster", "status", check=False).returncode == 0, 60,
             "the embedded database to be back")
    local("experiment", "create", str(config(tmp_path, "echo hello")), str(tmp_path / "ctx"))
    assert local("experiment", "wait", "1", timeout=120).returncode == 0
    assert "hello" in local("trial", "logs", "1").stdout

    pids = [read_pid(run, n) for n in ("supervisor", "reconciler", "agent")]
    down = local("cluster", "down", timeout=120)
    # pgserver's import warned about XDG_RUNTIME_DIR on every stop (issue 34)
    assert "Warning" not in down.stderr, down.stderr
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                   for p in pids if p)
    assert "det cluster up" in local("cluster", "status", check=False).stderr


def test_status_tells_a_dead_leader_from_a_live_one(det, conn) -> None:
    rec = det.start("reconciler", "reconcile", "--interval", "0.5")
    wait_for(lambda: "leading as" in det.log("reconciler"), 30, "the reconciler to lead")
    assert f"leader: {os.uname().nodename}:{rec.pid}" in det("cluster", "status").stdout
    rec.send_signal(signal.SIGKILL)
    rec.wait()
    out = det("cluster", "status").stdout
    assert "leader: none; the last leader" in out and "is gone" in out


def test_a_zombie_is_not_running(tmp_path) -> None:
    """`det cluster up` must not call a dead child that was never reaped "already running"."""
    import subprocess
    import time

    from det.cli.supervisor import alive

    child = subprocess.Popen(["true"])
    (tmp_path / "agent.pid").write_text(str(child.pid))
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)
    assert not alive(child.pid) and read_pid(tmp_path, "agent") is None
    child.wait()


def test_cluster_up_serves_the_rest_api_and_webui(local, tmp_path) -> None:
    """`det cluster up` starts det serve under the supervisor; status shows where it is."""
    import httpx
    from test_api import free_port

    port = free_port()
    out = local("cluster", "up", "--runtime", "process", "--slots", "1", "--web-port",
                str(port)).stdout
    url = f"http://127.0.0.1:{port}/"
    assert f"web: {url}" in out

    def answers() -> bool:
        try:
            return httpx.get(f"{url}api/v1/openapi.json", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(answers, 60, "the web server to answer")
    # The cluster admin (the OS user's det account) logs in once it has a password it knows.
    local("user", "change-password", "--password", "known", "--weak-ok")
    assert local("user", "whoami").stdout.strip() == getpass.getuser()
    token = httpx.post(f"{url}api/v1/auth/login",
                       json={"username": getpass.getuser(), "password": "known"}).json()["token"]
    r = httpx.get(f"{url}api/v1/agents", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200
    assert "<title>det</title>" in httpx.get(f"{url}ui/").text
    status = _status(local)
    assert status["processes"]["server"] and status["web"] == url
    assert f"server: running (pid {status['processes']['server']}) at {url}" in \
        local("cluster", "status").stdout
    server = status["processes"]["server"]
    local("cluster", "down", timeout=120)
    assert not (psutil.pid_exists(server) and psutil.Process(server).status() != "zombie")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_down_right_after_up_stops_the_supervisor_up_started(local, tmp_path) -> None:
    """`up` returned before its supervisor had written its pid file, so a `down` at once
    found none, stopped only the database, and left the supervisor to start it again: the
    next `up` said "already running". `up` records the pid it started."""
    run = tmp_path / "home" / "run"
    local("cluster", "up", "--runtime", "process", "--slots", "1", "--web-port", "0")
    pid = read_pid(run, "supervisor")
    assert pid is not None, "up returned with no supervisor on record"
    assert "supervisor: stopped" in local("cluster", "down", timeout=120).stdout
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_taken_web_port_is_refused_and_the_chosen_one_kept(local, tmp_path) -> None:
    """Issue 34: with 8080 taken, `up` printed that URL and exited 0 while its server
    crash-looped (and the URL served someone else's det); `--web-port` was forgotten by the
    next `up`."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = local("cluster", "up", "--runtime", "process", "--web-port", str(port), check=False)
        assert r.returncode == 1 and len(r.stderr.splitlines()) == 1
        assert f"127.0.0.1:{port} is taken" in r.stderr and "--web-port" in r.stderr
    assert read_pid(tmp_path / "home" / "run", "supervisor") is None
    free = _free_port()
    out = local("cluster", "up", "--runtime", "process", "--slots", "1",
                "--web-port", str(free)).stdout
    assert f"web: http://127.0.0.1:{free}/" in out
    local("cluster", "down", timeout=120)
    # every setting of the last `up` is kept (the supervisor's command line says which)
    assert f"web: http://127.0.0.1:{free}/" in local("cluster", "up").stdout
    pid = wait_for(lambda: read_pid(tmp_path / "home" / "run", "supervisor"), 30,
                   "the supervisor's pid file")
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"--slots") + 1] == b"1"
    assert argv[argv.index(b"--runtime") + 1] == b"process"


def test_status_reports_a_failing_server_with_its_log_line(local, tmp_path) -> None:
    """Issue 34: a server that crash-loops (here: its port taken by another program) was
    reported as running; status names it failing, with its log's last line."""
    run = tmp_path / "home" / "run"
    port = _free_port()
    with socket.socket() as taken:
        # Bound but not listening, `up`'s check of the port passes; listening before the
        # server (still importing) binds it, the server then fails at every start.
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        local("cluster", "up", "--runtime", "process", "--slots", "1", "--web-port", str(port))
        taken.listen()
        wait_for(lambda: "server" in _status(local)["failing"], 90, "the server to fail")
        failure = _status(local)["failing"]["server"]
        assert failure["exit_code"] != 0 and failure["failures"] >= 1
        assert "address already in use" in failure["last_log_line"]
        out = local("cluster", "status").stdout
        line = next(ln for ln in out.splitlines() if ln.startswith("server:"))
        assert line.startswith("server: failing: exited with code ")
        assert "address already in use" in line and str(run / "server.log") in line
    assert "reconciler: running" in out  # the others are not failing


def test_failing_line_says_how_it_ended() -> None:
    from det.cli.cluster import failing_line

    line = failing_line("agent", {"failures": 1, "exit_code": -9, "ran_seconds": 2.5,
                                  "at": 1000.0, "log": "/r/agent.log", "last_log_line": None},
                        1065.0)
    assert line == ("agent: failing: killed by signal 9 after 2s, 1 time in a row, the last "
                    "1m 05s ago; the supervisor starts it again. Last line of /r/agent.log: "
                    "(its log is empty)")
