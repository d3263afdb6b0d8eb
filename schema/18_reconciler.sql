-- Reconciler helpers (also read by user actions: a job's default priority, `det job update`)

CREATE FUNCTION det_user.pool_scheduler(p_pool text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
-- The scheduler a pool really uses, every default filled in: the pool's own, else the
-- cluster's, else fair_share (the spec's default for a blank type: Resource Pools).
-- min_run_time: seconds a run without a checkpoint is not preempted. The defaults are
-- det.configs.cluster's (SchedulerConfig), the values a cluster config gets before it is
-- stored; they are here for a cluster that has none applied yet.
BEGIN
    RETURN jsonb_build_object('type', 'fair_share', 'preemption', false,
                              'fitting_policy', 'best', 'default_priority', 42,
                              'min_run_time', 60)
           || coalesce((SELECT nullif(scheduler, 'null') FROM resource_pools WHERE name = p_pool),
                       (SELECT scheduler FROM cluster_config),
                       '{}');
END $$;
GRANT EXECUTE ON FUNCTION det_user.pool_scheduler(text) TO det_user;

CREATE FUNCTION det_internal.job_label(p_job bigint) RETURNS text
LANGUAGE sql STABLE AS $$
-- A job as reasons name it to users: 'experiment 3', 'notebook 12' (a task's id is its job's),
-- else 'job N'.
SELECT coalesce((SELECT 'experiment ' || e.id FROM experiments e WHERE e.job_id = p_job),
                (SELECT lower(t.type) || ' ' || t.job_id FROM tasks t WHERE t.job_id = p_job),
                'job ' || p_job);
$$;

CREATE FUNCTION det_internal.preempted_reason(p_job bigint, p_rule text) RETURNS text
LANGUAGE sql STABLE AS $$
-- The stop reason of a run the scheduler preempted: 'preempted: slots given to experiment 3
-- (fair share)'. p_job: the job its slots go to (NULL: not known); p_rule: the scheduler's
-- rule. det_user.run_status knows a preempted run by this prefix.
SELECT format('preempted: slots given to %s (%s)',
              coalesce(det_internal.job_label(p_job), 'a waiting job'), p_rule);
$$;

CREATE FUNCTION det_user.run_end_reason(p_allocation bigint) RETURNS text
LANGUAGE sql STABLE STRICT AS $$
-- Why a run ended (the WebUI's "Why it ended"; NULL while it lives), never blank once it has:
-- why det stopped it (stop_reason), then what the run said (its checkpoint storage error, the
-- agent's or det's reason: a signal, 'agent lost', 'stopped before it started'), else what
-- its flags and exit code tell (so a preempted run's is not blank). By id, not by row: a
-- whole allocations row includes token_hash, which no user may read.
SELECT CASE WHEN a.state = 'TERMINATED' THEN concat_ws('; ', a.stop_reason, coalesce(
    a.storage_error, a.exit_reason,
    CASE WHEN a.stop_reason IS NOT NULL AND a.exit_code = 0 THEN NULL
         WHEN a.planned_stop THEN 'its agent stopped it (a planned stop)'
         WHEN a.exit_code = 0 AND a.out_of_work THEN 'finished its work (exit code 0)'
         WHEN a.exit_code = 0 THEN 'its code exited (exit code 0)'
         WHEN a.exit_code IS NULL THEN 'ended without an exit code'
         ELSE 'exit code ' || a.exit_code END)) END
  FROM allocations a WHERE a.id = p_allocation;
$$;
-- users' queries (a trial's runs, an experiment's trials) show it
GRANT EXECUTE ON FUNCTION det_user.run_end_reason(bigint) TO det_user;

CREATE FUNCTION det_user.run_status(p_allocation bigint) RETURNS text
LANGUAGE sql STABLE STRICT AS $$
-- A run as users should read it, agreeing with the job queue (a trial waiting for a slot
-- reads waiting, not "running"): waiting (for slots: pending_reason says why), starting (slots
-- held, its process or container not yet running), running, preempting or stopping (told to stop,
-- not yet gone), preempted or ended.
SELECT CASE WHEN a.state = 'PENDING' AND a.desired_state = 'RUNNING' THEN 'waiting'
            WHEN a.state = 'TERMINATED'
                THEN CASE WHEN a.stop_reason LIKE 'preempted:%' THEN 'preempted' ELSE 'ended' END
            WHEN a.desired_state <> 'RUNNING'
                THEN CASE WHEN a.stop_reason LIKE 'preempted:%' THEN 'preempting'
                          ELSE 'stopping' END
            WHEN a.state = 'RUNNING' THEN 'running'
            ELSE 'starting' END
  FROM allocations a WHERE a.id = p_allocation;
$$;
-- users' queries (a trial's runs, an experiment's trials) show it
GRANT EXECUTE ON FUNCTION det_user.run_status(bigint) TO det_user;

CREATE FUNCTION det_user.run_reason(p_allocation bigint) RETURNS text
LANGUAGE sql STABLE STRICT AS $$
-- The reason that goes with det_user.run_status: the scheduler's while it waits, det's while it
-- is told to stop, det_user.run_end_reason once it ended; NULL while it starts or runs.
SELECT CASE WHEN a.state = 'PENDING' AND a.desired_state = 'RUNNING' THEN a.pending_reason
            WHEN a.state = 'TERMINATED' THEN det_user.run_end_reason(a.id)
            WHEN a.desired_state <> 'RUNNING' THEN a.stop_reason END
  FROM allocations a WHERE a.id = p_allocation;
$$;
-- users' queries (a trial's runs, an experiment's trials) show it
GRANT EXECUTE ON FUNCTION det_user.run_reason(bigint) TO det_user;
