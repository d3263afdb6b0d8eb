-- Issue 33: what the servers inside interactive tasks need (det.harness.interactive).

-- A shell's address names its login user: the sshd in the task runs as the task's own user,
-- which only the task knows (root in det's image, the agent's user under the process runtime).
CREATE OR REPLACE FUNCTION det_task_ready(p_token text, p_address text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling task's server answers at p_address (host:port; a shell's is user@host:port, the
-- user its sshd lets in): det serve proxies to it. The task's use starts now (last_activity),
-- so the idle clock counts from here.
DECLARE
    a allocations := det_auth(p_token);
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

CREATE FUNCTION det_task_tensorboard_sources(p_token text)
RETURNS TABLE (experiment_id integer, trial_id integer, storage jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The event files the calling TensorBoard task shows (det.harness.tensorboard writes them
-- under <storage>/tensorboard/experiment/<id>/trial/<id>): a row per experiment of its
-- experiment_ids (trial_id NULL: all its trials, those that start later too) and a row per
-- trial of its trial_ids, each with its experiment's checkpoint storage, credentials left out
-- (a viewer of the experiment may open the TensorBoard). The token's own task only; no row
-- for another kind of task. Its agent calls it too, to mount the directories in a container.
DECLARE
    a allocations := det_auth(p_token);
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

GRANT EXECUTE ON FUNCTION det_task_tensorboard_sources(text) TO det_task, det_agent;
