-- The task's API (the harness). Every call names its allocation by token.

CREATE FUNCTION det_internal.auth(p_token text) RETURNS allocations
LANGUAGE plpgsql STABLE AS $$
-- The live allocation holding this token (the chief's, or one of allocation_nodes' for the
-- workers on the other agents of a gang), or an error (SQLSTATE 28000).
DECLARE
    v allocations;
    v_hash bytea := sha256(convert_to(p_token, 'UTF8'));
BEGIN
    SELECT * INTO v FROM allocations WHERE token_hash = v_hash AND state <> 'TERMINATED';
    IF NOT FOUND THEN
        SELECT a.* INTO v FROM allocation_nodes n JOIN allocations a ON a.id = n.allocation_id
         WHERE n.token_hash = v_hash AND a.state <> 'TERMINATED';
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'invalid or expired allocation token'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    RETURN v;
END $$;

CREATE FUNCTION det_internal.json_problem(p_value jsonb, p_max_bytes integer) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
-- What is wrong with a JSON object a task sends to store (metric values, metadata), or NULL:
-- not an object, larger than p_max_bytes (jsonb's size, of the value as sent: a stored value
-- may be compressed), or a value nested deeper than 32 levels (a top-level value is level 1;
-- deeper documents break readers that recurse, such as Python's json). A jsonb that deep
-- takes 8 bytes or more per level, so smaller ones skip the walk (most metrics rows are
-- about 100 bytes). Plain SQL, so that a query over many rows inlines it.
    SELECT CASE
        WHEN jsonb_typeof(p_value) IS DISTINCT FROM 'object'
            THEN 'must be a JSON object, not ' || coalesce(jsonb_typeof(p_value), 'null')
        WHEN pg_column_size(p_value) > p_max_bytes
            THEN format('is %s bytes, more than the %s allowed', pg_column_size(p_value),
                        p_max_bytes)
        WHEN pg_column_size(p_value) >= 256 AND jsonb_path_exists(p_value, 'strict $.**{33}')
            THEN 'nests deeper than 32 levels' END;
$$;

CREATE FUNCTION det_user.json_shown(p_value jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
-- p_value as readers show it: a value nested deeper than 32 levels (stored before the task's
-- functions refused those, migration 0032) becomes a string saying so, since clients that
-- parse JSON recursively (Python's json, hence det trial describe) fail on deep documents.
    SELECT CASE WHEN jsonb_path_exists(p_value, 'strict $.**{33}')
                THEN to_jsonb('(not shown: nested deeper than 32 levels)'::text)
                ELSE p_value END;
$$;
-- readers show stored JSON through it
GRANT EXECUTE ON FUNCTION det_user.json_shown(jsonb) TO det_user;

CREATE FUNCTION det_internal.trial_best_validation(p_trial integer) RETURNS double precision
LANGUAGE sql STABLE AS $$
-- The best searcher metric (searcher.smaller_is_better decides "best") of the trial's
-- surviving validation rows; NULL without one. det_task.report_metrics_batch keeps
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

CREATE FUNCTION det_internal.metrics_supersede(p_allocation bigint) RETURNS integer
LANGUAGE plpgsql AS $$
-- Run p_allocation resumes its trial from the trial's restart point (trials.steps_completed,
-- the step of its latest checkpoint): the rows earlier runs reported after that step are
-- superseded by it (metrics.superseded_by), as the run will report those steps again; rows
-- already superseded keep the run that superseded them first. The trial's best validation is
-- then recomputed from the surviving rows. Once per run start, not per row: the rows are
-- found per group on the (trial, group, steps) index, the groups by a loose index scan.
-- Returns the rows superseded (0 for a run that is not a trial's, or a first run).
DECLARE
    v_trial integer;
    v_steps bigint;
    v_rows integer;
    v_validation boolean;
BEGIN
    SELECT t.id, t.steps_completed INTO v_trial, v_steps
      FROM allocations a JOIN trials t ON t.id = a.trial_id WHERE a.id = p_allocation;
    IF v_trial IS NULL THEN
        RETURN 0;
    END IF;
    WITH RECURSIVE groups (g) AS (
        (SELECT "group" FROM metrics WHERE trial_id = v_trial ORDER BY "group" LIMIT 1)
        UNION ALL
        SELECT (SELECT m."group" FROM metrics m
                 WHERE m.trial_id = v_trial AND m."group" > groups.g
                 ORDER BY m."group" LIMIT 1)
          FROM groups WHERE groups.g IS NOT NULL
    ), marked AS (
        UPDATE metrics m SET superseded_by = p_allocation
          FROM groups
         WHERE m.trial_id = v_trial AND m."group" = groups.g AND m.steps_completed > v_steps
           AND m.superseded_by IS NULL AND m.allocation_id <> p_allocation
        RETURNING m."group"
    )
    SELECT count(*), coalesce(bool_or("group" = 'validation'), false)
      INTO v_rows, v_validation FROM marked;
    IF v_validation THEN
        UPDATE trials SET best_validation = det_internal.trial_best_validation(v_trial)
         WHERE id = v_trial;
    END IF;
    RETURN v_rows;
END $$;

CREATE FUNCTION det_task.info(p_token text) RETURNS jsonb LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Identity and starting point of the task; also marks the allocation RUNNING and supersedes
-- what earlier runs of its trial reported after that starting point
-- (det_internal.metrics_supersede): the run starts from its trial's latest checkpoint, which this
-- returns.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    UPDATE allocations SET state = 'RUNNING' WHERE id = a.id AND state < 'RUNNING';
    PERFORM det_internal.metrics_supersede(a.id);
    RETURN (
        SELECT jsonb_build_object(
            'allocation_id', a.id, 'trial_id', t.id, 'experiment_id', e.id,
            'config', e.config, 'hparams', t.hparams, 'trial_seed', t.seed,
            'latest_checkpoint', t.latest_checkpoint, 'steps_completed', t.steps_completed,
            'slots', a.slots_needed)
        FROM trials t JOIN experiments e ON e.id = t.experiment_id
        WHERE t.id = a.trial_id);
END $$;
GRANT EXECUTE ON FUNCTION det_task.info(text) TO det_task;

CREATE FUNCTION det_internal.append_metrics(
    a allocations, p_groups text[], p_steps bigint[], p_values jsonb[]
) RETURNS integer LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
-- Append metrics rows of run a in order: row i is (p_groups[i], p_steps[i], p_values[i]);
-- returns the rows written. Validation rows update the trial's best searcher metric
-- (searcher.smaller_is_better decides "best"). The one home of the metrics-append rule, for a
-- task's reports (det_task.report_metrics_batch) and an unmanaged script's
-- (det_user.unmanaged_report_metrics). Each row is checked first, and the whole batch refused
-- (invalid_parameter_value naming the row's group and step) for: a group that is empty,
-- longer than 255 characters or holds a control character (it is shown on terminals); a step
-- outside 0 to 2^53 - 1 (what a JSON reader such as the WebUI holds exactly; Core API code
-- counts steps in its own unit, so the searcher's length gives no tighter bound); values that
-- are not a JSON object, are over 64 KiB or nest deeper than 32 levels (det_internal.json_problem:
-- any JSON inside, as Determined allows; the harness writes NaN and infinities as strings); a
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
               WHEN det_internal.json_problem(u.v, 65536) IS NOT NULL
                   THEN 'values ' || det_internal.json_problem(u.v, 65536)
               ELSE format('values: searcher metric "%s" is %s, beyond a double', v_metric,
                           u.v -> v_metric) END AS problem
      INTO v_bad
      FROM unnest(p_groups, p_steps, p_values) WITH ORDINALITY AS u (g, s, v, i)
     WHERE u.g IS NULL OR u.g = '' OR length(u.g) > 255 OR u.g ~ '[[:cntrl:]]'
        OR u.s IS NULL OR u.s NOT BETWEEN 0 AND 9007199254740991
        OR det_internal.json_problem(u.v, 65536) IS NOT NULL
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

CREATE FUNCTION det_task.report_metrics_batch(
    p_token text, p_writer uuid, p_seq bigint,
    p_groups text[], p_steps bigint[], p_values jsonb[]
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A task appends a batch of metrics rows (det_internal.append_metrics: the rows and what is
-- refused). p_writer and p_seq name the batch (see metric_batches): a batch already recorded is
-- skipped; a NULL p_writer asks for no such check (det_task.report_metrics). Returns the rows
-- written (0 for a skipped batch).
DECLARE
    a allocations := det_internal.auth(p_token);
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
    RETURN det_internal.append_metrics(a, p_groups, p_steps, p_values);
END $$;
GRANT EXECUTE ON FUNCTION det_task.report_metrics_batch(text, uuid, bigint, text[],
    bigint[], jsonb[]) TO det_task;

CREATE FUNCTION det_task.report_metrics(
    p_token text, p_group text, p_steps_completed bigint, p_metrics jsonb
) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Append one metrics row (no re-send check: the harness uses det_task.report_metrics_batch).
    SELECT FROM det_task.report_metrics_batch(p_token, NULL, NULL, ARRAY[p_group],
                                         ARRAY[p_steps_completed], ARRAY[p_metrics]);
$$;
GRANT EXECUTE ON FUNCTION det_task.report_metrics(text, text, bigint, jsonb) TO det_task;

CREATE FUNCTION det_task.report_checkpoint(
    p_token text, p_uuid uuid, p_steps_completed bigint, p_resources jsonb, p_metadata jsonb
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Record a checkpoint the task has finished writing; it becomes the trial's restart point.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    INSERT INTO checkpoints (uuid, trial_id, allocation_id, steps_completed, storage, resources,
                             metadata)
    SELECT p_uuid, a.trial_id, a.id, p_steps_completed, e.config -> 'checkpoint_storage',
           coalesce(p_resources, '{}'), coalesce(p_metadata, '{}')
    FROM trials t JOIN experiments e ON e.id = t.experiment_id WHERE t.id = a.trial_id;
    UPDATE trials SET latest_checkpoint = p_uuid, steps_completed = p_steps_completed
     WHERE id = a.trial_id AND steps_completed <= p_steps_completed;
END $$;
GRANT EXECUTE ON FUNCTION det_task.report_checkpoint(text, uuid, bigint, jsonb, jsonb) TO det_task;

-- Unmanaged runs (Determined 0.38's determined.experimental.core_v2): a script run
-- outside det, as a det user, reports into an experiment with one trial that det never
-- schedules. Each start of the script is one run of the trial, an allocation row born
-- TERMINATED and settled, which no pass places, settles or ends.
CREATE FUNCTION det_internal.unmanaged_run(p_allocation bigint) RETURNS allocations
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
    IF NOT FOUND OR NOT (det_user.is_owner_session() OR det_user.permitted(det_user.caller(),
        'view', v_ws)) THEN
        RAISE EXCEPTION 'unmanaged run % not found', p_allocation USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.require('edit', v_ws, format('report into trial %s', a.trial_id));
    IF v_owner <> det_user.caller() AND NOT det_user.is_owner_session() THEN
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

CREATE FUNCTION det_user.unmanaged_start(
    p_config jsonb, p_original_config text, p_workspace text, p_project text,
    p_external_experiment text, p_external_trial text, p_hparams jsonb
) RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- core_v2.init of a script outside det (Determined 0.38's unmanaged mode): a new run of a
-- trial of an unmanaged experiment owned by the caller, in one transaction. The experiment is
-- the caller's with external id p_external_experiment if there is one, else a new one
-- submitted as det_user.create_experiment submits (p_config: the expanded config; same checks,
-- placement and permission); the trial is its trial with external id p_external_trial if
-- any, else a new one with hyperparameters p_hparams. A resumed experiment or trial that had
-- ended is ACTIVE again. The run is an allocation born TERMINATED and settled (no pass places
-- or ends it; det_user.unmanaged_end stamps its end); it supersedes what earlier runs reported
-- after the trial's latest checkpoint (det_internal.metrics_supersede), as a managed run's start
-- does. Returns det_task.info's object. Refused: p_external_trial without
-- p_external_experiment (invalid_parameter_value, as upstream requires both); a paused or
-- stopping experiment (object_not_in_prerequisite_state).
DECLARE
    v_user text := det_user.caller();
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
        PERFORM pg_advisory_xact_lock(hashtext('det_user.unmanaged_start'),
                                      hashtext(v_user || '/' || p_external_experiment));
        SELECT * INTO e FROM experiments
         WHERE owner = v_user AND external_id = p_external_experiment FOR NO KEY UPDATE;
    END IF;
    IF e.id IS NULL THEN
        v_exp := det_user.create_experiment(p_config, p_original_config, NULL, p_workspace,
                                       p_project);
        UPDATE experiments SET unmanaged = true, external_id = p_external_experiment
         WHERE id = v_exp RETURNING * INTO e;
    ELSIF e.state IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        PERFORM det_internal.require('edit', (SELECT workspace_id FROM jobs WHERE id = e.job_id),
                            format('resume experiment %s', e.id));
        UPDATE experiments SET state = 'ACTIVE', end_time = NULL WHERE id = e.id;
    ELSIF e.state <> 'ACTIVE' THEN
        RAISE EXCEPTION 'experiment % is %: activate it to resume it', e.id, e.state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    ELSE
        PERFORM det_internal.require('edit', (SELECT workspace_id FROM jobs WHERE id = e.job_id),
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
    PERFORM det_internal.metrics_supersede(v_alloc);
    RETURN jsonb_build_object(
        'allocation_id', v_alloc, 'trial_id', t.id, 'experiment_id', e.id,
        'config', (SELECT config FROM experiments WHERE id = e.id), 'hparams', t.hparams,
        'trial_seed', t.seed, 'latest_checkpoint', t.latest_checkpoint,
        'steps_completed', t.steps_completed, 'slots', 1);
END $$;
GRANT EXECUTE ON FUNCTION det_user.unmanaged_start(jsonb, text, text, text, text, text, jsonb)
    TO det_user;

CREATE FUNCTION det_user.unmanaged_report_metrics(
    p_allocation bigint, p_group text, p_steps_completed bigint, p_metrics jsonb
) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An unmanaged script's metrics report (det_internal.unmanaged_run: who may;
-- det_internal.append_metrics: what is refused).
    SELECT FROM det_internal.append_metrics(det_internal.unmanaged_run(p_allocation),
        ARRAY[p_group],
                                   ARRAY[p_steps_completed], ARRAY[p_metrics]);
$$;
GRANT EXECUTE ON FUNCTION det_user.unmanaged_report_metrics(bigint, text, bigint,
    jsonb) TO det_user;

CREATE FUNCTION det_user.unmanaged_report_checkpoint(
    p_allocation bigint, p_uuid uuid, p_steps_completed bigint, p_resources jsonb,
    p_metadata jsonb
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An unmanaged script stored a checkpoint (det_internal.unmanaged_run: who may); it becomes the
-- trial's restart point, as det_task.report_checkpoint's. Its files lie where the script wrote
-- them, which det's GC tasks may not reach, so no GC policy applies to it (gc_pending false):
-- upstream collects no unmanaged checkpoint either.
DECLARE
    a allocations := det_internal.unmanaged_run(p_allocation);
BEGIN
    INSERT INTO checkpoints (uuid, trial_id, allocation_id, steps_completed, storage, resources,
                             metadata, gc_pending)
    SELECT p_uuid, a.trial_id, a.id, p_steps_completed, e.config -> 'checkpoint_storage',
           coalesce(p_resources, '{}'), coalesce(p_metadata, '{}'), false
    FROM trials t JOIN experiments e ON e.id = t.experiment_id WHERE t.id = a.trial_id;
    UPDATE trials SET latest_checkpoint = p_uuid, steps_completed = p_steps_completed
     WHERE id = a.trial_id AND steps_completed <= p_steps_completed;
END $$;
GRANT EXECUTE ON FUNCTION det_user.unmanaged_report_checkpoint(bigint, uuid, bigint, jsonb, jsonb)
    TO det_user;

CREATE FUNCTION det_user.unmanaged_progress(p_allocation bigint, p_progress double precision)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- core_v2.train.report_progress: the fraction (0 to 1) of the experiment's work done, shown as
-- its progress. Refused outside [0, 1] (invalid_parameter_value).
DECLARE
    a allocations := det_internal.unmanaged_run(p_allocation);
BEGIN
    IF p_progress IS NULL OR NOT p_progress BETWEEN 0 AND 1 THEN
        RAISE EXCEPTION 'progress: expected 0 to 1, not %', p_progress
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE experiments SET progress = p_progress
     WHERE id = (SELECT experiment_id FROM trials WHERE id = a.trial_id);
END $$;
GRANT EXECUTE ON FUNCTION det_user.unmanaged_progress(bigint, double precision) TO det_user;

CREATE FUNCTION det_user.unmanaged_end(p_allocation bigint, p_error text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- core_v2.close: the run ends, and with it its trial, COMPLETED, or ERROR when p_error (the
-- script's exception, kept as the run's exit reason) is given, as upstream's unmanaged
-- heartbeat sets the trial's state at exit. The experiment ends when it has no live trial
-- left: ERROR if one of its trials errored, else COMPLETED.
DECLARE
    a allocations := det_internal.unmanaged_run(p_allocation);
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
       AND NOT EXISTS (SELECT 1 FROM trials t WHERE t.experiment_id = e.id
           AND t.state < 'COMPLETED');
END $$;
GRANT EXECUTE ON FUNCTION det_user.unmanaged_end(bigint, text) TO det_user;

CREATE FUNCTION det_task.checkpoint_begin(p_token text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The task is about to write a checkpoint: refused (SQLSTATE 28000, det_internal.auth) once its
-- allocation was ended (agent lost, run killed), so a fenced run writes no files.
-- det_task.report_checkpoint checks again when the files are in place.
BEGIN
    PERFORM det_internal.auth(p_token);
END $$;
GRANT EXECUTE ON FUNCTION det_task.checkpoint_begin(text) TO det_task;

CREATE FUNCTION det_task.report_storage_error(p_token text, p_message text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The task could not write a checkpoint to its storage (no space, quota, read-only, I/O
-- error): p_message, one line naming the path and the OS error, becomes the run's exit reason
-- (allocations.storage_error), control characters made spaces, cut to 1000 characters. A
-- blank message is invalid_parameter_value.
DECLARE
    a allocations := det_internal.auth(p_token);
    v_line text := btrim(regexp_replace(p_message, '[[:cntrl:]]+', ' ', 'g'));
BEGIN
    IF v_line IS NULL OR v_line = '' THEN
        RAISE EXCEPTION 'storage error: a message naming the path and the error is required'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE allocations SET storage_error = left(v_line, 1000) WHERE id = a.id;
END $$;
GRANT EXECUTE ON FUNCTION det_task.report_storage_error(text, text) TO det_task;

CREATE FUNCTION det_task.secrets(p_token text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling task's own secrets: {job_id, jupyter_token, ssh_public_key} (its server needs
-- them; the private key stays with det).
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    RETURN (SELECT jsonb_build_object('job_id', s.job_id, 'jupyter_token', s.jupyter_token,
                                      'ssh_public_key', s.ssh_public_key)
              FROM task_secrets s WHERE s.job_id = a.job_id);
END $$;
GRANT EXECUTE ON FUNCTION det_task.secrets(text) TO det_task;

CREATE FUNCTION det_task.ready(p_token text, p_address text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling task's server answers at p_address (host:port; a shell's is user@host:port, the
-- user its sshd lets in): det serve proxies to it. The task's use starts now (last_activity),
-- so the idle clock counts from here.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    IF p_address IS NULL
       OR p_address !~ '^([A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9.:\[\]-]+:[0-9]{1,5}$' THEN
        RAISE EXCEPTION 'address: expected host:port or user@host:port, got %',
                        coalesce(p_address, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE allocations SET address = p_address WHERE id = a.id;
    UPDATE tasks SET last_activity = now() WHERE job_id = a.job_id;
END $$;
GRANT EXECUTE ON FUNCTION det_task.ready(text, text) TO det_task;

CREATE FUNCTION det_task.activity(p_token text, p_at timestamptz) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling task's server saw use at p_at (an open kernel, terminal or SSH session, by its
-- idle type); a time in the future counts as now.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    UPDATE tasks SET last_activity = least(now(), p_at)
     WHERE job_id = a.job_id AND last_activity < least(now(), p_at);
END $$;
GRANT EXECUTE ON FUNCTION det_task.activity(text, timestamptz) TO det_task;

CREATE FUNCTION det_task.tensorboard_sources(p_token text)
RETURNS TABLE (experiment_id integer, trial_id integer, storage jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The event files the calling TensorBoard task shows (det.harness.tensorboard writes them
-- under <storage>/tensorboard/experiment/<id>/trial/<id>): a row per experiment of its
-- experiment_ids (trial_id NULL: all its trials, those that start later too) and a row per
-- trial of its trial_ids, each with its experiment's checkpoint storage, credentials left out
-- (a viewer of the experiment may open the TensorBoard). The token's own task only; no row
-- for another kind of task. Its agent calls it too, to mount the directories in a container.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    RETURN QUERY
    SELECT s.experiment_id, s.trial_id,
           s.storage - 'access_key' - 'secret_key'
      FROM (SELECT e.id AS experiment_id, NULL::integer AS trial_id,
                   e.config -> 'checkpoint_storage' AS storage
              FROM tasks k JOIN experiments e ON e.id = ANY (k.experiment_ids)
             WHERE k.job_id = a.job_id AND k.type = 'TENSORBOARD'
            UNION ALL
            SELECT t.experiment_id, t.id, e.config -> 'checkpoint_storage'
              FROM tasks k JOIN trials t ON t.id = ANY (k.trial_ids)
              JOIN experiments e ON e.id = t.experiment_id
             WHERE k.job_id = a.job_id AND k.type = 'TENSORBOARD') s
     ORDER BY s.experiment_id, s.trial_id NULLS FIRST;
END $$;
-- a TensorBoard's agent mounts its event files' directories in its container
GRANT EXECUTE ON FUNCTION det_task.tensorboard_sources(text) TO det_task, det_agent;

CREATE FUNCTION det_user.task_open(p_job bigint)
RETURNS TABLE (type text, state text, address text, jupyter_token text, end_reason text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- What det serve's proxy needs to open task p_job for the caller: its kind, its run's state,
-- its server's address (NULL until it answers), the Jupyter token it injects, and why it
-- ended. Opening a TensorBoard needs view permission; a notebook, shell or command runs code
-- as the task's owner, so opening one needs edit (Editor). Touches last_activity (proxied
-- traffic is use) at most once every 5 seconds, so a busy page costs no write per request.
DECLARE
    t tasks := det_internal.task_find(p_job, 'view', 'open');
BEGIN
    IF t.type <> 'TENSORBOARD' THEN
        PERFORM det_internal.require('edit', (SELECT j.workspace_id FROM jobs j WHERE j.id = p_job),
                            format('open %s %s', lower(t.type), p_job));
    END IF;
    UPDATE tasks SET last_activity = now()
     WHERE job_id = p_job AND last_activity < now() - interval '5 seconds';
    RETURN QUERY
    SELECT t.type, a.state::text, a.address, s.jupyter_token, t.end_reason
      FROM allocations a JOIN task_secrets s ON s.job_id = a.job_id
     WHERE a.job_id = p_job ORDER BY a.run DESC LIMIT 1;
END $$;
GRANT EXECUTE ON FUNCTION det_user.task_open(bigint) TO det_user;

CREATE FUNCTION det_user.task_ssh_key(p_job bigint) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The private key that opens shell p_job (`det shell open`): Editor of its workspace.
DECLARE
    t tasks := det_internal.task_find(p_job, 'edit', 'open');
BEGIN
    IF t.type <> 'SHELL' THEN
        RAISE EXCEPTION 'task %: a %, not a shell', p_job, lower(t.type)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN (SELECT ssh_private_key FROM task_secrets WHERE job_id = p_job);
END $$;
GRANT EXECUTE ON FUNCTION det_user.task_ssh_key(bigint) TO det_user;

CREATE FUNCTION det_task.current_op(p_token text) RETURNS jsonb LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The trial's oldest open searcher operation as {id, length}; {"wait": true} while the
-- searcher has not yet read the trial's events (its next op is not decided yet: ask again);
-- NULL when the searcher wants nothing more from it, which marks the allocation out_of_work
-- (the task then checkpoints and exits so its slots go back).
DECLARE
    a allocations := det_internal.auth(p_token);
    v_op jsonb;
BEGIN
    SELECT jsonb_build_object('id', o.id, 'length', o.length) INTO v_op
      FROM searcher_ops o WHERE o.trial_id = a.trial_id AND NOT o.completed
     ORDER BY o.id LIMIT 1;
    IF v_op IS NOT NULL THEN
        RETURN v_op;
    END IF;
    IF EXISTS (SELECT 1 FROM searcher_events v JOIN trials t ON t.experiment_id = v.experiment_id
                WHERE t.id = a.trial_id AND v.trial_id = t.id AND NOT v.consumed) THEN
        RETURN jsonb_build_object('wait', true);
    END IF;
    UPDATE allocations SET out_of_work = true WHERE id = a.id;
    RETURN NULL;
END $$;
GRANT EXECUTE ON FUNCTION det_task.current_op(text) TO det_task;

CREATE FUNCTION det_task.report_progress(p_token text, p_op_id bigint, p_units double precision)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The units of its op the trial has trained (absolute, in the op's unit: searcher_ops.length;
-- not a fraction). Refused (invalid_parameter_value) unless a finite number >= 0; stored at
-- most the op's length (a length in epochs or records is trained in whole batches, so the
-- last report may pass it by part of a batch).
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    IF p_units IS NULL OR p_units = 'NaN' OR p_units < 0 OR p_units = 'Infinity' THEN
        RAISE EXCEPTION 'progress: expected a finite number of units >= 0, not %',
            coalesce(p_units::text, 'null') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE searcher_ops SET progress = least(p_units, length)
     WHERE id = p_op_id AND trial_id = a.trial_id;
END $$;
GRANT EXECUTE ON FUNCTION det_task.report_progress(text, bigint, double precision) TO det_task;

CREATE FUNCTION det_task.complete_op(p_token text, p_op_id bigint, p_metric double precision)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The trial trained to the op's length and validated: record the searcher metric and a
-- validation_completed event, which the searcher reads as it decides (under adaptive ASHA's
-- time_metric, as nothing: the trial's validation rows are its results). Completing an op
-- twice is a no-op.
DECLARE
    a allocations := det_internal.auth(p_token);
    o searcher_ops;
BEGIN
    UPDATE searcher_ops SET completed = true, metric = p_metric, progress = length
     WHERE id = p_op_id AND trial_id = a.trial_id AND NOT completed
    RETURNING * INTO o;
    IF FOUND THEN
        INSERT INTO searcher_events (experiment_id, trial_id, kind, payload)
        SELECT t.experiment_id, t.id, 'validation_completed',
               jsonb_build_object('length', o.length, 'metric', p_metric)
        FROM trials t WHERE t.id = a.trial_id;
        PERFORM pg_notify(det_internal.channel('reconciler', ''), 'searcher');
    END IF;
END $$;
GRANT EXECUTE ON FUNCTION det_task.complete_op(text, bigint, double precision) TO det_task;

CREATE FUNCTION det_task.should_preempt(p_token text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN (det_internal.auth(p_token)).desired_state <> 'RUNNING';
END $$;
GRANT EXECUTE ON FUNCTION det_task.should_preempt(text) TO det_task;

CREATE FUNCTION det_task.stop_reason(p_token text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Why det asks the run holding p_token to stop, for the harness's preemption line: the
-- run's stop_reason (written with its desired state, migration 0040: 'paused: its experiment
-- was paused', 'preempted: slots given to experiment 3 (fair share)'); NULL while it is not
-- asked to stop.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    IF a.desired_state = 'RUNNING' THEN
        RETURN NULL;
    END IF;
    RETURN coalesce(a.stop_reason, 'det asked the run to stop');
END $$;
GRANT EXECUTE ON FUNCTION det_task.stop_reason(text) TO det_task;

CREATE FUNCTION det_task.ack_preemption(p_token text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    UPDATE allocations SET preempt_acked = true WHERE id = a.id;
END $$;
GRANT EXECUTE ON FUNCTION det_task.ack_preemption(text) TO det_task;

CREATE FUNCTION det_task.report_early_exit(p_token text, p_reason text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The trial ends itself, for one of the early_exit_reason labels.
DECLARE
    a allocations := det_internal.auth(p_token);
    v_reason early_exit_reason;
BEGIN
    BEGIN
        v_reason := p_reason::early_exit_reason;
    EXCEPTION WHEN invalid_text_representation THEN
        RAISE EXCEPTION 'early exit reason must be one of %, not "%"',
            array_to_string(enum_range(NULL::early_exit_reason)::text[], ', '), p_reason
            USING ERRCODE = 'invalid_parameter_value';
    END;
    UPDATE trials SET closed = true, exit_reason = v_reason::text WHERE id = a.trial_id;
    UPDATE searcher_ops SET completed = true WHERE trial_id = a.trial_id AND NOT completed;
END $$;
GRANT EXECUTE ON FUNCTION det_task.report_early_exit(text, text) TO det_task;

CREATE FUNCTION det_task.experiment_best_validation(p_token text) RETURNS double precision
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT CASE WHEN e.smaller_is_better
                THEN min(t.best_validation) ELSE max(t.best_validation) END
    FROM allocations a
    JOIN trials me ON me.id = a.trial_id
    JOIN experiments e ON e.id = me.experiment_id
    JOIN trials t ON t.experiment_id = e.id
    WHERE a.id = (det_internal.auth(p_token)).id
    GROUP BY e.id;
$$;
GRANT EXECUTE ON FUNCTION det_task.experiment_best_validation(text) TO det_task;
