"""Reading interactive tasks (commands, notebooks, shells, TensorBoards): the list and one
task (``reporting.tasks``, which row-level security filters like every job), their logs, and
what ``det shell open`` and ``det notebook start`` wait for."""

import math

import psycopg

from det.errors import NotFoundError
from det.reconciler.tasks import go_duration

KINDS = {"cmd": "COMMAND", "notebook": "NOTEBOOK", "shell": "SHELL",
         "tensorboard": "TENSORBOARD"}
"""``tasks.type`` of each ``det`` command group."""

NOUNS = {"COMMAND": "command", "NOTEBOOK": "notebook", "SHELL": "shell",
         "TENSORBOARD": "TensorBoard"}
"""How messages name a task of each kind."""

# Live means the task's run has not ended; "mine" is the session's det user (det_caller), the
# owner det_create_task recorded.
TASKS = """
SELECT id, kind, state, owner, workspace, project, description, resource_pool, priority,
       slots, submitted_at, started, ended, idle_seconds, end_reason, exit_code, address
  FROM reporting.tasks
 WHERE (%(kind)s::text IS NULL OR kind = %(kind)s)
   AND (%(all)s OR (owner = det_caller() AND state <> 'TERMINATED'))
 ORDER BY id
"""

TASK = """
SELECT id, kind, state, desired_state, owner, workspace, project, description, resource_pool,
       priority, weight, slots, submitted_at, started, ended, last_activity, idle_seconds,
       end_reason, exit_code, address, agent_id, pending_reason, experiment_ids, trial_ids,
       allocation_id, config
  FROM reporting.tasks WHERE id = %(id)s
"""

# The task's output in order, from every run of its job (a task has one), after a log id.
LOGS_AFTER = """
SELECT l.id, l.stream, l.line FROM task_logs l
 WHERE l.allocation_id IN (SELECT a.id FROM allocations a WHERE a.job_id = %(job)s)
   AND l.id > %(after)s
 ORDER BY l.id LIMIT %(limit)s
"""

# The task's last line of stderr (or det's own note): why a server that exited early did.
LAST_ERROR_LINE = """
SELECT l.line FROM task_logs l
 WHERE l.allocation_id IN (SELECT a.id FROM allocations a WHERE a.job_id = %(job)s)
   AND l.stream IN ('stderr', 'det')
 ORDER BY l.id DESC LIMIT 1
"""

# Where a task's run is: its state, the host:port its server answers on once it does, and
# whether an agent ever took it (a run stopped before that "ends" with exit code 0).
RUN = """
SELECT a.state::text AS state, a.address, a.exit_code, a.started_at IS NOT NULL AS claimed,
       coalesce(t.end_reason, a.storage_error, a.exit_reason) AS end_reason
  FROM tasks t JOIN allocations a ON a.job_id = t.job_id
 WHERE t.job_id = %(id)s ORDER BY a.run DESC LIMIT 1
"""

ENDED = "TERMINATED"
"""The state of a task whose run has ended (``allocation_state``)."""


def get_task(conn: psycopg.Connection, job_id: int, kind: str | None = None) -> dict:
    """The task ``job_id`` (TASK: ``reporting.tasks``' row), of ``kind`` (``tasks.type``) if
    given.

    Raises:
        NotFoundError: no such task, or one the user may not view (row-level security hides
            it); a task of another kind is named with the command that reads it.
    """
    row = conn.execute(TASK, {"id": job_id}).fetchone()
    noun = NOUNS.get(kind or "", "task")
    if row is None:
        raise NotFoundError(f"{noun} {job_id} not found")
    if kind is not None and row["kind"] != kind:
        group = next(g for g, k in KINDS.items() if k == row["kind"])
        raise NotFoundError(f"{noun} {job_id} not found: job {job_id} is a "
                            f"{NOUNS[row['kind']]} (det {group} describe {job_id})")
    return row


def list_tasks(conn: psycopg.Connection, kind: str | None, all_: bool) -> list[dict]:
    """The tasks (TASKS) of ``kind`` (None: every kind): the caller's live ones, or with
    ``all_`` every task they may view, ended ones included."""
    return conn.execute(TASKS, {"kind": kind, "all": all_}).fetchall()


def run_of(conn: psycopg.Connection, job_id: int) -> dict:
    """The state, address, exit code and end reason of task ``job_id``'s run (RUN).

    Raises:
        NotFoundError: no such task visible to the user.
    """
    row = conn.execute(RUN, {"id": job_id}).fetchone()
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
