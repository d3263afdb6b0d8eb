-- Issue 38: unmanaged runs (Determined 0.38's determined.experimental.core_v2): a script run
-- outside det, as a det user, reports metrics and checkpoints into an experiment with one
-- trial that det never schedules. Each start of the script is one run of the trial, an
-- allocation row born TERMINATED and settled, which no pass places, settles or ends.

ALTER TABLE experiments ADD COLUMN unmanaged boolean NOT NULL DEFAULT false;
ALTER TABLE experiments ADD COLUMN external_id text;
ALTER TABLE trials ADD COLUMN external_id text;
COMMENT ON COLUMN experiments.unmanaged IS
    'Made by a script that reports from outside det (core_v2.init, det_unmanaged_start): no '
    'searcher, no runs placed; its owner''s script reports through det_unmanaged_*.';
COMMENT ON COLUMN experiments.external_id IS
    'core_v2''s external_experiment_id: a later start with the same id (and owner) resumes it.';
COMMENT ON COLUMN trials.external_id IS
    'core_v2''s external_trial_id: a later start with the same id resumes this trial.';
CREATE UNIQUE INDEX experiments_external ON experiments (owner, external_id)
    WHERE external_id IS NOT NULL;
CREATE UNIQUE INDEX trials_external ON trials (experiment_id, external_id)
    WHERE external_id IS NOT NULL;
DROP INDEX experiments_unsearched;
CREATE INDEX experiments_unsearched ON experiments (id)
    WHERE searcher_state IS NULL AND state IN ('ACTIVE', 'PAUSED') AND NOT unmanaged;

CREATE OR REPLACE FUNCTION det_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
-- Experiments and trials: terminal states are final (but an unmanaged one's, resumed), and a
-- STOPPING_* state only moves on to its terminal state (det_stopped_state), or to a harsher
-- STOPPING_* (a cancel may become a kill). Allocations: the observed state only moves forward.
DECLARE
    old_s text := OLD.state::text;
    new_s text := NEW.state::text;
BEGIN
    IF old_s = new_s THEN
        RETURN NEW;
    END IF;
    IF TG_TABLE_NAME = 'allocations' THEN
        IF NEW.state < OLD.state THEN
            RAISE EXCEPTION 'allocation %: illegal state change % -> %', OLD.id, old_s, new_s
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    -- A later start of an unmanaged script resumes its ended experiment and trial
    -- (det_unmanaged_start), as upstream reopens an unmanaged trial.
    IF old_s IN ('COMPLETED', 'CANCELED', 'ERROR') AND new_s = 'ACTIVE'
       AND EXISTS (SELECT 1 FROM experiments e
                    WHERE e.unmanaged AND e.id = CASE TG_TABLE_NAME
                        WHEN 'experiments' THEN OLD.id
                        ELSE (SELECT t.experiment_id FROM trials t WHERE t.id = OLD.id) END) THEN
        RETURN NEW;
    END IF;
    IF old_s IN ('COMPLETED', 'CANCELED', 'ERROR')
       OR (old_s LIKE 'STOPPING_%' AND new_s IN ('ACTIVE', 'PAUSED'))
       OR (old_s = 'STOPPING_KILLED' AND new_s LIKE 'STOPPING_%')
       OR (old_s = 'STOPPING_CANCELED' AND new_s IN ('STOPPING_COMPLETED', 'COMPLETED'))
       OR (old_s LIKE 'STOPPING_%' AND new_s NOT LIKE 'STOPPING_%'
           AND new_s <> det_stopped_state(old_s)) THEN
        RAISE EXCEPTION '% %: illegal state change % -> %', TG_TABLE_NAME, OLD.id, old_s, new_s
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION det_append_metrics(
    a allocations, p_groups text[], p_steps bigint[], p_values jsonb[]
) RETURNS integer LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
-- Append metrics rows of run a in order: row i is (p_groups[i], p_steps[i], p_values[i]);
-- returns the rows written. Validation rows update the trial's best searcher metric
-- (searcher.smaller_is_better decides "best"). The one home of the metrics-append rule, for a
-- task's reports (det_report_metrics_batch) and an unmanaged script's
-- (det_unmanaged_report_metrics). Each row is checked first, and the whole batch refused
-- (invalid_parameter_value naming the row's group and step) for: a group that is empty,
-- longer than 255 characters or holds a control character (it is shown on terminals); a step
-- outside 0 to 2^53 - 1 (what a JSON reader such as the WebUI holds exactly; Core API code
-- counts steps in its own unit, so the searcher's length gives no tighter bound); values that
-- are not a JSON object, are over 64 KiB or nest deeper than 32 levels (det_json_problem: any
-- JSON inside, as Determined allows; the harness writes NaN and infinities as strings); a
-- validation's searcher metric that is a number a double cannot hold.
DECLARE
    v_cfg jsonb;
    v_metric text;
    v_best double precision;
    v_rows integer;
    v_bad record;
BEGIN
    IF cardinality(p_groups) IS DISTINCT FROM cardinality(p_steps)
       OR cardinality(p_groups) IS DISTINCT FROM cardinality(p_values) THEN
        RAISE EXCEPTION 'metrics batch: groups, steps and values must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT e.config INTO v_cfg FROM trials t JOIN experiments e ON e.id = t.experiment_id
     WHERE t.id = a.trial_id;
    v_metric := v_cfg #>> '{searcher,metric}';
    SELECT u.g, u.s, CASE
               WHEN u.g IS NULL OR u.g = '' THEN 'metrics group must be a non-empty name'
               WHEN length(u.g) > 255 THEN 'group: longer than 255 characters'
               WHEN u.g ~ '[[:cntrl:]]' THEN 'group: holds a control character'
               WHEN u.s IS NULL OR u.s NOT BETWEEN 0 AND 9007199254740991
                   THEN format('steps_completed: expected 0 to 2^53 - 1, not %s', u.s)
               WHEN det_json_problem(u.v, 65536) IS NOT NULL
                   THEN 'values ' || det_json_problem(u.v, 65536)
               ELSE format('values: searcher metric "%s" is %s, beyond a double', v_metric,
                           u.v -> v_metric) END AS problem
      INTO v_bad
      FROM unnest(p_groups, p_steps, p_values) WITH ORDINALITY AS u (g, s, v, i)
     WHERE u.g IS NULL OR u.g = '' OR length(u.g) > 255 OR u.g ~ '[[:cntrl:]]'
        OR u.s IS NULL OR u.s NOT BETWEEN 0 AND 9007199254740991
        OR det_json_problem(u.v, 65536) IS NOT NULL
        OR (u.g = 'validation' AND jsonb_typeof(u.v -> v_metric) = 'number'
            AND abs((u.v ->> v_metric)::numeric) > 1.7976931348623157e308)
     ORDER BY u.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '%', CASE WHEN v_bad.g IS NULL OR v_bad.g = '' THEN v_bad.problem
            ELSE format('metrics %s at batch %s: %s', to_jsonb(left(v_bad.g, 64)), v_bad.s,
                        v_bad.problem) END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO metrics (trial_id, allocation_id, "group", steps_completed, "values")
    SELECT a.trial_id, a.id, u.g, u.s, u.v
      FROM unnest(p_groups, p_steps, p_values) WITH ORDINALITY AS u (g, s, v, i)
     ORDER BY u.i;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    SELECT CASE WHEN (v_cfg #>> '{searcher,smaller_is_better}')::boolean
                THEN min((u.v ->> v_metric)::double precision)
                ELSE max((u.v ->> v_metric)::double precision) END
      INTO v_best
      FROM unnest(p_groups, p_values) AS u (g, v)
     WHERE u.g = 'validation' AND jsonb_typeof(u.v -> v_metric) = 'number';
    IF v_best IS NOT NULL THEN
        UPDATE trials SET best_validation = CASE
            WHEN best_validation IS NULL THEN v_best
            WHEN (v_cfg #>> '{searcher,smaller_is_better}')::boolean
                THEN least(best_validation, v_best)
            ELSE greatest(best_validation, v_best) END
         WHERE id = a.trial_id;
    END IF;
    RETURN v_rows;
END $$;

CREATE OR REPLACE FUNCTION det_report_metrics_batch(
    p_token text, p_writer uuid, p_seq bigint,
    p_groups text[], p_steps bigint[], p_values jsonb[]
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A task appends a batch of metrics rows (det_append_metrics: the rows and what is refused).
-- p_writer and p_seq name the batch (see metric_batches): a batch already recorded is
-- skipped; a NULL p_writer asks for no such check (det_report_metrics). Returns the rows
-- written (0 for a skipped batch).
DECLARE
    a allocations := det_auth(p_token);
    v_rows integer;
BEGIN
    IF p_writer IS NOT NULL THEN
        IF p_seq IS NULL OR p_seq < 1 THEN
            RAISE EXCEPTION 'metrics batch number must be 1 or more, not %', p_seq
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        INSERT INTO metric_batches AS b (writer, allocation_id, last_seq)
        VALUES (p_writer, a.id, p_seq)
        ON CONFLICT (writer) DO UPDATE SET last_seq = excluded.last_seq
         WHERE b.last_seq < excluded.last_seq AND b.allocation_id = excluded.allocation_id;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows = 0 THEN
            RETURN 0;
        END IF;
    END IF;
    RETURN det_append_metrics(a, p_groups, p_steps, p_values);
END $$;

CREATE FUNCTION det_unmanaged_run(p_allocation bigint) RETURNS allocations
LANGUAGE plpgsql STABLE SET search_path = public, pg_temp AS $$
-- The unmanaged run p_allocation, for its script to report into: refused unless the run is
-- its trial's latest (a later start of the script took over: object_not_in_prerequisite_state),
-- the trial is still live (ended: the same), and the caller is the experiment's owner and
-- still an Editor of its workspace (insufficient_privilege; a caller who cannot view it, or a
-- run of a managed trial: no_data_found). Upstream lets the script's session write into its
-- own trial only; a Viewer of the workspace never can.
DECLARE
    a allocations;
    v_owner text;
    v_ws integer;
    v_state trial_state;
    v_latest integer;
BEGIN
    SELECT * INTO a FROM allocations WHERE id = p_allocation;
    SELECT e.owner, j.workspace_id, t.state, t.runs INTO v_owner, v_ws, v_state, v_latest
      FROM trials t JOIN experiments e ON e.id = t.experiment_id JOIN jobs j ON j.id = e.job_id
     WHERE t.id = a.trial_id AND e.unmanaged;
    IF NOT FOUND OR NOT (det_is_owner_session() OR det_permitted(det_caller(), 'view', v_ws)) THEN
        RAISE EXCEPTION 'unmanaged run % not found', p_allocation USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_require('edit', v_ws, format('report into trial %s', a.trial_id));
    IF v_owner <> det_caller() AND NOT det_is_owner_session() THEN
        RAISE EXCEPTION 'permission denied: trial % is %''s unmanaged trial; only its owner '
                        'reports into it', a.trial_id, to_jsonb(v_owner)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF a.run <> v_latest THEN
        RAISE EXCEPTION 'unmanaged run % of trial % was replaced by run % (the script was '
                        'started again)', a.run, a.trial_id, v_latest
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF v_state <> 'ACTIVE' THEN
        RAISE EXCEPTION 'trial % is %: it takes no more reports', a.trial_id, v_state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN a;
END $$;

CREATE FUNCTION det_unmanaged_start(
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
                coalesce((e.config #>> '{reproducibility,experiment_seed}')::bigint, 0),
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

CREATE FUNCTION det_unmanaged_report_metrics(
    p_allocation bigint, p_group text, p_steps_completed bigint, p_metrics jsonb
) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An unmanaged script's metrics report (det_unmanaged_run: who may; det_append_metrics: what
-- is refused).
    SELECT FROM det_append_metrics(det_unmanaged_run(p_allocation), ARRAY[p_group],
                                   ARRAY[p_steps_completed], ARRAY[p_metrics]);
$$;

CREATE FUNCTION det_unmanaged_report_checkpoint(
    p_allocation bigint, p_uuid uuid, p_steps_completed bigint, p_resources jsonb,
    p_metadata jsonb
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An unmanaged script stored a checkpoint (det_unmanaged_run: who may); it becomes the
-- trial's restart point, as det_report_checkpoint's. Its files lie where the script wrote
-- them, which det's GC tasks may not reach, so no GC policy applies to it (gc_pending false):
-- upstream collects no unmanaged checkpoint either.
DECLARE
    a allocations := det_unmanaged_run(p_allocation);
BEGIN
    INSERT INTO checkpoints (uuid, trial_id, allocation_id, steps_completed, storage, resources,
                             metadata, gc_pending)
    SELECT p_uuid, a.trial_id, a.id, p_steps_completed, e.config -> 'checkpoint_storage',
           coalesce(p_resources, '{}'), coalesce(p_metadata, '{}'), false
    FROM trials t JOIN experiments e ON e.id = t.experiment_id WHERE t.id = a.trial_id;
    UPDATE trials SET latest_checkpoint = p_uuid, steps_completed = p_steps_completed
     WHERE id = a.trial_id AND steps_completed <= p_steps_completed;
END $$;

CREATE FUNCTION det_unmanaged_progress(p_allocation bigint, p_progress double precision)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- core_v2.train.report_progress: the fraction (0 to 1) of the experiment's work done, shown as
-- its progress. Refused outside [0, 1] (invalid_parameter_value).
DECLARE
    a allocations := det_unmanaged_run(p_allocation);
BEGIN
    IF p_progress IS NULL OR NOT p_progress BETWEEN 0 AND 1 THEN
        RAISE EXCEPTION 'progress: expected 0 to 1, not %', p_progress
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE experiments SET progress = p_progress
     WHERE id = (SELECT experiment_id FROM trials WHERE id = a.trial_id);
END $$;

CREATE FUNCTION det_unmanaged_end(p_allocation bigint, p_error text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- core_v2.close: the run ends, and with it its trial, COMPLETED, or ERROR when p_error (the
-- script's exception, kept as the run's exit reason) is given, as upstream's unmanaged
-- heartbeat sets the trial's state at exit. The experiment ends when it has no live trial
-- left: ERROR if one of its trials errored, else COMPLETED.
DECLARE
    a allocations := det_unmanaged_run(p_allocation);
    v_exp integer;
BEGIN
    UPDATE allocations
       SET ended_at = now(), exit_code = CASE WHEN p_error IS NULL THEN 0 ELSE 1 END,
           exit_reason = coalesce(left(p_error, 4096), 'completed')
     WHERE id = a.id;
    UPDATE trials
       SET state = CASE WHEN p_error IS NULL THEN 'COMPLETED' ELSE 'ERROR' END::trial_state,
           end_time = now(), exit_reason = CASE WHEN p_error IS NOT NULL THEN 'errored' END
     WHERE id = a.trial_id RETURNING experiment_id INTO v_exp;
    UPDATE experiments e
       SET state = CASE WHEN EXISTS (SELECT 1 FROM trials t
                                      WHERE t.experiment_id = e.id AND t.state = 'ERROR')
                        THEN 'ERROR' ELSE 'COMPLETED' END::experiment_state,
           end_time = now(), progress = CASE WHEN p_error IS NULL THEN 1 ELSE e.progress END
     WHERE e.id = v_exp
       AND NOT EXISTS (SELECT 1 FROM trials t WHERE t.experiment_id = e.id AND t.state < 'COMPLETED');
END $$;

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
       string_agg(DISTINCT a.pending_reason, ' | ') FILTER (WHERE a.state = 'PENDING')
           AS pending_reason,
       row_number() OVER (PARTITION BY j.resource_pool
                          ORDER BY j.priority, j.queue_position, j.id) - 1 AS queue_order
FROM jobs j
LEFT JOIN experiments e ON e.job_id = j.id
LEFT JOIN tasks t ON t.job_id = j.id
LEFT JOIN allocations a ON a.job_id = j.id AND a.state <> 'TERMINATED'
WHERE (e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') AND NOT e.unmanaged)
   OR (t.job_id IS NOT NULL AND a.id IS NOT NULL)
GROUP BY j.id, e.id, t.job_id;

REVOKE ALL ON FUNCTION det_append_metrics(allocations, text[], bigint[], jsonb[]),
    det_unmanaged_run(bigint),
    det_unmanaged_start(jsonb, text, text, text, text, text, jsonb),
    det_unmanaged_report_metrics(bigint, text, bigint, jsonb),
    det_unmanaged_report_checkpoint(bigint, uuid, bigint, jsonb, jsonb),
    det_unmanaged_progress(bigint, double precision),
    det_unmanaged_end(bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION det_unmanaged_start(jsonb, text, text, text, text, text, jsonb),
    det_unmanaged_report_metrics(bigint, text, bigint, jsonb),
    det_unmanaged_report_checkpoint(bigint, uuid, bigint, jsonb, jsonb),
    det_unmanaged_progress(bigint, double precision),
    det_unmanaged_end(bigint, text) TO det_user;
