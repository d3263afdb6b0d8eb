-- Issue 34: create an experiment from an existing one (spec: run-training-code.rst, "create an
-- experiment from an existing experiment or trial"): `det experiment fork` (the experiment's
-- model definition, a new config) and `det trial continue` (one trial that resumes another
-- trial's latest checkpoint).

CREATE TABLE continuations (
    experiment_id   integer PRIMARY KEY REFERENCES experiments (id) ON DELETE CASCADE,
    source_trial_id integer NOT NULL,
    checkpoint_uuid uuid NOT NULL
);
COMMENT ON TABLE continuations IS
    'Experiments made by det trial continue: their trial starts from checkpoint_uuid (the '
    'latest checkpoint of trial source_trial_id when it was continued), weights and batch '
    'count, as a trial resumes after a pause. The checkpoint is also the config''s '
    'searcher.source_checkpoint_uuid, which pins it (checkpoint_pins).';

CREATE FUNCTION det_trials_continue() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A new trial of a continuation (continuations) starts from its checkpoint: the trial's
-- restart point (latest_checkpoint, steps_completed) is that checkpoint's, so its first run
-- restores it (det_task_info) and counts batches on from the checkpoint's.
DECLARE
    v_uuid uuid;
    v_steps bigint;
BEGIN
    SELECT c.uuid, c.steps_completed INTO v_uuid, v_steps
      FROM continuations k JOIN checkpoints c ON c.uuid = k.checkpoint_uuid
     WHERE k.experiment_id = NEW.experiment_id;
    IF FOUND AND NEW.latest_checkpoint IS NULL THEN
        NEW.latest_checkpoint := v_uuid;
        NEW.steps_completed := v_steps;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER trials_continue BEFORE INSERT ON trials
    FOR EACH ROW EXECUTE FUNCTION det_trials_continue();

CREATE FUNCTION det_experiment_fork(
    p_source integer, p_config jsonb, p_original_config text, p_workspace text, p_project text
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment fork`: a new experiment with the model definition (context) of experiment
-- p_source and the expanded config p_config (its YAML p_original_config), stored by
-- det_create_experiment (its checks, placement and permissions: Editor where it goes). The
-- caller must be able to view p_source (no_data_found otherwise, as for any experiment they
-- cannot see). Returns the new experiment's id.
DECLARE
    v_ctx bytea;
    v_id integer;
BEGIN
    PERFORM det_require('view', det_experiment_workspace(p_source),
                        format('fork experiment %s', p_source));
    SELECT b.data INTO v_ctx
      FROM experiments e LEFT JOIN context_blobs b ON b.id = e.context_id WHERE e.id = p_source;
    v_id := det_create_experiment(p_config, p_original_config, v_ctx, p_workspace, p_project);
    PERFORM det_audit('fork', 'experiment', v_id::text, jsonb_build_object('source', p_source));
    RETURN v_id;
END $$;

CREATE FUNCTION det_trial_continue(
    p_trial integer, p_config jsonb, p_original_config text, p_workspace text, p_project text
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det trial continue`: a new experiment of one trial (searcher single) that resumes trial
-- p_trial from its latest checkpoint, weights and batch count (continuations); the model
-- definition is p_trial's experiment's. p_config (expanded; YAML p_original_config) names that
-- checkpoint as searcher.source_checkpoint_uuid, which pins it, and keeps the checkpoint's
-- storage, from which the new trial restores it. Stored by det_create_experiment (its checks
-- and permissions: Editor where it goes and of the checkpoint's workspace). Raises
-- no_data_found (a trial the caller cannot view), check_violation (no COMPLETED latest
-- checkpoint) or invalid_parameter_value naming the config key. Returns the new experiment's
-- id.
DECLARE
    v_exp integer;
    v_uuid uuid;
    c checkpoints;
    v_id integer;
BEGIN
    SELECT t.experiment_id, t.latest_checkpoint INTO v_exp, v_uuid
      FROM trials t WHERE t.id = p_trial;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'trial % not found', p_trial USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_require('view', det_experiment_workspace(v_exp),
                        format('continue trial %s', p_trial));
    -- FOR KEY SHARE: the checkpoint's row stays until the pin commits.
    SELECT * INTO c FROM checkpoints WHERE uuid = v_uuid FOR KEY SHARE;
    IF NOT FOUND OR c.state <> 'COMPLETED' THEN
        RAISE EXCEPTION 'trial %: no checkpoint to continue from%', p_trial,
            CASE WHEN FOUND THEN format(' (its latest, %s, is %s)', c.uuid, c.state) ELSE '' END
            USING ERRCODE = 'check_violation';
    END IF;
    IF p_config #>> '{searcher,name}' IS DISTINCT FROM 'single' THEN
        RAISE EXCEPTION 'searcher.name: a continued trial is one trial: expected single, got %',
            coalesce(p_config #>> '{searcher,name}', 'none')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_config #>> '{searcher,source_checkpoint_uuid}' IS DISTINCT FROM c.uuid::text THEN
        RAISE EXCEPTION 'searcher.source_checkpoint_uuid: expected % (the latest checkpoint of '
            'trial %), got %', c.uuid, p_trial,
            coalesce(p_config #>> '{searcher,source_checkpoint_uuid}', 'none')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A length in batches (the unit the checkpoint counts) must go past the checkpoint.
    IF jsonb_typeof(p_config #> '{searcher,max_length,batches}') = 'number'
       AND (p_config #>> '{searcher,max_length,batches}')::numeric <= c.steps_completed THEN
        RAISE EXCEPTION 'searcher.max_length: % batches is not past the checkpoint''s %: the '
            'continued trial would train nothing', p_config #>> '{searcher,max_length,batches}',
            c.steps_completed USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Where the files are, not how many GC keeps.
    IF (p_config -> 'checkpoint_storage') - '{save_experiment_best,save_trial_best,save_trial_latest}'::text[]
       IS DISTINCT FROM c.storage - '{save_experiment_best,save_trial_best,save_trial_latest}'::text[] THEN
        RAISE EXCEPTION 'checkpoint_storage: checkpoint % is stored in %, which the continued '
            'trial restores it from; the config names another storage', c.uuid,
            det_redact_secrets(c.storage)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_id := det_create_experiment(p_config, p_original_config,
                                  (SELECT b.data FROM experiments e
                                     JOIN context_blobs b ON b.id = e.context_id
                                    WHERE e.id = v_exp),
                                  p_workspace, p_project);
    INSERT INTO continuations (experiment_id, source_trial_id, checkpoint_uuid)
    VALUES (v_id, p_trial, c.uuid);
    PERFORM det_audit('continue', 'experiment', v_id::text,
                      jsonb_build_object('trial', p_trial, 'checkpoint', c.uuid));
    RETURN v_id;
END $$;

REVOKE ALL ON FUNCTION det_trials_continue(),
    det_experiment_fork(integer, jsonb, text, text, text),
    det_trial_continue(integer, jsonb, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION det_experiment_fork(integer, jsonb, text, text, text),
    det_trial_continue(integer, jsonb, text, text, text) TO det_user;
