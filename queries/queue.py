"""Reading the job queue: the scheduling order per pool, and why each job waits."""

from det.sql import named

Q = named("queries")


def explain_reasons(job: dict, leading: dict | None) -> list[str]:
    """Why a job waits: no reconciler leads (``leading``: :func:`leader.current`), the states
    det itself imposes, then the scheduler's words from its last pass."""
    out = []
    if not (leading and leading["alive"]):
        out.append("no reconciler is running, so nothing is scheduled (det cluster up, or "
                   "det reconcile)")
    if job["experiment_state"] == "PAUSED":
        out.append("paused: activate it to run")
    mct, max_trials = job["max_concurrent_trials"], job["max_trials"]
    # The cap matters only when nothing waits for slots and the search has trials to create.
    if (isinstance(mct, int) and 0 < mct <= job["live_trials"] and not job["pending_reason"]
            and isinstance(max_trials, int) and job["trials"] < max_trials):
        out.append(f"capped by max_concurrent_trials ({mct} trials alive)")
    if job["pool_agents"] == 0:
        out.append(f"pool {job['resource_pool']} has no agents")
    if job["pending_reason"]:
        out.extend(job["pending_reason"].split(" | "))
    return out


def job_queue(conn, pool: str | None = None, job: int | None = None) -> list[dict]:
    """The queue (queries.sql: job_queue) of ``pool`` (None: every pool) or of one ``job``,
    each queued job with ``reasons`` (:func:`explain_reasons`; empty for scheduled ones)."""
    from det.reconciler import leader

    rows = conn.execute(Q.job_queue, {"pool": pool, "job": job}).fetchall()
    leading = leader.current(conn)
    for r in rows:
        r["reasons"] = explain_reasons(r, leading) if r["status"] == "STATE_QUEUED" else []
    return rows


def head_other_than(conn, job: int) -> int:
    """The job at the head of queued ``job``'s pool's queue, ``job`` itself left out
    (queries.sql: queue_head_other_than): whom Move to Top puts it ahead of. For a job that
    is not at the head, so another heads the queue."""
    return conn.execute(Q.queue_head_other_than, {"job": job}).fetchone()["job_id"]


def job_exists(conn, job: int) -> bool:
    """Whether job ``job`` exists (ended or not) and the caller may see it."""
    return conn.execute(Q.job_exists, (job,)).fetchone() is not None
