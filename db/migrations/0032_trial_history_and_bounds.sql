-- Issue 39: one history per trial, and bounds on what a task stores.
-- * A run that resumes a trial from its checkpoint at step S supersedes what earlier runs
--   reported after S (metrics.superseded_by, det_metrics_supersede, called by det_task_info);
--   every reader shows and counts only the surviving rows, and the trial's best validation
--   is recomputed from them (det_trial_best_validation).
-- * The task's functions check what they store: metrics rows (det_report_metrics_batch),
--   op progress (det_report_progress), trial metadata (det_set_trial_metadata) and
--   checkpoint rows (det_checkpoint_input_check, a trigger, so det_report_checkpoint keeps
--   one body); each refusal is invalid_parameter_value naming the field.

ALTER TABLE metrics ADD COLUMN superseded_by bigint;
COMMENT ON COLUMN metrics.superseded_by IS
    'The run (allocation) that resumed the trial from a checkpoint taken before this row''s '
    'step, so that this row, reported by an earlier run after that checkpoint, is no longer '
    'part of the trial''s history (det_metrics_supersede); NULL for the surviving rows. Kept '
    'for audit; readers show and count only rows where it is NULL.';

CREATE FUNCTION det_json_problem(p_value jsonb, p_max_bytes integer) RETURNS text
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

CREATE FUNCTION det_json_shown(p_value jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
-- p_value as readers show it: a value nested deeper than 32 levels (stored before the task's
-- functions refused those, migration 0032) becomes a string saying so, since clients that
-- parse JSON recursively (Python's json, hence det trial describe) fail on deep documents.
    SELECT CASE WHEN jsonb_path_exists(p_value, 'strict $.**{33}')
                THEN to_jsonb('(not shown: nested deeper than 32 levels)'::text)
                ELSE p_value END;
$$;

CREATE FUNCTION det_trial_best_validation(p_trial integer) RETURNS double precision
LANGUAGE sql STABLE AS $$
-- The best searcher metric (searcher.smaller_is_better decides "best") of the trial's
-- surviving validation rows; NULL without one. det_report_metrics_batch keeps
-- trials.best_validation up to date row by row; this recomputes it when rows are superseded.
    SELECT CASE WHEN (e.config #>> '{searcher,smaller_is_better}')::boolean
                THEN min((m."values" ->> (e.config #>> '{searcher,metric}'))::double precision)
                ELSE max((m."values" ->> (e.config #>> '{searcher,metric}'))::double precision)
                END
      FROM trials t
      JOIN experiments e ON e.id = t.experiment_id
      JOIN metrics m ON m.trial_id = t.id AND m."group" = 'validation'
                    AND m.superseded_by IS NULL
     WHERE t.id = p_trial
       AND jsonb_typeof(m."values" -> (e.config #>> '{searcher,metric}')) = 'number'
     GROUP BY e.config;
$$;

CREATE FUNCTION det_metrics_supersede(p_allocation bigint) RETURNS integer
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
        UPDATE trials SET best_validation = det_trial_best_validation(v_trial)
         WHERE id = v_trial;
    END IF;
    RETURN v_rows;
END $$;

CREATE OR REPLACE FUNCTION det_task_info(p_token text) RETURNS jsonb LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Identity and starting point of the task; also marks the allocation RUNNING and supersedes
-- what earlier runs of its trial reported after that starting point (det_metrics_supersede):
-- the run starts from its trial's latest checkpoint, which this returns.
DECLARE
    a allocations := det_auth(p_token);
BEGIN
    UPDATE allocations SET state = 'RUNNING' WHERE id = a.id AND state < 'RUNNING';
    PERFORM det_metrics_supersede(a.id);
    RETURN (
        SELECT jsonb_build_object(
            'allocation_id', a.id, 'trial_id', t.id, 'experiment_id', e.id,
            'config', e.config, 'hparams', t.hparams, 'trial_seed', t.seed,
            'latest_checkpoint', t.latest_checkpoint, 'steps_completed', t.steps_completed,
            'slots', a.slots_needed)
        FROM trials t JOIN experiments e ON e.id = t.experiment_id
        WHERE t.id = a.trial_id);
END $$;

CREATE OR REPLACE FUNCTION det_report_metrics_batch(
    p_token text, p_writer uuid, p_seq bigint,
    p_groups text[], p_steps bigint[], p_values jsonb[]
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Append a batch of metrics rows in order: row i is (p_groups[i], p_steps[i], p_values[i]).
-- p_writer and p_seq name the batch (see metric_batches): a batch already recorded is
-- skipped; a NULL p_writer asks for no such check (det_report_metrics). Returns the rows
-- written (0 for a skipped batch). Validation rows update the trial's best searcher metric
-- (searcher.smaller_is_better decides "best"). The one home of the metrics-append rule.
-- Each row is checked first, and the whole batch refused (invalid_parameter_value naming
-- the row's group and step) for: a group that is empty, longer than 255 characters or holds
-- a control character (it is shown on terminals); a step outside 0 to 2^53 - 1 (what a JSON
-- reader such as the WebUI holds exactly; Core API code counts steps in its own unit, so
-- the searcher's length gives no tighter bound); values that are not a JSON object, are
-- over 64 KiB or nest deeper than 32 levels (det_json_problem: any JSON inside, as
-- Determined allows; the harness writes NaN and infinities as strings); a validation's
-- searcher metric that is a number a double cannot hold.
DECLARE
    a allocations := det_auth(p_token);
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

CREATE OR REPLACE FUNCTION det_report_progress(p_token text, p_op_id bigint, p_units double precision)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The units of its op the trial has trained (absolute, in the op's unit: searcher_ops.length;
-- not a fraction). Refused (invalid_parameter_value) unless a finite number >= 0; stored at
-- most the op's length (a length in epochs or records is trained in whole batches, so the
-- last report may pass it by part of a batch).
DECLARE
    a allocations := det_auth(p_token);
BEGIN
    IF p_units IS NULL OR p_units = 'NaN' OR p_units < 0 OR p_units = 'Infinity' THEN
        RAISE EXCEPTION 'progress: expected a finite number of units >= 0, not %',
            coalesce(p_units::text, 'null') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE searcher_ops SET progress = least(p_units, length)
     WHERE id = p_op_id AND trial_id = a.trial_id;
END $$;

CREATE OR REPLACE FUNCTION det_set_trial_metadata(p_token text, p_metadata jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Merge p_metadata (an object) into the calling trial's metadata (det_merge_metadata);
-- returns the trial's metadata after it. Refused (invalid_parameter_value): p_metadata not
-- an object, over 64 KiB or nested deeper than 32 levels (det_json_problem), or a merged
-- metadata over 1 MiB.
DECLARE
    a allocations := det_auth(p_token);
    v_problem text := det_json_problem(p_metadata, 65536);
    v_merged jsonb;
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'metadata %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE trials SET metadata = det_merge_metadata(metadata, p_metadata)
     WHERE id = a.trial_id RETURNING metadata INTO v_merged;
    IF octet_length(v_merged::text) > 1048576 THEN
        RAISE EXCEPTION 'metadata: the trial''s metadata would be % bytes of JSON, more than '
            'the % allowed', octet_length(v_merged::text), 1048576
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN v_merged;
END $$;

CREATE FUNCTION det_checkpoint_input_check() RETURNS trigger LANGUAGE plpgsql AS $$
-- BEFORE INSERT ON checkpoints: what a task records of a checkpoint (det_report_checkpoint)
-- is refused (invalid_parameter_value naming the field) unless steps_completed is at most
-- 2^53 - 1 (as metrics' steps), resources is a JSON object of at most 8 MiB mapping each
-- file's path, relative and inside the checkpoint (not empty, not starting with '/', no '..'
-- part, no control character), to its size in bytes (a whole number 0 to 2^63 - 1: the GC
-- sums them as bigint), and metadata is an object of at most 64 KiB nested at most 32 levels.
DECLARE
    v_bad record;
    v_problem text := det_json_problem(NEW.metadata, 65536);
BEGIN
    IF NEW.steps_completed > 9007199254740991 THEN
        RAISE EXCEPTION 'checkpoint steps_completed: expected 0 to 2^53 - 1, not %',
            NEW.steps_completed USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(NEW.resources) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'checkpoint resources: expected a JSON object of file path -> size '
            'in bytes, not %', coalesce(jsonb_typeof(NEW.resources), 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_column_size(NEW.resources) > 8388608 THEN
        RAISE EXCEPTION 'checkpoint resources: % bytes, more than the % allowed',
            pg_column_size(NEW.resources), 8388608 USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT r.key, r.value INTO v_bad FROM jsonb_each(NEW.resources) r
     WHERE r.key = '' OR r.key ~ '^/' OR r.key ~ '(^|/)\.\.(/|$)' OR r.key ~ '[[:cntrl:]]'
        OR jsonb_typeof(r.value) <> 'number'
        OR (r.value #>> '{}')::numeric NOT BETWEEN 0 AND 9223372036854775807
        OR (r.value #>> '{}')::numeric <> trunc((r.value #>> '{}')::numeric)
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'checkpoint resources: entry % -> % is not a relative file path '
            'inside the checkpoint with a whole number of bytes >= 0', to_jsonb(v_bad.key),
            v_bad.value USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'checkpoint metadata %', v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER checkpoints_input_check BEFORE INSERT ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION det_checkpoint_input_check();

-- Readers of metrics read the surviving history (superseded_by IS NULL).
CREATE OR REPLACE VIEW reporting.trials WITH (security_invoker = true) AS
SELECT t.id, t.experiment_id, t.state, t.hparams, t.restarts, t.steps_completed,
       t.best_validation, t.latest_checkpoint, t.start_time, t.end_time, t.exit_reason,
       (SELECT m."values" FROM metrics m
         WHERE m.trial_id = t.id AND m."group" = 'validation' AND m.superseded_by IS NULL
         ORDER BY m.steps_completed DESC, m.id DESC LIMIT 1) AS latest_validation
FROM trials t;

CREATE OR REPLACE VIEW reporting.model_versions WITH (security_invoker = true) AS
-- Every model version with the checkpoint it pins: where it came from (trial, experiment,
-- batches), its size in bytes and the validation metrics reported at its step.
SELECT v.id, v.model_id, m.name AS model_name, v.version, v.name, v.notes, v.labels,
       v.metadata, v.owner, v.creation_time, v.last_updated_time, v.checkpoint_uuid,
       c.state AS checkpoint_state, c.trial_id, t.experiment_id, c.steps_completed,
       (SELECT sum(r.value::bigint)::bigint FROM jsonb_each_text(c.resources) r) AS size_bytes,
       (SELECT x."values" FROM metrics x
         WHERE x.trial_id = c.trial_id AND x."group" = 'validation'
           AND x.steps_completed = c.steps_completed AND x.superseded_by IS NULL
         ORDER BY x.id DESC LIMIT 1) AS validation_metrics
FROM model_versions v
JOIN models m ON m.id = v.model_id
JOIN checkpoints c ON c.uuid = v.checkpoint_uuid
JOIN trials t ON t.id = c.trial_id;

CREATE OR REPLACE FUNCTION det_checkpoints_to_delete(
    p_experiment integer, p_save_experiment_best integer DEFAULT NULL,
    p_save_trial_best integer DEFAULT NULL, p_save_trial_latest integer DEFAULT NULL
) RETURNS TABLE (uuid uuid, trial_id integer, steps_completed bigint, size_bytes bigint,
                 metric double precision)
LANGUAGE sql STABLE AS $$
-- The GC keep rule, one statement (reference-facts §5.1; issue 16). Of the experiment's
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
           CASE WHEN (e.config #>> '{searcher,smaller_is_better}')::boolean THEN 1 ELSE -1 END
               AS sign,
           e.config #>> '{searcher,metric}' AS metric,
           coalesce(p_save_experiment_best,
                    (e.config #>> '{checkpoint_storage,save_experiment_best}')::integer) AS seb,
           coalesce(p_save_trial_best,
                    (e.config #>> '{checkpoint_storage,save_trial_best}')::integer) AS stb,
           coalesce(p_save_trial_latest,
                    (e.config #>> '{checkpoint_storage,save_trial_latest}')::integer) AS stl
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


GRANT EXECUTE ON FUNCTION det_json_shown(jsonb) TO det_user;

-- Trials that restarted before this migration: the same rule, applied once to what their runs
-- left. A run resumed from the latest checkpoint of the runs before it, so each row of an
-- earlier run after that checkpoint's step is superseded by the first later run that resumed
-- from before it; the best validation of the trials that had such rows is recomputed.
WITH starts AS (
    SELECT r.id, r.trial_id, r.run,
           coalesce((SELECT max(c.steps_completed) FROM checkpoints c
                      JOIN allocations p ON p.id = c.allocation_id
                     WHERE c.trial_id = r.trial_id AND p.run < r.run), 0) AS steps
      FROM allocations r WHERE r.trial_id IS NOT NULL AND r.run > 1
), marks AS (
    SELECT DISTINCT ON (m.id) m.id, s.id AS by
      FROM starts s
      JOIN metrics m ON m.trial_id = s.trial_id AND m.steps_completed > s.steps
      JOIN allocations p ON p.id = m.allocation_id AND p.run < s.run
     ORDER BY m.id, s.run
)
UPDATE metrics m SET superseded_by = marks.by FROM marks WHERE m.id = marks.id;
-- (a statement of its own: it reads the rows as marked)
UPDATE trials t SET best_validation = det_trial_best_validation(t.id)
 WHERE EXISTS (SELECT 1 FROM metrics m WHERE m.trial_id = t.id AND m."group" = 'validation'
                                         AND m.superseded_by IS NOT NULL);
