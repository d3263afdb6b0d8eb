"""``/api/v1/trials``: a trial, its metrics (downsampled in SQL), logs and checkpoints."""

import shutil
import tarfile
import tempfile
from pathlib import Path

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse, Response
from starlette.background import BackgroundTask

from det.api.params import BIGINT_MAX, IntId
from det.api.session import Session, session
from det.configs.storage_policy import storage_access, stored_cluster_config
from det.errors import NotFoundError, StateError
from det.harness.storage import storage_from_config
from det.queries import trials as q
from det.queries.experiments import get_experiment
from det.sql import named

READ = named("queries")
router = APIRouter(prefix="/api/v1", tags=["trials"])

MAX_LOG_LINES = 5000
"""Most log lines one call returns."""


@router.get("/trials/{trial_id}")
def get_trial(trial_id: IntId, s: Session = session) -> dict:
    """The trial: state, hyperparameters, batches trained (``batches``, live; and as of its
    latest checkpoint, ``steps_completed``), restarts, and its runs: where each ran, how
    it ended and why (``run_history``)."""
    trial = q.get_trial(s.conn, trial_id)
    return {**trial, "run_history": s.conn.execute(READ.trial_runs, {"id": trial_id}).fetchall()}


@router.get("/trials/{trial_id}/metrics")
def trial_metrics(
    trial_id: IntId, s: Session = session,
    group: str = Query("training", max_length=255,
                       description="training, validation, or any other group reported."),
    max_points: int | None = Query(None, description="Downsample to at most this many rows "
                                                     "spread over the batches (2 to 100000)."),
) -> dict:
    """The trial's metrics rows of one group in batch order."""
    q.get_trial(s.conn, trial_id)
    return {"trial_id": trial_id, "group": group,
            "rows": q.metric_series(s.conn, trial_id, group, max_points)}


@router.get("/trials/{trial_id}/logs")
def trial_logs(
    trial_id: IntId, s: Session = session,
    after: int = Query(0, ge=0, le=BIGINT_MAX, description="Only lines after this log id."),
    tail: int | None = Query(None, ge=1, le=MAX_LOG_LINES,
                             description="Only the last N lines."),
    limit: int = Query(MAX_LOG_LINES, ge=1, le=MAX_LOG_LINES),
) -> dict:
    """The trial's output (stdout, stderr, and det's notes on its runs) by log id: each line
    with its time, run, rank (the worker that wrote it; null for det's notes) and level
    (error, warning, info or debug: det_user.log_level)."""
    q.get_trial(s.conn, trial_id)
    if tail is not None:
        rows = s.conn.execute(READ.trial_logs_tail,
                              {"trial": trial_id, "limit": tail}).fetchall()[::-1]
    else:
        rows = s.conn.execute(READ.trial_logs_after, {"trial": trial_id, "after": after,
                                                      "limit": limit}).fetchall()
    return {"trial_id": trial_id, "logs": rows}


@router.get("/trials/{trial_id}/logs/download")
def download_trial_logs(trial_id: IntId, s: Session = session) -> Response:
    """The trial's whole log as text (``trial-ID-logs.txt``, an attachment): a line per log
    line, as ``det trial logs --timestamps`` prints it. 404 for an unknown trial."""
    q.get_trial(s.conn, trial_id)
    lines: list[str] = []
    after = 0
    while rows := s.conn.execute(READ.trial_logs_after, {"trial": trial_id, "after": after,
                                                         "limit": MAX_LOG_LINES}).fetchall():
        lines.extend(q.log_text(r, timestamps=True) + "\n" for r in rows)
        after = rows[-1]["id"]
    return Response("".join(lines), media_type="text/plain; charset=utf-8", headers={
        "Content-Disposition": f'attachment; filename="trial-{trial_id}-logs.txt"'})


@router.get("/trials/{trial_id}/checkpoints")
def trial_checkpoints(trial_id: IntId, s: Session = session) -> dict:
    """The trial's checkpoints: batches, state, size in bytes."""
    q.get_trial(s.conn, trial_id)
    return {"checkpoints": q.trial_checkpoints(s.conn, trial_id)}


@router.get("/experiments/{exp_id}/trials")
def experiment_trials(exp_id: IntId, s: Session = session) -> dict:
    """The experiment's trials (as in ``GET /experiments/{id}``)."""
    get_experiment(s.conn, exp_id)
    return {"trials": s.conn.execute(READ.experiment_trials, {"id": exp_id}).fetchall()}


@router.get("/checkpoints/{uuid}/download")
def download_checkpoint(uuid: str, s: Session = session) -> FileResponse:
    """The checkpoint's files as one ``.tar.gz`` (read from its storage: shared_fs,
    directory or s3). 404 for an unknown checkpoint, 403 for S3 storage the cluster config
    does not let det serve read (det.configs.storage_policy), 409 for one being deleted or
    deleted, 502 when the storage fails. Links in the checkpoint are left out, never followed
    (``FsspecStorage.download``: a task's link to a host file must not serve that file)."""
    row = s.conn.execute(READ.checkpoint, {"uuid": uuid}).fetchone()
    if row is None:
        raise NotFoundError(f"checkpoint {uuid} not found")
    ambient = storage_access(row["storage"], stored_cluster_config(s.conn))  # or 403
    if row["state"] != "COMPLETED":
        raise StateError(f"checkpoint {uuid} is {row['state']}")
    tmp = Path(tempfile.mkdtemp(prefix="det-api-ckpt-"))
    try:
        storage_from_config(row["storage"], ambient_credentials=ambient).download(
            row["uuid"], tmp / row["uuid"])
        archive = tmp / f"{row['uuid']}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(tmp / row["uuid"], arcname=row["uuid"])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return FileResponse(archive, media_type="application/gzip", filename=archive.name,
                        background=BackgroundTask(shutil.rmtree, tmp, ignore_errors=True))
