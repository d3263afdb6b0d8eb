"""Reading interactive tasks (commands, notebooks, shells, TensorBoards): the list and one
task (``reporting.tasks``, which row-level security filters like every job), their logs, and
what ``det shell open`` and ``det notebook start`` wait for."""

import math

import psycopg

from det.errors import NotFoundError
from det.reconciler.tasks import go_duration
from det.sql import named

Q = named("queries")

KINDS = {"cmd": "COMMAND", "notebook": "NOTEBOOK", "shell": "SHELL",
         "tensorboard": "TENSORBOARD"}
"""``tasks.type`` of each ``det`` command group."""

NOUNS = {"COMMAND": "command", "NOTEBOOK": "notebook", "SHELL": "shell",
         "TENSORBOARD": "TensorBoard"}
"""How messages name a task of each kind."""

ENDED = "TERMINATED"
"""The state of a task whose run has ended (``allocation_state``)."""


def get_task(conn: psycopg.Connection, job_id: int, kind: str | None = None) -> dict:
    """The task ``job_id`` (TASK: ``reporting.tasks``' row), of ``kind`` (``tasks.type``) if
    given.

    Raises:
        NotFoundError: no such task, or one the user may not view (row-level security hides
            it); a task of another kind is named with the command that reads it.
    """
    row = conn.execute(Q.task, {"id": job_id}).fetchone()
    noun = NOUNS.get(kind or "", "task")
    if row is None:
        raise NotFoundError(f"{noun} {job_id} not found")
    if kind is not None and row["kind"] != kind:
        group = next(g for g, k in KINDS.items() if k == row["kind"])
        raise NotFoundError(f"{noun} {job_id} not found: job {job_id} is a "
                            f"{NOUNS[row['kind']]} (det {group} describe {job_id})")
    return row


def list_tasks(conn: psycopg.Connection, kind: str | None, all_: bool) -> list[dict]:
    """The tasks (queries.sql: tasks) of ``kind`` (None: every kind): the caller's live ones,
    or with ``all_`` every task they may view, ended ones included."""
    return conn.execute(Q.tasks, {"kind": kind, "all": all_}).fetchall()


def run_of(conn: psycopg.Connection, job_id: int) -> dict:
    """The state, address, exit code and end reason of task ``job_id``'s run (RUN).

    Raises:
        NotFoundError: no such task visible to the user.
    """
    row = conn.execute(Q.task_run, {"id": job_id}).fetchone()
    if row is None:
        raise NotFoundError(f"task {job_id} not found")
    return row


def idle_for(seconds: float | None) -> str:
    """``seconds`` idle as ``det task list`` shows it: whole seconds in Go's duration style,
    as det's end reasons say it (``45s``, ``10m0s``; det.reconciler.tasks.go_duration); ""
    for None (a task not running)."""
    if seconds is None:
        return ""
    return go_duration(max(0, math.floor(seconds)))


def logs_tail(conn: psycopg.Connection, job_id: int, limit: int) -> list[dict]:
    """The last ``limit`` lines of task ``job_id``'s output (every run of its job), oldest
    first (queries.sql: task_logs_tail): ``id``, ``stream``, ``line``."""
    return conn.execute(Q.task_logs_tail, {"job": job_id, "limit": limit}).fetchall()[::-1]
