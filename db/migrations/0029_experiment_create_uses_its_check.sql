-- Issue 32: det_create_experiment places and permits through det_experiment_create_check
-- (migration 0028), the check det serve makes before it unpacks a context, so the rule lives
-- in one function instead of two copies that could drift.
CREATE OR REPLACE FUNCTION det_create_experiment(
    p_config jsonb, p_original_config text, p_context bytea, p_workspace text DEFAULT NULL,
    p_project text DEFAULT NULL
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Submit an experiment (Editor of its workspace), owned by the caller. p_config is the
-- expanded config (validated by det.configs, every default filled: nothing here supplies one
-- again); what the control plane reads of it is checked again here
-- (det_experiment_config_problem: invalid_parameter_value naming the key), so a caller
-- from psql cannot store a config that breaks the reconciler or the readers. p_context is the
-- packed model definition (tar.gz), stored once per distinct content.
-- It goes to project p_project of workspace p_workspace, else the config's workspace and
-- project (both or neither), else Uncategorized. Its pools must serve that workspace
-- (workspace_pools). The job's priority defaults to its pool scheduler's default_priority
-- (the pool's rule, not the config's).
-- The checkpoint it warm-starts from (searcher.source_checkpoint_uuid, or the checkpoints of
-- trial searcher.source_trial_id) is pinned (checkpoint_pins): its owner can no longer
-- delete it, so the caller must be an Editor of that checkpoint's workspace, not only a
-- viewer (issue 32; the model registry's rule, det_model_register_version). One the caller
-- cannot view, or that does not exist, is not found (no_data_found).
DECLARE
    v_problem text := det_experiment_config_problem(p_config);
    v_workspace text := coalesce(p_workspace, p_config ->> 'workspace');
    v_project text := coalesce(p_project, p_config ->> 'project');
    p projects;
    v_user text;
    v_pools text[] := CASE jsonb_typeof(p_config #> '{resources,resource_pool}')
        WHEN 'array' THEN ARRAY(SELECT jsonb_array_elements_text(
                                    p_config #> '{resources,resource_pool}'))
        ELSE ARRAY[p_config #>> '{resources,resource_pool}'] END;
    v_pool text := v_pools[1];
    v_source_trial bigint;
    v_source_uuid uuid;
    v_source_ws integer;
    v_ctx bigint;
    v_job bigint;
    v_id integer;
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'det_create_experiment: %', v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Cast only now: det_experiment_config_problem has checked their kinds.
    v_source_trial := p_config #>> '{searcher,source_trial_id}';
    v_source_uuid := p_config #>> '{searcher,source_checkpoint_uuid}';
    -- Placement and permission: the rule det serve also checks before it unpacks a context.
    SELECT * INTO p FROM projects
     WHERE id = det_experiment_create_check(v_workspace, v_project);
    v_user := det_caller();
    PERFORM det_check_pools(p.workspace_id, v_pools, 'resources.resource_pool');
    -- The pin's target: FOR KEY SHARE keeps its row from being deleted (an experiment purged)
    -- until this experiment, and so the pin, commits; det_unpin_deleting settles a GC that
    -- marked it meanwhile.
    IF v_source_trial IS NOT NULL THEN
        SELECT j.workspace_id INTO v_source_ws
          FROM trials t JOIN experiments e ON e.id = t.experiment_id JOIN jobs j ON j.id = e.job_id
         WHERE t.id = v_source_trial FOR KEY SHARE OF t;
    ELSIF v_source_uuid IS NOT NULL THEN
        SELECT j.workspace_id INTO v_source_ws
          FROM checkpoints c JOIN trials t ON t.id = c.trial_id
          JOIN experiments e ON e.id = t.experiment_id JOIN jobs j ON j.id = e.job_id
         WHERE c.uuid = v_source_uuid FOR KEY SHARE OF c;
    END IF;
    IF coalesce(v_source_trial::text, v_source_uuid::text) IS NOT NULL THEN
        IF v_source_ws IS NULL
           OR NOT (det_is_owner_session() OR det_permitted(v_user, 'view', v_source_ws)) THEN
            RAISE EXCEPTION '%: % % not found',
                CASE WHEN v_source_trial IS NOT NULL THEN 'searcher.source_trial_id'
                     ELSE 'searcher.source_checkpoint_uuid' END,
                CASE WHEN v_source_trial IS NOT NULL THEN 'trial' ELSE 'checkpoint' END,
                coalesce(v_source_trial::text, v_source_uuid::text)
                USING ERRCODE = 'no_data_found';
        END IF;
        PERFORM det_require('edit', v_source_ws, CASE
            WHEN v_source_trial IS NOT NULL THEN format(
                'warm-start from trial %s (searcher.source_trial_id), which pins its checkpoints',
                v_source_trial)
            ELSE format('warm-start from checkpoint %s (searcher.source_checkpoint_uuid), '
                        'which pins it', v_source_uuid) END);
    END IF;
    IF p_context IS NOT NULL THEN
        INSERT INTO context_blobs (sha256, size_bytes, data)
        VALUES (sha256(p_context), length(p_context), p_context)
        ON CONFLICT (sha256) DO NOTHING;
        SELECT id INTO v_ctx FROM context_blobs WHERE sha256 = sha256(p_context);
    END IF;
    INSERT INTO jobs (type, resource_pool, fallback_pools, priority, weight, max_slots,
                      queue_position, owner, workspace_id)
    VALUES ('EXPERIMENT', v_pool, v_pools[2:],
            coalesce((p_config #>> '{resources,priority}')::integer,
                     (det_pool_scheduler(v_pool) ->> 'default_priority')::integer),
            (p_config #>> '{resources,weight}')::double precision,
            (p_config #>> '{resources,max_slots}')::integer,
            extract(epoch FROM clock_timestamp()) * 1000000, v_user, p.workspace_id)
    RETURNING id INTO v_job;
    INSERT INTO experiments (job_id, name, description, config, original_config, context_id,
                             owner, project_id)
    VALUES (v_job, p_config ->> 'name', coalesce(p_config ->> 'description', ''), p_config,
            p_original_config, v_ctx, v_user, p.id)
    RETURNING id INTO v_id;
    PERFORM det_audit('create', 'experiment', v_id::text, jsonb_build_object('project', p.id));
    PERFORM pg_notify(det_channel('reconciler', ''), 'experiment');
    RETURN v_id;
END $$;
