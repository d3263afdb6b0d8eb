-- The config read once: the fields of a stored config that the control plane decides on
-- become typed columns generated from it. An experiment's searcher name, metric and
-- smaller_is_better, max_trials and max_concurrent_trials, warm-start source, max_restarts,
-- preemption_timeout, slots_per_trial, experiment_seed and checkpoint policy; a task's
-- idle_timeout; the cluster config's scheduler and default pools. Each is parsed once when
-- the row is written (ADD COLUMN fills them for every existing row) and equals the config
-- after any edit of it. The functions and views that read those fields by path read the
-- columns; their results are unchanged.

ALTER TABLE experiments
    ADD COLUMN searcher_name text GENERATED ALWAYS AS (config #>> '{searcher,name}') STORED,
    ADD COLUMN searcher_metric text GENERATED ALWAYS AS (config #>> '{searcher,metric}') STORED,
    ADD COLUMN smaller_is_better boolean
        GENERATED ALWAYS AS ((config #>> '{searcher,smaller_is_better}')::boolean) STORED,
    ADD COLUMN max_trials integer
        GENERATED ALWAYS AS ((config #>> '{searcher,max_trials}')::numeric::integer) STORED,
    ADD COLUMN max_concurrent_trials bigint GENERATED ALWAYS AS
        ((config #>> '{searcher,max_concurrent_trials}')::numeric::bigint) STORED,
    ADD COLUMN source_trial_id bigint
        GENERATED ALWAYS AS ((config #>> '{searcher,source_trial_id}')::numeric::bigint) STORED,
    ADD COLUMN source_checkpoint_uuid uuid GENERATED ALWAYS AS (
        CASE WHEN config #>> '{searcher,source_checkpoint_uuid}'
                  ~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
             THEN (config #>> '{searcher,source_checkpoint_uuid}')::uuid END) STORED,
    ADD COLUMN max_restarts integer
        GENERATED ALWAYS AS ((config ->> 'max_restarts')::numeric::integer) STORED,
    ADD COLUMN preemption_timeout integer
        GENERATED ALWAYS AS ((config ->> 'preemption_timeout')::numeric::integer) STORED,
    ADD COLUMN slots_per_trial integer
        GENERATED ALWAYS AS ((config #>> '{resources,slots_per_trial}')::numeric::integer) STORED,
    ADD COLUMN experiment_seed bigint GENERATED ALWAYS AS
        ((config #>> '{reproducibility,experiment_seed}')::numeric::bigint) STORED,
    ADD COLUMN save_experiment_best integer GENERATED ALWAYS AS
        ((config #>> '{checkpoint_storage,save_experiment_best}')::numeric::integer) STORED,
    ADD COLUMN save_trial_best integer GENERATED ALWAYS AS
        ((config #>> '{checkpoint_storage,save_trial_best}')::numeric::integer) STORED,
    ADD COLUMN save_trial_latest integer GENERATED ALWAYS AS
        ((config #>> '{checkpoint_storage,save_trial_latest}')::numeric::integer) STORED;

ALTER TABLE tasks ADD COLUMN idle_timeout double precision
    GENERATED ALWAYS AS ((config ->> 'idle_timeout')::double precision) STORED;

ALTER TABLE cluster_config
    ADD COLUMN scheduler jsonb
        GENERATED ALWAYS AS (config #> '{resource_manager,scheduler}') STORED,
    ADD COLUMN default_compute_pool text
        GENERATED ALWAYS AS (config #>> '{resource_manager,default_compute_resource_pool}') STORED,
    ADD COLUMN default_aux_pool text
        GENERATED ALWAYS AS (config #>> '{resource_manager,default_aux_resource_pool}') STORED;

CREATE OR REPLACE FUNCTION det_trial_best_validation(p_trial integer) RETURNS double precision
LANGUAGE sql STABLE AS $$
-- The best searcher metric (searcher.smaller_is_better decides "best") of the trial's
-- surviving validation rows; NULL without one. det_report_metrics_batch keeps
-- trials.best_validation up to date row by row; this recomputes it when rows are superseded.
    SELECT CASE WHEN e.smaller_is_better
                THEN min((m."values" ->> e.searcher_metric)::double precision)
                ELSE max((m."values" ->> e.searcher_metric)::double precision)
                END
      FROM trials t
      JOIN experiments e ON e.id = t.experiment_id
      JOIN metrics m ON m.trial_id = t.id AND m."group" = 'validation'
                    AND m.superseded_by IS NULL
     WHERE t.id = p_trial
       AND jsonb_typeof(m."values" -> e.searcher_metric) = 'number'
     GROUP BY e.id;
$$;

CREATE OR REPLACE FUNCTION det_unmanaged_start(
    p_config jsonb, p_original_config text, p_workspace text, p_project text,
    p_external_experiment text, p_external_trial text, p_hparams jsonb
) RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- core_v2.init of a script outside det (Determined 0.38's unmanaged mode): a new run of a
-- trial of an unmanaged experiment owned by the caller, in one transaction. The experiment is
-- the caller's with external id p_external_experiment if there is one, else a new one
-- submitted as det_create_experiment submits (p_config: the expanded config; same checks,
-- placement and permission); the trial is its trial with external id p_external_trial if
-- any, else a new one with hyperparameters p_hparams. A resumed experiment or trial that had
-- ended is ACTIVE again. The run is an allocation born TERMINATED and settled (no pass places
-- or ends it; det_unmanaged_end stamps its end); it supersedes what earlier runs reported
-- after the trial's latest checkpoint (det_metrics_supersede), as a managed run's start
-- does. Returns det_task_info's object. Refused: p_external_trial without
-- p_external_experiment (invalid_parameter_value, as upstream requires both); a paused or
-- stopping experiment (object_not_in_prerequisite_state).
DECLARE
    v_user text := det_caller();
    e experiments;
    t trials;
    v_exp integer;
    v_alloc bigint;
BEGIN
    IF p_external_trial IS NOT NULL AND p_external_experiment IS NULL THEN
        RAISE EXCEPTION 'external_trial_id: needs external_experiment_id as well'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_hparams IS NOT NULL AND jsonb_typeof(p_hparams) <> 'object' THEN
        RAISE EXCEPTION 'hparams: expected a JSON object, got %', jsonb_typeof(p_hparams)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_external_experiment IS NOT NULL THEN
        -- Two first starts with one external id make one experiment.
        PERFORM pg_advisory_xact_lock(hashtext('det_unmanaged_start'),
                                      hashtext(v_user || '/' || p_external_experiment));
        SELECT * INTO e FROM experiments
         WHERE owner = v_user AND external_id = p_external_experiment FOR NO KEY UPDATE;
    END IF;
    IF e.id IS NULL THEN
        v_exp := det_create_experiment(p_config, p_original_config, NULL, p_workspace,
                                       p_project);
        UPDATE experiments SET unmanaged = true, external_id = p_external_experiment
         WHERE id = v_exp RETURNING * INTO e;
    ELSIF e.state IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        PERFORM det_require('edit', (SELECT workspace_id FROM jobs WHERE id = e.job_id),
                            format('resume experiment %s', e.id));
        UPDATE experiments SET state = 'ACTIVE', end_time = NULL WHERE id = e.id;
    ELSIF e.state <> 'ACTIVE' THEN
        RAISE EXCEPTION 'experiment % is %: activate it to resume it', e.id, e.state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    ELSE
        PERFORM det_require('edit', (SELECT workspace_id FROM jobs WHERE id = e.job_id),
                            format('resume experiment %s', e.id));
    END IF;
    IF p_external_trial IS NOT NULL THEN
        SELECT * INTO t FROM trials
         WHERE experiment_id = e.id AND external_id = p_external_trial FOR NO KEY UPDATE;
    END IF;
    IF t.id IS NULL THEN
        INSERT INTO trials (experiment_id, request_id, hparams, seed, external_id)
        VALUES (e.id, gen_random_uuid(), coalesce(p_hparams, '{}'),
                coalesce(e.experiment_seed, 0),
                p_external_trial)
        RETURNING * INTO t;
    END IF;
    UPDATE trials SET runs = runs + 1, state = 'ACTIVE', end_time = NULL, exit_reason = NULL
     WHERE id = t.id RETURNING * INTO t;
    INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec, state,
                             settled, started_at, running_at, ended_at, preemptible)
    SELECT e.job_id, t.id, t.runs, j.resource_pool, 0,
           jsonb_build_object('kind', 'unmanaged', 'experiment_id', e.id, 'trial_id', t.id),
           'TERMINATED', true, now(), now(), now(), false
      FROM jobs j WHERE j.id = e.job_id
    RETURNING id INTO v_alloc;
    PERFORM det_metrics_supersede(v_alloc);
    RETURN jsonb_build_object(
        'allocation_id', v_alloc, 'trial_id', t.id, 'experiment_id', e.id,
        'config', (SELECT config FROM experiments WHERE id = e.id), 'hparams', t.hparams,
        'trial_seed', t.seed, 'latest_checkpoint', t.latest_checkpoint,
        'steps_completed', t.steps_completed, 'slots', 1);
END $$;

CREATE OR REPLACE FUNCTION det_experiment_best_validation(p_token text) RETURNS double precision
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT CASE WHEN e.smaller_is_better
                THEN min(t.best_validation) ELSE max(t.best_validation) END
    FROM allocations a
    JOIN trials me ON me.id = a.trial_id
    JOIN experiments e ON e.id = me.experiment_id
    JOIN trials t ON t.experiment_id = e.id
    WHERE a.id = (det_auth(p_token)).id
    GROUP BY e.id;
$$;

CREATE OR REPLACE VIEW checkpoint_pins WITH (security_invoker = true) AS
-- Checkpoints that are not deleted, whatever the GC policy or a user asks: the versions of
-- the model registry, the checkpoints experiments warm-start from
-- (searcher.source_checkpoint_uuid, or the latest checkpoint of searcher.source_trial_id;
-- as Determined 0.38 keeps them), and while a trial lives its restart point (its latest
-- checkpoint: GC runs during runs). It is the one home of "pinned".
SELECT checkpoint_uuid FROM model_versions
UNION
SELECT e.source_checkpoint_uuid FROM experiments e WHERE e.source_checkpoint_uuid IS NOT NULL
UNION
SELECT t.latest_checkpoint
  FROM experiments e
  JOIN trials t ON t.id = e.source_trial_id
 WHERE t.latest_checkpoint IS NOT NULL
UNION
SELECT t.latest_checkpoint FROM trials t
 WHERE t.state < 'COMPLETED' AND t.latest_checkpoint IS NOT NULL;

CREATE OR REPLACE FUNCTION det_checkpoints_to_delete(
    p_experiment integer, p_save_experiment_best integer DEFAULT NULL,
    p_save_trial_best integer DEFAULT NULL, p_save_trial_latest integer DEFAULT NULL
) RETURNS TABLE (uuid uuid, trial_id integer, steps_completed bigint, size_bytes bigint,
                 metric double precision)
LANGUAGE sql STABLE AS $$
-- The GC keep rule (Determined 0.38's checkpoint GC policy), one statement. Of the experiment's
-- COMPLETED checkpoints keep the union of
--   * the save_experiment_best best by the searcher metric across the experiment,
--   * each trial's save_trial_best best,
--   * each trial's save_trial_latest latest (by steps_completed);
-- and return the rest, less the pinned ones (checkpoint_pins). A checkpoint's metric is the
-- searcher metric of its trial's validation at the checkpoint's step (the last one reported
-- there); without one it is never "best". Ties share a rank (rank()), so tied checkpoints are
-- all kept. The policy is the experiment's checkpoint_storage save_* values unless given; if
-- it has none, nothing is returned.
WITH x AS (
    SELECT e.id,
           CASE WHEN e.smaller_is_better THEN 1 ELSE -1 END
               AS sign,
           e.searcher_metric AS metric,
           coalesce(p_save_experiment_best,
                    e.save_experiment_best) AS seb,
           coalesce(p_save_trial_best,
                    e.save_trial_best) AS stb,
           coalesce(p_save_trial_latest,
                    e.save_trial_latest) AS stl
      FROM experiments e WHERE e.id = p_experiment
), scored AS (
    SELECT c.uuid, c.trial_id, c.steps_completed,
           (SELECT sum(r.value::bigint) FROM jsonb_each_text(c.resources) r)::bigint AS size_bytes,
           CASE WHEN jsonb_typeof(v."values" -> x.metric) = 'number'
                THEN (v."values" ->> x.metric)::double precision END AS metric,
           x.sign
      FROM x
      JOIN trials t ON t.experiment_id = x.id
      JOIN checkpoints c ON c.trial_id = t.id AND c.state = 'COMPLETED'
      LEFT JOIN LATERAL (
          SELECT m."values" FROM metrics m
           WHERE m.trial_id = c.trial_id AND m."group" = 'validation'
             AND m.steps_completed = c.steps_completed AND m.superseded_by IS NULL
           ORDER BY m.id DESC LIMIT 1) v ON true
), ranked AS (
    SELECT s.*,
           CASE WHEN s.metric IS NOT NULL
                THEN rank() OVER (ORDER BY s.sign * s.metric NULLS LAST) END AS experiment_rank,
           CASE WHEN s.metric IS NOT NULL
                THEN rank() OVER (PARTITION BY s.trial_id ORDER BY s.sign * s.metric NULLS LAST)
                END AS trial_rank,
           rank() OVER (PARTITION BY s.trial_id ORDER BY s.steps_completed DESC) AS latest_rank
      FROM scored s
)
SELECT r.uuid, r.trial_id, r.steps_completed, r.size_bytes, r.metric
  FROM ranked r, x
 WHERE x.seb IS NOT NULL AND x.stb IS NOT NULL AND x.stl IS NOT NULL
   AND NOT (coalesce(r.experiment_rank <= x.seb, false)
            OR coalesce(r.trial_rank <= x.stb, false)
            OR r.latest_rank <= x.stl)
   AND NOT EXISTS (SELECT 1 FROM checkpoint_pins p WHERE p.checkpoint_uuid = r.uuid)
 ORDER BY r.trial_id, r.steps_completed;
$$;

CREATE OR REPLACE VIEW reporting.experiments WITH (security_invoker = true) AS
SELECT e.id, e.name, e.state, e.owner, e.progress, e.start_time, e.end_time, e.archived,
       e.searcher_name AS searcher,
       e.searcher_metric AS metric,
       (SELECT count(*) FROM trials t WHERE t.experiment_id = e.id) AS trials,
       (SELECT CASE WHEN e.smaller_is_better
                    THEN min(t.best_validation) ELSE max(t.best_validation) END
          FROM trials t WHERE t.experiment_id = e.id) AS best_validation,
       j.resource_pool, j.priority, j.weight, e.project_id, p.name AS project,
       p.workspace_id, w.name AS workspace
FROM experiments e JOIN jobs j ON j.id = e.job_id
JOIN projects p ON p.id = e.project_id JOIN workspaces w ON w.id = p.workspace_id;

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
            THEN e.slots_per_trial
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

CREATE OR REPLACE FUNCTION det_pool_scheduler(p_pool text) RETURNS jsonb
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
