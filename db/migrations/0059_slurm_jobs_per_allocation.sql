-- Slurm pools run each allocation as its own Slurm job (det.reconciler.slurm_provider): a
-- slurm pool's instance is tied to the one run it was submitted for, and the job queue gives,
-- for each waiting run, what Slurm says of its own job.

ALTER TABLE instances ADD COLUMN allocation_id bigint;
COMMENT ON COLUMN instances.allocation_id IS
    'slurm pools: the one run this instance (one Slurm job) was submitted for; its agent '
    'takes no other and exits when it ends. NULL for an elastic pool''s agents. No foreign '
    'key: an instance''s history outlives a deleted experiment''s runs.';
-- A run has at most one live Slurm job: nothing is queued twice for it.
CREATE UNIQUE INDEX instances_one_per_allocation ON instances (allocation_id)
    WHERE state <> 'GONE';

CREATE OR REPLACE VIEW reporting.job_queue WITH (security_invoker = true) AS
-- Active jobs in scheduling order per pool, with slots acquired / needed and the scheduler's
-- reasons for what still waits. An interactive task is active while its run lives; its name
-- is its description. An unmanaged experiment (core_v2) is no job: det schedules nothing of it.
SELECT j.id AS job_id, j.type, j.resource_pool, j.priority, j.weight, j.owner, j.submitted_at,
       j.queue_position, e.id AS experiment_id, coalesce(e.name, t.description) AS name,
       e.state::text AS experiment_state,
       coalesce(sum(a.slots_needed) FILTER (WHERE a.state > 'PENDING'), 0) AS slots_acquired,
       -- an active job with no run yet (the reconciler has not created one) still needs
       -- one trial's slots
       CASE WHEN count(a.id) = 0 AND e.state = 'ACTIVE'
            THEN (e.config #>> '{resources,slots_per_trial}')::bigint
            ELSE coalesce(sum(a.slots_needed), 0) END AS slots_needed,
       CASE WHEN bool_or(a.state > 'PENDING') THEN 'STATE_SCHEDULED'
            ELSE 'STATE_QUEUED' END AS status,
       -- the scheduler's reasons, then what the pool's provider says of what the job still
       -- waits for: the Slurm job of each of its waiting runs (state and reason in Slurm's
       -- queue), or an elastic pool's instances not yet running
       nullif(concat_ws(' | ',
           string_agg(DISTINCT a.pending_reason, ' | ') FILTER (WHERE a.state = 'PENDING'),
           CASE WHEN bool_or(a.state = 'PENDING') THEN
               (SELECT string_agg(i.provider_state, ' | ' ORDER BY i.id) FROM instances i
                 WHERE i.resource_pool = j.resource_pool AND i.state < 'RUNNING'
                   AND i.provider_state <> ''
                   AND (i.allocation_id IS NULL
                        OR i.allocation_id IN (SELECT x.id FROM allocations x
                                                WHERE x.job_id = j.id
                                                  AND x.state = 'PENDING'))) END),
           '') AS pending_reason,
       row_number() OVER (PARTITION BY j.resource_pool
                          ORDER BY j.priority, j.queue_position, j.id) - 1 AS queue_order
FROM jobs j
LEFT JOIN experiments e ON e.job_id = j.id
LEFT JOIN tasks t ON t.job_id = j.id
LEFT JOIN allocations a ON a.job_id = j.id AND a.state <> 'TERMINATED'
WHERE (e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') AND NOT e.unmanaged)
   OR (t.job_id IS NOT NULL AND a.id IS NOT NULL)
GROUP BY j.id, e.id, t.job_id;
