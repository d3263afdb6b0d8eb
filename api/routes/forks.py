"""Experiments made from an existing one (spec run-training-code.rst: "create an
experiment from an existing experiment or trial on the WebUI"): fork an experiment, continue a
trial. Registered before ``experiments``, whose ``/experiments/{id}/{action}`` would otherwise
take ``/experiments/{id}/fork``."""

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from det.api.params import IntId
from det.api.session import Session, session
from det.submission import (
    continue_config_text,
    continue_trial,
    fork_experiment,
    source_experiment,
)

router = APIRouter(prefix="/api/v1", tags=["experiments"])


class FromSource(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: str | None = Field(None, description="The new experiment's config, YAML text "
                                                 "(default: the source experiment's original "
                                                 "config).")
    force: bool = Field(False, description="Submit even if no agent of the pool could run it.")
    workspace: str | None = Field(None, description="Workspace to place it in (with project; "
                                                    "default: the source's).")
    project: str | None = Field(None, description="Project (of workspace) to place it in.")


@router.get("/experiments/{exp_id}/fork")
def fork_preview(exp_id: IntId, s: Session = session) -> dict:
    """The config a fork of this experiment starts from (its original config), for the user
    to edit; 404 for an experiment the caller cannot view."""
    return {"experiment_id": exp_id,
            "config": source_experiment(s.conn, exp_id)["original_config"]}


@router.post("/experiments/{exp_id}/fork", status_code=201)
def fork(exp_id: IntId, body: FromSource, s: Session = session) -> dict:
    """`det experiment fork`: a new experiment with this one's model definition and the given
    config (checked as a new experiment's: 400 naming the field). 404 for an experiment the
    caller cannot view, 403 without Editor where it goes."""
    return {"id": fork_experiment(s.conn, exp_id, body.config, "config", (), body.workspace,
                                  body.project, None, body.force)}


@router.get("/trials/{trial_id}/continue")
def continue_preview(trial_id: IntId, s: Session = session) -> dict:
    """The config `det trial continue` submits by default (one trial, this trial's
    hyperparameters, from its latest checkpoint), for the user to edit; 409 for a trial with
    no checkpoint."""
    return {"trial_id": trial_id, "config": continue_config_text(s.conn, trial_id)}


@router.post("/trials/{trial_id}/continue", status_code=201)
def continue_(trial_id: IntId, body: FromSource, s: Session = session) -> dict:
    """`det trial continue`: a new experiment of one trial that resumes this trial from its
    latest checkpoint (weights and batch count). The config given is made one trial with this
    trial's hyperparameters and checkpoint whatever it says; 409 for a trial with no
    checkpoint, 400 naming a config field."""
    return {"id": continue_trial(s.conn, trial_id, body.config, "config", (), body.workspace,
                                 body.project, None, body.force)}
