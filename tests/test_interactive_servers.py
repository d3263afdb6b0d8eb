"""The servers inside interactive tasks (issue 33, det.harness.interactive): each started for a
real task row, claimed like an agent claims it, and used through the address it records:
JupyterLab runs a kernel, TensorBoard lists an experiment's scalar tags, sshd lets the task's
key in; a server that never answers fails the run with the reason; use is reported by idle
type. The agent's side (DET_JOB_ID, a kill ending the server and what it started) runs a real
agent with the process runtime, and with docker and det's image where an engine answers."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from conftest import wait_for
from psycopg.types.json import Jsonb

from det.harness.interactive.common import TaskTransport
from det.harness.interactive.notebook import jupyter_argv, notebook_activity
from det.harness.interactive.shell import sshd_config
from det.harness.interactive.tensorboard import event_dirs, logdir_spec
from det.submission import expand_task_config, submit_task

SSHD = shutil.which("sshd", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
needs_sshd = pytest.mark.skipif(SSHD is None, reason="sshd is not installed (Debian's "
                                "openssh-server; .ci/run installs it)")


@dataclass
class Claimed:
    """A task's run claimed as its agent claims it: what the harness needs to start."""

    url: str
    job_id: int
    allocation_id: int
    token: str
    spec: dict

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "DET_DB_URL": self.url, "DET_ALLOCATION_ID": str(self.allocation_id),
                "DET_ALLOCATION_TOKEN": self.token, "DET_JOB_ID": str(self.job_id),
                "DET_TASK_SPEC": json.dumps(self.spec["task"]), "PYTHONUNBUFFERED": "1",
                **extra}


def claim_task(conn: psycopg.Connection, url: str, kind: str, overrides: tuple[str, ...] = (),
               experiment_ids: tuple[int, ...] = (), trial_ids: tuple[int, ...] = ()) -> Claimed:
    """Submit a task (det.submission, as the CLI does) and claim its run on agent ``h3``."""
    conn.execute("SELECT det_agent.register('h3', 'host', 'default', 'process', %s)",
                 (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
    expanded = expand_task_config(conn, kind, None, "test", ("resources.slots=0", *overrides))
    job = submit_task(conn, kind, expanded, experiment_ids=experiment_ids, trial_ids=trial_ids)
    row = conn.execute("UPDATE allocations SET state = 'ASSIGNED', agent_id = 'h3' "
                       "WHERE job_id = %s RETURNING id, spec", (job,)).fetchone()
    token = conn.execute("SELECT det_agent.claim('h3', %s) AS t", (row["id"],)).fetchone()["t"]
    assert token
    return Claimed(url, job, row["id"], token, row["spec"])


class Harness:
    """``python -m det.harness.interactive KIND`` for a claimed task, its output in a file."""

    def __init__(self, claimed: Claimed, kind: str, workdir: Path, **env: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir.parent / f"{workdir.name}.log"
        self.out = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "det.harness.interactive", kind], cwd=workdir,
            env=claimed.env(PYTHONFAULTHANDLER="1", **env), stdout=self.out,
            stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            # Seen once under heavy load, cause unknown: SIGABRT has faulthandler write every
            # thread's stack into the task's output, which the failure shows.
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(10)
            raise AssertionError(f"no exit 30 s after SIGTERM:\n{self.output()}") from None
        finally:
            with_group_killed(self.proc.pid)
            self.out.close()


def with_group_killed(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def address(conn: psycopg.Connection, claimed: Claimed, harness: Harness,
            timeout: float = 90) -> str:
    """The address the task's server recorded once it answered."""
    def recorded() -> str | None:
        assert harness.proc.poll() is None, harness.output()
        return conn.execute("SELECT address FROM allocations WHERE id = %s",
                            (claimed.allocation_id,)).fetchone()["address"]
    return wait_for(recorded, timeout, "the server's address")


def last_activity(conn: psycopg.Connection, job: int) -> datetime:
    return conn.execute("SELECT last_activity FROM tasks WHERE job_id = %s",
                        (job,)).fetchone()["last_activity"]


def jupyter_token(conn: psycopg.Connection, job: int) -> str:
    return conn.execute("SELECT jupyter_token FROM task_secrets WHERE job_id = %s",
                        (job,)).fetchone()["jupyter_token"]


# -- pure parts ---------------------------------------------------------------------------------

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
IDLE_KERNEL = {"id": "k", "execution_state": "idle", "connections": 0,
               "last_activity": "2026-11-27T11:50:00.000000Z"}


def test_notebook_activity_by_idle_type() -> None:
    terminal = {"name": "1", "last_activity": "2026-11-27T11:55:00.000000Z"}
    # kernels_or_terminals: any kernel or terminal open is use now
    assert notebook_activity("kernels_or_terminals", [], [], NOW) is None
    assert notebook_activity("kernels_or_terminals", [IDLE_KERNEL], [], NOW) == NOW
    assert notebook_activity("kernels_or_terminals", [], [terminal], NOW) == NOW
    # kernel_connections: only a kernel someone is connected to
    assert notebook_activity("kernel_connections", [IDLE_KERNEL], [terminal], NOW) is None
    assert notebook_activity("kernel_connections",
                             [{**IDLE_KERNEL, "connections": 1}], [], NOW) == NOW
    # activity: a busy kernel is use now, else the latest kernel message or terminal I/O
    assert notebook_activity("activity", [{**IDLE_KERNEL, "execution_state": "busy"}], [],
                             NOW) == NOW
    assert notebook_activity("activity", [IDLE_KERNEL], [terminal], NOW) == \
        datetime(2026, 11, 27, 11, 55, tzinfo=UTC)
    assert notebook_activity("activity", [], [], NOW) is None


def test_jupyter_runs_behind_the_proxy_path_with_the_tasks_token() -> None:
    argv = jupyter_argv("/py", "10.0.0.5", 4242, "tok", 17, "/work")
    assert argv[:3] == ["/py", "-m", "det.harness.interactive.jupyter"]
    for arg in ("--ip=10.0.0.5", "--port=4242", "--ServerApp.port_retries=0",
                "--IdentityProvider.token=tok", "--ServerApp.base_url=/proxy/17/",
                "--ServerApp.root_dir=/work"):
        assert arg in argv
    assert not any("disable_check_xsrf" in a for a in argv)


def test_tensorboard_reads_local_storage_and_says_what_it_leaves_out() -> None:
    dirs, skipped = event_dirs([
        {"experiment_id": 1, "trial_id": None,
         "storage": {"type": "shared_fs", "host_path": "/ckpt", "storage_path": "sub"}},
        {"experiment_id": 2, "trial_id": 7, "storage": {"type": "directory",
                                                        "container_path": "/mnt/c"}},
        {"experiment_id": 3, "trial_id": None, "storage": {"type": "s3", "bucket": "b"}}])
    assert dirs == [("exp1", "/ckpt/sub/tensorboard/experiment/1"),
                    ("exp2-trial7", "/mnt/c/tensorboard/experiment/2/trial/7")]
    assert skipped == ["experiment 3: its event files are on s3 storage, which TensorBoard "
                       "here cannot read (only shared_fs or directory)"]
    assert logdir_spec(dirs) == ("exp1:/ckpt/sub/tensorboard/experiment/1,"
                                 "exp2-trial7:/mnt/c/tensorboard/experiment/2/trial/7")


def test_sshd_lets_in_only_the_task_user_by_its_key(tmp_path: Path) -> None:
    config = sshd_config("10.0.0.5", 2222, tmp_path, "alice",
                         {"PATH": "/opt/det/venv/bin:/usr/bin", "CUDA_VISIBLE_DEVICES": "GPU-1",
                          "SECRET": "x"})
    lines = config.splitlines()
    for line in ("ListenAddress 10.0.0.5", "Port 2222", "AllowUsers alice",
                 f"AuthorizedKeysFile {tmp_path / 'authorized_keys'}", "PasswordAuthentication no",
                 "UsePAM no", "StrictModes no", "PidFile none"):
        assert line in lines
    assert ('SetEnv "PATH=/opt/det/venv/bin:/usr/bin" "CUDA_VISIBLE_DEVICES=GPU-1"') in lines
    assert "SECRET" not in config


# -- the servers, each for a real task row ------------------------------------------------------

def http(method: str, url: str, token: str | None = None, body: dict | None = None):
    """The JSON answer of a request to the task's server."""
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"token {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def execute(ws_url: str, code: str, timeout: float = 60) -> str:
    """Run ``code`` in a kernel through Jupyter's kernel WebSocket; its stdout."""
    from websockets.sync.client import connect

    msg_id, out = uuid.uuid4().hex, []
    request = {"header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex,
                          "msg_type": "execute_request", "version": "5.3"},
               "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
               "content": {"code": code, "silent": False, "store_history": False,
                           "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}
    deadline = time.monotonic() + timeout
    with connect(ws_url, open_timeout=30) as ws:
        ws.send(json.dumps(request))
        while time.monotonic() < deadline:
            msg = json.loads(ws.recv(timeout=deadline - time.monotonic()))
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return "".join(out)
    raise AssertionError(f"no answer to {code!r} within {timeout} s")


def test_notebook_runs_a_kernel_and_a_busy_kernel_is_activity(
        conn: psycopg.Connection, db_url: str, tmp_path: Path) -> None:
    claimed = claim_task(conn, db_url, "NOTEBOOK", ("notebook_idle_type=activity",))
    harness = Harness(claimed, "notebook", tmp_path / "task")
    try:
        addr = address(conn, claimed, harness)
        token = jupyter_token(conn, claimed.job_id)
        api = f"http://{addr}/proxy/{claimed.job_id}/api"
        assert "started" in http("GET", f"{api}/status", token)
        with pytest.raises(Exception, match="403"):  # no token, no entry
            http("GET", f"{api}/kernels")
        kernel = http("POST", f"{api}/kernels", token, {"name": "python3"})
        ws = f"ws://{addr}/proxy/{claimed.job_id}/api/kernels/{kernel['id']}/channels"
        assert execute(f"{ws}?token={token}", "print(6*7)") == "42\n"
        # activity: a busy kernel is use now, each poll, for as long as it runs
        before = last_activity(conn, claimed.job_id)
        busy_from = datetime.now(UTC)
        execute(f"{ws}?token={token}", "import time; time.sleep(12)")
        after = last_activity(conn, claimed.job_id)
        assert after > before and after >= busy_from + timedelta(seconds=4), (
            before, busy_from, after, harness.output())
        assert harness.stop() == 0
        out = harness.output()
        assert "JupyterLab answers at" in out and "stopping JupyterLab" in out
    finally:
        harness.stop()


def test_a_server_that_never_answers_fails_the_run_with_the_reason(
        conn: psycopg.Connection, db_url: str, tmp_path: Path) -> None:
    # A real JupyterLab whose configuration hangs before it listens (a user's
    # jupyter_server_config.py doing slow work at import).
    config_dir = tmp_path / "jupyter-config"
    config_dir.mkdir()
    (config_dir / "jupyter_server_config.py").write_text("import time\ntime.sleep(3600)\n")
    claimed = claim_task(conn, db_url, "NOTEBOOK")
    harness = Harness(claimed, "notebook", tmp_path / "task",
                      JUPYTER_CONFIG_DIR=str(config_dir), DET_SERVER_START_TIMEOUT="5")
    assert harness.proc.wait(60) == 1
    assert "notebook failed: JupyterLab did not answer at" in harness.output()
    assert "within 5 s" in harness.output()
    assert conn.execute("SELECT address FROM allocations WHERE id = %s",
                        (claimed.allocation_id,)).fetchone()["address"] is None
    harness.stop()
    # one that exits first says so, with its exit code
    (config_dir / "jupyter_server_config.py").write_text("raise SystemExit(3)\n")
    again = claim_task(conn, db_url, "NOTEBOOK")
    harness = Harness(again, "notebook", tmp_path / "task2", JUPYTER_CONFIG_DIR=str(config_dir))
    assert harness.proc.wait(60) == 1
    assert "exited with code" in harness.output() and "before it answered" in harness.output()
    harness.stop()


def test_tensorboard_lists_an_experiments_scalar_tags(
        conn: psycopg.Connection, db_url: str, tmp_path: Path, ended) -> None:
    eid, trials = write_events(conn, ended)
    claimed = claim_task(conn, db_url, "TENSORBOARD", experiment_ids=(eid,))
    transport = TaskTransport(db_url, claimed.allocation_id, claimed.token)
    [source] = transport.tensorboard_sources()
    transport.close()
    assert (source["experiment_id"], source["trial_id"]) == (eid, None)  # all its trials
    assert source["storage"]["host_path"] == str(ended.storage)
    harness = Harness(claimed, "tensorboard", tmp_path / "task")
    try:
        addr = address(conn, claimed, harness)
        url = f"http://{addr}/proxy/{claimed.job_id}/data/plugin/scalars/tags"
        tags = wait_for(lambda: http("GET", url), 60, "TensorBoard's first load of the events")
        assert {run: sorted(t) for run, t in tags.items()} == {
            f"exp{eid}/trial/{tid}": ["loss", "val_accuracy"] for tid in trials}
        # a run to stop (an agent's planned stop) stops the server and ends the task cleanly
        conn.execute("UPDATE allocations SET desired_state = 'STOPPED' WHERE id = %s",
                     (claimed.allocation_id,))
        assert harness.proc.wait(30) == 0
        assert "stopping TensorBoard" in harness.output()
    finally:
        harness.stop()


def ssh(addr: str, key: Path, *command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The system ssh to a shell task's ``user@host:port`` with its private key."""
    user_host, port = addr.rsplit(":", 1)
    return subprocess.run(["ssh", "-i", str(key), "-p", port, "-o", "StrictHostKeyChecking=no",
                           "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
                           "-o", "LogLevel=ERROR", user_host, *command],
                          capture_output=True, text=True, timeout=timeout, check=False)


@needs_sshd
def test_shell_lets_the_tasks_key_in_and_an_open_session_is_activity(
        conn: psycopg.Connection, db_url: str, tmp_path: Path) -> None:
    import pwd

    claimed = claim_task(conn, db_url, "SHELL")
    harness = Harness(claimed, "shell", tmp_path / "task")
    try:
        addr = address(conn, claimed, harness)
        me = pwd.getpwuid(os.geteuid()).pw_name
        assert addr.startswith(f"{me}@")
        key = tmp_path / "key"
        key.write_text(conn.execute("SELECT ssh_private_key FROM task_secrets WHERE job_id = %s",
                                    (claimed.job_id,)).fetchone()["ssh_private_key"])
        key.chmod(0o600)
        done = ssh(addr, key, "hostname; echo $DET_JOB_ID")
        assert done.returncode == 0, done.stderr + harness.output()
        assert done.stdout.split() == [socket.gethostname(), str(claimed.job_id)]
        # another key is refused
        other = tmp_path / "other"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                       check=True)
        assert ssh(addr, other, "true").returncode == 255
        # an open session is use, reported while it lasts
        before = last_activity(conn, claimed.job_id)
        session_from = datetime.now(UTC)
        assert ssh(addr, key, "sleep 12").returncode == 0
        after = last_activity(conn, claimed.job_id)
        assert after >= session_from + timedelta(seconds=4) and after > before, (
            before, session_from, after)
        # stopping the task ends the sessions still open (sshd alone would leave them)
        session = open_session(addr, key)
        assert harness.stop() == 0
        assert session.wait(20) != 0
    finally:
        harness.stop()


def open_session(addr: str, key: Path) -> subprocess.Popen:
    """An SSH session to a shell task that stays open (a remote ``sleep``), once it runs."""
    user_host, port = addr.rsplit(":", 1)
    session = subprocess.Popen(
        ["ssh", "-i", str(key), "-p", port, "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
         user_host, "echo open; exec sleep 120"], stdout=subprocess.PIPE, text=True)
    assert session.stdout.readline().strip() == "open"
    return session


# -- the agent's side -----------------------------------------------------------------------------

def place(conn: psycopg.Connection, kind: str, agent: str, *overrides: str,
          experiment_ids: tuple[int, ...] = ()) -> tuple[int, int]:
    """Submit a zero-slot task and assign its run to ``agent`` as the pass would; (job id,
    allocation id)."""
    expanded = expand_task_config(conn, kind, None, "test", ("resources.slots=0", *overrides))
    job = submit_task(conn, kind, expanded, experiment_ids=experiment_ids)
    alloc = conn.execute("UPDATE allocations SET state = 'ASSIGNED', agent_id = %s "
                         "WHERE job_id = %s RETURNING id", (agent, job)).fetchone()["id"]
    conn.execute("SELECT pg_notify(det_internal.channel('agent', %s), 'assigned')", (agent,))
    return job, alloc


def task_log(conn: psycopg.Connection, alloc: int) -> str:
    return "\n".join(r["line"] for r in conn.execute(
        "SELECT line FROM task_logs WHERE allocation_id = %s ORDER BY id", (alloc,)))


def run_agent(det, conn: psycopg.Connection, runtime: str) -> str:
    agent = f"h3-{uuid.uuid4().hex[:6]}"
    det.start("agent", "agent", "run", "--id", agent, "--slots", "1", "--runtime", runtime)
    wait_for(lambda: conn.execute("SELECT 1 FROM agents WHERE id = %s", (agent,)).fetchone(),
             60, "the agent's registration")
    return agent


def notebook_through_an_agent(det, conn: psycopg.Connection, runtime: str) -> None:
    """An agent runs a notebook task: its kernel sees DET_JOB_ID; killing the run (desired
    KILLED) ends the server and everything it started (a kernel, a terminal)."""
    from det.agent.guard import marked

    agent = run_agent(det, conn, runtime)
    job, alloc = place(conn, "NOTEBOOK", agent)

    def recorded() -> str | None:
        row = conn.execute("SELECT state, address FROM allocations WHERE id = %s",
                           (alloc,)).fetchone()
        assert row["state"] != "TERMINATED", task_log(conn, alloc) + det.log("agent")
        return row["address"]

    addr = wait_for(recorded, 240, "the notebook's address")
    token = jupyter_token(conn, job)
    api = f"http://{addr}/proxy/{job}/api"
    opened = datetime.now(UTC)
    kernel = http("POST", f"{api}/kernels", token, {"name": "python3"})
    http("POST", f"{api}/terminals", token, {})
    # kernels_or_terminals (the default): an open kernel is use, reported at the next poll
    wait_for(lambda: last_activity(conn, job) > opened, 20, "the open kernel's report")
    ws = f"ws://{addr}/proxy/{job}/api/kernels/{kernel['id']}/channels?token={token}"
    out = execute(ws, "import os; print(6*7, os.environ['DET_JOB_ID'], "
                      "os.environ['DET_ALLOCATION_TOKEN'])").split()
    assert out[:2] == ["42", str(job)]
    marker = f"DET_ALLOCATION_TOKEN={out[2]}".encode()
    if runtime == "process":
        assert len(marked(marker)) >= 3  # the harness, JupyterLab, the kernel, the terminal
    conn.execute("UPDATE allocations SET desired_state = 'KILLED' WHERE id = %s", (alloc,))
    conn.execute("SELECT pg_notify(det_internal.channel('agent', %s), 'kill')", (agent,))
    wait_for(lambda: conn.execute("SELECT state FROM allocations WHERE id = %s",
                                  (alloc,)).fetchone()["state"] == "TERMINATED",
             60, "the killed notebook's end")
    assert marked(marker) == []  # no kernel, terminal or server outlives the task


def test_notebook_through_a_process_agent(det, conn: psycopg.Connection) -> None:
    notebook_through_an_agent(det, conn, "process")


@needs_sshd
def test_a_killed_shell_ends_its_open_ssh_sessions(det, conn: psycopg.Connection,
                                                   tmp_path: Path) -> None:
    """sshd serves each connection from a process in a session of its own, which a kill of
    the task's process group misses: the process runtime also kills what carries the task's
    token, so an open SSH session ends with the task."""
    agent = run_agent(det, conn, "process")
    job, alloc = place(conn, "SHELL", agent)
    addr = wait_for(lambda: conn.execute("SELECT address FROM allocations WHERE id = %s",
                                         (alloc,)).fetchone()["address"],
                    120, "the shell's address")
    key = tmp_path / "key"
    key.write_text(conn.execute("SELECT ssh_private_key FROM task_secrets WHERE job_id = %s",
                                (job,)).fetchone()["ssh_private_key"])
    key.chmod(0o600)
    session = open_session(addr, key)
    try:
        conn.execute("UPDATE allocations SET desired_state = 'KILLED' WHERE id = %s", (alloc,))
        conn.execute("SELECT pg_notify(det_internal.channel('agent', %s), 'kill')", (agent,))
        wait_for(lambda: conn.execute("SELECT state FROM allocations WHERE id = %s",
                                      (alloc,)).fetchone()["state"] == "TERMINATED",
                 60, "the killed shell's end")
        # what ran in the session is gone, and with it the session
        assert session.wait(20) != 0
    finally:
        if session.poll() is None:
            session.kill()


def write_events(conn: psycopg.Connection, ended) -> tuple[int, list[int]]:
    """An ended experiment of two trials whose harness wrote TensorBoard events of a training
    and a validation metric; (its id, its trial ids)."""
    from det.harness.storage import storage_from_config
    from det.harness.tensorboard import TensorboardFiles

    eid, _ = ended.make([[(10, 0.5)], [(10, 0.25)]])
    trials = [r["id"] for r in conn.execute(
        "SELECT id FROM trials WHERE experiment_id = %s ORDER BY id", (eid,))]
    storage = storage_from_config({"type": "shared_fs", "host_path": str(ended.storage)})
    for tid in trials:
        files = TensorboardFiles(storage, eid, tid)
        files.report("training", 10, {"loss": 0.5})
        files.report("validation", 10, {"accuracy": 0.9})
        files.close()
    return eid, trials


def test_servers_in_containers_of_dets_image(det, conn: psycopg.Connection, tmp_path: Path,
                                             ended, docker_client, task_image: str) -> None:
    """The docker runtime with det's image (built offline): JupyterLab runs a kernel and a
    kill ends the container; TensorBoard reads the event files the agent mounted; sshd lets the
    task's key in as root."""
    notebook_through_an_agent(det, conn, "docker")
    agent = conn.execute("SELECT id FROM agents").fetchone()["id"]
    eid, trials = write_events(conn, ended)
    job, alloc = place(conn, "TENSORBOARD", agent, experiment_ids=(eid,))
    addr = wait_for(lambda: conn.execute("SELECT address FROM allocations WHERE id = %s",
                                         (alloc,)).fetchone()["address"],
                    120, "TensorBoard's address")
    url = f"http://{addr}/proxy/{job}/data/plugin/scalars/tags"
    tags = wait_for(lambda: http("GET", url), 60, "TensorBoard's first load of the events")
    assert sorted(tags) == [f"exp{eid}/trial/{tid}" for tid in trials]
    job, alloc = place(conn, "SHELL", agent)

    def recorded() -> str | None:
        row = conn.execute("SELECT state, address FROM allocations WHERE id = %s",
                           (alloc,)).fetchone()
        assert row["state"] != "TERMINATED", task_log(conn, alloc) + det.log("agent")
        return row["address"]

    addr = wait_for(recorded, 120, "the shell's address")
    assert addr.startswith("root@")
    key = tmp_path / "key"
    key.write_text(conn.execute("SELECT ssh_private_key FROM task_secrets WHERE job_id = %s",
                                (job,)).fetchone()["ssh_private_key"])
    key.chmod(0o600)
    done = ssh(addr, key, "hostname; command -v python3")
    assert done.returncode == 0, done.stderr + task_log(conn, alloc)
    # host networking: the container's hostname is the host's; the task's Python first
    assert done.stdout.split() == [socket.gethostname(), "/opt/det/venv/bin/python3"]
    # an agent that dies and comes back adopts the task's container: the shell goes on
    [agent_proc] = det.procs
    agent_proc.kill()
    agent_proc.wait()
    det.start("agent2", "agent", "run", "--id", agent, "--slots", "1", "--runtime", "docker")
    wait_for(lambda: f"allocation {alloc}: adopted container" in det.log("agent2"), 60,
             "the shell's adoption")
    assert ssh(addr, key, "true").returncode == 0
    assert conn.execute("SELECT state FROM allocations WHERE id = %s",
                        (alloc,)).fetchone()["state"] == "RUNNING"


def test_tensorboard_sources_are_the_tasks_own_without_credentials(
        conn: psycopg.Connection, db_url: str, ended) -> None:
    e1, _ = ended.make([[(10, 0.5)]])
    s3 = {"type": "s3", "bucket": "b", "prefix": "p", "access_key": "AK", "secret_key": "SK"}
    e2, _ = ended.make([[(10, 0.5)], [(10, 0.4)]], checkpoint_storage=s3)
    t2 = conn.execute("SELECT max(id) AS id FROM trials WHERE experiment_id = %s",
                      (e2,)).fetchone()["id"]
    board = claim_task(conn, db_url, "TENSORBOARD", experiment_ids=(e1,), trial_ids=(t2,))
    transport = TaskTransport(db_url, board.allocation_id, board.token)
    try:
        rows = transport.tensorboard_sources()
    finally:
        transport.close()
    assert [(r["experiment_id"], r["trial_id"]) for r in rows] == [(e1, None), (e2, t2)]
    assert rows[1]["storage"]["bucket"] == "b"
    assert "access_key" not in rows[1]["storage"] and "secret_key" not in rows[1]["storage"]
    # another kind of task has no sources
    notebook = claim_task(conn, db_url, "NOTEBOOK")
    assert conn.execute("SELECT count(*) AS n FROM det_task.tensorboard_sources(%s)",
                        (notebook.token,)).fetchone()["n"] == 0
    # and a token that is no live run's is refused
    with pytest.raises(psycopg.errors.InvalidAuthorizationSpecification):
        conn.execute("SELECT * FROM det_task.tensorboard_sources('nope')")


def test_a_task_records_host_port_or_a_shells_user_at_host_port(
        conn: psycopg.Connection, db_url: str) -> None:
    shell = claim_task(conn, db_url, "SHELL")
    for good in ("10.0.0.5:2222", "root@10.0.0.5:2222", "det-user_1@host.example:22"):
        conn.execute("SELECT det_task.ready(%s, %s)", (shell.token, good))
        assert conn.execute("SELECT address FROM allocations WHERE id = %s",
                            (shell.allocation_id,)).fetchone()["address"] == good
    for bad in ("10.0.0.5", "a b@host:22", "@host:22", "root@host:22; rm", None):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="address: expected"):
            conn.execute("SELECT det_task.ready(%s, %s)", (shell.token, bad))
