-- Issue 32, pins and references: an experiment warm-starting from a checkpoint
-- (searcher.source_trial_id, searcher.source_checkpoint_uuid) or a model version registering
-- one pins it, so its owner can no longer delete it; the caller must now be an Editor of the
-- checkpoint's workspace, not only a viewer. And SQL is the boundary for experiment configs:
-- det_create_experiment checks the keys the control plane reads
-- (det_experiment_config_problem), so a config stored from psql cannot break the reconciler
-- or the readers. Pins made before this migration stay.

CREATE FUNCTION det_config_value_problem(
    p_value jsonb, p_key text, p_kind text, p_min numeric DEFAULT NULL,
    p_max numeric DEFAULT NULL, p_required boolean DEFAULT false
) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
-- Why p_value, a config's value at key p_key (dotted, for the message), is not of kind
-- p_kind, or NULL. Kinds: 'integer' (a whole JSON number from p_min to p_max), 'number' (above
-- p_min, at most p_max), 'boolean', 'name' (a non-blank string of at most p_max characters
-- without control characters: it is shown in one table cell), 'text' (a string of at most
-- p_max characters), 'length' (det.configs.length: {batches|records|epochs: N} or a bare N,
-- N from 1 to 2**63 - 1). Absent or JSON null is a problem only if p_required.
DECLARE
    v_type text := jsonb_typeof(p_value);
    v_got text := left(p_value::text, 64);
    v_bad boolean;
BEGIN
    IF v_type IS NULL OR v_type = 'null' THEN
        RETURN CASE WHEN p_required
                    THEN format('%s: required; expected an expanded config (det.configs)', p_key)
               END;
    END IF;
    CASE p_kind
    WHEN 'integer' THEN
        -- CASE: the casts run only on a number (OR's operands have no set order).
        v_bad := CASE WHEN v_type = 'number' THEN p_value::numeric % 1 <> 0
                                                 OR p_value::numeric NOT BETWEEN p_min AND p_max
                      ELSE true END;
        IF v_bad THEN
            RETURN format('%s: expected a whole number from %s to %s, got %s', p_key, p_min,
                          p_max, v_got);
        END IF;
    WHEN 'number' THEN
        v_bad := CASE WHEN v_type = 'number' THEN NOT (p_value::numeric > p_min
                                                       AND p_value::numeric <= p_max)
                      ELSE true END;
        IF v_bad THEN
            RETURN format('%s: expected a number above %s and at most %s, got %s', p_key,
                          p_min, p_max, v_got);
        END IF;
    WHEN 'boolean' THEN
        IF v_type <> 'boolean' THEN
            RETURN format('%s: expected true or false, got %s', p_key, v_got);
        END IF;
    WHEN 'name', 'text' THEN
        IF v_type <> 'string' THEN
            RETURN format('%s: expected a string, got %s', p_key, v_got);
        ELSIF length(p_value #>> '{}') > p_max THEN
            RETURN format('%s: expected at most %s characters, got %s', p_key, p_max,
                          length(p_value #>> '{}'));
        ELSIF p_kind = 'name' AND (btrim(p_value #>> '{}') = ''
                                   OR p_value #>> '{}' ~ '[[:cntrl:]]') THEN
            RETURN format('%s: expected non-blank printable text, got %s', p_key, v_got);
        END IF;
    WHEN 'length' THEN
        v_bad := NOT CASE v_type
            WHEN 'number' THEN det_config_value_problem(p_value, p_key, 'integer', 1,
                                                        9223372036854775807) IS NULL
            WHEN 'object' THEN (SELECT count(*) = 1 AND bool_and(
                                    k IN ('batches', 'records', 'epochs')
                                    AND det_config_value_problem(v, p_key, 'integer', 1,
                                                                 9223372036854775807) IS NULL)
                                  FROM jsonb_each(p_value) AS e (k, v))
            ELSE false END;
        IF v_bad THEN
            RETURN format('%s: expected {batches|records|epochs: N} or N (batches), N from 1 '
                          'to 2**63 - 1, got %s', p_key, v_got);
        END IF;
    END CASE;
    RETURN NULL;
END $$;

CREATE FUNCTION det_experiment_config_problem(p_config jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
-- Why p_config cannot be stored as an experiment's config, or NULL: the first key, dotted,
-- and what was expected. det.configs expands every config before submission (its rules:
-- configs/experiment.py, configs/searcher.py, configs/limits.py); this is the part of them
-- that det_create_experiment checks again, so that a config stored from psql past det.configs
-- cannot break the control plane (issue 32): the values the reconciler's SQL casts
-- (resources.slots_per_trial, max_restarts, preemption_timeout, searcher.source_trial_id,
-- checkpoint_storage.save_*: one bad value would fail the statement for every experiment),
-- the searcher's name and required fields, and what the readers show (name, description,
-- searcher.metric and smaller_is_better). Required: name, searcher.name, searcher.metric,
-- the searcher's required fields, resources.resource_pool, resources.weight and
-- resources.slots_per_trial; the other keys are checked when present. The rest
-- (hyperparameters, entrypoint, environment, ...) is det.configs' alone: the searcher reads
-- the config through it, and a failure there errors that one experiment.
DECLARE
    s jsonb := p_config -> 'searcher';
    r jsonb := p_config -> 'resources';
    v_searcher text;
    v_problem text;
BEGIN
    IF jsonb_typeof(p_config) IS DISTINCT FROM 'object' THEN
        RETURN 'config: expected a JSON object (an expanded config, det.configs)';
    END IF;
    IF jsonb_typeof(s) IS DISTINCT FROM 'object' THEN
        RETURN format('searcher: required, a mapping (an expanded config, det.configs); got %s',
                      coalesce(left(s::text, 64), 'none'));
    END IF;
    IF jsonb_typeof(r) IS DISTINCT FROM 'object' THEN
        RETURN format('resources: required, a mapping (an expanded config, det.configs); got %s',
                      coalesce(left(r::text, 64), 'none'));
    END IF;
    v_searcher := CASE WHEN jsonb_typeof(s -> 'name') = 'string' THEN s ->> 'name' END;
    IF v_searcher IS NULL OR v_searcher NOT IN ('single', 'random', 'grid', 'adaptive_asha',
                                                'tpe') THEN
        RETURN coalesce(det_config_value_problem(s -> 'name', 'searcher.name', 'name',
                                                 p_required => true),
                        format('searcher.name: expected one of single|random|grid|'
                               'adaptive_asha|tpe, got %s', left((s -> 'name')::text, 64)));
    END IF;
    IF s ? 'source_trial_id' AND s ? 'source_checkpoint_uuid'
       AND s -> 'source_trial_id' <> 'null' AND s -> 'source_checkpoint_uuid' <> 'null' THEN
        RETURN 'searcher: expected at most one of source_trial_id, source_checkpoint_uuid';
    END IF;
    IF jsonb_typeof(s -> 'source_checkpoint_uuid') = 'string'
       AND s ->> 'source_checkpoint_uuid'
           !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$' THEN
        RETURN format('searcher.source_checkpoint_uuid: expected a checkpoint UUID, got %s',
                      left((s -> 'source_checkpoint_uuid')::text, 64));
    END IF;
    SELECT x.problem INTO v_problem FROM (VALUES
        (1, det_config_value_problem(p_config -> 'name', 'name', 'text', 0, 255, true)),
        (2, det_config_value_problem(p_config -> 'description', 'description', 'text', 0,
                                     4096)),
        (3, det_config_value_problem(p_config -> 'max_restarts', 'max_restarts', 'integer', 0,
                                     2147483647)),
        (4, det_config_value_problem(p_config -> 'preemption_timeout', 'preemption_timeout',
                                     'integer', 0, 2147483647)),
        (5, det_config_value_problem(p_config #> '{reproducibility,experiment_seed}',
                                     'reproducibility.experiment_seed', 'integer', 0,
                                     4294967295)),
        (6, det_config_value_problem(s -> 'metric', 'searcher.metric', 'name', 0, 255, true)),
        (7, det_config_value_problem(s -> 'smaller_is_better', 'searcher.smaller_is_better',
                                     'boolean')),
        (8, det_config_value_problem(s -> 'max_trials', 'searcher.max_trials', 'integer', 1,
                                     10000, v_searcher IN ('random', 'adaptive_asha', 'tpe'))),
        (9, det_config_value_problem(s -> 'max_concurrent_trials',
                                     'searcher.max_concurrent_trials', 'integer', 0,
                                     9223372036854775807)),
        -- adaptive_asha: max_length, or max_time with time_metric (det.configs.searcher).
        (10, det_config_value_problem(s -> 'max_length', 'searcher.max_length', 'length',
                                      p_required => v_searcher = 'tpe'
                                          OR (v_searcher = 'adaptive_asha'
                                              AND coalesce(s -> 'max_time', 'null') = 'null'))),
        (11, det_config_value_problem(s -> 'max_time', 'searcher.max_time', 'integer', 1,
                                      9223372036854775807)),
        (12, det_config_value_problem(s -> 'time_metric', 'searcher.time_metric', 'name', 0,
                                      255, coalesce(s -> 'max_time', 'null') <> 'null')),
        (13, det_config_value_problem(s -> 'source_trial_id', 'searcher.source_trial_id',
                                      'integer', 1, 9223372036854775807)),
        (14, det_config_value_problem(s -> 'source_checkpoint_uuid',
                                      'searcher.source_checkpoint_uuid', 'text', 0, 36)),
        (15, CASE jsonb_typeof(r -> 'resource_pool')
             WHEN 'array' THEN coalesce(
                 (SELECT det_config_value_problem(v, format('resources.resource_pool[%s]',
                                                            i - 1), 'name', 0, 255)
                    FROM jsonb_array_elements(r -> 'resource_pool') WITH ORDINALITY AS a (v, i)
                   WHERE det_config_value_problem(v, 'x', 'name', 0, 255, true) IS NOT NULL
                   ORDER BY i LIMIT 1),
                 CASE WHEN jsonb_array_length(r -> 'resource_pool') = 0
                      THEN 'resources.resource_pool: expected a pool name or a non-empty list '
                           'of them' END)
             ELSE det_config_value_problem(r -> 'resource_pool', 'resources.resource_pool',
                                           'name', 0, 255, true) END),
        (16, det_config_value_problem(r -> 'weight', 'resources.weight', 'number', 0, 1000000,
                                      true)),
        (17, det_config_value_problem(r -> 'slots_per_trial', 'resources.slots_per_trial',
                                      'integer', 0, 2147483647, true)),
        (18, det_config_value_problem(r -> 'priority', 'resources.priority', 'integer', 1, 99)),
        (19, det_config_value_problem(r -> 'max_slots', 'resources.max_slots', 'integer', 0,
                                      2147483647)),
        (20, det_config_value_problem(p_config #> '{checkpoint_storage,save_experiment_best}',
                                      'checkpoint_storage.save_experiment_best', 'integer', 0,
                                      2147483647)),
        (21, det_config_value_problem(p_config #> '{checkpoint_storage,save_trial_best}',
                                      'checkpoint_storage.save_trial_best', 'integer', 0,
                                      2147483647)),
        (22, det_config_value_problem(p_config #> '{checkpoint_storage,save_trial_latest}',
                                      'checkpoint_storage.save_trial_latest', 'integer', 0,
                                      2147483647)),
        (23, det_config_value_problem(p_config -> 'workspace', 'workspace', 'name', 0, 255)),
        (24, det_config_value_problem(p_config -> 'project', 'project', 'name', 0, 255))
    ) AS x (n, problem) WHERE x.problem IS NOT NULL ORDER BY x.n LIMIT 1;
    RETURN v_problem;
END $$;

REVOKE EXECUTE ON FUNCTION det_config_value_problem(jsonb, text, text, numeric, numeric, boolean),
    det_experiment_config_problem(jsonb) FROM PUBLIC;

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
    IF (v_workspace IS NULL) <> (v_project IS NULL) THEN
        RAISE EXCEPTION 'workspace and project: give both or neither (neither: Uncategorized)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_workspace IS NULL THEN
        SELECT * INTO p FROM projects WHERE id = 1;
    ELSE
        p := det_project_find(v_workspace, v_project);
    END IF;
    v_user := det_require('edit', p.workspace_id,
                          format('create an experiment in project %s', to_jsonb(p.name)));
    IF p.archived OR (SELECT archived FROM workspaces WHERE id = p.workspace_id) THEN
        RAISE EXCEPTION 'project %: it (or its workspace) is archived', to_jsonb(p.name)
            USING ERRCODE = 'check_violation';
    END IF;
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

CREATE OR REPLACE FUNCTION det_model_register_version(
    p_model text, p_checkpoint text, p_name text, p_notes text, p_labels text[],
    p_metadata jsonb
) RETURNS model_versions LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model register-version`: the model's next version (its highest number plus one; the
-- model's row lock serialises concurrent registrations) is the checkpoint p_checkpoint, which
-- must be COMPLETED (Determined: "checkpoints for model versions must be in a COMPLETED
-- state"). The version pins the checkpoint. An archived model takes no new versions. The
-- caller is an Editor of the model's workspace and of the checkpoint's: a pinned checkpoint
-- cannot be deleted by its owner, so viewing it is not enough (issue 32; the same rule as
-- det_create_experiment's searcher.source_checkpoint_uuid).
DECLARE
    m models := det_model_find(p_model);
    v_uuid uuid;
    v_state text;
    v_problem text := det_label_problem(p_labels);
    r model_versions;
    v_user text := det_require('edit', m.workspace_id,
                               format('register a version of model %s', to_jsonb(m.name)));
BEGIN
    SELECT * INTO m FROM models WHERE id = m.id FOR UPDATE;
    IF m.archived THEN
        RAISE EXCEPTION 'model % is archived: unarchive it to register new versions',
            to_jsonb(m.name) USING ERRCODE = 'check_violation';
    END IF;
    BEGIN
        v_uuid := p_checkpoint::uuid;
    EXCEPTION WHEN invalid_text_representation THEN
        RAISE EXCEPTION 'checkpoint: expected a checkpoint UUID, got %', to_jsonb(p_checkpoint)
            USING ERRCODE = 'invalid_parameter_value';
    END;
    -- FOR SHARE: the checkpoint cannot change state or go away until this version commits.
    SELECT state INTO v_state FROM checkpoints WHERE uuid = v_uuid FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'checkpoint % not found', v_uuid USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_require('edit', (SELECT j.workspace_id FROM checkpoints c
                                   JOIN trials t ON t.id = c.trial_id
                                   JOIN experiments e ON e.id = t.experiment_id
                                   JOIN jobs j ON j.id = e.job_id WHERE c.uuid = v_uuid),
                        format('register checkpoint %s, which pins it', v_uuid));
    IF v_state <> 'COMPLETED' THEN
        RAISE EXCEPTION 'checkpoint % is %: only a COMPLETED checkpoint can be registered',
            v_uuid, v_state USING ERRCODE = 'check_violation';
    END IF;
    IF length(p_name) > 255 THEN
        RAISE EXCEPTION 'version name: expected at most 255 characters, got %', length(p_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'labels: %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
        RAISE EXCEPTION 'metadata: expected a JSON object, got %', jsonb_typeof(p_metadata)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO model_versions (model_id, version, checkpoint_uuid, name, notes, labels,
                                metadata, owner)
    SELECT m.id, coalesce(max(v.version), 0) + 1, v_uuid, coalesce(p_name, ''),
           coalesce(p_notes, ''), coalesce(p_labels, '{}'), coalesce(p_metadata, '{}'), v_user
      FROM model_versions v WHERE v.model_id = m.id
    RETURNING * INTO r;
    UPDATE models SET last_updated_time = now() WHERE id = m.id;
    PERFORM det_audit('register_version', 'model', m.id::text,
                      jsonb_build_object('version', r.version, 'checkpoint', v_uuid));
    RETURN r;
END $$;
