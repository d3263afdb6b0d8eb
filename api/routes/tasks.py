"""``/api/v1/tasks``, ``/api/v1/{notebooks,tensorboards,commands,shells}``: interactive tasks:
list, one task, its logs, kill, and starting each kind through det.submission
(the same path as ``det notebook start`` & co.). Viewer lists, reads and opens a TensorBoard;
Editor starts and kills (det_internal.create_task, det_user.task_kill)."""

import base64
import tempfile
from pathlib import Path

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from det import context
from det.api.params import BIGINT_MAX, BigId
from det.api.proxy import WEB_KINDS
from det.api.session import Session, session
from det.errors import ContextError
from det.queries import tasks as q
from det.sql import named
from det.submission import (
    TaskKind,
    expand_task_config,
    submit_task,
    template_for_submission,
)

Q = named("api")
READ = named("queries")

router = APIRouter(prefix="/api/v1", tags=["tasks"])

MAX_LOG_LINES = 5000
"""Most log lines one call returns."""


def with_url(task: dict) -> dict:
    """``task`` with ``url``: where det serve proxies its web server (None for a kind
    without one)."""
    return {**task, "url": f"/proxy/{task['id']}/" if task["kind"] in WEB_KINDS else None}


@router.get("/tasks")
def list_tasks(
    s: Session = session,
    kind: TaskKind | None = Query(None, description="Only this kind."),
    all: bool = Query(False, description="Every task the user may view, ended ones and "
                                         "other users' included; else the user's live ones."),
) -> dict:
    """Interactive tasks: kind, state, owner, workspace, started, ``idle_seconds`` (since the
    last sign of use), end reason, and ``url`` (``/proxy/<id>/``) for those with a web
    server."""
    return {"tasks": [with_url(t) for t in q.list_tasks(s.conn, kind, all)]}


@router.get("/tasks/{task_id}")
def get_task(task_id: BigId, s: Session = session) -> dict:
    """One task (its expanded config, run, pending reason, end reason); 404 for one the user
    cannot see."""
    return with_url(q.get_task(s.conn, task_id))


@router.post("/tasks/{task_id}/kill")
def kill_task(task_id: BigId, s: Session = session) -> dict:
    """End the task (Editor of its workspace: 403; 404 for one the user cannot see). Killing
    an ended task changes nothing."""
    s.conn.execute(Q.task_kill, (task_id,))
    return {"id": task_id, "state": q.run_of(s.conn, task_id)["state"]}


@router.get("/tasks/{task_id}/logs")
def task_logs(
    task_id: BigId, s: Session = session,
    after: int = Query(0, ge=0, le=BIGINT_MAX, description="Only lines after this log id."),
    tail: int | None = Query(None, ge=1, le=MAX_LOG_LINES,
                             description="Only the last N lines."),
    limit: int = Query(MAX_LOG_LINES, ge=1, le=MAX_LOG_LINES),
) -> dict:
    """The task's output (stdout, stderr, det's notes on its run) by log id."""
    q.get_task(s.conn, task_id)
    if tail is not None:
        rows = q.logs_tail(s.conn, task_id, tail)
    else:
        rows = s.conn.execute(READ.task_logs_after, {"job": task_id, "after": after,
                                                     "limit": limit}).fetchall()
    return {"task_id": task_id, "logs": rows}


class CreateTask(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: str | None = Field(None, description="The task config, YAML text (description, "
                                                 "resources, idle_timeout, ...).")
    overrides: list[str] = Field([], description="KEY=VALUE settings over the config, as "
                                                 "`--config` (resources.slots=0).")
    template: str | None = Field(None, description="A configuration template to merge under.")
    context: str | None = Field(None, description="A directory for the task as a base64 "
                                                  "tar.gz (`-c/--context`).")
    workspace: str | None = Field(None, description="Workspace to place it in (with project).")
    project: str | None = Field(None, description="Project (of workspace) to place it in.")
    force: bool = Field(False, description="Submit even if no agent of the pool could run it.")


class CreateCommand(CreateTask):
    command: list[str] = Field(min_length=1, description="The command's argv.")


class CreateTensorBoard(CreateTask):
    experiment_ids: list[int] = Field([], description="Experiments whose metrics it shows.")
    trial_ids: list[int] = Field([], description="Trials whose metrics it shows.")


def _submit(s: Session, kind: TaskKind, body: CreateTask, entrypoint: list[str] | None = None,
            experiment_ids: list[int] | tuple = (), trial_ids: list[int] | tuple = ()) -> dict:
    """Expand and submit a task as the CLI does (det.submission), in the request's one
    transaction. Permission to create in the target project is checked before the context is
    unpacked (as for experiments).

    Raises:
        ConfigError: a bad config or override (400 naming the key).
        ContextError: a context that is not base64 of a tar.gz, or one det refuses (400).
        NotFoundError / PermissionDeniedError: no Editor role there (404 / 403).
    """
    blob = None
    if body.context is not None:
        try:
            blob = base64.b64decode(body.context, validate=True)
        except ValueError as e:
            raise ContextError(f"context: expected base64 of a tar.gz ({e})") from e
        if len(blob) > context.MAX_CONTEXT_BYTES:
            raise ContextError(f"context: {len(blob)} bytes, more than the "
                               f"{context.MAX_CONTEXT_BYTES} allowed")
    s.conn.execute(Q.experiment_create_check, (body.workspace, body.project))
    tpl = (template_for_submission(s.conn, body.template, body.workspace)
           if body.template is not None else None)
    expanded = expand_task_config(s.conn, kind, body.config, "config", body.overrides, tpl,
                                  body.workspace, entrypoint)
    with tempfile.TemporaryDirectory(prefix="det-api-task-") as tmp:
        ctx = None
        if blob is not None:
            ctx = Path(tmp) / "context"
            context.unpack(blob, ctx)
        job = submit_task(s.conn, kind, expanded, ctx, body.workspace, body.project,
                          experiment_ids, trial_ids, body.force)
    return with_url({"id": job, "kind": kind})


@router.post("/notebooks", status_code=201)
def start_notebook(body: CreateTask, s: Session = session) -> dict:
    """Start a JupyterLab (`det notebook start`); open it at ``url`` once it runs."""
    return _submit(s, "NOTEBOOK", body)


@router.post("/tensorboards", status_code=201)
def start_tensorboard(body: CreateTensorBoard, s: Session = session) -> dict:
    """Start a TensorBoard over experiments' and trials' metrics (`det tensorboard start`):
    each must be one the user may view (404 naming the first that is not)."""
    return _submit(s, "TENSORBOARD", body, None, body.experiment_ids, body.trial_ids)


@router.post("/commands", status_code=201)
def run_command(body: CreateCommand, s: Session = session) -> dict:
    """Run a command (`det cmd run`): its output is the task's logs."""
    return _submit(s, "COMMAND", body, body.command)


@router.post("/shells", status_code=201)
def start_shell(body: CreateTask, s: Session = session) -> dict:
    """Start an SSH server (`det shell start`); `det shell open ID` connects to it."""
    return _submit(s, "SHELL", body)
