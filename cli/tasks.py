"""``det cmd``, ``det notebook``, ``det shell``, ``det tensorboard`` and ``det task``:
interactive tasks, with Determined 0.38's command names. Each kind has ``list``, ``describe``,
``logs``, ``kill`` and ``set priority``; each submission is one transaction through
:func:`det.submission.submit_task`, as an experiment's is."""

import json
import os
import subprocess
import tempfile
import time
import webbrowser
from pathlib import Path

import typer
from psycopg.rows import dict_row

from det.cli.output import print_json, print_table
from det.cli.session import db
from det.configs.job import job_change, parse_job_id
from det.configs.load import read_config_file
from det.db import database_url, det_home
from det.db.reconnect import Reconnecting
from det.errors import DetError
from det.queries.tasks import (
    ENDED,
    LAST_ERROR_LINE,
    LOGS_AFTER,
    NOUNS,
    get_task,
    go_duration,
    list_tasks,
    run_of,
)

POLL_SECONDS = 0.25
"""How often a waiting command reads its task's run (a wake-up costs one indexed read)."""

# Options every start command shares (Determined's names); typer reads each as metadata only.
CONFIG_FILE = typer.Option(None, "--config-file", metavar="FILE",
                           help="Task config (YAML): description, environment, resources, "
                                "bind_mounts, work_dir, idle_timeout, notebook_idle_type.")
CONFIG = typer.Option([], "--config", metavar="KEY=VALUE",
                      help="Override a config key (dotted, e.g. resources.slots=0; the value "
                           "is YAML). Repeatable.")
TEMPLATE = typer.Option(None, "--template",
                        help="Merge this configuration template under the config.")
CONTEXT = typer.Option(None, "--context", "-c", metavar="DIR",
                       help="A directory uploaded as the task's working directory.")
WORKSPACE = typer.Option(None, "--workspace", "-w",
                         help="Workspace to place it in (with --project; default "
                              "Uncategorized).")
PROJECT = typer.Option(None, "--project", help="Project (of --workspace) to place it in.")
FORCE = typer.Option(False, "--force",
                     help="Submit even if no agent of the pool could ever hold its slots.")
ID = typer.Argument(..., metavar="ID")
JSON = typer.Option(False, "--json", help="Print JSON.")


def submit(kind: str, config_file: Path | None, overrides: list[str], template: str | None,
           context_dir: Path | None, workspace: str | None, project: str | None,
           force: bool, entrypoint: list[str] | None = None,
           experiment_ids: tuple[int, ...] = (), trial_ids: tuple[int, ...] = ()) -> int:
    """Submit a task of ``kind`` (one transaction, :func:`det.submission.submit_task`) and
    say so on stderr (stdout stays the task's); returns its id.

    Raises:
        ConfigError: a bad config, override or context, or slots no agent can hold (unless
            ``force``), naming the field.
    """
    from det.submission import expand_task_config, submit_task, template_for_submission

    text = read_config_file(config_file) if config_file is not None else None
    source = str(config_file) if config_file is not None else "--config"
    with db() as conn:
        tpl = (template_for_submission(conn, template, workspace)
               if template is not None else None)
        expanded = expand_task_config(conn, kind, text, source, overrides, tpl, workspace,
                                      entrypoint)
        job = submit_task(conn, kind, expanded, context_dir, workspace, project,
                          experiment_ids, trial_ids, force)
    typer.echo(f"Launched {NOUNS[kind]} {job}", err=True)
    return job


def follow_logs(job: int, follow: bool) -> dict:
    """Print task ``job``'s output (stderr lines to stderr, det's own notes prefixed
    ``[det]``); with ``follow``, until its run ends. Returns the run (:func:`run_of`). Rides
    out database restarts: lines are read by id after the last one printed, so none is
    printed twice or skipped."""
    after = 0

    def lines(conn) -> list[dict]:
        return conn.execute(LOGS_AFTER, {"job": job, "after": after,
                                          "limit": 5000}).fetchall()

    what = f"task {job}: logs"
    with Reconnecting(database_url(), row_factory=dict_row) as session:
        while True:
            rows = session.run(what, lines)
            for r in rows:
                prefix = "[det] " if r["stream"] == "det" else ""
                typer.echo(f"{prefix}{r['line']}", err=r["stream"] == "stderr")
                after = r["id"]
            if rows:
                continue
            run = session.run(what, lambda c: run_of(c, job))
            if not follow or run["state"] == ENDED:
                # One more read: lines flushed between the last read and the state check.
                if not session.run(what, lines):
                    return run
                continue
            time.sleep(POLL_SECONDS)


def wait_ready(job: int) -> dict:
    """Wait until task ``job``'s server answers (its run RUNNING with an address); returns
    the run (:func:`run_of`).

    Raises:
        DetError: the task ended first, with its end reason and its last line of stderr.
    """
    noticed = False
    with Reconnecting(database_url(), row_factory=dict_row) as session:
        while True:
            run = session.run(f"task {job}: state", lambda c: run_of(c, job))
            if run["state"] == "RUNNING" and run["address"]:
                return run
            if run["state"] == ENDED:
                why = run["end_reason"] or f"exit code {run['exit_code']}"
                last = session.run(f"task {job}: logs", lambda c: c.execute(
                    LAST_ERROR_LINE, {"job": job}).fetchone())
                said = f": {last['line']}" if last else ""
                raise DetError(f"task {job} ended before its server answered: {why}{said} "
                               f"(det task logs {job})")
            if not noticed:
                typer.echo(f"Waiting for task {job} to start ({run['state']})...", err=True)
                noticed = True
            time.sleep(POLL_SECONDS)


def exit_status(run: dict) -> int:
    """The exit status ``det cmd run`` ends with for a command's ended ``run``
    (:func:`run_of`): the command's own, 128 + N for a command killed by signal N (as a
    shell says), 1 if no agent ever took it or it has no exit code (the reason printed on
    stderr)."""
    code = run["exit_code"]
    if code is None or not run["claimed"]:
        typer.echo(f"Error: the command did not run: {run['end_reason'] or run['state']}",
                   err=True)
        return 1
    if code != 0 and run["end_reason"]:
        typer.echo(f"[det] {run['end_reason']}", err=True)
    return 128 - code if code < 0 else min(code, 255)


def serve_url() -> str | None:
    """Where det serve answers: ``DET_MASTER`` (Determined's variable), else the web server
    ``det cluster up`` runs on this machine; None if neither."""
    url = os.environ.get("DET_MASTER")
    if url:
        return (url if "://" in url else f"http://{url}").rstrip("/")
    from det.cli.cluster import running_web_url

    url = running_web_url()
    return url.rstrip("/") if url else None


def open_url(job: int, browser: bool) -> None:
    """Print the proxy URL of task ``job`` and, with ``browser``, open it in a browser."""
    path = f"/proxy/{job}/"
    base = serve_url()
    if base is None:
        typer.echo(f"{path} (no det serve found: set DET_MASTER to its URL, or run "
                   "det cluster up)")
        return
    typer.echo(f"{base}{path}")
    if browser:
        webbrowser.open(f"{base}{path}")


# -- det shell open ------------------------------------------------------------------------------

SSH_OPTIONS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR"]
"""Every task's sshd has a new host key, so none is remembered or checked; the task's own
key is the only one offered."""


def ssh_argv(address: str, key_file: str, ssh_args: list[str]) -> list[str]:
    """The ``ssh`` command line that logs in to a shell at its run's ``address``
    (``user@host:port``: the task's sshd lets in its own user alone, recorded by the task,
    det.harness.interactive.shell) with the private key in ``key_file``, then ``ssh_args``.

    Raises:
        DetError: an address without its user.
    """
    user, at, host_port = address.rpartition("@")
    if not at:
        raise DetError(f"the shell's address {address!r} names no user")
    host, _, port = host_port.rpartition(":")
    return ["ssh", "-i", key_file, "-p", port, *SSH_OPTIONS, f"{user}@{host.strip('[]')}",
            *ssh_args]


def ssh_key(conn, job: int) -> str:
    """The private key that opens shell ``job`` (det_task_ssh_key).

    Raises:
        NotFoundError / PermissionDeniedError: not a shell the caller may open (Editor).
    """
    key = conn.execute("SELECT det_task_ssh_key(%s) AS k", (job,)).fetchone()["k"]
    return key if key.endswith("\n") else key + "\n"  # ssh refuses a key without it


def write_key(path: str | Path, key: str) -> None:
    """Write ``key`` to ``path``, readable by its owner alone (ssh refuses any other)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)


def open_shell(job: int, ssh_args: list[str]) -> int:
    """Run the system ``ssh`` into shell ``job`` once its server answers; returns ssh's exit
    status. The private key lives in a 0600 temporary file removed afterwards."""
    with db() as conn:
        key = ssh_key(conn, job)  # refused before any wait
    run = wait_ready(job)
    with tempfile.TemporaryDirectory(prefix=f"det-shell-{job}-") as tmp:
        key_file = str(Path(tmp) / "key")
        write_key(key_file, key)
        return subprocess.run(ssh_argv(run["address"], key_file, ssh_args)).returncode


# -- each kind's commands ------------------------------------------------------------------------

def _rows_for_table(rows: list[dict]) -> list[dict]:
    for r in rows:
        r["idle_for"] = go_duration(r["idle_seconds"])
    return rows


def add_common(app: typer.Typer, kind: str) -> None:
    """Add the commands every kind has to ``app``: list, describe, logs, kill, set
    priority."""
    noun = NOUNS[kind]

    @app.command("list")
    def list_(all_: bool = typer.Option(False, "--all", "-a",
                                        help="Every user's, ended ones too."),
              json_: bool = JSON) -> None:
        """Your live tasks of this kind (with --all, every one you may view)."""
        with db() as conn:
            rows = list_tasks(conn, kind, all_)
        if json_:
            print_json(rows)
            return
        print_table(_rows_for_table(rows),
                    ["id", "owner", "workspace", "description", "state", "started", "idle_for",
                     "end_reason", "resource_pool"],
                    ["ID", "Owner", "Workspace", "Description", "State", "Started", "Idle for",
                     "End reason", "Pool"])

    app.command("ls", hidden=True)(list_)

    @app.command("describe")
    def describe(job: int = ID, json_: bool = JSON) -> None:
        """State, owner, workspace, pool, times, end reason, address and config."""
        with db() as conn:
            task = get_task(conn, parse_job_id(job, "ID"), kind)
        if json_:
            print_json(task)
            return
        typer.echo(f"{noun} {task['id']}: {task['description']}  [{task['state']}]  "
                   f"owner {task['owner']}")
        typer.echo(f"workspace {task['workspace']}, project {task['project']}, resource pool "
                   f"{task['resource_pool']}, priority {task['priority']}, slots "
                   f"{task['slots']}")
        typer.echo(f"submitted {_time(task['submitted_at'])}, started "
                   f"{_time(task['started'])}, ended {_time(task['ended'])}")
        if task["idle_seconds"] is not None:
            typer.echo(f"idle for {go_duration(task['idle_seconds'])}")
        if task["address"]:
            typer.echo(f"server at {task['address']} (agent {task['agent_id']})")
        if task["pending_reason"] and task["state"] == "PENDING":
            typer.echo(f"waiting: {task['pending_reason']}")
        if task["end_reason"] or task["exit_code"] is not None:
            typer.echo(f"ended: {task['end_reason'] or '-'} (exit code "
                       f"{'-' if task['exit_code'] is None else task['exit_code']})")
        if task["experiment_ids"] or task["trial_ids"]:
            typer.echo(f"experiments {task['experiment_ids']}, trials {task['trial_ids']}")
        typer.echo(f"config: {json.dumps(task['config'], sort_keys=True)}")

    @app.command("logs")
    def logs(job: int = ID,
             follow: bool = typer.Option(False, "--follow", "-f",
                                         help="Keep streaming until it ends.")) -> None:
        """The task's stdout and stderr (and det's own notes on its run)."""
        job = parse_job_id(job, "ID")
        with db() as conn:
            get_task(conn, job, kind)
        follow_logs(job, follow)

    @app.command("kill")
    def kill(job: int = ID) -> None:
        """End the task now (Editor of its workspace)."""
        job = parse_job_id(job, "ID")
        with db() as conn, conn.transaction():
            get_task(conn, job, kind)
            conn.execute("SELECT det_task_kill(%s)", (job,))
        typer.echo(f"Killed {noun} {job}")

    set_app = typer.Typer(no_args_is_help=True)
    app.add_typer(set_app, name="set", help="Change the task's scheduling settings.")

    @set_app.command("priority")
    def set_priority(job: int = ID,
                     priority: str = typer.Argument(..., metavar="N",
                                                    help="1-99; lower runs first.")) -> None:
        """Set the task's priority (priority scheduler); a running task is never preempted,
        so this changes only where a waiting one stands in the queue."""
        job = parse_job_id(job, "ID")
        value = job_change("priority", priority, "N")  # checked before the transaction
        with db() as conn, conn.transaction():
            get_task(conn, job, kind)
            conn.execute("SELECT det_job_update(%s, 'priority', %s)", (job, value))
        typer.echo(f"{noun} {job}: priority set to {value}")


def _time(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


# -- det cmd ---------------------------------------------------------------------------------------

cmd_app = typer.Typer(no_args_is_help=True)


@cmd_app.command("run", context_settings={"allow_interspersed_args": False})
def run(
    command: list[str] = typer.Argument(..., metavar="[--] CMD...",
                                        help="The command and its arguments, run as is."),
    config_file: Path = CONFIG_FILE, config: list[str] = CONFIG, template: str = TEMPLATE,
    context_dir: Path = CONTEXT, workspace: str = WORKSPACE, project: str = PROJECT,
    force: bool = FORCE,
    detach: bool = typer.Option(False, "--detach", "-d",
                                help="Print the id and return; do not stream its output."),
) -> None:
    """Run a command on the cluster: streams its output and exits with its exit status
    (1, with the reason, if it never ran)."""
    job = submit("COMMAND", config_file, config, template, context_dir, workspace, project,
                 force, entrypoint=command)
    if detach:
        typer.echo(job)
        return
    raise typer.Exit(exit_status(follow_logs(job, follow=True)))


# -- det shell -----------------------------------------------------------------------------------

shell_app = typer.Typer(no_args_is_help=True)


@shell_app.command("start")
def shell_start(
    config_file: Path = CONFIG_FILE, config: list[str] = CONFIG, template: str = TEMPLATE,
    context_dir: Path = CONTEXT, workspace: str = WORKSPACE, project: str = PROJECT,
    force: bool = FORCE,
    detach: bool = typer.Option(False, "--detach", "-d", help="Print the id; do not open it."),
) -> None:
    """Start a shell (an SSH server in a task) and open it with ssh."""
    job = submit("SHELL", config_file, config, template, context_dir, workspace, project, force)
    typer.echo(job)
    if not detach:
        raise typer.Exit(open_shell(job, []))


@shell_app.command("open", context_settings={"allow_interspersed_args": False})
def shell_open(job: int = ID,
               ssh_args: list[str] = typer.Argument(None, metavar="[-- SSH_ARGS...]",
                                                    help="Passed to ssh (a command to run)."),
               ) -> None:
    """Log in to the shell with the system ssh and the task's own key (Editor of its
    workspace); exits with ssh's status."""
    job = parse_job_id(job, "ID")
    with db() as conn:
        get_task(conn, job, "SHELL")
    raise typer.Exit(open_shell(job, list(ssh_args or [])))


@shell_app.command("show_ssh_command")
def show_ssh_command(job: int = ID) -> None:
    """Print the ssh command that opens the shell; its key is saved, readable by you alone,
    under det's home."""
    job = parse_job_id(job, "ID")
    with db() as conn:
        get_task(conn, job, "SHELL")
        key = ssh_key(conn, job)  # refused before any wait
    run = wait_ready(job)
    keys = det_home() / "ssh"
    keys.mkdir(mode=0o700, parents=True, exist_ok=True)
    key_file = keys / f"shell-{job}.key"
    write_key(key_file, key)
    typer.echo(" ".join(ssh_argv(run["address"], str(key_file), [])))


# -- det notebook, det tensorboard ---------------------------------------------------------------

NO_BROWSER = typer.Option(False, "--no-browser", help="Print the URL only.")

notebook_app = typer.Typer(no_args_is_help=True)


@notebook_app.command("start")
def notebook_start(
    config_file: Path = CONFIG_FILE, config: list[str] = CONFIG, template: str = TEMPLATE,
    context_dir: Path = CONTEXT, workspace: str = WORKSPACE, project: str = PROJECT,
    force: bool = FORCE, no_browser: bool = NO_BROWSER,
) -> None:
    """Start JupyterLab; once it answers, print its URL (through det serve) and open it."""
    job = submit("NOTEBOOK", config_file, config, template, context_dir, workspace, project,
                 force)
    wait_ready(job)
    open_url(job, not no_browser)


tensorboard_app = typer.Typer(no_args_is_help=True)


@tensorboard_app.command("start")
def tensorboard_start(
    experiment_ids: list[int] = typer.Argument(None, metavar="EXPERIMENT_ID..."),
    trial_ids: list[int] = typer.Option([], "--trial-ids", "-t", metavar="TRIAL_ID",
                                        help="A trial to show. Repeatable."),
    config_file: Path = CONFIG_FILE, config: list[str] = CONFIG, template: str = TEMPLATE,
    context_dir: Path = CONTEXT, workspace: str = WORKSPACE, project: str = PROJECT,
    force: bool = FORCE, no_browser: bool = NO_BROWSER,
) -> None:
    """Start TensorBoard over the metrics of experiments and trials (you may view them);
    once it answers, print its URL (through det serve) and open it."""
    if not experiment_ids and not trial_ids:
        raise DetError("give at least one EXPERIMENT_ID or --trial-ids TRIAL_ID")
    job = submit("TENSORBOARD", config_file, config, template, context_dir, workspace,
                 project, force, experiment_ids=tuple(experiment_ids or ()),
                 trial_ids=tuple(trial_ids))
    wait_ready(job)
    open_url(job, not no_browser)


def _open_command(kind: str):
    def open_(job: int = ID, no_browser: bool = NO_BROWSER) -> None:
        """Print the task's URL (through det serve) once it answers, and open it."""
        job = parse_job_id(job, "ID")
        with db() as conn:
            get_task(conn, job, kind)
        wait_ready(job)
        open_url(job, not no_browser)
    return open_


notebook_app.command("open")(_open_command("NOTEBOOK"))
tensorboard_app.command("open")(_open_command("TENSORBOARD"))
for _app, _kind in ((cmd_app, "COMMAND"), (shell_app, "SHELL"), (notebook_app, "NOTEBOOK"),
                    (tensorboard_app, "TENSORBOARD")):
    add_common(_app, _kind)


# -- det task ------------------------------------------------------------------------------------

task_app = typer.Typer(no_args_is_help=True)


@task_app.command("list")
def task_list(all_: bool = typer.Option(False, "--all", "-a",
                                        help="Every user's, ended ones too."),
              json_: bool = JSON) -> None:
    """Your live tasks of every kind (with --all, every one you may view)."""
    with db() as conn:
        rows = list_tasks(conn, None, all_)
    if json_:
        print_json(rows)
        return
    print_table(_rows_for_table(rows),
                ["id", "kind", "state", "owner", "workspace", "description", "started",
                 "idle_for", "end_reason"],
                ["ID", "Kind", "State", "Owner", "Workspace", "Description", "Started",
                 "Idle for", "End reason"])


task_app.command("ls", hidden=True)(task_list)


@task_app.command("logs")
def task_logs(job: int = ID,
              follow: bool = typer.Option(False, "--follow", "-f",
                                          help="Keep streaming until it ends.")) -> None:
    """Any task's stdout and stderr (and det's own notes on its run)."""
    job = parse_job_id(job, "ID")
    with db() as conn:
        get_task(conn, job)
    follow_logs(job, follow)

