"""``/api/v1/events``: server-sent-event streams of the experiment list, one experiment, one
trial, the job queue and the cluster (det.api.events). A stream first sends ``ready`` with
the ids it will send rows after (metrics, logs): a page then loads the history up to there
through the REST endpoints and merges the rows that follow by id.

Events: ``experiments`` (the list page, filtered as ``GET /experiments``), ``experiment``
(summary and trials), ``trial``, ``metrics`` (new rows), ``logs`` (new lines), ``queue``,
``cluster``, ``tasks`` (interactive tasks, as ``GET /tasks``); each snapshot is sent only when
it changed.
"""

from collections.abc import Callable

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from det.api.events import Stream, sse, stream
from det.api.params import BIGINT_MAX, IntId
from det.api.routes.tasks import with_url
from det.api.session import act_as, request_token
from det.db import channels
from det.queries import experiments as qe
from det.queries import trials as qt
from det.queries.queue import job_queue
from det.queries.tasks import list_tasks
from det.reconciler.searchers.live import add_rungs, page_with_live_progress, with_live_progress
from det.sql import named

READ = named("queries")
router = APIRouter(prefix="/api/v1/events", tags=["events"])

SUMMARY = ("id", "name", "state", "progress", "owner", "start_time", "end_time", "archived",
           "resource_pool", "priority", "weight", "job_id", "checkpoint_gc_error")


def _authenticate(request: Request, check: Callable | None) -> str:
    """The stream's user, checked in a short transaction of its own (a stream holds none
    open while it waits), with ``check(conn)`` (that the object exists: 404 before the
    stream starts)."""
    token = request_token(request)
    with request.app.state.pool.connection() as conn, conn.transaction():
        user = act_as(conn, token)
        if check is not None:
            check(conn)
        return user


def _response(request: Request, topics: list[str], read) -> StreamingResponse:
    """The stream: each read is a transaction of its own, as the token's user (a token that
    expires, or a user deactivated, ends the stream)."""
    pool, token = request.app.state.pool, request_token(request)

    def run(st: Stream) -> list[str]:
        with pool.connection() as conn, conn.transaction():
            act_as(conn, token)
            return read(conn, st)

    return StreamingResponse(stream(request.app.state.hub, topics, run),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def _metrics(conn, st: Stream, trials: list[int], out: list[str]) -> None:
    """New metrics rows of ``trials`` after the stream's cursor (``ready`` on first call)."""
    if "metrics" not in st.cursors:
        st.cursors["metrics"] = conn.execute(READ.last_metric_id).fetchone()["id"]
        return
    rows = conn.execute(READ.metrics_since, {"after": st.cursors["metrics"],
                                             "trials": trials}).fetchall()
    if rows:
        st.cursors["metrics"] = rows[-1]["id"]
        out.append(sse("metrics", rows))


@router.get("/experiments")
async def experiments(
    request: Request,
    state: list[str] | None = Query(None), owner: str | None = Query(None, max_length=255),
    name: str | None = Query(None, max_length=255), archived: bool = Query(False),
    workspace: str | None = Query(None, max_length=255),
    project: str | None = Query(None, max_length=255),
    sort: str = Query("-id"), limit: int = Query(100), offset: int = Query(0, le=BIGINT_MAX),
) -> StreamingResponse:
    """The experiment list page (filters as ``GET /experiments``), whenever it changes."""
    f = qe.ListFilter(archived=archived, states=tuple(state) if state else None, owner=owner,
                      name=name, workspace=workspace, project=project, sort=sort, limit=limit,
                      offset=offset)
    # The filter is checked by a first read (400 naming the field) before the stream starts:
    # once it has, an error can only cut the stream.
    await _auth(request, lambda conn: qe.list_experiments(conn, f))

    def read(conn, st: Stream) -> list[str]:
        page = {"experiments": page_with_live_progress(conn, qe.list_experiments(conn, f)),
                "pagination": {"offset": offset, "limit": limit,
                               "total": qe.count_experiments(conn, f)}}
        return [e for e in [st.changed("experiments", page)] if e]

    return _response(request, [channels.EXPERIMENTS], read)


@router.get("/experiments/{exp_id}")
async def experiment(request: Request, exp_id: IntId) -> StreamingResponse:
    """One experiment: ``experiment`` (summary and trials) and ``metrics`` of its trials."""
    await _auth(request, lambda conn: qe.get_experiment(conn, exp_id))

    def read(conn, st: Stream) -> list[str]:
        out: list[str] = []
        exp = with_live_progress(conn, qe.get_experiment(conn, exp_id))
        trials = conn.execute(READ.experiment_trials, {"id": exp_id}).fetchall()
        add_rungs(conn, exp, trials)
        first = "metrics" not in st.cursors
        _metrics(conn, st, [t["id"] for t in trials], out)
        if first:
            out.append(sse("ready", {"metrics_after": st.cursors["metrics"]}))
        summary = {k: exp[k] for k in SUMMARY}
        changed = st.changed("experiment", {**summary, "trials": trials})
        return ([changed] if changed else []) + out

    return _response(request, [channels.experiment_topic(exp_id)], read)


@router.get("/trials/{trial_id}")
async def trial(request: Request, trial_id: IntId) -> StreamingResponse:
    """One trial: ``trial`` (its row), ``metrics`` and ``logs`` (new lines)."""
    await _auth(request, lambda conn: qt.get_trial(conn, trial_id))

    def read(conn, st: Stream) -> list[str]:
        out: list[str] = []
        t = {**qt.get_trial(conn, trial_id),
             "run_history": conn.execute(READ.trial_runs, {"id": trial_id}).fetchall()}
        first = "metrics" not in st.cursors
        _metrics(conn, st, [trial_id], out)
        if first:
            st.cursors["logs"] = conn.execute(READ.last_trial_log_id,
                                              {"trial": trial_id}).fetchone()["id"]
            out.append(sse("ready", {"metrics_after": st.cursors["metrics"],
                                     "logs_after": st.cursors["logs"]}))
        else:
            lines = conn.execute(READ.trial_logs_after,
                                 {"trial": trial_id, "after": st.cursors["logs"],
                                  "limit": 5000}).fetchall()
            if lines:
                st.cursors["logs"] = lines[-1]["id"]
                out.append(sse("logs", lines))
        changed = st.changed("trial", t)
        return ([changed] if changed else []) + out

    return _response(request, [channels.trial_topic(trial_id)], read)


@router.get("/job-queue")
async def queue(request: Request,
                resource_pool: str | None = Query(None, max_length=255)) -> StreamingResponse:
    """The job queue (as ``GET /job-queue``), whenever it changes."""
    await _auth(request)

    def read(conn, st: Stream) -> list[str]:
        return [e for e in [st.changed("queue", {"jobs": job_queue(conn, resource_pool)})] if e]

    return _response(request, [channels.QUEUE], read)


@router.get("/cluster")
async def cluster(request: Request) -> StreamingResponse:
    """Pools, agents and slots (``cluster``), whenever they change."""
    await _auth(request)

    def read(conn, st: Stream) -> list[str]:
        snap = {"resource_pools": conn.execute(READ.pools).fetchall(),
                "agents": conn.execute(READ.agents).fetchall(),
                "slots": conn.execute(READ.slots, {"agent": None}).fetchall()}
        return [e for e in [st.changed("cluster", snap)] if e]

    return _response(request, [channels.CLUSTER], read)


@router.get("/tasks")
async def tasks(request: Request, all: bool = Query(False)) -> StreamingResponse:
    """Interactive tasks (``tasks``, as ``GET /tasks``), whenever they change: a run's state
    wakes the queue's topic; an address or idle time that changed shows within a tick."""
    await _auth(request)

    def read(conn, st: Stream) -> list[str]:
        rows = [with_url(t) for t in list_tasks(conn, None, all)]
        return [e for e in [st.changed("tasks", {"tasks": rows})] if e]

    return _response(request, [channels.QUEUE], read)


async def _auth(request: Request, check: Callable | None = None) -> str:
    return await run_in_threadpool(_authenticate, request, check)
