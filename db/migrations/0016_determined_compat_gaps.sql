-- Issue 13's remaining gaps with Determined 0.38: adaptive_asha's max_time + time_metric,
-- trial metadata, and the TensorBoard files of an experiment deleted with no checkpoints.

-- adaptive_asha in Determined 0.38's form (searcher.max_time + time_metric): the searcher
-- ranks trials by the validation metrics they report, which carry the time metric, and stops
-- those below a rung's cut (reference-facts §1.7).

CREATE OR REPLACE FUNCTION det_complete_op(p_token text, p_op_id bigint,
                                           p_metric double precision)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The trial trained to the op's length and validated: record the searcher metric and queue a
-- validation_completed event for the searcher. Completing an op twice is a no-op. Under a
-- searcher with a time metric the validation row itself was the event
-- (det_timed_validation), so none is queued here.
DECLARE
    a allocations := det_auth(p_token);
    o searcher_ops;
BEGIN
    UPDATE searcher_ops SET completed = true, metric = p_metric, progress = length
     WHERE id = p_op_id AND trial_id = a.trial_id AND NOT completed
    RETURNING * INTO o;
    IF FOUND THEN
        INSERT INTO searcher_events (experiment_id, trial_id, kind, payload)
        SELECT t.experiment_id, t.id, 'validation_completed',
               jsonb_build_object('length', o.length, 'metric', p_metric)
        FROM trials t JOIN experiments e ON e.id = t.experiment_id
        WHERE t.id = a.trial_id AND e.config #>> '{searcher,time_metric}' IS NULL;
        PERFORM pg_notify('det_reconciler', 'searcher');
    END IF;
END $$;

CREATE FUNCTION det_timed_validation() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A validation row of a trial whose searcher has a time metric (adaptive_asha's max_time +
-- time_metric) is a validation_completed event at length floor(<time metric>), with the
-- searcher metric (null when not a number: it ranks worst). A row without a numeric time
-- metric is no event; the harness refuses to report one (TrainContext).
DECLARE
    v_searcher jsonb;
    v_time jsonb;
    v_metric jsonb;
BEGIN
    SELECT e.config -> 'searcher' INTO v_searcher
      FROM trials t JOIN experiments e ON e.id = t.experiment_id WHERE t.id = NEW.trial_id;
    IF v_searcher ->> 'time_metric' IS NULL THEN
        RETURN NULL;
    END IF;
    v_time := NEW."values" -> (v_searcher ->> 'time_metric');
    IF jsonb_typeof(v_time) IS DISTINCT FROM 'number' THEN
        RETURN NULL;
    END IF;
    v_metric := NEW."values" -> (v_searcher ->> 'metric');
    INSERT INTO searcher_events (experiment_id, trial_id, kind, payload)
    SELECT t.experiment_id, t.id, 'validation_completed', jsonb_build_object(
               'length', greatest(least(floor(v_time::numeric), 9223372036854775807), 0)::bigint,
               'metric', CASE WHEN jsonb_typeof(v_metric) = 'number' THEN v_metric END)
      FROM trials t WHERE t.id = NEW.trial_id;
    PERFORM pg_notify('det_reconciler', 'searcher');
    RETURN NULL;
END $$;

CREATE TRIGGER metrics_timed_validation AFTER INSERT ON metrics
    FOR EACH ROW WHEN (NEW."group" = 'validation') EXECUTE FUNCTION det_timed_validation();

-- Trial metadata (Determined 0.38's TrainContext.set_metadata / get_metadata): a JSON object
-- the trial's code builds up, key by key.
ALTER TABLE trials ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}';
COMMENT ON COLUMN trials.metadata IS
    'What the trial''s code recorded with set_metadata (det_set_trial_metadata): a JSON '
    'object, merged key by key.';

CREATE FUNCTION det_merge_metadata(p_current jsonb, p_addition jsonb, p_path text DEFAULT '')
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE SET search_path = public, pg_temp AS $$
-- p_addition merged into p_current (both objects): objects merge key by key, a new key is
-- added, and a key that already holds another value is refused, naming its dotted path (the
-- reference's run metadata never overwrites a key). Setting a key to the value it holds is a
-- no-op, so a call retried after a lost commit acknowledgement succeeds.
DECLARE
    k text;
    v jsonb;
    v_path text;
BEGIN
    FOR k, v IN SELECT * FROM jsonb_each(p_addition) LOOP
        v_path := CASE WHEN p_path = '' THEN k ELSE p_path || '.' || k END;
        IF NOT p_current ? k OR p_current -> k = v THEN
            p_current := jsonb_set(p_current, ARRAY[k], v);
        ELSIF jsonb_typeof(v) = 'object' AND jsonb_typeof(p_current -> k) = 'object' THEN
            p_current := jsonb_set(p_current, ARRAY[k],
                                   det_merge_metadata(p_current -> k, v, v_path));
        ELSE
            RAISE EXCEPTION 'metadata key "%" is already set (to %); a key cannot be changed',
                v_path, p_current -> k USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    RETURN p_current;
END $$;

CREATE FUNCTION det_set_trial_metadata(p_token text, p_metadata jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Merge p_metadata (an object) into the calling trial's metadata (det_merge_metadata);
-- returns the trial's metadata after it.
DECLARE
    a allocations := det_auth(p_token);
    v_merged jsonb;
BEGIN
    IF jsonb_typeof(p_metadata) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'metadata must be a JSON object, not %',
            coalesce(jsonb_typeof(p_metadata), 'null') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE trials SET metadata = det_merge_metadata(metadata, p_metadata)
     WHERE id = a.trial_id RETURNING metadata INTO v_merged;
    RETURN v_merged;
END $$;

CREATE FUNCTION det_trial_metadata(p_token text) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling trial's metadata.
    SELECT metadata FROM trials WHERE id = (det_auth(p_token)).trial_id;
$$;

-- An experiment deleted with no checkpoints still gets a GC task when a trial of it ran: it
-- removes the experiment's TensorBoard files, and its rows go only after that.
ALTER TABLE experiments ADD COLUMN tensorboards_deleted_at timestamptz;
COMMENT ON COLUMN experiments.tensorboards_deleted_at IS
    'When the GC task of its deletion removed its TensorBoard files (det_purge_experiment waits '
    'for it when a trial of it ran, checkpoints or not).';

CREATE FUNCTION det_gc_task_tensorboards_deleted(p_token text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The GC task removed the TensorBoard files of its experiment being deleted: its rows may go
-- (det_purge_experiment).
DECLARE
    a allocations := det_gc_auth(p_token);
BEGIN
    UPDATE experiments SET tensorboards_deleted_at = now()
     WHERE job_id = a.job_id AND delete_requested_at IS NOT NULL;
END $$;

CREATE OR REPLACE FUNCTION det_purge_experiment(p_id integer) RETURNS boolean LANGUAGE plpgsql AS $$
-- Remove an experiment whose deletion was asked for, with its trials, runs, metrics, logs,
-- checkpoint rows, searcher rows and job (its context too, if no other experiment shares it),
-- once none of its checkpoints is DELETING, none of its runs is live, and its TensorBoard files
-- are gone if a trial of it ever ran (a GC task removes them, det_gc_task_tensorboards_deleted).
-- Returns false (and removes nothing) while that is not yet so.
DECLARE
    e experiments;
BEGIN
    SELECT * INTO e FROM experiments WHERE id = p_id AND delete_requested_at IS NOT NULL
       FOR UPDATE;
    IF NOT FOUND
       OR EXISTS (SELECT 1 FROM checkpoints c JOIN trials t ON t.id = c.trial_id
                   WHERE t.experiment_id = p_id AND c.state <> 'DELETED')
       OR EXISTS (SELECT 1 FROM allocations a
                   WHERE a.job_id = e.job_id AND a.state <> 'TERMINATED')
       OR (e.tensorboards_deleted_at IS NULL
           AND EXISTS (SELECT 1 FROM trials t WHERE t.experiment_id = p_id AND t.runs > 0)) THEN
        RETURN false;
    END IF;
    DELETE FROM task_logs l USING allocations a WHERE l.allocation_id = a.id AND a.job_id = e.job_id;
    DELETE FROM metrics m USING trials t WHERE m.trial_id = t.id AND t.experiment_id = p_id;
    DELETE FROM checkpoints c USING trials t WHERE c.trial_id = t.id AND t.experiment_id = p_id;
    DELETE FROM allocation_slots s USING allocations a
     WHERE s.allocation_id = a.id AND a.job_id = e.job_id;
    DELETE FROM allocations WHERE job_id = e.job_id;
    DELETE FROM searcher_events WHERE experiment_id = p_id;
    DELETE FROM searcher_ops o USING trials t WHERE o.trial_id = t.id AND t.experiment_id = p_id;
    DELETE FROM trials WHERE experiment_id = p_id;
    DELETE FROM experiments WHERE id = p_id;
    DELETE FROM jobs WHERE id = e.job_id;
    DELETE FROM context_blobs b WHERE b.id = e.context_id
       AND NOT EXISTS (SELECT 1 FROM experiments x WHERE x.context_id = b.id);
    RETURN true;
END $$;

-- Revoked from PUBLIC here too (0014's default privileges cover only functions that the
-- role which applied 0014 creates); the trial's metadata and the GC task's report are task
-- functions.
REVOKE ALL ON FUNCTION
    det_timed_validation(), det_merge_metadata(jsonb, jsonb, text),
    det_set_trial_metadata(text, jsonb), det_trial_metadata(text),
    det_gc_task_tensorboards_deleted(text)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    det_set_trial_metadata(text, jsonb), det_trial_metadata(text),
    det_gc_task_tensorboards_deleted(text)
TO det_task;
