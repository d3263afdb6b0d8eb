"""``/api/v1/experiments``: list, get, create, pause / activate / cancel / kill, archive,
priority and weight, learning curves, checkpoints."""

import base64
import tempfile
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, Query
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ConfigDict, Field

from det import context
from det.api.params import BIGINT_MAX, IntId
from det.api.session import Session, session
from det.configs.job import job_change
from det.db.reconnect import BULK_CALL_DEADLINE_SECONDS, patience
from det.errors import ContextError, DetError
from det.queries import experiments as q
from det.queries.trials import metric_series
from det.queries.workspaces import placement, workspace_defaults
from det.reconciler.searchers.live import add_rungs, page_with_live_progress, with_live_progress
from det.reconciler.searchers.preview import search_preview
from det.sql import named
from det.submission import expand_config_text, refuse_unfit, template_for_submission

Q = named("api")
READ = named("queries")

router = APIRouter(prefix="/api/v1", tags=["experiments"])

Action = Literal["pause", "activate", "cancel", "kill"]


@router.get("/experiments")
def list_experiments(
    s: Session = session,
    state: list[str] | None = Query(None, description="Only these states (repeatable)."),
    owner: str | None = Query(None, max_length=255),
    name: str | None = Query(None, max_length=255, description="Name contains (any case)."),
    workspace: str | None = Query(None, max_length=255, description="Only this workspace's."),
    project: str | None = Query(None, max_length=255, description="Only this project's."),
    archived: bool = Query(False, description="Include archived experiments."),
    sort: str = Query("-id", description="id, name, state, progress, started, ended, owner, "
                                         "trials or best_validation; - first: descending."),
    limit: int = Query(100, description=f"Page size, 0 to {q.MAX_PAGE}."),
    offset: int = Query(0, le=BIGINT_MAX),
) -> dict:
    """The experiments the user may view (state, progress %, best metric, owner, workspace,
    project, times, searcher), filtered, sorted and paged; ``pagination.total`` counts all
    that match."""
    f = q.ListFilter(archived=archived, states=tuple(state) if state else None, owner=owner,
                     name=name, workspace=workspace, project=project, sort=sort, limit=limit,
                     offset=offset)
    rows = page_with_live_progress(s.conn, q.list_experiments(s.conn, f))
    return {"experiments": rows,
            "pagination": {"offset": offset, "limit": limit,
                           "total": q.count_experiments(s.conn, f)}}


class CreateExperiment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: str = Field(description="The experiment config, YAML text.")
    context: str = Field(description="The model-definition directory as a base64 tar.gz "
                                     "(what `det experiment create` uploads).")
    template: str | None = Field(None, description="A configuration template to merge under.")
    force: bool = Field(False, description="Submit even if no agent of the pool could run it.")
    workspace: str | None = Field(None, description="Workspace to place it in (with project).")
    project: str | None = Field(None, description="Project (of workspace) to place it in.")
    project_id: int | None = Field(None, description="Place it in the project with this id.")


@router.post("/experiments", status_code=201)
def create_experiment(body: CreateExperiment, s: Session = session) -> dict:
    """Submit an experiment: the config is checked and expanded as `det experiment create`
    does (400 naming the field), the context unpacked and its entrypoint checked. Permission
    to create in the target project (``det_user.experiment_create_check``: 403, or 404 for one the
    caller cannot see) is checked before a byte of the context is unpacked; a
    context that is not base64 of a tar.gz, or whose members det refuses
    (:mod:`det.archives`), is a 400 naming the member."""
    try:
        blob = base64.b64decode(body.context, validate=True)
    except ValueError as e:  # binascii.Error, or a character outside ASCII
        raise ContextError(f"context: expected base64 of a tar.gz ({e})") from e
    if len(blob) > context.MAX_CONTEXT_BYTES:
        raise ContextError(f"context: {len(blob)} bytes, more than the "
                           f"{context.MAX_CONTEXT_BYTES} allowed")
    workspace, project = placement(s.conn, body.config, "config", body.workspace, body.project,
                                   body.project_id)
    tpl = (template_for_submission(s.conn, body.template, workspace)
           if body.template is not None else None)
    s.conn.execute(Q.experiment_create_check, (workspace, project))
    with tempfile.TemporaryDirectory(prefix="det-api-ctx-") as tmp:
        context.unpack(blob, Path(tmp))
        expanded, original = expand_config_text(body.config, "config", Path(tmp), tpl,
                                                defaults=workspace_defaults(s.conn, workspace))
    if not body.force:
        refuse_unfit(s.conn, expanded)
    with patience(s.conn, BULK_CALL_DEADLINE_SECONDS):  # the context blob travels
        exp_id = s.conn.execute(Q.create_experiment,
                                (Jsonb(expanded), original, blob, workspace, project)
                                ).fetchone()["id"]
    return {"id": exp_id}


@router.get("/experiments/{exp_id}")
def get_experiment(exp_id: IntId, s: Session = session) -> dict:
    """The experiment (config included), its trials (hyperparameters, state, batches,
    best validation; ``rung`` for adaptive_asha and tpe; ``run_state`` and ``run_reason``:
    its latest run as the job queue sees it, e.g. ``waiting`` and why) and checkpoints."""
    exp = with_live_progress(s.conn, q.get_experiment(s.conn, exp_id))
    trials = s.conn.execute(READ.experiment_trials, {"id": exp_id}).fetchall()
    add_rungs(s.conn, exp, trials)
    ckpts = s.conn.execute(READ.experiment_checkpoints, {"id": exp_id}).fetchall()
    return {**exp, "trials": trials, "checkpoints": ckpts}


@router.post("/experiments/{exp_id}/{action}")
def act(exp_id: IntId, action: Action, s: Session = session) -> dict:
    """pause | activate | cancel | kill; 409 where the state does not allow it."""
    state = s.conn.execute(Q.experiment_action, (exp_id, action)).fetchone()["s"]
    return {"id": exp_id, "state": state}


class Archive(BaseModel):
    model_config = ConfigDict(extra="forbid")
    archived: bool


@router.put("/experiments/{exp_id}/archived")
def archive(exp_id: IntId, body: Archive, s: Session = session) -> dict:
    """Archive (hide from the default list) or unarchive; only an ended experiment can be
    archived (409)."""
    s.conn.execute(Q.experiment_archive, (exp_id, body.archived))
    return {"id": exp_id, "archived": body.archived}


class JobSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    priority: int | str | None = None
    weight: float | str | None = None


@router.patch("/experiments/{exp_id}")
def set_job(exp_id: IntId, body: JobSettings, s: Session = session) -> dict:
    """Set the experiment's priority (priority scheduler) or weight (fair share)."""
    changes = {k: job_change(k, str(v), k) for k, v in body.model_dump().items()
               if v is not None}
    if not changes:
        raise DetError("nothing to update: give priority or weight")
    job = q.job_of(s.conn, exp_id)
    for field, value in changes.items():
        s.conn.execute(Q.job_update, (job, field, value))
    return {"id": exp_id, **{k: v for k, v in body.model_dump().items() if v is not None}}


@router.get("/experiments/{exp_id}/metrics")
def experiment_metrics(
    exp_id: IntId, s: Session = session,
    group: str = Query("validation", max_length=255),
    max_points: int | None = Query(2000, description="Per trial; empty: every row."),
) -> dict:
    """Learning curves: each trial's metrics of ``group``, downsampled in SQL."""
    q.get_experiment(s.conn, exp_id)
    trials = s.conn.execute(READ.experiment_trials, {"id": exp_id}).fetchall()
    return {"group": group, "trials": [
        {"trial_id": t["id"], "hparams": t["hparams"],
         "rows": metric_series(s.conn, t["id"], group, max_points)} for t in trials]}


@router.get("/experiments/{exp_id}/checkpoints")
def experiment_checkpoints(exp_id: IntId, s: Session = session) -> dict:
    """The checkpoints of its trials, with the validation metrics at each one's step."""
    q.get_experiment(s.conn, exp_id)
    return {"checkpoints": s.conn.execute(READ.experiment_checkpoints, {"id": exp_id}).fetchall()}


class Preview(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: str = Field(description="The experiment config, YAML text.")


@router.post("/preview-search")
def preview_search(body: Preview, s: Session = session) -> dict:
    """The trials a search will create and the training it will run (`det preview-search`):
    per bracket and rung for adaptive_asha and tpe."""
    return search_preview(body.config, "config")
