"""``det task`` and what every kind of interactive task shares (``det cmd``, ``det shell``,
``det notebook``, ``det tensorboard``: det.cli.commands, det.cli.shells, det.cli.notebooks),
with Determined 0.38's command names: each kind's ``list``, ``describe``, ``logs``, ``kill``
and ``set priority``, the start commands' options, submission (one transaction through
:func:`det.submission.submit_task`, as an experiment's), following a task's logs, waiting for
its server."""

import json
import time
from pathlib import Path

import typer
from psycopg.rows import dict_row

from det.cli.logs import stream_log_rows
from det.cli.output import print_json, print_table
from det.cli.session import db
from det.configs.job import job_change, parse_job_id
from det.configs.load import read_config_file
from det.db import database_url
from det.db.reconnect import Reconnecting
from det.errors import DetError
from det.queries.tasks import (
    ENDED,
    NOUNS,
    get_task,
    idle_for,
    list_tasks,
    run_of,
)
from det.sql import named

Q = named("cli")
READ = named("queries")

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
    """Print task ``job``'s output, its stderr on stderr (:func:`det.cli.logs.stream_log_rows`);
    with ``follow``, until its run ends. Returns the run (:func:`run_of`)."""
    stream_log_rows(f"task {job}: logs",
                    lambda c, after: c.execute(READ.task_logs_after, {"job": job, "after": after,
                                                                      "limit": 5000}).fetchall(),
                    (lambda c: run_of(c, job)["state"] == ENDED) if follow else None,
                    POLL_SECONDS, split=True)
    with Reconnecting(database_url(), row_factory=dict_row) as session:
        return session.run(f"task {job}: state", lambda c: run_of(c, job))


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
                    READ.task_last_error_line, {"job": job}).fetchone())
                said = f": {last['line']}" if last else ""
                raise DetError(f"task {job} ended before its server answered: {why}{said} "
                               f"(det task logs {job})")
            if not noticed:
                typer.echo(f"Waiting for task {job} to start ({run['state']})...", err=True)
                noticed = True
            time.sleep(POLL_SECONDS)


# -- each kind's commands ------------------------------------------------------------------------

def _rows_for_table(rows: list[dict]) -> list[dict]:
    for r in rows:
        r["idle_for"] = idle_for(r["idle_seconds"])
    return rows


TASK_COLUMNS = {"id": "ID", "kind": "Kind", "state": "State", "owner": "Owner",
                "workspace": "Workspace", "description": "Description", "started": "Started",
                "idle_for": "Idle for", "end_reason": "End reason", "resource_pool": "Pool"}
"""The columns of a task list, by row key; one kind's list leaves out Kind."""


def print_tasks(kind: str | None, all_: bool, json_: bool) -> None:
    """Print the live tasks of ``kind`` (None: every kind) the user started, or with ``all_``
    every task they may view, as a table or as JSON."""
    with db() as conn:
        rows = list_tasks(conn, kind, all_)
    if json_:
        print_json(rows)
        return
    columns = {k: v for k, v in TASK_COLUMNS.items() if kind is None or k != "kind"}
    print_table(_rows_for_table(rows), list(columns), list(columns.values()))


def add_common(app: typer.Typer, kind: str) -> None:
    """Add the commands every kind has to ``app``: list, describe, logs, kill, set
    priority."""
    noun = NOUNS[kind]

    @app.command("list")
    def list_(all_: bool = typer.Option(False, "--all", "-a",
                                        help="Every user's, ended ones too."),
              json_: bool = JSON) -> None:
        """Your live tasks of this kind (with --all, every one you may view)."""
        print_tasks(kind, all_, json_)

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
            typer.echo(f"idle for {idle_for(task['idle_seconds'])}")
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
            conn.execute(Q.task_kill, (job,))
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
            conn.execute(Q.job_set_priority, (job, value))
        typer.echo(f"{noun} {job}: priority set to {value}")


def _time(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


# -- det task ------------------------------------------------------------------------------------

app = typer.Typer(no_args_is_help=True)


@app.command("list")
def task_list(all_: bool = typer.Option(False, "--all", "-a",
                                        help="Every user's, ended ones too."),
              json_: bool = JSON) -> None:
    """Your live tasks of every kind (with --all, every one you may view)."""
    print_tasks(None, all_, json_)


app.command("ls", hidden=True)(task_list)


@app.command("logs")
def task_logs(job: int = ID,
              follow: bool = typer.Option(False, "--follow", "-f",
                                          help="Keep streaming until it ends.")) -> None:
    """Any task's stdout and stderr (and det's own notes on its run)."""
    job = parse_job_id(job, "ID")
    with db() as conn:
        get_task(conn, job)
    follow_logs(job, follow)

