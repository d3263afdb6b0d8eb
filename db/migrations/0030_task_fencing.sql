-- Issue 39, the task's side of fencing and storage errors: a run whose allocation was ended
-- writes no checkpoint (det_checkpoint_begin, before any file), what a crashed or fenced run
-- left in storage is found by the GC task (det_gc_task_unrecorded), and a checkpoint storage
-- error (a full disk) is the run's exit reason and pauses its experiment instead of spending
-- its restarts (det_report_storage_error; det.reconciler.trials.settle).

ALTER TABLE allocations ADD COLUMN storage_error text;
COMMENT ON COLUMN allocations.storage_error IS
    'The checkpoint storage error that ended the run: one line naming the path and the OS '
    'error, set by the task (det_report_storage_error); its exit reason, over the agent''s. '
    'A failed run with one pauses its experiment, without counting a restart '
    '(det.reconciler.trials.settle).';
GRANT SELECT (storage_error) ON allocations TO det_user;

ALTER TABLE experiments ADD COLUMN paused_reason text;
COMMENT ON COLUMN experiments.paused_reason IS
    'Why the cluster paused the experiment (a run''s checkpoint storage error), shown by '
    '`det experiment describe`; cleared when it is activated, canceled or killed.';

CREATE FUNCTION det_checkpoint_begin(p_token text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The task is about to write a checkpoint: refused (SQLSTATE 28000, det_auth) once its
-- allocation was ended (agent lost, run killed), so a fenced run writes no files (issue 39).
-- det_report_checkpoint checks again when the files are in place.
BEGIN
    PERFORM det_auth(p_token);
END $$;

CREATE FUNCTION det_report_storage_error(p_token text, p_message text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The task could not write a checkpoint to its storage (no space, quota, read-only, I/O
-- error): p_message, one line naming the path and the OS error, becomes the run's exit reason
-- (allocations.storage_error), control characters made spaces, cut to 1000 characters. A
-- blank message is invalid_parameter_value.
DECLARE
    a allocations := det_auth(p_token);
    v_line text := btrim(regexp_replace(p_message, '[[:cntrl:]]+', ' ', 'g'));
BEGIN
    IF v_line IS NULL OR v_line = '' THEN
        RAISE EXCEPTION 'storage error: a message naming the path and the error is required'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE allocations SET storage_error = left(v_line, 1000) WHERE id = a.id;
END $$;

CREATE FUNCTION det_gc_task_unrecorded(p_token text, p_uuids uuid[]) RETURNS SETOF uuid
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Of p_uuids (checkpoint directories the GC task found in its experiment's storage), those no
-- checkpoint row names, of any experiment: files a crashed run published but never recorded
-- (det.harness.checkpoint_gc sweeps them once they are old enough).
DECLARE
    a allocations := det_gc_auth(p_token);
BEGIN
    RETURN QUERY
    SELECT u FROM unnest(p_uuids) AS u
     WHERE NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.uuid = u);
END $$;

REVOKE EXECUTE ON FUNCTION det_checkpoint_begin(text), det_report_storage_error(text, text),
    det_gc_task_unrecorded(text, uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION det_checkpoint_begin(text), det_report_storage_error(text, text),
    det_gc_task_unrecorded(text, uuid[]) TO det_task;

CREATE OR REPLACE FUNCTION det_experiment_action(p_id integer, p_action text)
RETURNS experiment_state
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- pause | activate | cancel | kill (spec: run-training-code, Pause and Activate). Returns the
-- new state. The reconciler turns the state into desired states of the trials' allocations.
-- An action the state does not allow is a check_violation (an illegal transition); an
-- unknown action a bad argument. Any action but pause clears the reason the cluster paused
-- the experiment for (experiments.paused_reason).
DECLARE
    v_state experiment_state;
    v_new experiment_state;
BEGIN
    IF p_action IS NULL OR p_action NOT IN ('pause', 'activate', 'cancel', 'kill') THEN
        RAISE EXCEPTION 'action: expected pause, activate, cancel or kill, not %', p_action
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_require('edit', det_experiment_workspace(p_id),
                        format('%s experiment %s', p_action, p_id));
    SELECT state INTO v_state FROM experiments WHERE id = p_id FOR UPDATE;
    v_new := CASE
        WHEN p_action = 'pause' AND v_state IN ('ACTIVE', 'PAUSED') THEN 'PAUSED'
        WHEN p_action = 'activate' AND v_state IN ('ACTIVE', 'PAUSED') THEN 'ACTIVE'
        WHEN p_action = 'cancel' AND v_state IN ('ACTIVE', 'PAUSED') THEN 'STOPPING_CANCELED'
        WHEN p_action = 'cancel' AND v_state::text LIKE 'STOPPING_%' THEN v_state
        WHEN p_action = 'kill' AND (v_state IN ('ACTIVE', 'PAUSED')
                                    OR v_state::text LIKE 'STOPPING_%') THEN 'STOPPING_KILLED'
    END::experiment_state;
    IF v_new IS NULL THEN
        RAISE EXCEPTION 'experiment %: cannot % an experiment in state %', p_id, p_action, v_state
            USING ERRCODE = 'check_violation';
    END IF;
    UPDATE experiments
       SET state = v_new, paused_reason = CASE WHEN p_action = 'pause' THEN paused_reason END
     WHERE id = p_id;
    PERFORM det_audit(p_action, 'experiment', p_id::text);
    PERFORM pg_notify(det_channel('reconciler', ''), 'experiment');
    RETURN v_new;
END $$;
