"""The CLI of interactive tasks (issue 33) through the real `det` command: `det cmd run`
streams a command's output and exits with its status, each kind's list / describe / logs /
kill / set priority, `det task list`, the job queue showing tasks, `det shell open` over real
ssh, `det notebook start` printing its URL; bad input one line, writing nothing."""

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator

import pytest
import torch
from conftest import Det, private_env, wait_for
from psycopg.types.json import Jsonb
from test_cli import one_line_error
from test_rbac import CONFIG, Cluster

from det.cli.commands import exit_status
from det.cli.shells import ssh_argv
from det.errors import DetError
from det.queries.tasks import idle_for


def start_cluster(det, slots: int = 1) -> None:
    det.start("reconciler", "reconcile", "--interval", "0.3")
    det.start("agent", "agent", "run", "--id", "a1", "--slots", str(slots))


def task_rows(conn) -> dict[str, int]:
    """Row counts of what a task submission writes."""
    return {t: conn.execute(f"SELECT count(*) AS n FROM {t}").fetchone()["n"]
            for t in ("jobs", "tasks", "task_secrets", "allocations")}


def run_state(conn, job: int) -> str | None:
    row = conn.execute("SELECT state::text AS s FROM allocations WHERE job_id = %s",
                       (job,)).fetchone()
    return row and row["s"]


def test_cmd_run_streams_and_exits_with_the_commands_status(det, conn) -> None:
    """The issue's checks: torch's version printed and exit 0; `exit 3` makes det exit 3; a
    missing command gives its exit code (127, the shell's) and its log line."""
    start_cluster(det)
    r = det("cmd", "run", "--", "python", "-c", "import torch; print(torch.__version__)",
            timeout=240)
    assert r.stdout.strip().splitlines()[-1] == torch.__version__, r.stdout
    assert "Launched command 1" in r.stderr
    r = det("cmd", "run", "python", "-c", "import sys; print('bye'); sys.exit(3)",
            check=False, timeout=240)
    assert r.returncode == 3 and "bye" in r.stdout, (r.stdout, r.stderr)
    r = det("cmd", "run", "--", "no-such-command-h1", check=False, timeout=240)
    assert r.returncode == 127, (r.returncode, r.stdout, r.stderr)
    assert "no-such-command-h1" in r.stderr and "not found" in r.stderr
    # the same lines afterwards, from the database
    assert "not found" in det("cmd", "logs", "3").stderr
    assert torch.__version__ in det("task", "logs", "1").stdout


def test_cmd_run_with_context_config_file_and_template(det, conn, tmp_path) -> None:
    """`-c DIR` is the command's working directory; a template's environment variables and
    a --config-file's description reach the task, the file's values over the template's."""
    start_cluster(det)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "hello.txt").write_text("from the context\n")
    template = tmp_path / "t.yaml"
    template.write_text("description: from the template\n"
                        "environment: {environment_variables: [GREETING=hi]}\n")
    det("template", "set", "team", str(template))
    config = tmp_path / "task.yaml"
    config.write_text("description: greeter\n")
    r = det("cmd", "run", "-c", str(ctx), "--template", "team", "--config-file", str(config),
            "--", "sh", "-c", 'echo "$GREETING $(cat hello.txt)"', timeout=240)
    assert r.stdout.strip().splitlines()[-1] == "hi from the context", (r.stdout, r.stderr)
    assert json.loads(det("cmd", "list", "--all", "--json").stdout)[0]["description"] == \
        "greeter"


def test_list_describe_kill_and_the_queue(det, conn) -> None:
    """A long command: listed by its kind and by `det task list`, described (its secrets
    redacted), in the job queue with its type; killed, it leaves the default list (mine and
    live) for --all with who killed it."""
    start_cluster(det)
    job = int(det("cmd", "run", "--detach", "--config", "description=sleeper", "--config",
                  "environment.environment_variables=[HF_TOKEN=s3cret]", "--",
                  "sleep", "600").stdout.strip())
    wait_for(lambda: run_state(conn, job) == "RUNNING", 120, "the command to run")
    listed = det("cmd", "list").stdout
    assert "sleeper" in listed and "RUNNING" in listed
    tasks = json.loads(det("task", "list", "--json").stdout)
    assert [(t["id"], t["kind"], t["state"]) for t in tasks] == [(job, "COMMAND", "RUNNING")]
    assert tasks[0]["workspace"] == "Uncategorized" and tasks[0]["idle_seconds"] >= 0
    queue = json.loads(det("job", "list", "--json").stdout)
    assert [(j["job_id"], j["type"], j["name"], j["status"]) for j in queue] == [
        (job, "TYPE_COMMAND", "sleeper", "STATE_SCHEDULED")]
    described = det("cmd", "describe", str(job)).stdout
    assert "sleeper" in described and "[RUNNING]" in described and "sleep" in described
    assert "HF_TOKEN=********" in described and "s3cret" not in described
    # another kind's command names it for what it is
    r = det("notebook", "describe", str(job), check=False)
    assert f"job {job} is a command (det cmd describe {job})" in one_line_error(r)
    r = det("cmd", "set", "priority", str(job), "10", check=False)
    assert "priority applies only under the priority scheduler" in one_line_error(r)
    assert det("cmd", "kill", str(job)).stdout.strip() == f"Killed command {job}"
    wait_for(lambda: run_state(conn, job) == "TERMINATED", 60, "the killed command to end")
    assert str(job) not in det("cmd", "list").stdout.split("\n", 2)[-1]
    ended = json.loads(det("cmd", "list", "--all", "--json").stdout)
    assert ended[0]["end_reason"].startswith("killed by ")
    assert json.loads(det("job", "list", "--json").stdout) == []
    assert "no longer queued" in det("job", "explain", str(job)).stdout


def test_cmd_run_rides_out_a_database_restart(private_pg, det_env, tmp_path) -> None:
    """The database restarts while `det cmd run` streams: every line comes once, in order,
    and det still exits with the command's status."""
    pdet = Det(private_env(det_env, private_pg.url), tmp_path)
    try:
        start_cluster(pdet)
        ticker = "for i in $(seq 1 60); do echo line $i; sleep 0.1; done; exit 5"
        run = pdet.start("run", "cmd", "run", "--", "sh", "-c", ticker)
        wait_for(lambda: "line 10" in pdet.log("run"), 120, "the command's first lines")
        private_pg.restart(down=1.0)
        assert run.wait(120) == 5, pdet.log("run")
        assert "task 1: logs: database unavailable" in pdet.log("run")  # the fault hit it
        lines = [ln for ln in pdet.log("run").splitlines() if ln.startswith("line ")]
        assert lines == [f"line {i}" for i in range(1, 61)], pdet.log("run")
    finally:
        pdet.stop_all()


def test_a_waiting_task_says_why_and_one_killed_before_it_ran(det, conn, tmp_path) -> None:
    """No agent: the task waits and `det job explain` says why; `det cmd set priority` moves
    it in the priority scheduler's queue; `det cmd run` of a command killed before it ran
    exits 1 with the reason."""
    policy = tmp_path / "cluster.yaml"
    policy.write_text("scheduler: {type: priority}\n")
    det("cluster", "config", "apply", str(policy))
    det.start("reconciler", "reconcile", "--interval", "0.3")
    waiting = det.start("run", "cmd", "run", "--", "true")
    wait_for(lambda: run_state(conn, 1) == "PENDING", 60, "the command's run")
    explained = wait_for(lambda: (out := det("job", "explain", "1").stdout)
                         and "no agents" in out and out, 60, "the reason it waits")
    assert "pool default has no agents" in explained
    assert det("cmd", "set", "priority", "1", "10").stdout.strip() == \
        "command 1: priority set to 10"
    assert [(j["job_id"], j["priority"]) for j in
            json.loads(det("job", "list", "--json").stdout)] == [(1, 10)]
    det("cmd", "kill", "1")
    assert waiting.wait(60) == 1
    assert "Error: the command did not run: killed by " in det.log("run")


def test_bad_input_is_one_line_and_writes_nothing(det, conn) -> None:
    """Unknown ids, an invalid idle type, a bad priority, slots no agent can hold: one line,
    exit 1, no row written."""
    before = task_rows(conn)
    for args in (["cmd", "describe", "999"], ["notebook", "kill", "999"],
                 ["shell", "open", "999"], ["task", "logs", "999"],
                 ["tensorboard", "set", "priority", "999", "5"]):
        assert "999 not found" in one_line_error(det(*args, check=False))
    r = det("notebook", "start", "--no-browser", "--config", "notebook_idle_type=busy",
            check=False)
    assert "notebook_idle_type" in one_line_error(r)
    assert "N: " in one_line_error(det("cmd", "set", "priority", "1", "100", check=False))
    r = det("tensorboard", "start", "--no-browser", check=False)
    assert "EXPERIMENT_ID" in one_line_error(r)
    r = det("tensorboard", "start", "--no-browser", "4242", check=False)
    assert "experiment 4242: not found" in one_line_error(r)
    conn.execute("SELECT det_agent.register('small', 'host', 'default', 'process', %s)",
                 (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
    r = det("cmd", "run", "--config", "resources.slots=4", "--", "true", check=False)
    assert "resources.slots" in one_line_error(r) and "--force" in r.stderr
    assert task_rows(conn) == before


@pytest.fixture
def cluster(db_url: str) -> Iterator[Cluster]:
    c = Cluster(db_url)
    yield c
    c.owner.close()


def test_another_users_task(cluster: Cluster, det, conn) -> None:
    """A task in a workspace bob has no role in is not found for him (row-level security);
    carol, a Viewer there, sees it but may not kill it or open its shell."""
    det("workspace", "create", "private")
    det("project", "create", "private", "p")
    for name in ("bob", "carol"):
        cluster.user(name)
    det("rbac", "assign-role", "Viewer", "--username-to-assign", "carol",
        "--workspace-name", "private")
    job = int(det("shell", "start", "--detach", "--force", "-w", "private", "--project",
                  "p").stdout.strip())
    as_bob = {"DET_DB_URL": cluster.url_of("bob")}
    as_carol = {"DET_DB_URL": cluster.url_of("carol")}
    for args in (["shell", "describe", str(job)], ["shell", "kill", str(job)],
                 ["shell", "show_ssh_command", str(job)], ["task", "logs", str(job)]):
        assert f"shell {job} not found" in one_line_error(det(*args, check=False, **as_bob)) \
            or f"task {job} not found" in det(*args, check=False, **as_bob).stderr
    assert json.loads(det("task", "list", "--all", "--json", **as_bob).stdout) == []
    assert [t["id"] for t in json.loads(det("task", "list", "--all", "--json",
                                            **as_carol).stdout)] == [job]
    for args in (["shell", "kill", str(job)], ["shell", "open", str(job)]):
        assert "needs Editor on workspace 'private'" in one_line_error(
            det(*args, check=False, **as_carol))
    assert run_state(conn, job) == "PENDING"


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (0.4, "0s"), (59.9, "59s"), (60, "1m0s"), (600.5, "10m0s"), (3725, "1h2m5s"),
    (-0.2, "0s"), (None, "")])
def test_idle_for_is_whole_seconds_in_gos_style(seconds, text) -> None:
    """A clock a little ahead of the database's never shows a negative idle time."""
    assert idle_for(seconds) == text


@pytest.mark.parametrize(("code", "status"), [(0, 0), (3, 3), (127, 127), (-9, 137),
                                              (-15, 143)])
def test_exit_status(code, status) -> None:
    run = {"exit_code": code, "end_reason": None, "state": "TERMINATED", "claimed": True}
    assert exit_status(run) == status
    assert exit_status({**run, "claimed": False}) == 1


def test_ssh_argv_logs_in_as_the_user_the_task_recorded() -> None:
    argv = ssh_argv("alice@10.0.0.5:2222", "/tmp/k", ["hostname"])
    assert argv[:5] == ["ssh", "-i", "/tmp/k", "-p", "2222"]
    assert argv[-2:] == ["alice@10.0.0.5", "hostname"]
    assert "StrictHostKeyChecking=no" in argv and "UserKnownHostsFile=/dev/null" in argv
    assert ssh_argv("root@[::1]:22", "k", [])[-1] == "root@::1"
    with pytest.raises(DetError, match="names no user"):
        ssh_argv("10.0.0.5:2222", "k", [])


@pytest.mark.skipif(shutil.which("ssh") is None or shutil.which(
    "sshd", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") is None,
    reason="no ssh client or sshd is installed (Debian's openssh-server: .ci/run installs it)")
def test_shell_open_runs_ssh_into_the_task(det, conn) -> None:
    """`det shell open ID -- hostname` prints the task's hostname over real ssh, as does
    the command show_ssh_command prints; `det shell start` opens the new shell."""
    start_cluster(det)
    job = int(det("shell", "start", "--detach").stdout.strip())
    r = det("shell", "open", str(job), "--", "hostname", timeout=240)
    assert r.stdout.strip() == socket.gethostname(), (r.stdout, r.stderr)
    shown = det("shell", "show_ssh_command", str(job)).stdout.strip()
    assert shown.startswith("ssh -i ") and "-p " in shown
    out = subprocess.run([*shown.split(), "hostname"], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == socket.gethostname(), out.stderr
    det("shell", "kill", str(job))
    # start without --detach: the id, then ssh (its commands from stdin here, no terminal)
    r = det("shell", "start", input="hostname\nexit 4\n", check=False, timeout=240)
    assert r.returncode == 4, (r.stdout, r.stderr)
    assert r.stdout.split() == [str(job + 1), socket.gethostname()], (r.stdout, r.stderr)


def test_notebook_and_tensorboard_start_print_the_proxy_url(det, conn, tmp_path) -> None:
    """`det notebook start --no-browser` waits for JupyterLab, then prints
    `<det serve>/proxy/<id>/` (DET_MASTER's); with no det serve known it prints the path and
    says so. `det tensorboard start EXPERIMENT_ID` likewise, once TensorBoard answers."""
    start_cluster(det)
    r = det("notebook", "start", "--no-browser", "--config", "resources.slots=0",
            timeout=240, DET_MASTER="http://det.example:8080")
    assert r.stdout.strip() == "http://det.example:8080/proxy/1/", (r.stdout, r.stderr)
    assert "/proxy/1/ (no det serve found: set DET_MASTER" in det(
        "notebook", "open", "1", "--no-browser").stdout
    # an experiment whose storage TensorBoard cannot read: its server never answers
    exp = conn.execute("SELECT det_user.create_experiment(%s, '', NULL, NULL, NULL) AS id",
                       (Jsonb(CONFIG),)).fetchone()["id"]
    r = det("tensorboard", "start", str(exp), "--no-browser", check=False, timeout=240)
    assert r.returncode == 1 and "has no event files" in r.stderr.splitlines()[-1], r.stderr
    storage = {"type": "shared_fs", "host_path": str(tmp_path / "checkpoints")}
    exp = conn.execute("SELECT det_user.create_experiment(%s, '', NULL, NULL, NULL) AS id",
                       (Jsonb({**CONFIG, "checkpoint_storage": storage}),)).fetchone()["id"]
    r = det("tensorboard", "start", str(exp), "--no-browser", timeout=240, check=False,
            DET_MASTER="det.example:8080")
    board = int(r.stderr.split("Launched TensorBoard ")[1].split()[0])
    assert r.stdout.strip() == f"http://det.example:8080/proxy/{board}/", (
        r.stdout, r.stderr, det("task", "logs", str(board)).stdout,
        det("task", "logs", str(board)).stderr)
    tasks = json.loads(det("task", "list", "--json").stdout)
    assert [(t["kind"], t["state"]) for t in tasks] == [("NOTEBOOK", "RUNNING"),
                                                        ("TENSORBOARD", "RUNNING")]
    assert f"experiments [{exp}]" in det("tensorboard", "describe", str(board)).stdout
    det("notebook", "kill", "1")
    det("tensorboard", "kill", str(board))
