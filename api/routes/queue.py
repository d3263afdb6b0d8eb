"""``/api/v1/job-queue``: the queue per pool in scheduling order with why each job waits;
change a job; several changes at once; Move to Top."""

from typing import Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from det.api.params import BIGINT_MAX, BigId
from det.api.session import Session, session
from det.configs.job import job_change
from det.errors import DetError, NotFoundError, StateError
from det.queries.queue import head_other_than, job_exists, job_queue
from det.sql import named

Q = named("api")

router = APIRouter(prefix="/api/v1", tags=["job queue"])

JobField = Literal["priority", "weight", "resource-pool", "ahead-of", "behind-of"]


@router.get("/job-queue")
def get_job_queue(s: Session = session,
                  resource_pool: str | None = Query(None, max_length=255)) -> dict:
    """Active jobs per pool in scheduling order: slots acquired / needed, status, and for
    queued ones why they wait (``reasons``)."""
    return {"jobs": job_queue(s.conn, resource_pool)}


class JobChanges(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    priority: int | str | None = None
    weight: float | str | None = None
    resource_pool: str | None = Field(None, alias="resource-pool")
    ahead_of: int | str | None = Field(None, alias="ahead-of")
    behind_of: int | str | None = Field(None, alias="behind-of")


@router.patch("/jobs/{job_id}")
def update_job(job_id: BigId, body: JobChanges, s: Session = session) -> dict:
    """Change one job (`det job update`): each field checked against its pool's scheduler;
    all apply or none."""
    given = body.model_dump(by_alias=True, exclude_none=True)
    if not given:
        raise DetError("nothing to update: give priority, weight, resource-pool, ahead-of or "
                       "behind-of")
    changes = {k: job_change(k, str(v), k) for k, v in given.items()}
    for field, value in changes.items():
        s.conn.execute(Q.job_update, (job_id, field, value))
    return {"job_id": job_id, **given}


class BatchChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: int = Field(ge=-BIGINT_MAX - 1, le=BIGINT_MAX)
    field: JobField
    value: str | int | float


class Batch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    changes: list[BatchChange] = Field(min_length=1, max_length=10000)


@router.post("/job-queue/update-batch")
def update_batch(body: Batch, s: Session = session) -> dict:
    """Several changes in one transaction (`det job update-batch`): all apply or none."""
    parsed = [(c.job_id, c.field, job_change(c.field, str(c.value), f"changes.{i}.value"))
              for i, c in enumerate(body.changes)]
    for job, field, value in parsed:
        s.conn.execute(Q.job_update, (job, field, value))
    return {"applied": len(parsed)}


@router.post("/jobs/{job_id}/move-to-top")
def move_to_top(job_id: BigId, s: Session = session) -> dict:
    """Put the job ahead of the current head of its pool's queue (priority scheduler: it
    takes the head's priority; 400 under another). A job at the head stays; 409 for a job no
    longer queued."""
    mine = job_queue(s.conn, None, job_id)
    if not mine:
        if not job_exists(s.conn, job_id):
            raise NotFoundError(f"job {job_id} not found")
        raise StateError(f"job {job_id} has ended: it is no longer queued")
    if mine[0]["queue_order"] > 0:
        s.conn.execute(Q.job_move_ahead_of, (job_id, str(head_other_than(s.conn, job_id))))
    return {"job_id": job_id, "jobs": job_queue(s.conn, mine[0]["resource_pool"])}
