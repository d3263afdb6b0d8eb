-- User actions (the CLI). Each is one transaction; each wakes the reconciler.

CREATE FUNCTION det_internal.config_value_problem(
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
            WHEN 'number' THEN det_internal.config_value_problem(p_value, p_key, 'integer', 1,
                                                        9223372036854775807) IS NULL
            WHEN 'object' THEN (SELECT count(*) = 1 AND bool_and(
                                    k IN ('batches', 'records', 'epochs')
                                    AND det_internal.config_value_problem(v, p_key, 'integer', 1,
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

CREATE FUNCTION det_internal.experiment_config_problem(p_config jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
-- Why p_config cannot be stored as an experiment's config, or NULL: the first key, dotted,
-- and what was expected. det.configs expands every config before submission (its rules:
-- configs/experiment.py, configs/searcher.py, configs/limits.py); this is the part of them
-- that det_user.create_experiment checks again, so that a config stored from psql past det.configs
-- cannot break the control plane: the values the reconciler's SQL casts
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
        RETURN coalesce(det_internal.config_value_problem(s -> 'name', 'searcher.name', 'name',
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
        (1, det_internal.config_value_problem(p_config -> 'name', 'name', 'text', 0, 255, true)),
        (2, det_internal.config_value_problem(p_config -> 'description', 'description', 'text', 0,
                                     4096)),
        (3, det_internal.config_value_problem(p_config -> 'max_restarts', 'max_restarts',
            'integer', 0,
                                     2147483647)),
        (4, det_internal.config_value_problem(p_config -> 'preemption_timeout',
            'preemption_timeout',
                                     'integer', 0, 2147483647)),
        (5, det_internal.config_value_problem(p_config #> '{reproducibility,experiment_seed}',
                                     'reproducibility.experiment_seed', 'integer', 0,
                                     4294967295)),
        (6, det_internal.config_value_problem(s -> 'metric', 'searcher.metric', 'name', 0,
            255, true)),
        (7, det_internal.config_value_problem(s -> 'smaller_is_better',
            'searcher.smaller_is_better',
                                     'boolean')),
        (8, det_internal.config_value_problem(s -> 'max_trials', 'searcher.max_trials',
            'integer', 1,
                                     10000, v_searcher IN ('random', 'adaptive_asha', 'tpe'))),
        (9, det_internal.config_value_problem(s -> 'max_concurrent_trials',
                                     'searcher.max_concurrent_trials', 'integer', 0,
                                     9223372036854775807)),
        -- adaptive_asha: max_length, or max_time with time_metric (det.configs.searcher).
        (10, det_internal.config_value_problem(s -> 'max_length', 'searcher.max_length', 'length',
                                      p_required => v_searcher = 'tpe'
                                          OR (v_searcher = 'adaptive_asha'
                                              AND coalesce(s -> 'max_time', 'null') = 'null'))),
        (11, det_internal.config_value_problem(s -> 'max_time', 'searcher.max_time', 'integer', 1,
                                      9223372036854775807)),
        (12, det_internal.config_value_problem(s -> 'time_metric',
            'searcher.time_metric', 'name', 0,
                                      255, coalesce(s -> 'max_time', 'null') <> 'null')),
        (13, det_internal.config_value_problem(s -> 'source_trial_id', 'searcher.source_trial_id',
                                      'integer', 1, 9223372036854775807)),
        (14, det_internal.config_value_problem(s -> 'source_checkpoint_uuid',
                                      'searcher.source_checkpoint_uuid', 'text', 0, 36)),
        (15, CASE jsonb_typeof(r -> 'resource_pool')
             WHEN 'array' THEN coalesce(
                 (SELECT det_internal.config_value_problem(v, format('resources.resource_pool[%s]',
                                                            i - 1), 'name', 0, 255)
                    FROM jsonb_array_elements(r -> 'resource_pool') WITH ORDINALITY AS a (v, i)
                   WHERE det_internal.config_value_problem(v, 'x', 'name', 0, 255, true) IS NOT NULL
                   ORDER BY i LIMIT 1),
                 CASE WHEN jsonb_array_length(r -> 'resource_pool') = 0
                      THEN 'resources.resource_pool: expected a pool name or a non-empty list '
                           'of them' END)
             ELSE det_internal.config_value_problem(r -> 'resource_pool', 'resources.resource_pool',
                                           'name', 0, 255, true) END),
        (16, det_internal.config_value_problem(r -> 'weight', 'resources.weight',
            'number', 0, 1000000,
                                      true)),
        (17, det_internal.config_value_problem(r -> 'slots_per_trial', 'resources.slots_per_trial',
                                      'integer', 0, 2147483647, true)),
        (18, det_internal.config_value_problem(r -> 'priority', 'resources.priority',
            'integer', 1, 99)),
        (19, det_internal.config_value_problem(r -> 'max_slots', 'resources.max_slots',
            'integer', 0,
                                      2147483647)),
        (20, det_internal.config_value_problem(p_config #> '{checkpoint_storage,save_experiment_best}',
                                      'checkpoint_storage.save_experiment_best', 'integer', 0,
                                      2147483647)),
        (21, det_internal.config_value_problem(p_config #> '{checkpoint_storage,save_trial_best}',
                                      'checkpoint_storage.save_trial_best', 'integer', 0,
                                      2147483647)),
        (22, det_internal.config_value_problem(p_config #> '{checkpoint_storage,save_trial_latest}',
                                      'checkpoint_storage.save_trial_latest', 'integer', 0,
                                      2147483647)),
        (23, det_internal.config_value_problem(p_config -> 'workspace', 'workspace',
            'name', 0, 255)),
        (24, det_internal.config_value_problem(p_config -> 'project', 'project', 'name', 0, 255))
    ) AS x (n, problem) WHERE x.problem IS NOT NULL ORDER BY x.n LIMIT 1;
    RETURN v_problem;
END $$;

CREATE FUNCTION det_user.create_experiment(
    p_config jsonb, p_original_config text, p_context bytea, p_workspace text DEFAULT NULL,
    p_project text DEFAULT NULL
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Submit an experiment (Editor of its workspace), owned by the caller. p_config is the
-- expanded config (validated by det.configs, every default filled: nothing here supplies one
-- again); what the control plane reads of it is checked again here
-- (det_internal.experiment_config_problem: invalid_parameter_value naming the key), so a caller
-- from psql cannot store a config that breaks the reconciler or the readers. p_context is the
-- packed model definition (tar.gz), stored once per distinct content.
-- It goes to project p_project of workspace p_workspace, else the config's workspace and
-- project (both or neither), else Uncategorized. Its pools must serve that workspace
-- (workspace_pools). The job's priority defaults to its pool scheduler's default_priority
-- (the pool's rule, not the config's).
-- The checkpoint it warm-starts from (searcher.source_checkpoint_uuid, or the checkpoints of
-- trial searcher.source_trial_id) is pinned (checkpoint_pins): its owner can no longer
-- delete it, so the caller must be an Editor of that checkpoint's workspace, not only a
-- viewer (the model registry's rule, det_user.model_register_version). One the caller
-- cannot view, or that does not exist, is not found (no_data_found).
DECLARE
    v_problem text := det_internal.experiment_config_problem(p_config);
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
        RAISE EXCEPTION 'det_user.create_experiment: %', v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Cast only now: det_internal.experiment_config_problem has checked their kinds.
    v_source_trial := p_config #>> '{searcher,source_trial_id}';
    v_source_uuid := p_config #>> '{searcher,source_checkpoint_uuid}';
    -- Placement and permission: the rule det serve also checks before it unpacks a context.
    SELECT * INTO p FROM projects
     WHERE id = det_user.experiment_create_check(v_workspace, v_project);
    v_user := det_user.caller();
    PERFORM det_internal.check_pools(p.workspace_id, v_pools, 'resources.resource_pool');
    -- The pin's target: FOR KEY SHARE keeps its row from being deleted (an experiment purged)
    -- until this experiment, and so the pin, commits; det_internal.unpin_deleting settles a GC that
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
           OR NOT (det_user.is_owner_session() OR det_user.permitted(v_user, 'view',
               v_source_ws)) THEN
            RAISE EXCEPTION '%: % % not found',
                CASE WHEN v_source_trial IS NOT NULL THEN 'searcher.source_trial_id'
                     ELSE 'searcher.source_checkpoint_uuid' END,
                CASE WHEN v_source_trial IS NOT NULL THEN 'trial' ELSE 'checkpoint' END,
                coalesce(v_source_trial::text, v_source_uuid::text)
                USING ERRCODE = 'no_data_found';
        END IF;
        PERFORM det_internal.require('edit', v_source_ws, CASE
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
                     (det_user.pool_scheduler(v_pool) ->> 'default_priority')::integer),
            (p_config #>> '{resources,weight}')::double precision,
            (p_config #>> '{resources,max_slots}')::integer,
            extract(epoch FROM clock_timestamp()) * 1000000, v_user, p.workspace_id)
    RETURNING id INTO v_job;
    INSERT INTO experiments (job_id, name, description, config, original_config, context_id,
                             owner, project_id)
    VALUES (v_job, p_config ->> 'name', coalesce(p_config ->> 'description', ''), p_config,
            p_original_config, v_ctx, v_user, p.id)
    RETURNING id INTO v_id;
    PERFORM det_internal.audit('create', 'experiment', v_id::text,
        jsonb_build_object('project', p.id));
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'experiment');
    RETURN v_id;
END $$;
GRANT EXECUTE ON FUNCTION det_user.create_experiment(jsonb, text, bytea, text, text) TO det_user;

-- Experiments made from an existing experiment (det experiment fork) or trial
-- (det trial continue); spec: run-training-code.rst, "Create an Experiment".
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

CREATE FUNCTION det_internal.trials_continue() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A new trial of a continuation (continuations) starts from its checkpoint: the trial's
-- restart point (latest_checkpoint, steps_completed) is that checkpoint's, so its first run
-- restores it (det_task.info) and counts batches on from the checkpoint's.
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
    FOR EACH ROW EXECUTE FUNCTION det_internal.trials_continue();

CREATE FUNCTION det_user.experiment_fork(
    p_source integer, p_config jsonb, p_original_config text, p_workspace text, p_project text
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment fork`: a new experiment with the model definition (context) of experiment
-- p_source and the expanded config p_config (its YAML p_original_config), stored by
-- det_user.create_experiment (its checks, placement and permissions: Editor where it goes). The
-- caller must be able to view p_source (no_data_found otherwise, as for any experiment they
-- cannot see). Returns the new experiment's id.
DECLARE
    v_ctx bytea;
    v_id integer;
BEGIN
    PERFORM det_internal.require('view', det_user.experiment_workspace(p_source),
                        format('fork experiment %s', p_source));
    SELECT b.data INTO v_ctx
      FROM experiments e LEFT JOIN context_blobs b ON b.id = e.context_id WHERE e.id = p_source;
    v_id := det_user.create_experiment(p_config, p_original_config, v_ctx, p_workspace, p_project);
    PERFORM det_internal.audit('fork', 'experiment', v_id::text,
        jsonb_build_object('source', p_source));
    RETURN v_id;
END $$;
GRANT EXECUTE ON FUNCTION det_user.experiment_fork(integer, jsonb, text, text, text) TO det_user;

CREATE FUNCTION det_user.trial_continue(
    p_trial integer, p_config jsonb, p_original_config text, p_workspace text, p_project text
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det trial continue`: a new experiment of one trial (searcher single) that resumes trial
-- p_trial from its latest checkpoint, weights and batch count (continuations); the model
-- definition is p_trial's experiment's. p_config (expanded; YAML p_original_config) names that
-- checkpoint as searcher.source_checkpoint_uuid, which pins it, and keeps the checkpoint's
-- storage, from which the new trial restores it. Stored by det_user.create_experiment (its checks
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
    PERFORM det_internal.require('view', det_user.experiment_workspace(v_exp),
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
            det_user.redact_secrets(c.storage)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_id := det_user.create_experiment(p_config, p_original_config,
                                  (SELECT b.data FROM experiments e
                                     JOIN context_blobs b ON b.id = e.context_id
                                    WHERE e.id = v_exp),
                                  p_workspace, p_project);
    INSERT INTO continuations (experiment_id, source_trial_id, checkpoint_uuid)
    VALUES (v_id, p_trial, c.uuid);
    PERFORM det_internal.audit('continue', 'experiment', v_id::text,
                      jsonb_build_object('trial', p_trial, 'checkpoint', c.uuid));
    RETURN v_id;
END $$;
GRANT EXECUTE ON FUNCTION det_user.trial_continue(integer, jsonb, text, text, text) TO det_user;

CREATE FUNCTION det_user.experiment_action(p_id integer, p_action text) RETURNS experiment_state
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
    PERFORM det_internal.require('edit', det_user.experiment_workspace(p_id),
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
    PERFORM det_internal.audit(p_action, 'experiment', p_id::text);
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'experiment');
    RETURN v_new;
END $$;
GRANT EXECUTE ON FUNCTION det_user.experiment_action(integer, text) TO det_user;

CREATE FUNCTION det_internal.create_task(
    p_type text, p_config jsonb, p_context bytea, p_workspace text, p_project text,
    p_experiment_ids integer[], p_trial_ids integer[], p_secrets jsonb
) RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Submit an interactive task of kind p_type (COMMAND, NOTEBOOK, SHELL, TENSORBOARD) with the
-- expanded task config p_config (det.configs.task: every default filled, its pool chosen),
-- owned by the caller, in project p_project of workspace p_workspace (both NULL:
-- Uncategorized): Editor there, as for an experiment (det_user.experiment_create_check). A
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
    SELECT * INTO p FROM projects
        WHERE id = det_user.experiment_create_check(p_workspace, p_project);
    v_user := det_user.caller();
    PERFORM det_internal.check_pools(p.workspace_id, ARRAY[v_pool], 'resources.resource_pool');
    SELECT m INTO v_missing FROM (
        SELECT 'experiment ' || x AS m FROM unnest(p_experiment_ids) x
         WHERE NOT EXISTS (SELECT 1 FROM experiments e JOIN jobs j ON j.id = e.job_id
                            WHERE e.id = x AND (det_user.is_owner_session()
                                                OR det_user.permitted(v_user, 'view',
                                                    j.workspace_id)))
        UNION ALL
        SELECT 'trial ' || x FROM unnest(p_trial_ids) x
         WHERE NOT EXISTS (SELECT 1 FROM trials t JOIN experiments e ON e.id = t.experiment_id
                             JOIN jobs j ON j.id = e.job_id
                            WHERE t.id = x AND (det_user.is_owner_session()
                                                OR det_user.permitted(v_user, 'view',
                                                    j.workspace_id)))
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
                     (det_user.pool_scheduler(v_pool) ->> 'default_priority')::integer),
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
    PERFORM det_internal.audit('create', lower(p_type), v_job::text,
        jsonb_build_object('project', p.id));
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'task');
    RETURN v_job;
END $$;
GRANT EXECUTE ON FUNCTION
    det_internal.create_task(text, jsonb, bytea, text, text, integer[], integer[], jsonb)
    TO det_user;

CREATE FUNCTION det_internal.task_find(p_job bigint, p_permission text, p_action text) RETURNS tasks
LANGUAGE plpgsql STABLE AS $$
-- Task p_job, once the caller holds p_permission in its workspace (det_internal.require:
-- no_data_found for a task the caller cannot see, as for one that does not exist;
-- insufficient_privilege naming the role for one they see but may not p_action).
DECLARE
    t tasks;
    v_ws integer;
BEGIN
    SELECT * INTO t FROM tasks WHERE job_id = p_job;
    SELECT j.workspace_id INTO v_ws FROM jobs j WHERE j.id = p_job;
    IF t.job_id IS NULL OR NOT (det_user.is_owner_session()
                                OR det_user.permitted(det_user.caller(), 'view', v_ws)) THEN
        RAISE EXCEPTION 'task %: not found', p_job USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.require(p_permission, v_ws, format('%s task %s', p_action, p_job));
    RETURN t;
END $$;

CREATE FUNCTION det_user.task_kill(p_job bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det <kind> kill`: end task p_job (Editor of its workspace). Its live run is desired
-- KILLED (the agent stops it at once: an interactive task has nothing to checkpoint); one
-- not yet placed ends in the next pass. end_reason records who killed it. Killing an ended
-- task changes nothing.
DECLARE
    t tasks := det_internal.task_find(p_job, 'edit', 'kill');
    v_agent text;
BEGIN
    UPDATE allocations SET desired_state = 'KILLED', stop_requested_at = coalesce(
               stop_requested_at, now())
     WHERE job_id = t.job_id AND state <> 'TERMINATED' AND desired_state <> 'KILLED'
    RETURNING agent_id INTO v_agent;
    IF FOUND THEN
        UPDATE tasks SET end_reason = coalesce(end_reason, format('killed by %s',
            det_user.caller()))
         WHERE job_id = t.job_id;
        PERFORM det_internal.audit('kill', lower(t.type), t.job_id::text);
        IF v_agent IS NOT NULL THEN
            PERFORM pg_notify(det_internal.channel('agent', v_agent), '');
        END IF;
        PERFORM pg_notify(det_internal.channel('reconciler', ''), 'task');
    END IF;
END $$;
GRANT EXECUTE ON FUNCTION det_user.task_kill(bigint) TO det_user;

CREATE FUNCTION det_user.job_update(p_job bigint, p_field text, p_value text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- One change to a queued job (spec: run-training-code, Modify the Job Queue): priority only
-- under the priority scheduler, weight only under fair share, ahead-of / behind-of only under
-- priority, resource-pool only for experiments. Several calls in one transaction are
-- `det job update-batch`: all apply or none. Editor of the job's workspace; a new pool must
-- serve it.
DECLARE
    j jobs;
    other jobs;
    v_type text;
    v_neighbour numeric;
    v_int integer;
    v_weight double precision;
    v_exp integer;
    v_state experiment_state;
BEGIN
    SELECT * INTO j FROM jobs WHERE id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % not found', p_job USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.require('edit', j.workspace_id, format('change the %s of job %s',
        p_field, p_job));
    SELECT e.id, e.state INTO v_exp, v_state FROM experiments e WHERE e.job_id = p_job;
    IF v_state IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RAISE EXCEPTION 'job % (experiment %) is %: it is no longer queued', p_job, v_exp,
            v_state USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_type := det_user.pool_scheduler(j.resource_pool) ->> 'type';
    CASE p_field
    WHEN 'priority' THEN
        IF v_type <> 'priority' THEN
            RAISE EXCEPTION 'job %: priority applies only under the priority scheduler; pool "%" uses %',
                p_job, j.resource_pool, v_type USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_int := p_value::integer;
        IF v_int NOT BETWEEN 1 AND 99 THEN
            RAISE EXCEPTION 'job %: priority must be between 1 and 99, not %', p_job, p_value
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- A new priority puts the job back at its submission time within that priority.
        UPDATE jobs SET priority = v_int,
               queue_position = extract(epoch FROM submitted_at) * 1000000
         WHERE id = p_job;
    WHEN 'weight' THEN
        IF v_type <> 'fair_share' THEN
            RAISE EXCEPTION 'job %: weight applies only under the fair_share scheduler; pool "%" uses %',
                p_job, j.resource_pool, v_type USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_weight := p_value::double precision;
        -- NOT (... AND ...) also refuses NaN, which PostgreSQL sorts above every number (so
        -- NaN > 0 holds), and Infinity; the same rule is the jobs.weight CHECK.
        IF NOT (v_weight > 0 AND v_weight <= 1000000) THEN
            RAISE EXCEPTION 'job %: weight must be a finite number > 0 and at most 1e6, not %',
                p_job, p_value USING ERRCODE = 'invalid_parameter_value';
        END IF;
        UPDATE jobs SET weight = v_weight WHERE id = p_job;
    WHEN 'resource-pool' THEN
        IF j.type <> 'EXPERIMENT' THEN
            RAISE EXCEPTION 'job %: only experiments can change resource pool; cancel and resubmit a %',
                p_job, lower(j.type) USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM det_internal.check_pools(j.workspace_id, ARRAY[p_value], format('job %s', p_job));
        UPDATE jobs SET resource_pool = p_value, fallback_pools = '{}' WHERE id = p_job;
        UPDATE allocations SET resource_pool = p_value
         WHERE job_id = p_job AND state = 'PENDING';
        UPDATE experiments SET config = jsonb_set(config, '{resources,resource_pool}',
            to_jsonb(p_value))
         WHERE job_id = p_job;
    WHEN 'ahead-of', 'behind-of' THEN
        IF v_type <> 'priority' THEN
            RAISE EXCEPTION 'job %: % applies only under the priority scheduler; pool "%" uses %',
                p_job, p_field, j.resource_pool, v_type USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT * INTO other FROM jobs WHERE id = p_value::bigint;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'job %: no job % to move %', p_job, p_value, replace(p_field, '-of', '')
                USING ERRCODE = 'no_data_found';
        END IF;
        IF other.resource_pool <> j.resource_pool THEN
            RAISE EXCEPTION 'job %: job % is in pool "%", not "%"', p_job, other.id,
                other.resource_pool, j.resource_pool USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- Take the other job's priority and a position just before (after) it: the midpoint
        -- with its neighbour, so no other job moves.
        IF p_field = 'ahead-of' THEN
            SELECT max(queue_position) INTO v_neighbour FROM jobs
             WHERE resource_pool = other.resource_pool AND priority = other.priority
               AND queue_position < other.queue_position AND id <> p_job;
            v_neighbour := coalesce(v_neighbour, other.queue_position - 2);
        ELSE
            SELECT min(queue_position) INTO v_neighbour FROM jobs
             WHERE resource_pool = other.resource_pool AND priority = other.priority
               AND queue_position > other.queue_position AND id <> p_job;
            v_neighbour := coalesce(v_neighbour, other.queue_position + 2);
        END IF;
        UPDATE jobs SET priority = other.priority,
               queue_position = (other.queue_position + v_neighbour) / 2
         WHERE id = p_job;
    ELSE
        RAISE EXCEPTION 'unknown job field "%"; expected priority, weight, resource-pool, ahead-of or behind-of',
            p_field USING ERRCODE = 'invalid_parameter_value';
    END CASE;
    PERFORM det_internal.audit('update', 'job', p_job::text,
                      jsonb_build_object('field', p_field, 'value', p_value));
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'job');
EXCEPTION
    WHEN invalid_text_representation OR numeric_value_out_of_range THEN
        RAISE EXCEPTION 'job %: % expects a number, not "%"', p_job, p_field, p_value
            USING ERRCODE = 'invalid_parameter_value';
END $$;
GRANT EXECUTE ON FUNCTION det_user.job_update(bigint, text, text) TO det_user;

CREATE FUNCTION det_user.apply_cluster_config(p_config jsonb, p_original text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Store a validated cluster config and make resource_pools match it (ClusterAdmin). A pool
-- the config drops is deleted only if nothing uses it (agents and live instances count);
-- otherwise the whole apply is refused. A pool's provider is stored as given.
DECLARE
    v_gone text;
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL, 'apply a cluster config');
    INSERT INTO resource_pools (name, description, scheduler, max_aux_containers_per_agent,
                                provider)
    SELECT p ->> 'name', coalesce(p ->> 'description', ''), nullif(p -> 'scheduler', 'null'),
           coalesce((p ->> 'max_aux_containers_per_agent')::integer, 100),
           nullif(p -> 'provider', 'null')
    FROM jsonb_array_elements(p_config -> 'resource_pools') p
    ON CONFLICT (name) DO UPDATE
        SET description = excluded.description, scheduler = excluded.scheduler,
            max_aux_containers_per_agent = excluded.max_aux_containers_per_agent,
            provider = excluded.provider;
    SELECT name INTO v_gone FROM resource_pools r
     WHERE name NOT IN (SELECT p ->> 'name'
         FROM jsonb_array_elements(p_config -> 'resource_pools') p)
       AND (EXISTS (SELECT 1 FROM agents g WHERE g.resource_pool = r.name AND g.state <> 'LOST')
            OR EXISTS (SELECT 1 FROM instances i WHERE i.resource_pool = r.name
                                                   AND i.state <> 'GONE')
            OR EXISTS (SELECT 1 FROM jobs j JOIN experiments e ON e.job_id = j.id
                        WHERE j.resource_pool = r.name
                          AND e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR')))
     LIMIT 1;
    IF v_gone IS NOT NULL THEN
        RAISE EXCEPTION 'resource_pools: pool "%" still has agents or active jobs; keep it in the config or drain it first', v_gone
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM resource_pools r
     WHERE name NOT IN (SELECT p ->> 'name'
         FROM jsonb_array_elements(p_config -> 'resource_pools') p)
       AND NOT EXISTS (SELECT 1 FROM agents g WHERE g.resource_pool = r.name)
       AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.resource_pool = r.name)
       AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.resource_pool = r.name);
    INSERT INTO cluster_config (config, original) VALUES (p_config, p_original)
    ON CONFLICT (singleton) DO UPDATE
        SET config = excluded.config, original = excluded.original, applied_at = now();
    PERFORM det_internal.audit('apply', 'cluster_config', 'cluster', p_config);
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'cluster');
END $$;
GRANT EXECUTE ON FUNCTION det_user.apply_cluster_config(jsonb, text) TO det_user;

CREATE FUNCTION det_user.agent_set_enabled(p_id text, p_enabled boolean) RETURNS agent_state
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Disable (drain) or enable an agent (ClusterAdmin): a disabled agent's running work
-- finishes, nothing new is placed on it (Determined's `det agent disable`). Returns its new
-- state.
DECLARE
    v_state agent_state;
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL,
                        format('%s agent %s', CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END,
                               p_id));
    UPDATE agents
       SET state = CASE WHEN p_enabled THEN 'ACTIVE' ELSE 'DISABLED' END::agent_state
     WHERE id = p_id AND state <> 'LOST'
    RETURNING state INTO v_state;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent % not found (or lost)', p_id USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.audit(CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END, 'agent', p_id);
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'agent');
    RETURN v_state;
END $$;
GRANT EXECUTE ON FUNCTION det_user.agent_set_enabled(text, boolean) TO det_user;

CREATE FUNCTION det_user.agent_drain(p_id text) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det agent disable --drain` (ClusterAdmin): disable agent p_id (det_user.agent_set_enabled) and
-- stop its live runs as a planned stop (det_internal.stop_runs_of): each trial checkpoints and
-- exits as on pause and resumes on another agent from that checkpoint, its end no failure.
-- A task that ignores the request is killed after its preemption_timeout (the reconciler's
-- KILL_OVERDUE), still no failure. Returns how many runs were asked to stop.
BEGIN
    PERFORM det_user.agent_set_enabled(p_id, false);
    RETURN cardinality(det_internal.stop_runs_of(p_id));
END $$;
GRANT EXECUTE ON FUNCTION det_user.agent_drain(text) TO det_user;

CREATE FUNCTION det_agent.mark_fenced(p_agent text, p_ids bigint[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent killed its live runs p_ids because it could not heartbeat for its lease
-- (self-fencing, det.agent.heartbeat): the cluster's doing, not the trials' (a database outage
-- longer than the lease does it to every agent), so each is marked planned_stop and its
-- trial resumes from its latest checkpoint without counting a restart. Runs that already
-- ended (the reconciler declared the agent lost first: a failure, as any lost agent's run) or
-- that are not this agent's are left alone.
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    UPDATE allocations a SET planned_stop = true
     WHERE a.id = ANY (p_ids) AND a.state <> 'TERMINATED'
       AND (a.agent_id = p_agent
            OR EXISTS (SELECT 1 FROM allocation_slots h
                        WHERE h.allocation_id = a.id AND h.agent_id = p_agent));
END $$;
GRANT EXECUTE ON FUNCTION det_agent.mark_fenced(text, bigint[]) TO det_agent;

CREATE FUNCTION det_user.slot_set_enabled(p_agent text, p_slot integer, p_enabled boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Disable (drain) or enable one slot of an agent (ClusterAdmin); work holding it runs on.
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL,
                        format('%s slot %s of agent %s',
                               CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END, p_slot,
                               p_agent));
    UPDATE slots SET enabled = p_enabled WHERE agent_id = p_agent AND slot_id = p_slot;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent % has no slot %', p_agent, p_slot USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.audit(CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END, 'slot',
                      p_agent || '/' || p_slot);
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'agent');
END $$;
GRANT EXECUTE ON FUNCTION det_user.slot_set_enabled(text, integer, boolean) TO det_user;
