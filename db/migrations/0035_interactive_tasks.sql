-- Issue 33: commands, notebooks, shells and TensorBoards. Each is a job (jobs.type) with one
-- task row and one run (an allocation without a trial), submitted in one transaction
-- (det_create_task) through det.submission, as experiments are.

CREATE TABLE tasks (
    job_id         bigint PRIMARY KEY REFERENCES jobs (id),
    type           text NOT NULL CHECK (type IN ('COMMAND', 'NOTEBOOK', 'SHELL', 'TENSORBOARD')),
    description    text NOT NULL,
    config         jsonb NOT NULL,
    project_id     integer NOT NULL REFERENCES projects (id),
    context_id     bigint REFERENCES context_blobs (id),
    experiment_ids integer[] NOT NULL DEFAULT '{}',
    trial_ids      integer[] NOT NULL DEFAULT '{}',
    last_activity  timestamptz NOT NULL DEFAULT now(),
    end_reason     text
);
COMMENT ON TABLE tasks IS
    'One row per interactive task (command, notebook, shell, TensorBoard); its job row holds '
    'the owner, workspace, pool and priority, its one allocation the run. config is the '
    'expanded task config (det.configs.task, every default filled).';
COMMENT ON COLUMN tasks.experiment_ids IS
    'A TensorBoard''s experiments (with trial_ids, its trials): whose event files it shows.';
COMMENT ON COLUMN tasks.last_activity IS
    'The latest sign of use: the task''s server reports it (det_task_activity: open kernels, '
    'terminals, SSH sessions) and det serve''s proxy touches it (det_task_open). The pass ends '
    'a task idle past its idle_timeout.';
COMMENT ON COLUMN tasks.end_reason IS
    'Why det ended the task, when it did: "killed by alice", "idle for 10m0s".';
CREATE INDEX tasks_project ON tasks (project_id);

CREATE TABLE task_secrets (
    job_id          bigint PRIMARY KEY REFERENCES tasks (job_id),
    jupyter_token   text NOT NULL,
    ssh_private_key text NOT NULL,
    ssh_public_key  text NOT NULL
);
COMMENT ON TABLE task_secrets IS
    'Per-task secrets, made at submission: the token of a notebook''s Jupyter server (only '
    'det serve''s proxy sends it) and a shell''s key pair. No user reads this table: the task '
    'gets its own through det_task_secrets, a user who may open the task through det_task_open '
    'and det_task_ssh_key.';

ALTER TABLE allocations ADD COLUMN address text;
COMMENT ON COLUMN allocations.address IS
    'host:port of an interactive task''s server (Jupyter, TensorBoard, sshd) once it answers, '
    'recorded by the task (det_task_ready); det serve proxies /proxy/<job>/ to it.';

CREATE FUNCTION det_create_task(
    p_type text, p_config jsonb, p_context bytea, p_workspace text, p_project text,
    p_experiment_ids integer[], p_trial_ids integer[], p_secrets jsonb
) RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Submit an interactive task of kind p_type (COMMAND, NOTEBOOK, SHELL, TENSORBOARD) with the
-- expanded task config p_config (det.configs.task: every default filled, its pool chosen),
-- owned by the caller, in project p_project of workspace p_workspace (both NULL:
-- Uncategorized): Editor there, as for an experiment (det_experiment_create_check). A
-- TensorBoard's experiments p_experiment_ids and trials p_trial_ids must be ones the caller
-- can view (no_data_found naming the first that is not). p_secrets: {jupyter_token,
-- ssh_private_key, ssh_public_key}. Creates the job, the task and its one run (never
-- preempted: the seed's rule for interactive tasks) in this transaction; returns the job id.
DECLARE
    p projects;
    v_user text;
    v_pool text := p_config #>> '{resources,resource_pool}';
    v_slots integer := (p_config #>> '{resources,slots}')::integer;
    v_ctx bigint;
    v_job bigint;
    v_missing text;
BEGIN
    IF p_type IS NULL OR p_type NOT IN ('COMMAND', 'NOTEBOOK', 'SHELL', 'TENSORBOARD') THEN
        RAISE EXCEPTION 'task type: expected COMMAND, NOTEBOOK, SHELL or TENSORBOARD, not %',
            coalesce(p_type, 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_pool IS NULL OR v_slots IS NULL OR v_slots < 0 THEN
        RAISE EXCEPTION 'resources: the expanded config names its pool and slots (>= 0)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_type = 'TENSORBOARD' AND cardinality(p_experiment_ids) + cardinality(p_trial_ids) = 0
    THEN
        RAISE EXCEPTION 'a TensorBoard needs at least one experiment or trial'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO p FROM projects WHERE id = det_experiment_create_check(p_workspace, p_project);
    v_user := det_caller();
    PERFORM det_check_pools(p.workspace_id, ARRAY[v_pool], 'resources.resource_pool');
    SELECT m INTO v_missing FROM (
        SELECT 'experiment ' || x AS m FROM unnest(p_experiment_ids) x
         WHERE NOT EXISTS (SELECT 1 FROM experiments e JOIN jobs j ON j.id = e.job_id
                            WHERE e.id = x AND (det_is_owner_session()
                                                OR det_permitted(v_user, 'view', j.workspace_id)))
        UNION ALL
        SELECT 'trial ' || x FROM unnest(p_trial_ids) x
         WHERE NOT EXISTS (SELECT 1 FROM trials t JOIN experiments e ON e.id = t.experiment_id
                             JOIN jobs j ON j.id = e.job_id
                            WHERE t.id = x AND (det_is_owner_session()
                                                OR det_permitted(v_user, 'view', j.workspace_id)))
    ) missing LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION '%: not found', v_missing USING ERRCODE = 'no_data_found';
    END IF;
    IF p_context IS NOT NULL THEN
        INSERT INTO context_blobs (sha256, size_bytes, data)
        VALUES (sha256(p_context), length(p_context), p_context)
        ON CONFLICT (sha256) DO NOTHING;
        SELECT id INTO v_ctx FROM context_blobs WHERE sha256 = sha256(p_context);
    END IF;
    INSERT INTO jobs (type, resource_pool, priority, weight, queue_position, owner, workspace_id)
    VALUES (p_type, v_pool,
            coalesce((p_config #>> '{resources,priority}')::integer,
                     (det_pool_scheduler(v_pool) ->> 'default_priority')::integer),
            (p_config #>> '{resources,weight}')::double precision,
            extract(epoch FROM clock_timestamp()) * 1000000, v_user, p.workspace_id)
    RETURNING id INTO v_job;
    INSERT INTO tasks (job_id, type, description, config, project_id, context_id,
                       experiment_ids, trial_ids)
    VALUES (v_job, p_type,
            coalesce(p_config ->> 'description',
                     format('%s %s', initcap(p_type), v_job)),
            p_config, p.id, v_ctx, coalesce(p_experiment_ids, '{}'), coalesce(p_trial_ids, '{}'));
    INSERT INTO task_secrets (job_id, jupyter_token, ssh_private_key, ssh_public_key)
    VALUES (v_job, p_secrets ->> 'jupyter_token', p_secrets ->> 'ssh_private_key',
            p_secrets ->> 'ssh_public_key');
    INSERT INTO allocations (job_id, run, resource_pool, slots_needed, preemptible, spec)
    VALUES (v_job, 1, v_pool, v_slots, false, jsonb_build_object(
        'kind', lower(p_type), 'entrypoint', p_config -> 'entrypoint',
        'environment', p_config -> 'environment', 'bind_mounts', p_config -> 'bind_mounts',
        'resources', jsonb_build_object(
            'slots_per_trial', v_slots, 'resource_pool', v_pool,
            'priority', p_config #> '{resources,priority}',
            'weight', p_config #> '{resources,weight}',
            'shm_size', p_config #> '{resources,shm_size}',
            'memory_limit', p_config #> '{resources,memory_limit}'),
        'checkpoint_storage', NULL, 'context_id', v_ctx, 'experiment_id', NULL,
        'trial_id', NULL,
        'task', jsonb_build_object(
            'job_id', v_job, 'work_dir', p_config -> 'work_dir',
            'idle_timeout', p_config -> 'idle_timeout',
            'notebook_idle_type', p_config -> 'notebook_idle_type',
            'experiment_ids', to_jsonb(coalesce(p_experiment_ids, '{}')),
            'trial_ids', to_jsonb(coalesce(p_trial_ids, '{}')))));
    PERFORM det_audit('create', lower(p_type), v_job::text, jsonb_build_object('project', p.id));
    PERFORM pg_notify(det_channel('reconciler', ''), 'task');
    RETURN v_job;
END $$;

CREATE FUNCTION det_task_find(p_job bigint, p_permission text, p_action text) RETURNS tasks
LANGUAGE plpgsql STABLE AS $$
-- Task p_job, once the caller holds p_permission in its workspace (det_require: no_data_found
-- for a task the caller cannot see, as for one that does not exist; insufficient_privilege
-- naming the role for one they see but may not p_action).
DECLARE
    t tasks;
    v_ws integer;
BEGIN
    SELECT * INTO t FROM tasks WHERE job_id = p_job;
    SELECT j.workspace_id INTO v_ws FROM jobs j WHERE j.id = p_job;
    IF t.job_id IS NULL OR NOT (det_is_owner_session()
                                OR det_permitted(det_caller(), 'view', v_ws)) THEN
        RAISE EXCEPTION 'task %: not found', p_job USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_require(p_permission, v_ws, format('%s task %s', p_action, p_job));
    RETURN t;
END $$;

CREATE FUNCTION det_task_kill(p_job bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det <kind> kill`: end task p_job (Editor of its workspace). Its live run is desired
-- KILLED (the agent stops it at once: an interactive task has nothing to checkpoint); one
-- not yet placed ends in the next pass. end_reason records who killed it. Killing an ended
-- task changes nothing.
DECLARE
    t tasks := det_task_find(p_job, 'edit', 'kill');
    v_agent text;
BEGIN
    UPDATE allocations SET desired_state = 'KILLED', stop_requested_at = coalesce(
               stop_requested_at, now())
     WHERE job_id = t.job_id AND state <> 'TERMINATED' AND desired_state <> 'KILLED'
    RETURNING agent_id INTO v_agent;
    IF FOUND THEN
        UPDATE tasks SET end_reason = coalesce(end_reason, format('killed by %s', det_caller()))
         WHERE job_id = t.job_id;
        PERFORM det_audit('kill', lower(t.type), t.job_id::text);
        IF v_agent IS NOT NULL THEN
            PERFORM pg_notify(det_channel('agent', v_agent), '');
        END IF;
        PERFORM pg_notify(det_channel('reconciler', ''), 'task');
    END IF;
END $$;

CREATE FUNCTION det_task_secrets(p_token text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling task's own secrets: {job_id, jupyter_token, ssh_public_key} (its server needs
-- them; the private key stays with det).
DECLARE
    a allocations := det_auth(p_token);
BEGIN
    RETURN (SELECT jsonb_build_object('job_id', s.job_id, 'jupyter_token', s.jupyter_token,
                                      'ssh_public_key', s.ssh_public_key)
              FROM task_secrets s WHERE s.job_id = a.job_id);
END $$;

CREATE FUNCTION det_task_ready(p_token text, p_address text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling task's server answers at p_address (host:port): det serve proxies to it. The
-- task's use starts now (last_activity), so the idle clock counts from here.
DECLARE
    a allocations := det_auth(p_token);
BEGIN
    IF p_address IS NULL OR p_address !~ '^[A-Za-z0-9.:\[\]-]+:[0-9]{1,5}$' THEN
        RAISE EXCEPTION 'address: expected host:port, got %', coalesce(p_address, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE allocations SET address = p_address WHERE id = a.id;
    UPDATE tasks SET last_activity = now() WHERE job_id = a.job_id;
END $$;

CREATE FUNCTION det_task_activity(p_token text, p_at timestamptz) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling task's server saw use at p_at (an open kernel, terminal or SSH session, by its
-- idle type); a time in the future counts as now.
DECLARE
    a allocations := det_auth(p_token);
BEGIN
    UPDATE tasks SET last_activity = least(now(), p_at)
     WHERE job_id = a.job_id AND last_activity < least(now(), p_at);
END $$;

CREATE FUNCTION det_task_open(p_job bigint)
RETURNS TABLE (type text, state text, address text, jupyter_token text, end_reason text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- What det serve's proxy needs to open task p_job for the caller: its kind, its run's state,
-- its server's address (NULL until it answers), the Jupyter token it injects, and why it
-- ended. Opening a TensorBoard needs view permission; a notebook, shell or command runs code
-- as the task's owner, so opening one needs edit (Editor). Touches last_activity (proxied
-- traffic is use) at most once every 5 seconds, so a busy page costs no write per request.
DECLARE
    t tasks := det_task_find(p_job, 'view', 'open');
BEGIN
    IF t.type <> 'TENSORBOARD' THEN
        PERFORM det_require('edit', (SELECT j.workspace_id FROM jobs j WHERE j.id = p_job),
                            format('open %s %s', lower(t.type), p_job));
    END IF;
    UPDATE tasks SET last_activity = now()
     WHERE job_id = p_job AND last_activity < now() - interval '5 seconds';
    RETURN QUERY
    SELECT t.type, a.state::text, a.address, s.jupyter_token, t.end_reason
      FROM allocations a JOIN task_secrets s ON s.job_id = a.job_id
     WHERE a.job_id = p_job ORDER BY a.run DESC LIMIT 1;
END $$;

CREATE FUNCTION det_task_ssh_key(p_job bigint) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The private key that opens shell p_job (`det shell open`): Editor of its workspace.
DECLARE
    t tasks := det_task_find(p_job, 'edit', 'open');
BEGIN
    IF t.type <> 'SHELL' THEN
        RAISE EXCEPTION 'task %: a %, not a shell', p_job, lower(t.type)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN (SELECT ssh_private_key FROM task_secrets WHERE job_id = p_job);
END $$;

GRANT SELECT ON tasks TO det_user;
GRANT SELECT (address) ON allocations TO det_user;
ALTER TABLE tasks ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON tasks FOR SELECT USING (job_id IN (SELECT id FROM jobs));
GRANT EXECUTE ON FUNCTION
    det_create_task(text, jsonb, bytea, text, text, integer[], integer[], jsonb),
    det_task_kill(bigint), det_task_open(bigint), det_task_ssh_key(bigint)
TO det_user;
GRANT EXECUTE ON FUNCTION
    det_task_secrets(text), det_task_ready(text, text), det_task_activity(text, timestamptz)
TO det_task;
