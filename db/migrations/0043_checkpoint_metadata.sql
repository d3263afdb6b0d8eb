-- Issue 38: the SDK's Checkpoint.add_metadata (Determined 0.38) merges a user's keys into a
-- checkpoint's metadata, under the rule a task's metadata obeys (checkpoints_input_check).

DROP TRIGGER checkpoints_input_check ON checkpoints;
CREATE TRIGGER checkpoints_input_check BEFORE INSERT OR UPDATE OF metadata ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION det_checkpoint_input_check();

CREATE FUNCTION det_checkpoint_add_metadata(p_uuid uuid, p_metadata jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The SDK's Checkpoint.add_metadata (Determined 0.38): p_metadata's top-level keys replace or
-- join the checkpoint's metadata (its row, not the metadata.json in its storage, as in 0.38);
-- returns the metadata. Editor of the checkpoint's workspace. The result obeys a task's rule
-- (checkpoints_input_check, also on UPDATE OF metadata: at most 64 KiB, 32 levels deep).
DECLARE
    v_workspace integer;
    v_metadata jsonb;
BEGIN
    IF jsonb_typeof(p_metadata) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'metadata: expected a JSON object, got %',
            coalesce(jsonb_typeof(p_metadata), 'null') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT j.workspace_id INTO v_workspace
      FROM checkpoints c JOIN trials t ON t.id = c.trial_id
      JOIN experiments e ON e.id = t.experiment_id JOIN jobs j ON j.id = e.job_id
     WHERE c.uuid = p_uuid;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'checkpoint % not found', p_uuid USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_require('edit', v_workspace, format('add metadata to checkpoint %s', p_uuid));
    UPDATE checkpoints SET metadata = metadata || p_metadata WHERE uuid = p_uuid
    RETURNING metadata INTO v_metadata;
    RETURN v_metadata;
END $$;

REVOKE ALL ON FUNCTION det_checkpoint_add_metadata(uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION det_checkpoint_add_metadata(uuid, jsonb) TO det_user;
