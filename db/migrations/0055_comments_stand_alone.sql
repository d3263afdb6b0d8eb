-- The comments in function bodies and on tables stand on their own: they said which issue a
-- rule came from ("issue 32", "reference-facts §5.1", "spec: agents"), pointers to documents a
-- reader of the catalog does not have; each now says the rule itself. Only comments change:
-- every body below is the one before, comment lines apart.

COMMENT ON TABLE templates IS
    'Configuration templates (spec: Configuration Templates): a partial experiment config that '
    '`det experiment create --template NAME` merges under the user''s config '
    '(det.configs.templates). Experiments store the merged config, so changing or removing a '
    'template later changes no experiment. A template is its workspace''s: '
    'readable under the workspace''s row-level security, written by its Editors.';

CREATE OR REPLACE FUNCTION det_redact_secrets(p_value jsonb) RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
-- p_value with every secret replaced by '********': the value of each key that
-- det_secret_name calls a secret, at any depth, and the value of each 'NAME=VALUE' list item
-- (environment_variables) whose NAME is one. A null stays null: it hides nothing.
BEGIN
    CASE jsonb_typeof(p_value)
    WHEN 'object' THEN
        RETURN (SELECT coalesce(jsonb_object_agg(e.k, CASE
                    WHEN det_secret_name(e.k) AND jsonb_typeof(e.v) <> 'null' THEN '"********"'
                    ELSE det_redact_secrets(e.v) END), '{}')
                  FROM jsonb_each(p_value) AS e(k, v));
    WHEN 'array' THEN
        RETURN (SELECT coalesce(jsonb_agg(CASE
                    WHEN jsonb_typeof(e.v) = 'string' AND strpos(e.v #>> '{}', '=') > 1
                         AND det_secret_name(split_part(e.v #>> '{}', '=', 1))
                    THEN to_jsonb(split_part(e.v #>> '{}', '=', 1) || '=********')
                    ELSE det_redact_secrets(e.v) END ORDER BY e.i), '[]')
                  FROM jsonb_array_elements(p_value) WITH ORDINALITY AS e(v, i));
    ELSE
        RETURN p_value;
    END CASE;
END $$;

CREATE OR REPLACE FUNCTION det_password_policy(p_password_length integer, p_weak_ok boolean,
                                    p_action text) RETURNS void LANGUAGE plpgsql STABLE AS $$
-- The minimum password policy: a new password has at least 8 characters, unless a
-- ClusterAdmin sets p_weak_ok (`--weak-ok`) for p_action ('set the password of user "bob"').
-- det sees a password only as its client-made SCRAM verifier (det_check_verifier), so the
-- client states its length in characters (det's CLI counts it); the cluster's own session,
-- which may ALTER ROLE any password anyway, may leave it unstated (NULL). Raises
-- invalid_parameter_value (too short, or unstated), insufficient_privilege (p_weak_ok by a
-- caller who is no ClusterAdmin).
BEGIN
    IF p_weak_ok THEN
        PERFORM det_require('admin_cluster', NULL, format('%s with --weak-ok', p_action));
        RETURN;
    END IF;
    IF p_password_length IS NULL AND NOT det_is_owner_session() THEN
        RAISE EXCEPTION 'password length: expected the new password''s length in characters '
                        '(det requires at least 8)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_password_length < 8 THEN
        RAISE EXCEPTION 'password: expected at least 8 characters, got %; a ClusterAdmin may '
                        'allow a shorter one with --weak-ok', p_password_length
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION det_user_set_password(p_username text, p_password_verifier text,
                                      p_password_length integer DEFAULT NULL,
                                      p_weak_ok boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user change-password`: a user's own, or anyone's by a ClusterAdmin (the CLI asks a
-- user who is no ClusterAdmin for the current password first). p_password_length,
-- p_weak_ok: the password policy (det_password_policy). Every det serve login of the user
-- ends (a token minted under the old password is refused), and the change is audited with how
-- many logins it ended.
DECLARE
    u users := det_user_find(p_username);
    v_ended integer;
BEGIN
    IF u.username <> det_caller() THEN
        PERFORM det_require('admin_cluster', NULL,
                            format('change the password of user %s', to_jsonb(p_username)));
    END IF;
    IF p_password_verifier IS NULL THEN
        RAISE EXCEPTION 'password: expected a SCRAM-SHA-256 verifier, got nothing'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_check_verifier(p_password_verifier);
    PERFORM det_password_policy(p_password_length, p_weak_ok,
                                format('change the password of user %s', to_jsonb(p_username)));
    EXECUTE format('ALTER ROLE %I PASSWORD %L', u.username, p_password_verifier);
    DELETE FROM web_sessions WHERE username = u.username;
    GET DIAGNOSTICS v_ended = ROW_COUNT;
    PERFORM det_audit('change_password', 'user', u.username,
                      jsonb_build_object('logins_ended', v_ended,
                                         'weak_ok', coalesce(p_weak_ok, false)));
END $$;

CREATE OR REPLACE FUNCTION det_experiment_config_problem(p_config jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
-- Why p_config cannot be stored as an experiment's config, or NULL: the first key, dotted,
-- and what was expected. det.configs expands every config before submission (its rules:
-- configs/experiment.py, configs/searcher.py, configs/limits.py); this is the part of them
-- that det_create_experiment checks again, so that a config stored from psql past det.configs
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
-- viewer (the model registry's rule, det_model_register_version). One the caller
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

CREATE OR REPLACE FUNCTION det_agent_set_enabled(p_id text, p_enabled boolean) RETURNS agent_state
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Disable (drain) or enable an agent (ClusterAdmin): a disabled agent's running work
-- finishes, nothing new is placed on it (Determined's `det agent disable`). Returns its new
-- state.
DECLARE
    v_state agent_state;
BEGIN
    PERFORM det_require('admin_cluster', NULL,
                        format('%s agent %s', CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END,
                               p_id));
    UPDATE agents
       SET state = CASE WHEN p_enabled THEN 'ACTIVE' ELSE 'DISABLED' END::agent_state
     WHERE id = p_id AND state <> 'LOST'
    RETURNING state INTO v_state;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent % not found (or lost)', p_id USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_audit(CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END, 'agent', p_id);
    PERFORM pg_notify(det_channel('reconciler', ''), 'agent');
    RETURN v_state;
END $$;

CREATE OR REPLACE FUNCTION det_agent_drain(p_id text) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det agent disable --drain` (ClusterAdmin): disable agent p_id (det_agent_set_enabled) and
-- stop its live runs as a planned stop (det_stop_runs_of): each trial checkpoints and exits as
-- on pause and resumes on another agent from that checkpoint, its end no failure.
-- A task that ignores the request is killed after its preemption_timeout (the reconciler's
-- KILL_OVERDUE), still no failure. Returns how many runs were asked to stop.
BEGIN
    PERFORM det_agent_set_enabled(p_id, false);
    RETURN cardinality(det_stop_runs_of(p_id));
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
-- cannot be deleted by its owner, so viewing it is not enough (the same rule as
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

CREATE OR REPLACE FUNCTION det_template_set(p_workspace text, p_name text, p_config jsonb,
                                 p_original text)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det template set`: create or replace template p_name of workspace p_workspace (NULL:
-- Uncategorized), as an Editor there (a template is its workspace's, not the cluster's). p_config: its YAML (p_original) as a JSON object, checked by
-- det.configs.templates. Returns true when it was created.
DECLARE
    v_ws integer := det_template_workspace(
        p_workspace, 'edit', format('set template %s in workspace %s', to_jsonb(p_name),
                                    to_jsonb(coalesce(p_workspace, 'Uncategorized'))));
    v_problem text := det_template_name_problem(p_name);
    v_created boolean;
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'template name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(p_config) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'template %: expected a mapping at the top level', to_jsonb(p_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO templates AS t (workspace_id, name, config, original, owner)
    VALUES (v_ws, p_name, p_config, p_original, det_caller())
    ON CONFLICT (workspace_id, name) DO UPDATE
        SET config = excluded.config, original = excluded.original, updated_at = now()
    RETURNING (xmax = 0) INTO v_created;
    PERFORM det_audit(CASE WHEN v_created THEN 'create' ELSE 'update' END, 'template', p_name,
                      jsonb_build_object('workspace_id', v_ws));
    RETURN v_created;
END $$;

CREATE OR REPLACE FUNCTION det_template_expand(p_workspace text, p_name text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The config of template p_name of workspace p_workspace (NULL: Uncategorized), secrets
-- included, for `det experiment create --template` to merge under an experiment it submits
-- there: the one read of a template that is not redacted. It takes what the
-- submission takes, Editor on the workspace, so the secrets go only to those who may run
-- experiments with them (and whose experiments' configs hold them).
DECLARE
    v_ws integer := det_template_workspace(
        p_workspace, 'edit', format('use template %s of workspace %s', to_jsonb(p_name),
                                    to_jsonb(coalesce(p_workspace, 'Uncategorized'))));
    v_config jsonb := (SELECT config FROM templates WHERE workspace_id = v_ws AND name = p_name);
BEGIN
    IF v_config IS NULL THEN
        RAISE EXCEPTION 'template % not found in workspace %', to_jsonb(p_name),
            to_jsonb(coalesce(p_workspace, 'Uncategorized')) USING ERRCODE = 'no_data_found';
    END IF;
    RETURN v_config;
END $$;

CREATE OR REPLACE FUNCTION det_stop_runs_of(p_agent text) RETURNS bigint[] LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A planned stop of agent p_agent's live runs, for det_agent_stop_runs and
-- det_agent_drain: each becomes desired STOPPED (a KILLED one stays so) and planned_stop, and
-- its task is woken on its channel to checkpoint and exit as on pause (det_should_preempt).
-- Runs it holds a share of (a gang whose chief is elsewhere) stop too. Returns their ids,
-- ascending. Executable by the owner alone.
DECLARE
    v_ids bigint[];
BEGIN
    WITH stopped AS (
        UPDATE allocations a
           SET desired_state = greatest(a.desired_state, 'STOPPED'), planned_stop = true,
               stop_requested_at = coalesce(a.stop_requested_at, now())
         WHERE a.state <> 'TERMINATED'
           AND a.id IN (SELECT x.id FROM allocations x
                         WHERE x.agent_id = p_agent AND x.state <> 'TERMINATED'
                        UNION
                        SELECT h.allocation_id FROM allocation_slots h
                         WHERE h.agent_id = p_agent AND NOT h.released)
        RETURNING a.id
    )
    SELECT coalesce(array_agg(s.id ORDER BY s.id), '{}') INTO v_ids FROM stopped s;
    PERFORM pg_notify(det_channel('alloc', x::text), '') FROM unnest(v_ids) x;
    RETURN v_ids;
END $$;

CREATE OR REPLACE FUNCTION det_agent_claim_each(p_agent text, p_allocations bigint[])
RETURNS TABLE (allocation_id bigint, token text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The agent is about to launch allocations assigned to it: mint each one's task token
-- (returned once, stored hashed) and move it to STARTING, in one statement (an agent
-- starts its tasks in batches). Allocations no longer this agent's to start (ended,
-- or desired state is not RUNNING) are left out of the result.
#variable_conflict use_column
BEGIN
    PERFORM det_agent_check_self(p_agent);
    RETURN QUERY
    WITH minted AS MATERIALIZED (
        SELECT id, translate(encode(gen_random_uuid()::text::bytea
                                    || gen_random_uuid()::text::bytea, 'base64'),
                             E'+/=\n', '-_') AS token
          FROM unnest(p_allocations) AS id
    )
    UPDATE allocations a
       SET token_hash = sha256(convert_to(m.token, 'UTF8')), state = 'STARTING',
           started_at = coalesce(a.started_at, now())
      FROM minted m
     WHERE a.id = m.id AND a.agent_id = p_agent
       AND a.state IN ('ASSIGNED', 'PULLING', 'STARTING') AND a.desired_state = 'RUNNING'
    RETURNING a.id, m.token;
END $$;

CREATE OR REPLACE FUNCTION det_agent_report_each(
    p_agent text, p_allocations bigint[], p_state allocation_state,
    p_exit_codes integer[] DEFAULT NULL, p_reasons text[] DEFAULT NULL
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The agent reports what it observed of allocations it runs, all in one state, in one
-- statement; p_exit_codes and p_reasons go with p_allocations element by element.
-- TERMINATED releases the slots and records the exit code and reason; the reconciler settles
-- the trial afterwards. RUNNING of a gang spanning agents leaves it STARTING until every
-- other agent started its share (det_gang_started; det_agent_report_node moves it on then).
BEGIN
    PERFORM det_agent_check_self(p_agent);
    UPDATE allocations a
       -- a gang's other agents are looked for only where it has any (one index probe)
       SET state = CASE WHEN p_state = 'RUNNING'
                             AND EXISTS (SELECT 1 FROM allocation_slots h
                                          WHERE h.allocation_id = a.id
                                            AND h.agent_id <> p_agent)
                             AND NOT det_gang_started(a.id)
                        THEN greatest(a.state, 'STARTING') ELSE greatest(a.state, p_state) END,
           exit_code = CASE WHEN p_state = 'TERMINATED' THEN r.exit_code ELSE a.exit_code END,
           exit_reason = CASE WHEN p_state = 'TERMINATED' THEN r.reason
                              ELSE a.exit_reason END,
           ended_at = CASE WHEN p_state = 'TERMINATED' THEN coalesce(a.ended_at, now()) END,
           running_at = CASE WHEN p_state = 'RUNNING' THEN coalesce(a.running_at, now())
                             ELSE a.running_at END
      FROM unnest(p_allocations, p_exit_codes, p_reasons) AS r(id, exit_code, reason)
     WHERE a.id = r.id AND a.agent_id = p_agent AND a.state <> 'TERMINATED';
    IF p_state = 'TERMINATED' THEN
        UPDATE allocation_slots SET released = true
         WHERE allocation_id = ANY(p_allocations) AND NOT released;
        PERFORM pg_notify(det_channel('reconciler', ''), 'allocation');
    END IF;
END $$;

CREATE OR REPLACE FUNCTION det_checkpoint_begin(p_token text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The task is about to write a checkpoint: refused (SQLSTATE 28000, det_auth) once its
-- allocation was ended (agent lost, run killed), so a fenced run writes no files.
-- det_report_checkpoint checks again when the files are in place.
BEGIN
    PERFORM det_auth(p_token);
END $$;

CREATE OR REPLACE FUNCTION det_pool_scheduler(p_pool text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
-- The scheduler a pool really uses, every default filled in: the pool's own, else the
-- cluster's, else fair_share (the spec's default for a blank type: Resource Pools).
-- min_run_time: seconds a run without a checkpoint is not preempted. The defaults are
-- det.configs.cluster's (SchedulerConfig), the values a cluster config gets before it is
-- stored; they are here for a cluster that has none applied yet.
BEGIN
    RETURN jsonb_build_object('type', 'fair_share', 'preemption', false,
                              'fitting_policy', 'best', 'default_priority', 42,
                              'min_run_time', 60)
           || coalesce((SELECT nullif(scheduler, 'null') FROM resource_pools WHERE name = p_pool),
                       (SELECT config #> '{resource_manager,scheduler}' FROM cluster_config),
                       '{}');
END $$;

CREATE OR REPLACE FUNCTION det_run_end_reason(p_allocation bigint) RETURNS text
LANGUAGE sql STABLE STRICT AS $$
-- Why a run ended (the WebUI's "Why it ended"; NULL while it lives), never blank once it has:
-- why det stopped it (stop_reason), then what the run said (its checkpoint storage error, the
-- agent's or det's reason: a signal, 'agent lost', 'stopped before it started'), else what
-- its flags and exit code tell (so a preempted run's is not blank). By id, not by row: a
-- whole allocations row includes token_hash, which no user may read.
SELECT CASE WHEN a.state = 'TERMINATED' THEN concat_ws('; ', a.stop_reason, coalesce(
    a.storage_error, a.exit_reason,
    CASE WHEN a.stop_reason IS NOT NULL AND a.exit_code = 0 THEN NULL
         WHEN a.planned_stop THEN 'its agent stopped it (a planned stop)'
         WHEN a.exit_code = 0 AND a.out_of_work THEN 'finished its work (exit code 0)'
         WHEN a.exit_code = 0 THEN 'its code exited (exit code 0)'
         WHEN a.exit_code IS NULL THEN 'ended without an exit code'
         ELSE 'exit code ' || a.exit_code END)) END
  FROM allocations a WHERE a.id = p_allocation;
$$;

CREATE OR REPLACE FUNCTION det_run_status(p_allocation bigint) RETURNS text
LANGUAGE sql STABLE STRICT AS $$
-- A run as users should read it, agreeing with the job queue (a trial waiting for a slot
-- reads waiting, not "running"): waiting (for slots: pending_reason says why), starting (slots held,
-- its process or container not yet running), running, preempting or stopping (told to stop,
-- not yet gone), preempted or ended.
SELECT CASE WHEN a.state = 'PENDING' AND a.desired_state = 'RUNNING' THEN 'waiting'
            WHEN a.state = 'TERMINATED'
                THEN CASE WHEN a.stop_reason LIKE 'preempted:%' THEN 'preempted' ELSE 'ended' END
            WHEN a.desired_state <> 'RUNNING'
                THEN CASE WHEN a.stop_reason LIKE 'preempted:%' THEN 'preempting'
                          ELSE 'stopping' END
            WHEN a.state = 'RUNNING' THEN 'running'
            ELSE 'starting' END
  FROM allocations a WHERE a.id = p_allocation;
$$;

CREATE OR REPLACE FUNCTION det_checkpoints_to_delete(
    p_experiment integer, p_save_experiment_best integer DEFAULT NULL,
    p_save_trial_best integer DEFAULT NULL, p_save_trial_latest integer DEFAULT NULL
) RETURNS TABLE (uuid uuid, trial_id integer, steps_completed bigint, size_bytes bigint,
                 metric double precision)
LANGUAGE sql STABLE AS $$
-- The GC keep rule (Determined 0.38's checkpoint GC policy), one statement. Of the experiment's
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

CREATE OR REPLACE FUNCTION det_login_begin(p_user text, p_address text) RETURNS double precision
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve, before it has PostgreSQL check a password for POST /api/v1/auth/login (so a
-- throttled attempt costs no SCRAM work): the seconds the client must wait (429, Retry-After),
-- or 0 to go on. The rule: 5 failures for one user name p_user (from any address),
-- or 20 from one client address p_address (for any names), each within 15 minutes of the
-- last, lock further attempts for 30 s, doubling with each failure after (at most an hour);
-- a right password is refused too until the lock ends. Going on counts the attempt as failed
-- until det_web_login records its success, so parallel guesses cannot all pass before the
-- first failure is counted; a refused attempt counts nothing and is audited. The counters are
-- rows of login_throttle, shared by every det serve process and locked in one order (the
-- user's, then the address's).
DECLARE
    v_address text := coalesce(p_address, 'unknown');
    v_until timestamptz;
BEGIN
    DELETE FROM login_throttle WHERE forget_at <= now();
    INSERT INTO login_throttle AS t (kind, key, forget_at)
    VALUES ('user', p_user, now() + interval '15 minutes'),
           ('address', v_address, now() + interval '15 minutes')
    ON CONFLICT (kind, key) DO UPDATE SET forget_at = t.forget_at;
    SELECT max(locked_until) INTO v_until FROM login_throttle
     WHERE (kind, key) IN (('user', p_user), ('address', v_address));
    IF v_until > now() THEN
        INSERT INTO audit_log (actor, action, object_type, object_id, detail)
        VALUES (det_caller(), 'login', 'user', p_user,
                jsonb_build_object('outcome', 'throttled', 'address', v_address,
                                   'locked_until', v_until));
        RETURN extract(epoch FROM v_until - now());
    END IF;
    WITH counted AS (
        SELECT kind, key, failures + 1 AS failures,
               CASE kind WHEN 'user' THEN 5 ELSE 20 END AS lim
          FROM login_throttle
         WHERE (kind, key) IN (('user', p_user), ('address', v_address))
    ), locked AS (
        SELECT kind, key, failures,
               CASE WHEN failures >= lim
                    THEN now() + make_interval(secs => least(30 * 2 ^ (failures - lim), 3600))
               END AS until
          FROM counted
    )
    UPDATE login_throttle t
       SET failures = l.failures, locked_until = l.until,
           forget_at = coalesce(l.until, now()) + interval '15 minutes'
      FROM locked l
     WHERE t.kind = l.kind AND t.key = l.key;
    RETURN 0;
END $$;

CREATE OR REPLACE FUNCTION det_experiment_create_check(p_workspace text, p_project text) RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Check that the caller may create an experiment in project p_project of workspace
-- p_workspace (both NULL: Uncategorized): Editor of the workspace, neither it nor the project
-- archived, the rules det_create_experiment applies when it stores one. det serve calls it
-- before it unpacks a byte of the context (so a refused Viewer's context is never
-- unpacked). Returns the project's id. Raises insufficient_privilege, no_data_found (a
-- workspace or project the caller cannot see), check_violation (archived) or
-- invalid_parameter_value (only one of the two named).
DECLARE
    p projects;
BEGIN
    IF (p_workspace IS NULL) <> (p_project IS NULL) THEN
        RAISE EXCEPTION 'workspace and project: give both or neither (neither: Uncategorized)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_workspace IS NULL THEN
        SELECT * INTO p FROM projects WHERE id = 1;
    ELSE
        p := det_project_find(p_workspace, p_project);
    END IF;
    PERFORM det_require('edit', p.workspace_id,
                        format('create an experiment in project %s', to_jsonb(p.name)));
    IF p.archived OR (SELECT archived FROM workspaces WHERE id = p.workspace_id) THEN
        RAISE EXCEPTION 'project %: it (or its workspace) is archived', to_jsonb(p.name)
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN p.id;
END $$;
