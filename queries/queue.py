"""Reading the job queue: the scheduling order per pool, and why each job waits."""

# The queue with what `explain_reasons` needs to say why each job waits; filtered by pool
# (`det job list`) or by job (`det job explain`). An interactive task has no experiment
# (its experiment columns are NULL).
QUEUE = """
SELECT q.queue_order, q.job_id, 'TYPE_' || q.type AS type, q.name, q.priority, q.weight,
       q.submitted_at, q.slots_acquired, q.slots_needed, q.status, q.owner, q.resource_pool,
       q.experiment_id, q.experiment_state, q.pending_reason,
       det_pool_scheduler(q.resource_pool) ->> 'type' AS scheduler,
       tc.live_trials, tc.trials, coalesce(ag.n, 0) AS pool_agents,
       e.config #> '{searcher,max_concurrent_trials}' AS max_concurrent_trials,
       e.config #> '{searcher,max_trials}' AS max_trials
  FROM reporting.job_queue q LEFT JOIN experiments e ON e.id = q.experiment_id
  CROSS JOIN LATERAL (
      SELECT count(*) AS trials,
             count(*) FILTER (WHERE t.state IN ('ACTIVE', 'PAUSED') AND NOT t.closed)
                 AS live_trials
        FROM trials t WHERE t.experiment_id = q.experiment_id) tc
  LEFT JOIN (SELECT resource_pool, count(*) AS n FROM agents WHERE state = 'ACTIVE'
              GROUP BY resource_pool) ag ON ag.resource_pool = q.resource_pool
 WHERE (%(pool)s::text IS NULL OR q.resource_pool = %(pool)s)
   AND (%(job)s::bigint IS NULL OR q.job_id = %(job)s)
 ORDER BY q.resource_pool, q.queue_order
"""

# What an ended job was: its experiment, or its task (the task's run's state).
JOB_STATE = """
SELECT 'experiment ' || e.id AS what, e.state::text AS state
  FROM jobs j JOIN experiments e ON e.job_id = j.id WHERE j.id = %(id)s
UNION ALL
SELECT lower(t.kind) || ' ' || t.id, t.state FROM reporting.tasks t WHERE t.id = %(id)s
"""


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
    """The queue (QUEUE) of ``pool`` (None: every pool) or of one ``job``, each queued job
    with ``reasons`` (:func:`explain_reasons`; empty for scheduled ones)."""
    from det.reconciler import leader

    rows = conn.execute(QUEUE, {"pool": pool, "job": job}).fetchall()
    leading = leader.current(conn)
    for r in rows:
        r["reasons"] = explain_reasons(r, leading) if r["status"] == "STATE_QUEUED" else []
    return rows
