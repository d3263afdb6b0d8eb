-- det's functions leave public for a schema per actor (schema.sql, "Schemas"): det_user,
-- det_agent, det_task, det_web, det_enroll, det and det_internal, each function named without
-- the actor in its name (det_agent_claim is det_agent.claim). Moving keeps each function's
-- grants, comment and every reference by oid (policies, triggers, defaults, views); the
-- functions whose bodies name others by their old names are then re-created, as schema.sql
-- defines them.

CREATE SCHEMA det;
GRANT USAGE ON SCHEMA det TO PUBLIC;
CREATE SCHEMA det_user;
GRANT USAGE ON SCHEMA det_user TO PUBLIC;
CREATE SCHEMA det_agent;
GRANT USAGE ON SCHEMA det_agent TO PUBLIC;
CREATE SCHEMA det_task;
GRANT USAGE ON SCHEMA det_task TO PUBLIC;
CREATE SCHEMA det_web;
GRANT USAGE ON SCHEMA det_web TO PUBLIC;
CREATE SCHEMA det_enroll;
GRANT USAGE ON SCHEMA det_enroll TO PUBLIC;
CREATE SCHEMA det_internal;
GRANT USAGE ON SCHEMA det_internal TO PUBLIC;

DO $$
DECLARE
    f record;
BEGIN
    FOR f IN
        SELECT p.oid, m.schema, m.name
        FROM pg_proc p
        JOIN (VALUES
        ('det_name_problem', 'det_user', 'name_problem'),
        ('det_next_id', 'det_internal', 'next_id'),
        ('det_metrics_reference_check', 'det_internal', 'metrics_reference_check'),
        ('det_metrics_referenced_check', 'det_internal', 'metrics_referenced_check'),
        ('det_checkpoint_input_check', 'det_internal', 'checkpoint_input_check'),
        ('det_model_name_problem', 'det_user', 'model_name_problem'),
        ('det_label_problem', 'det_user', 'label_problem'),
        ('det_keep_pinned_checkpoint', 'det_internal', 'keep_pinned_checkpoint'),
        ('det_template_name_problem', 'det_user', 'template_name_problem'),
        ('det_secret_name', 'det_user', 'secret_name'),
        ('det_redact_secrets', 'det_user', 'redact_secrets'),
        ('det_channel', 'det_internal', 'channel'),
        ('det_listen', 'det_internal', 'listen'),
        ('det_web_listen', 'det_web', 'listen'),
        ('det_agent_check_self', 'det_internal', 'agent_check_self'),
        ('det_agent_check_allocation', 'det_internal', 'agent_check_allocation'),
        ('det_agent_listen', 'det_agent', 'listen'),
        ('det_task_listen', 'det_task', 'listen'),
        ('det_stopped_state', 'det_user', 'stopped_state'),
        ('det_check_transition', 'det_internal', 'check_transition'),
        ('det_instance_transition', 'det_internal', 'instance_transition'),
        ('det_caller', 'det_user', 'caller'),
        ('det_is_owner_session', 'det_user', 'is_owner_session'),
        ('det_user_grants', 'det_user', 'user_grants'),
        ('det_permitted', 'det_user', 'permitted'),
        ('det_visible_workspaces', 'det_user', 'visible_workspaces'),
        ('det_visible_projects', 'det_user', 'visible_projects'),
        ('det_role_needed', 'det_user', 'role_needed'),
        ('det_require', 'det_internal', 'require'),
        ('det_audit', 'det_internal', 'audit'),
        ('det_experiment_workspace', 'det_user', 'experiment_workspace'),
        ('det_check_experiment_project', 'det_internal', 'check_experiment_project'),
        ('det_workspace_find', 'det_user', 'workspace_find'),
        ('det_project_find', 'det_user', 'project_find'),
        ('det_user_find', 'det_user', 'user_find'),
        ('det_check_verifier', 'det_internal', 'check_verifier'),
        ('det_password_stamp', 'det_internal', 'password_stamp'),
        ('det_password_policy', 'det_internal', 'password_policy'),
        ('det_user_create', 'det_user', 'user_create'),
        ('det_user_set_password', 'det_user', 'user_set_password'),
        ('det_user_set_active', 'det_user', 'user_set_active'),
        ('det_group_create', 'det_user', 'group_create'),
        ('det_group_delete', 'det_user', 'group_delete'),
        ('det_group_set_member', 'det_user', 'group_set_member'),
        ('det_workspace_create', 'det_user', 'workspace_create'),
        ('det_workspace_set_archived', 'det_user', 'workspace_set_archived'),
        ('det_workspace_delete', 'det_user', 'workspace_delete'),
        ('det_workspace_bind_pool', 'det_user', 'workspace_bind_pool'),
        ('det_check_pools', 'det_internal', 'check_pools'),
        ('det_project_create', 'det_user', 'project_create'),
        ('det_project_set_archived', 'det_user', 'project_set_archived'),
        ('det_project_delete', 'det_user', 'project_delete'),
        ('det_experiment_move', 'det_user', 'experiment_move'),
        ('det_role_assign', 'det_user', 'role_assign'),
        ('det_model_move', 'det_user', 'model_move'),
        ('det_config_value_problem', 'det_internal', 'config_value_problem'),
        ('det_experiment_config_problem', 'det_internal', 'experiment_config_problem'),
        ('det_create_experiment', 'det_user', 'create_experiment'),
        ('det_trials_continue', 'det_internal', 'trials_continue'),
        ('det_experiment_fork', 'det_user', 'experiment_fork'),
        ('det_trial_continue', 'det_user', 'trial_continue'),
        ('det_experiment_action', 'det_user', 'experiment_action'),
        ('det_create_task', 'det_internal', 'create_task'),
        ('det_task_find', 'det_internal', 'task_find'),
        ('det_task_kill', 'det_user', 'task_kill'),
        ('det_job_update', 'det_user', 'job_update'),
        ('det_apply_cluster_config', 'det_user', 'apply_cluster_config'),
        ('det_agent_set_enabled', 'det_user', 'agent_set_enabled'),
        ('det_agent_drain', 'det_user', 'agent_drain'),
        ('det_agent_mark_fenced', 'det_agent', 'mark_fenced'),
        ('det_slot_set_enabled', 'det_user', 'slot_set_enabled'),
        ('det_model_find', 'det_user', 'model_find'),
        ('det_model_check', 'det_internal', 'model_check'),
        ('det_model_create', 'det_user', 'model_create'),
        ('det_model_update', 'det_user', 'model_update'),
        ('det_model_set_archived', 'det_user', 'model_set_archived'),
        ('det_model_delete', 'det_user', 'model_delete'),
        ('det_model_register_version', 'det_user', 'model_register_version'),
        ('det_model_version_find', 'det_user', 'model_version_find'),
        ('det_model_version_update', 'det_user', 'model_version_update'),
        ('det_model_version_delete', 'det_user', 'model_version_delete'),
        ('det_template_workspace', 'det_internal', 'template_workspace'),
        ('det_template_set', 'det_user', 'template_set'),
        ('det_template_remove', 'det_user', 'template_remove'),
        ('det_template_expand', 'det_user', 'template_expand'),
        ('det_agent_token_create', 'det_user', 'agent_token_create'),
        ('det_agent_enroll', 'det_enroll', 'agent_enroll'),
        ('det_agent_revoke', 'det_user', 'agent_revoke'),
        ('det_agent_register', 'det_agent', 'register'),
        ('det_agent_heartbeat', 'det_agent', 'heartbeat'),
        ('det_agent_timeout', 'det_agent', 'timeout'),
        ('det_stop_runs_of', 'det_internal', 'stop_runs_of'),
        ('det_agent_stop_runs', 'det_agent', 'stop_runs'),
        ('det_agent_leave', 'det_agent', 'leave'),
        ('det_agent_retire', 'det_agent', 'retire'),
        ('det_agent_claim_each', 'det_agent', 'claim_each'),
        ('det_agent_claim', 'det_agent', 'claim'),
        ('det_agent_report_each', 'det_agent', 'report_each'),
        ('det_agent_report', 'det_agent', 'report'),
        ('det_gang_agents', 'det_agent', 'gang_agents'),
        ('det_gang_started', 'det_agent', 'gang_started'),
        ('det_agent_set_rendezvous', 'det_agent', 'set_rendezvous'),
        ('det_agent_claim_node', 'det_agent', 'claim_node'),
        ('det_agent_report_node', 'det_agent', 'report_node'),
        ('det_append_logs', 'det_agent', 'append_logs'),
        ('det_log_level', 'det_user', 'log_level'),
        ('det_auth', 'det_internal', 'auth'),
        ('det_json_problem', 'det_internal', 'json_problem'),
        ('det_json_shown', 'det_user', 'json_shown'),
        ('det_trial_best_validation', 'det_internal', 'trial_best_validation'),
        ('det_metrics_supersede', 'det_internal', 'metrics_supersede'),
        ('det_task_info', 'det_task', 'info'),
        ('det_append_metrics', 'det_internal', 'append_metrics'),
        ('det_report_metrics_batch', 'det_task', 'report_metrics_batch'),
        ('det_report_metrics', 'det_task', 'report_metrics'),
        ('det_report_checkpoint', 'det_task', 'report_checkpoint'),
        ('det_unmanaged_run', 'det_internal', 'unmanaged_run'),
        ('det_unmanaged_start', 'det_user', 'unmanaged_start'),
        ('det_unmanaged_report_metrics', 'det_user', 'unmanaged_report_metrics'),
        ('det_unmanaged_report_checkpoint', 'det_user', 'unmanaged_report_checkpoint'),
        ('det_unmanaged_progress', 'det_user', 'unmanaged_progress'),
        ('det_unmanaged_end', 'det_user', 'unmanaged_end'),
        ('det_checkpoint_begin', 'det_task', 'checkpoint_begin'),
        ('det_report_storage_error', 'det_task', 'report_storage_error'),
        ('det_task_secrets', 'det_task', 'secrets'),
        ('det_task_ready', 'det_task', 'ready'),
        ('det_task_activity', 'det_task', 'activity'),
        ('det_task_tensorboard_sources', 'det_task', 'tensorboard_sources'),
        ('det_task_open', 'det_user', 'task_open'),
        ('det_task_ssh_key', 'det_user', 'task_ssh_key'),
        ('det_current_op', 'det_task', 'current_op'),
        ('det_report_progress', 'det_task', 'report_progress'),
        ('det_complete_op', 'det_task', 'complete_op'),
        ('det_should_preempt', 'det_task', 'should_preempt'),
        ('det_stop_reason', 'det_task', 'stop_reason'),
        ('det_ack_preemption', 'det_task', 'ack_preemption'),
        ('det_report_early_exit', 'det_task', 'report_early_exit'),
        ('det_experiment_best_validation', 'det_task', 'experiment_best_validation'),
        ('det_pool_scheduler', 'det_user', 'pool_scheduler'),
        ('det_job_label', 'det_internal', 'job_label'),
        ('det_preempted_reason', 'det_internal', 'preempted_reason'),
        ('det_run_end_reason', 'det_user', 'run_end_reason'),
        ('det_run_status', 'det_user', 'run_status'),
        ('det_run_reason', 'det_user', 'run_reason'),
        ('det_checkpoints_to_delete', 'det_user', 'checkpoints_to_delete'),
        ('det_unpin_deleting', 'det_internal', 'unpin_deleting'),
        ('det_checkpoint_gc', 'det_internal', 'checkpoint_gc'),
        ('det_set_gc_policy', 'det_user', 'set_gc_policy'),
        ('det_delete_checkpoints', 'det_user', 'delete_checkpoints'),
        ('det_checkpoint_add_metadata', 'det_user', 'checkpoint_add_metadata'),
        ('det_experiment_archive', 'det_user', 'experiment_archive'),
        ('det_purge_experiment', 'det_internal', 'purge_experiment'),
        ('det_experiment_delete', 'det_user', 'experiment_delete'),
        ('det_gc_auth', 'det_internal', 'gc_auth'),
        ('det_gc_task_checkpoints', 'det_task', 'gc_task_checkpoints'),
        ('det_gc_task_tensorboards', 'det_task', 'gc_task_tensorboards'),
        ('det_gc_task_tensorboards_deleted', 'det_task', 'gc_task_tensorboards_deleted'),
        ('det_gc_task_deleted', 'det_task', 'gc_task_deleted'),
        ('det_gc_task_failed', 'det_task', 'gc_task_failed'),
        ('det_gc_task_unrecorded', 'det_task', 'gc_task_unrecorded'),
        ('det_web_end_stale_logins', 'det_internal', 'web_end_stale_logins'),
        ('det_web_login', 'det_web', 'login'),
        ('det_web_auth', 'det_web', 'auth'),
        ('det_web_logout', 'det_web', 'logout'),
        ('det_login_begin', 'det_web', 'login_begin'),
        ('det_login_failed', 'det_web', 'login_failed'),
        ('det_web_event', 'det_internal', 'web_event'),
        ('det_web_event_throttled', 'det_internal', 'web_event_throttled'),
        ('det_web_watched', 'det_internal', 'web_watched'),
        ('det_web_watch', 'det_web', 'watch'),
        ('det_web_on_experiments', 'det_internal', 'web_on_experiments'),
        ('det_web_on_trials', 'det_internal', 'web_on_trials'),
        ('det_web_on_allocations', 'det_internal', 'web_on_allocations'),
        ('det_web_on_jobs', 'det_internal', 'web_on_jobs'),
        ('det_web_on_cluster', 'det_internal', 'web_on_cluster'),
        ('det_web_on_reports', 'det_internal', 'web_on_reports'),
        ('det_cluster_usage', 'det_user', 'cluster_usage'),
        ('det_agent_assignments', 'det_agent', 'assignments'),
        ('det_agent_live_allocations', 'det_agent', 'live_allocations'),
        ('det_agent_context', 'det_agent', 'context'),
        ('det_schema_version', 'det', 'schema_version'),
        ('det_experiment_create_check', 'det_user', 'experiment_create_check'),
        ('det_validation_reported', 'det_internal', 'validation_reported'),
        ('det_merge_metadata', 'det_internal', 'merge_metadata'),
        ('det_set_trial_metadata', 'det_task', 'set_trial_metadata'),
        ('det_trial_metadata', 'det_task', 'trial_metadata')
        ) AS m (old, schema, name) ON m.old = p.proname
        WHERE p.pronamespace = 'public'::regnamespace
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET SCHEMA %I', f.oid::regprocedure, f.schema);
        EXECUTE format('ALTER FUNCTION %s RENAME TO %I', f.oid::regprocedure, f.name);
    END LOOP;
END $$;


-- The functions whose bodies name others: re-created as schema.sql defines them.

CREATE OR REPLACE FUNCTION det_internal.checkpoint_input_check() RETURNS trigger LANGUAGE plpgsql AS $$
-- BEFORE INSERT ON checkpoints: what a task records of a checkpoint (det_task.report_checkpoint)
-- is refused (invalid_parameter_value naming the field) unless steps_completed is at most
-- 2^53 - 1 (as metrics' steps), resources is a JSON object of at most 8 MiB mapping each
-- file's path, relative and inside the checkpoint (not empty, not starting with '/', no '..'
-- part, no control character), to its size in bytes (a whole number 0 to 2^63 - 1: the GC
-- sums them as bigint), and metadata is an object of at most 64 KiB nested at most 32 levels.
DECLARE
    v_bad record;
    v_problem text := det_internal.json_problem(NEW.metadata, 65536);
BEGIN
    IF NEW.steps_completed > 9007199254740991 THEN
        RAISE EXCEPTION 'checkpoint steps_completed: expected 0 to 2^53 - 1, not %',
            NEW.steps_completed USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(NEW.resources) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'checkpoint resources: expected a JSON object of file path -> size '
            'in bytes, not %', coalesce(jsonb_typeof(NEW.resources), 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_column_size(NEW.resources) > 8388608 THEN
        RAISE EXCEPTION 'checkpoint resources: % bytes, more than the % allowed',
            pg_column_size(NEW.resources), 8388608 USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT r.key, r.value INTO v_bad FROM jsonb_each(NEW.resources) r
     WHERE r.key = '' OR r.key ~ '^/' OR r.key ~ '(^|/)\.\.(/|$)' OR r.key ~ '[[:cntrl:]]'
        OR jsonb_typeof(r.value) <> 'number'
        OR (r.value #>> '{}')::numeric NOT BETWEEN 0 AND 9223372036854775807
        OR (r.value #>> '{}')::numeric <> trunc((r.value #>> '{}')::numeric)
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'checkpoint resources: entry % -> % is not a relative file path '
            'inside the checkpoint with a whole number of bytes >= 0', to_jsonb(v_bad.key),
            v_bad.value USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'checkpoint metadata %', v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION det_user.template_name_problem(p_name text) RETURNS text
    LANGUAGE sql IMMUTABLE AS $$
-- Why p_name cannot name a configuration template, or NULL: non-blank, at most 255
-- characters, without control characters.
    SELECT CASE
        WHEN p_name IS NULL OR btrim(p_name) = '' THEN 'cannot be blank'
        WHEN length(p_name) > 255 THEN 'must be at most 255 characters'
        WHEN p_name ~ '[[:cntrl:]]' THEN 'cannot contain line breaks or control characters'
    END;
$$;

CREATE OR REPLACE FUNCTION det_user.redact_secrets(p_value jsonb) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE AS $$
-- p_value with every secret replaced by '********': the value of each key that
-- det_user.secret_name calls a secret, at any depth, and the value of each 'NAME=VALUE' list item
-- (environment_variables) whose NAME is one. A null stays null: it hides nothing.
BEGIN
    CASE jsonb_typeof(p_value)
    WHEN 'object' THEN
        RETURN (SELECT coalesce(jsonb_object_agg(e.k, CASE
                    WHEN det_user.secret_name(e.k) AND jsonb_typeof(e.v) <> 'null' THEN '"********"'
                    ELSE det_user.redact_secrets(e.v) END), '{}')
                  FROM jsonb_each(p_value) AS e(k, v));
    WHEN 'array' THEN
        RETURN (SELECT coalesce(jsonb_agg(CASE
                    WHEN jsonb_typeof(e.v) = 'string' AND strpos(e.v #>> '{}', '=') > 1
                         AND det_user.secret_name(split_part(e.v #>> '{}', '=', 1))
                    THEN to_jsonb(split_part(e.v #>> '{}', '=', 1) || '=********')
                    ELSE det_user.redact_secrets(e.v) END ORDER BY e.i), '[]')
                  FROM jsonb_array_elements(p_value) WITH ORDINALITY AS e(v, i));
    ELSE
        RETURN p_value;
    END CASE;
END $$;

CREATE OR REPLACE FUNCTION det_internal.channel(p_kind text, p_key text) RETURNS text LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The channel of kind ``p_kind`` ("reconciler", "web": p_key ''; "agent": the agent's id;
-- "alloc": the allocation's id) for this cluster: det_<kind>_<40 hex digits of
-- SHA-256(secret || kind:key)>, at most 55 bytes (a channel name is an identifier of 63).
-- The secret is of fixed length and a key is text (never a NUL byte), so no name derives from
-- another's (SHA-256's length extension appends padding with NUL bytes). Executable by the
-- owner alone (det.db.channels).
DECLARE
    v_secret bytea := (SELECT secret FROM channel_key);
BEGIN
    IF p_kind IS NULL OR p_kind NOT IN ('reconciler', 'web', 'agent', 'alloc') THEN
        RAISE EXCEPTION 'det_internal.channel: kind must be reconciler, web, agent or alloc, got %',
            coalesce(p_kind, 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_key IS NULL THEN
        RAISE EXCEPTION 'det_internal.channel: key of a % channel must not be NULL', p_kind
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_secret IS NULL THEN
        RAISE EXCEPTION 'det_internal.channel: table channel_key has no secret (the schema made one)'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN 'det_' || p_kind || '_'
        || left(encode(sha256(v_secret || convert_to(p_kind || ':' || p_key, 'UTF8')), 'hex'), 40);
END $$;

CREATE OR REPLACE FUNCTION det_internal.listen(p_kind text, p_key text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- This session LISTENs on det_internal.channel(p_kind, p_key) from its transaction's commit on (as
-- a LISTEN statement would). Executable by the owner alone: the reconciler's own channel.
BEGIN
    EXECUTE format('LISTEN %I', det_internal.channel(p_kind, p_key));
END $$;

CREATE OR REPLACE FUNCTION det_web.listen() RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve's event listener (det_web) LISTENs on the web channel (det_internal.web_event).
    SELECT det_internal.listen('web', '');
$$;

CREATE OR REPLACE FUNCTION det_internal.agent_check_self(p_agent text) RETURNS void LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Every agent function that names an agent first calls this: a login enrolled as an agent
-- (agent_logins) acts only for its own agent id, and not at all once revoked. Sessions of
-- other roles (the shared det_agent login of the single-host mode, the owner) pass. Raises
-- insufficient_privilege naming both agents; invalid_authorization_specification (28000)
-- for a revoked login (a session that slipped in before det_user.agent_revoke committed).
DECLARE
    l agent_logins;
BEGIN
    SELECT * INTO l FROM agent_logins WHERE role_name = session_user;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF l.revoked_at IS NOT NULL THEN
        RAISE EXCEPTION 'agent %: its login % was revoked at %', l.agent_id, l.role_name,
            l.revoked_at USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF p_agent IS DISTINCT FROM l.agent_id THEN
        RAISE EXCEPTION 'agent %: login % acts only for agent %', coalesce(p_agent, 'NULL'),
            l.role_name, l.agent_id USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION det_internal.agent_check_allocation(p_allocation bigint) RETURNS void
    LANGUAGE plpgsql
STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent function that names an allocation rather than an agent calls this: a login enrolled
-- as an agent (agent_logins) acts only for allocations it is the chief of or holds (or held:
-- logs are flushed after a run ends) slots of; otherwise det_internal.agent_check_self refuses it
-- as acting for the allocation's chief. Sessions of other roles pass.
DECLARE
    l agent_logins;
    v_chief text;
BEGIN
    SELECT * INTO l FROM agent_logins WHERE role_name = session_user;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT a.agent_id INTO v_chief FROM allocations a WHERE a.id = p_allocation;
    IF v_chief IS DISTINCT FROM l.agent_id
       AND NOT EXISTS (SELECT 1 FROM allocation_slots h
                        WHERE h.allocation_id = p_allocation AND h.agent_id = l.agent_id) THEN
        PERFORM det_internal.agent_check_self(v_chief);
    END IF;
    PERFORM det_internal.agent_check_self(l.agent_id);
END $$;

CREATE OR REPLACE FUNCTION det_agent.listen(p_agent text) RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent (det_agent) LISTENs on its own channel: the reconciler wakes it there when its
-- assignments or their desired states change. An agent names itself, as in every function
-- of det_agent's.
SELECT det_internal.agent_check_self(p_agent);
    SELECT det_internal.listen('agent', p_agent);
$$;

CREATE OR REPLACE FUNCTION det_task.listen(p_token text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A task (det_task) LISTENs on its own allocation's channel, named by its token: woken there
-- when it should preempt (empty payload) or its trial's next searcher op is decided ("op").
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    PERFORM det_internal.listen('alloc', a.id::text);
END $$;

CREATE OR REPLACE FUNCTION det_internal.check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
-- Experiments and trials: terminal states are final (but an unmanaged one's, resumed), and a
-- STOPPING_* state only moves on to its terminal state (det_user.stopped_state), or to a harsher
-- STOPPING_* (a cancel may become a kill). Allocations: the observed state only moves forward.
DECLARE
    old_s text := OLD.state::text;
    new_s text := NEW.state::text;
BEGIN
    IF old_s = new_s THEN
        RETURN NEW;
    END IF;
    IF TG_TABLE_NAME = 'allocations' THEN
        IF NEW.state < OLD.state THEN
            RAISE EXCEPTION 'allocation %: illegal state change % -> %', OLD.id, old_s, new_s
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    -- A later start of an unmanaged script resumes its ended experiment and trial
    -- (det_user.unmanaged_start), as upstream reopens an unmanaged trial.
    IF old_s IN ('COMPLETED', 'CANCELED', 'ERROR') AND new_s = 'ACTIVE'
       AND EXISTS (SELECT 1 FROM experiments e
                    WHERE e.unmanaged AND e.id = CASE TG_TABLE_NAME
                        WHEN 'experiments' THEN OLD.id
                        ELSE (SELECT t.experiment_id FROM trials t WHERE t.id = OLD.id) END) THEN
        RETURN NEW;
    END IF;
    IF old_s IN ('COMPLETED', 'CANCELED', 'ERROR')
       OR (old_s LIKE 'STOPPING_%' AND new_s IN ('ACTIVE', 'PAUSED'))
       OR (old_s = 'STOPPING_KILLED' AND new_s LIKE 'STOPPING_%')
       OR (old_s = 'STOPPING_CANCELED' AND new_s IN ('STOPPING_COMPLETED', 'COMPLETED'))
       OR (old_s LIKE 'STOPPING_%' AND new_s NOT LIKE 'STOPPING_%'
           AND new_s <> det_user.stopped_state(old_s)) THEN
        RAISE EXCEPTION '% %: illegal state change % -> %', TG_TABLE_NAME, OLD.id, old_s, new_s
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION det_user.caller() RETURNS text LANGUAGE sql STABLE AS $$
-- The user acting in this session: its login role (session_user, which a SECURITY DEFINER
-- function does not change, unlike current_user), or, for det serve (connected as det_web),
-- the user whose token det_web.auth accepted in this transaction.
SELECT coalesce(CASE WHEN pg_has_role(session_user, 'det_web', 'MEMBER')
                     THEN nullif(current_setting('det.web_user', true), '') END,
                session_user::text)
$$;

CREATE OR REPLACE FUNCTION det_user.is_owner_session() RETURNS boolean LANGUAGE plpgsql STABLE AS $$
-- Whether the session is the cluster's own (the role owning det's tables, a member of it, or
-- a superuser: the reconciler, `det cluster up`) acting as no det user. It holds every
-- permission.
BEGIN
    RETURN NOT EXISTS (SELECT 1 FROM users WHERE username = det_user.caller())
       AND pg_has_role(session_user, (SELECT relowner FROM pg_class
                                       WHERE oid = 'experiments'::regclass), 'MEMBER');
END $$;

CREATE OR REPLACE FUNCTION det_user.user_grants(p_user text)
RETURNS TABLE (workspace_id integer, permissions text[]) LANGUAGE sql STABLE AS $$
-- What active user p_user holds: one row per role assigned to them or to one of their
-- groups, with its workspace (NULL: every workspace) and its permissions (see roles). The
-- one home of that rule: det_user.permitted and det_user.visible_workspaces read it.
SELECT a.workspace_id, r.permissions
  FROM users u
  JOIN role_assignments a
    ON a.user_id = u.id
    OR a.group_id IN (SELECT m.group_id FROM user_group_members m WHERE m.user_id = u.id)
  JOIN roles r ON r.name = a.role
 WHERE u.username = p_user AND u.active
$$;

CREATE OR REPLACE FUNCTION det_user.permitted(p_user text, p_permission text, p_workspace integer)
RETURNS boolean LANGUAGE sql STABLE AS $$
-- Whether active user p_user holds p_permission in workspace p_workspace (NULL: globally)
-- through a role held globally or there (det_user.user_grants).
SELECT EXISTS (
    SELECT 1 FROM det_user.user_grants(p_user) g
     WHERE p_permission = ANY (g.permissions)
       AND (g.workspace_id IS NULL OR g.workspace_id = p_workspace))
$$;

CREATE OR REPLACE FUNCTION det_user.visible_workspaces() RETURNS integer[] LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The workspaces the calling user may view (det_user.permitted's rule, as one query): what the
-- row-level security policies key on, called once per query as an InitPlan:
-- `= ANY ((SELECT det_user.visible_workspaces())::integer[])`.
WITH viewable AS (SELECT g.workspace_id FROM det_user.user_grants(det_user.caller()) g
                   WHERE 'view' = ANY (g.permissions))
SELECT CASE WHEN EXISTS (SELECT 1 FROM viewable WHERE workspace_id IS NULL)
            THEN (SELECT coalesce(array_agg(id), '{}') FROM workspaces)
            ELSE (SELECT coalesce(array_agg(DISTINCT workspace_id), '{}') FROM viewable) END
$$;

CREATE OR REPLACE FUNCTION det_user.visible_projects() RETURNS integer[] LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The projects of det_user.visible_workspaces: experiments' policy keys on them, so that a user of
-- few projects reads their experiments through the project index.
SELECT coalesce(array_agg(id), '{}') FROM projects
 WHERE workspace_id = ANY (det_user.visible_workspaces())
$$;

CREATE OR REPLACE FUNCTION det_internal.require(p_permission text, p_workspace integer, p_action text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
-- Check that the caller may do p_action (words for the refusal: 'pause experiment 12') with
-- p_permission in workspace p_workspace (NULL: a cluster-wide permission); returns the
-- caller's name. Refusal is insufficient_privilege, one line naming the role and scope:
-- "permission denied: needs Editor on workspace 'vision' to pause experiment 12". A caller
-- who may not even view the workspace is told what they asked about is not found
-- (no_data_found), as row-level security would show it: no rows.
DECLARE
    v_user text := det_user.caller();
BEGIN
    IF det_user.is_owner_session() THEN
        RETURN v_user;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM users WHERE username = v_user AND active) THEN
        RAISE EXCEPTION 'permission denied: % is not an active det user', to_jsonb(v_user)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF det_user.permitted(v_user, p_permission, p_workspace) THEN
        RETURN v_user;
    END IF;
    IF p_workspace IS NOT NULL AND NOT det_user.permitted(v_user, 'view', p_workspace) THEN
        RAISE EXCEPTION 'cannot %: not found', p_action USING ERRCODE = 'no_data_found';
    END IF;
    RAISE EXCEPTION 'permission denied: needs % % to %', det_user.role_needed(p_permission),
        CASE WHEN p_workspace IS NULL THEN 'on the cluster'
             ELSE format('on workspace ''%s''', (SELECT name FROM workspaces
                                                  WHERE id = p_workspace)) END,
        p_action USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE OR REPLACE FUNCTION det_internal.audit(p_action text, p_object_type text, p_object_id text,
                          p_detail jsonb DEFAULT '{}') RETURNS void
LANGUAGE plpgsql AS $$
-- One audit_log entry by the caller, in the transaction of the change it records.
BEGIN
    INSERT INTO audit_log (actor, action, object_type, object_id, detail)
    VALUES (det_user.caller(), p_action, p_object_type, p_object_id, coalesce(p_detail, '{}'));
END $$;

CREATE OR REPLACE FUNCTION det_user.workspace_find(p_name text) RETURNS workspaces
    LANGUAGE plpgsql STABLE AS $$
-- The workspace named p_name (names are exact: any character is part of it). Raises
-- no_data_found, also when the caller may not view it.
DECLARE
    w workspaces;
BEGIN
    SELECT * INTO w FROM workspaces WHERE name = p_name;
    IF NOT FOUND OR NOT (det_user.is_owner_session() OR det_user.permitted(det_user.caller(),
        'view', w.id))
    THEN
        RAISE EXCEPTION 'workspace % not found', to_jsonb(p_name) USING ERRCODE = 'no_data_found';
    END IF;
    RETURN w;
END $$;

CREATE OR REPLACE FUNCTION det_user.project_find(p_workspace text, p_project text) RETURNS projects
LANGUAGE plpgsql STABLE AS $$
-- Project p_project of workspace p_workspace. Raises no_data_found.
DECLARE
    w workspaces := det_user.workspace_find(p_workspace);
    p projects;
BEGIN
    SELECT * INTO p FROM projects WHERE workspace_id = w.id AND name = p_project;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'project % not found in workspace %', to_jsonb(p_project),
            to_jsonb(w.name) USING ERRCODE = 'no_data_found';
    END IF;
    RETURN p;
END $$;

CREATE OR REPLACE FUNCTION det_internal.password_policy(p_password_length integer, p_weak_ok boolean,
                                    p_action text) RETURNS void LANGUAGE plpgsql STABLE AS $$
-- The minimum password policy: a new password has at least 8 characters, unless a
-- ClusterAdmin sets p_weak_ok (`--weak-ok`) for p_action ('set the password of user "bob"').
-- det sees a password only as its client-made SCRAM verifier (det_internal.check_verifier), so the
-- client states its length in characters (det's CLI counts it); the cluster's own session,
-- which may ALTER ROLE any password anyway, may leave it unstated (NULL). Raises
-- invalid_parameter_value (too short, or unstated), insufficient_privilege (p_weak_ok by a
-- caller who is no ClusterAdmin).
BEGIN
    IF p_weak_ok THEN
        PERFORM det_internal.require('admin_cluster', NULL, format('%s with --weak-ok', p_action));
        RETURN;
    END IF;
    IF p_password_length IS NULL AND NOT det_user.is_owner_session() THEN
        RAISE EXCEPTION 'password length: expected the new password''s length in characters '
                        '(det requires at least 8)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_password_length < 8 THEN
        RAISE EXCEPTION 'password: expected at least 8 characters, got %; a ClusterAdmin may '
                        'allow a shorter one with --weak-ok', p_password_length
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION det_user.user_create(p_username text, p_password_verifier text, p_admin boolean,
                                p_password_length integer DEFAULT NULL,
                                p_weak_ok boolean DEFAULT false)
RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user create` (ClusterAdmin): a det user is a new LOGIN role of the same name, member
-- of det_user (and of det_web, so det serve can act as it), Editor in Uncategorized, and
-- ClusterAdmin too if p_admin. p_password_verifier: see det_internal.check_verifier; NULL leaves
-- the user unable to log in until a password is set. p_password_length, p_weak_ok: the password
-- policy (det_internal.password_policy). Returns the user's id.
DECLARE
    v_problem text := det_user.name_problem(p_username, 63);
    v_id integer;
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL, format('create user %s',
        to_jsonb(p_username)));
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'username %: %', to_jsonb(p_username), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_internal.check_verifier(p_password_verifier);
    IF p_password_verifier IS NOT NULL THEN
        PERFORM det_internal.password_policy(p_password_length, p_weak_ok,
                                    format('create user %s', to_jsonb(p_username)));
    END IF;
    IF EXISTS (SELECT 1 FROM users WHERE username = p_username) THEN
        RAISE EXCEPTION 'username %: a user of that name exists', to_jsonb(p_username)
            USING ERRCODE = 'unique_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = p_username)
       OR p_username ~* '^pg_' OR lower(p_username) IN ('public', 'none', 'current_user',
                                                       'current_role', 'session_user') THEN
        RAISE EXCEPTION 'username %: the name of a PostgreSQL role of the server (not a det user)',
            to_jsonb(p_username) USING ERRCODE = 'unique_violation';
    END IF;
    EXECUTE format('CREATE ROLE %I LOGIN IN ROLE det_user PASSWORD %L', p_username,
                   p_password_verifier);
    EXECUTE format('GRANT %I TO det_web', p_username);
    INSERT INTO users (username, created_by) VALUES (p_username, det_user.caller())
    RETURNING id INTO v_id;
    INSERT INTO role_assignments (role, user_id, workspace_id) VALUES ('Editor', v_id, 1);
    IF p_admin THEN
        INSERT INTO role_assignments (role, user_id) VALUES ('ClusterAdmin', v_id);
    END IF;
    PERFORM det_internal.audit('create', 'user', p_username,
                      jsonb_build_object('admin', p_admin, 'weak_ok', coalesce(p_weak_ok, false)));
    RETURN v_id;
END $$;

CREATE OR REPLACE FUNCTION det_user.user_set_password(p_username text, p_password_verifier text,
                                      p_password_length integer DEFAULT NULL,
                                      p_weak_ok boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user change-password`: a user's own, or anyone's by a ClusterAdmin (the CLI asks a
-- user who is no ClusterAdmin for the current password first). p_password_length,
-- p_weak_ok: the password policy (det_internal.password_policy). Every det serve login of the user
-- ends (a token minted under the old password is refused), and the change is audited with how
-- many logins it ended.
DECLARE
    u users := det_user.user_find(p_username);
    v_ended integer;
BEGIN
    IF u.username <> det_user.caller() THEN
        PERFORM det_internal.require('admin_cluster', NULL,
                            format('change the password of user %s', to_jsonb(p_username)));
    END IF;
    IF p_password_verifier IS NULL THEN
        RAISE EXCEPTION 'password: expected a SCRAM-SHA-256 verifier, got nothing'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_internal.check_verifier(p_password_verifier);
    PERFORM det_internal.password_policy(p_password_length, p_weak_ok,
                                format('change the password of user %s', to_jsonb(p_username)));
    EXECUTE format('ALTER ROLE %I PASSWORD %L', u.username, p_password_verifier);
    DELETE FROM web_sessions WHERE username = u.username;
    GET DIAGNOSTICS v_ended = ROW_COUNT;
    PERFORM det_internal.audit('change_password', 'user', u.username,
                      jsonb_build_object('logins_ended', v_ended,
                                         'weak_ok', coalesce(p_weak_ok, false)));
END $$;

CREATE OR REPLACE FUNCTION det_user.user_set_active(p_username text, p_active boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user deactivate | activate` (ClusterAdmin): a deactivated user cannot log in (its role
-- loses LOGIN), holds no permission, and its det serve logins end.
DECLARE
    u users := det_user.user_find(p_username);
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL,
                        format('%s user %s', CASE WHEN p_active THEN 'activate'
                                                  ELSE 'deactivate' END, to_jsonb(p_username)));
    IF NOT p_active AND u.username = det_user.caller() THEN
        RAISE EXCEPTION 'user %: you cannot deactivate yourself', to_jsonb(u.username)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE users SET active = p_active WHERE id = u.id;
    EXECUTE format('ALTER ROLE %I %s', u.username,
        CASE WHEN p_active THEN 'LOGIN' ELSE 'NOLOGIN' END);
    IF NOT p_active THEN
        DELETE FROM web_sessions WHERE username = u.username;
    END IF;
    PERFORM det_internal.audit(CASE WHEN p_active THEN 'activate' ELSE 'deactivate' END, 'user',
                      u.username);
END $$;

CREATE OR REPLACE FUNCTION det_user.group_create(p_name text) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user-group create` (ClusterAdmin). Returns the group's id.
DECLARE
    v_problem text := det_user.name_problem(p_name, 255);
    v_id integer;
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL, format('create group %s',
        to_jsonb(p_name)));
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'group name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO user_groups (name) VALUES (p_name) RETURNING id INTO v_id;
    PERFORM det_internal.audit('create', 'group', p_name);
    RETURN v_id;
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'group name %: a group of that name exists', to_jsonb(p_name)
        USING ERRCODE = 'unique_violation';
END $$;

CREATE OR REPLACE FUNCTION det_user.group_delete(p_name text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user-group delete` (ClusterAdmin): its members lose the roles it held.
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL, format('delete group %s',
        to_jsonb(p_name)));
    DELETE FROM user_groups WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'group % not found', to_jsonb(p_name) USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.audit('delete', 'group', p_name);
END $$;

CREATE OR REPLACE FUNCTION det_user.group_set_member(p_group text, p_username text, p_member boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user-group add-user | remove-user` (ClusterAdmin). Adding a member twice or removing a
-- non-member changes nothing.
DECLARE
    v_group integer;
    u users := det_user.user_find(p_username);
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL,
                        format('%s group %s', CASE WHEN p_member THEN 'add users to'
                                                   ELSE 'remove users from' END,
                               to_jsonb(p_group)));
    SELECT id INTO v_group FROM user_groups WHERE name = p_group;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'group % not found', to_jsonb(p_group) USING ERRCODE = 'no_data_found';
    END IF;
    IF p_member THEN
        INSERT INTO user_group_members VALUES (v_group, u.id) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM user_group_members WHERE group_id = v_group AND user_id = u.id;
    END IF;
    PERFORM det_internal.audit(CASE WHEN p_member THEN 'add_member' ELSE 'remove_member' END, 'group',
                      p_group, jsonb_build_object('user', u.username));
END $$;

CREATE OR REPLACE FUNCTION det_user.workspace_create(
    p_name text, p_default_compute_pool text, p_default_aux_pool text,
    p_checkpoint_storage jsonb
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det workspace create` (WorkspaceCreator or ClusterAdmin): the creator becomes its
-- WorkspaceAdmin. p_checkpoint_storage was validated by det.configs. Returns its id.
DECLARE
    v_user text := det_internal.require('create_workspace', NULL,
                               format('create workspace %s', to_jsonb(p_name)));
    v_problem text := det_user.name_problem(p_name, 255);
    v_id integer;
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'workspace name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM workspaces WHERE name = p_name) THEN
        RAISE EXCEPTION 'workspace name %: a workspace of that name exists', to_jsonb(p_name)
            USING ERRCODE = 'unique_violation';
    END IF;
    INSERT INTO workspaces (name, created_by, default_compute_pool, default_aux_pool,
                            checkpoint_storage)
    VALUES (p_name, v_user, p_default_compute_pool, p_default_aux_pool, p_checkpoint_storage)
    RETURNING id INTO v_id;
    INSERT INTO role_assignments (role, user_id, workspace_id)
    SELECT 'WorkspaceAdmin', id, v_id FROM users WHERE username = v_user;
    PERFORM det_internal.audit('create', 'workspace', v_id::text,
        jsonb_build_object('name', p_name));
    RETURN v_id;
EXCEPTION WHEN foreign_key_violation THEN
    RAISE EXCEPTION 'workspace %: no resource pool named % or %', to_jsonb(p_name),
        to_jsonb(p_default_compute_pool), to_jsonb(p_default_aux_pool)
        USING ERRCODE = 'foreign_key_violation';
END $$;

CREATE OR REPLACE FUNCTION det_user.workspace_set_archived(p_name text, p_archived boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det workspace archive | unarchive` (WorkspaceAdmin): an archived workspace takes no new
-- experiments or projects and is hidden from `det workspace list` unless --all.
DECLARE
    w workspaces := det_user.workspace_find(p_name);
BEGIN
    PERFORM det_internal.require('admin_workspace', w.id,
                        format('%s workspace %s', CASE WHEN p_archived THEN 'archive'
                                                       ELSE 'unarchive' END, to_jsonb(w.name)));
    IF w.id = 1 THEN
        RAISE EXCEPTION 'workspace "Uncategorized" cannot be archived'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE workspaces SET archived = p_archived WHERE id = w.id;
    PERFORM det_internal.audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END,
        'workspace',
                      w.id::text, jsonb_build_object('name', w.name));
END $$;

CREATE OR REPLACE FUNCTION det_user.workspace_delete(p_name text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det workspace delete` (WorkspaceAdmin): refused while any experiment or model is in it
-- (move or delete them first); its projects, role assignments and pool bindings go with it.
DECLARE
    w workspaces := det_user.workspace_find(p_name);
    v_n bigint;
BEGIN
    PERFORM det_internal.require('admin_workspace', w.id, format('delete workspace %s',
        to_jsonb(w.name)));
    IF w.id = 1 THEN
        RAISE EXCEPTION 'workspace "Uncategorized" cannot be deleted'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT count(*) INTO v_n FROM jobs WHERE workspace_id = w.id;
    IF v_n > 0 THEN
        RAISE EXCEPTION 'workspace %: it still holds % experiment(s); move or delete them first',
            to_jsonb(w.name), v_n USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
    SELECT count(*) INTO v_n FROM models WHERE workspace_id = w.id;
    IF v_n > 0 THEN
        RAISE EXCEPTION 'workspace %: it still holds % model(s); move or delete them first',
            to_jsonb(w.name), v_n USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
    DELETE FROM projects WHERE workspace_id = w.id;
    DELETE FROM workspaces WHERE id = w.id;
    PERFORM det_internal.audit('delete', 'workspace', w.id::text,
        jsonb_build_object('name', w.name));
END $$;

CREATE OR REPLACE FUNCTION det_user.workspace_bind_pool(p_workspace text, p_pool text, p_bound boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det resource-pool bindings add | remove` (ClusterAdmin): bind a pool to a workspace, or
-- unbind it. Jobs already queued in the pool stay; new ones are checked at submission.
DECLARE
    w workspaces := det_user.workspace_find(p_workspace);
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL,
                        format('bind resource pool %s', to_jsonb(p_pool)));
    IF NOT EXISTS (SELECT 1 FROM resource_pools WHERE name = p_pool) THEN
        RAISE EXCEPTION 'no resource pool named %', to_jsonb(p_pool)
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF p_bound THEN
        INSERT INTO workspace_pools VALUES (w.id, p_pool) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM workspace_pools WHERE workspace_id = w.id AND resource_pool = p_pool;
    END IF;
    PERFORM det_internal.audit(CASE WHEN p_bound THEN 'bind_pool' ELSE 'unbind_pool' END,
        'workspace',
                      w.id::text, jsonb_build_object('name', w.name, 'pool', p_pool));
END $$;

CREATE OR REPLACE FUNCTION det_user.project_create(p_workspace text, p_name text, p_description text)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det project create` (Editor of the workspace). Returns the project's id.
DECLARE
    w workspaces := det_user.workspace_find(p_workspace);
    v_user text := det_internal.require('edit', w.id, format('create a project in workspace %s',
                                                     to_jsonb(w.name)));
    v_problem text := det_user.name_problem(p_name, 255);
    v_id integer;
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'project name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.archived THEN
        RAISE EXCEPTION 'workspace % is archived: unarchive it first', to_jsonb(w.name)
            USING ERRCODE = 'check_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM projects WHERE workspace_id = w.id AND name = p_name) THEN
        RAISE EXCEPTION 'project name %: workspace % has a project of that name',
            to_jsonb(p_name), to_jsonb(w.name) USING ERRCODE = 'unique_violation';
    END IF;
    INSERT INTO projects (workspace_id, name, description, created_by)
    VALUES (w.id, p_name, coalesce(p_description, ''), v_user) RETURNING id INTO v_id;
    PERFORM det_internal.audit('create', 'project', v_id::text,
                      jsonb_build_object('name', p_name, 'workspace', w.name));
    RETURN v_id;
END $$;

CREATE OR REPLACE FUNCTION det_user.project_set_archived(p_workspace text, p_name text, p_archived boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det project archive | unarchive` (Editor): an archived project takes no new experiments.
DECLARE
    p projects := det_user.project_find(p_workspace, p_name);
BEGIN
    PERFORM det_internal.require('edit', p.workspace_id,
                        format('%s project %s', CASE WHEN p_archived THEN 'archive'
                                                     ELSE 'unarchive' END, to_jsonb(p.name)));
    IF p.id = 1 THEN
        RAISE EXCEPTION 'project "Uncategorized" cannot be archived'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE projects SET archived = p_archived WHERE id = p.id;
    PERFORM det_internal.audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END, 'project',
                      p.id::text, jsonb_build_object('name', p.name));
END $$;

CREATE OR REPLACE FUNCTION det_user.project_delete(p_workspace text, p_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det project delete` (Editor): refused while it holds experiments.
DECLARE
    p projects := det_user.project_find(p_workspace, p_name);
    v_n bigint;
BEGIN
    PERFORM det_internal.require('edit', p.workspace_id, format('delete project %s',
        to_jsonb(p.name)));
    IF p.id = 1 THEN
        RAISE EXCEPTION 'project "Uncategorized" cannot be deleted'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT count(*) INTO v_n FROM experiments WHERE project_id = p.id;
    IF v_n > 0 THEN
        RAISE EXCEPTION 'project %: it still holds % experiment(s); move or delete them first',
            to_jsonb(p.name), v_n USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
    DELETE FROM projects WHERE id = p.id;
    PERFORM det_internal.audit('delete', 'project', p.id::text, jsonb_build_object('name', p.name));
END $$;

CREATE OR REPLACE FUNCTION det_user.experiment_move(p_id integer, p_workspace text, p_project text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment move` (Editor where it is and where it goes): its job (and so its runs,
-- metrics, checkpoints and logs, which row-level security reaches through it) moves too.
-- The destination's pool bindings are not checked: what already runs keeps its pool.
DECLARE
    v_from integer := det_user.experiment_workspace(p_id);
    p projects := det_user.project_find(p_workspace, p_project);
BEGIN
    PERFORM det_internal.require('edit', v_from, format('move experiment %s', p_id));
    PERFORM det_internal.require('edit', p.workspace_id,
                        format('move experiment %s into project %s', p_id, to_jsonb(p.name)));
    IF p.archived THEN
        RAISE EXCEPTION 'project % is archived: unarchive it first', to_jsonb(p.name)
            USING ERRCODE = 'check_violation';
    END IF;
    UPDATE jobs SET workspace_id = p.workspace_id
     WHERE id = (SELECT job_id FROM experiments WHERE id = p_id);
    UPDATE experiments SET project_id = p.id WHERE id = p_id;
    PERFORM det_internal.audit('move', 'experiment', p_id::text,
                      jsonb_build_object('project', p.id, 'workspace', p.workspace_id));
END $$;

CREATE OR REPLACE FUNCTION det_user.role_assign(
    p_role text, p_username text, p_group text, p_workspace text, p_assigned boolean
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det rbac assign-role | unassign-role`: role p_role to user p_username or group p_group,
-- in workspace p_workspace (WorkspaceAdmin there) or globally (NULL; ClusterAdmin).
-- WorkspaceCreator and ClusterAdmin are global only. Assigning twice, or unassigning what is
-- not assigned, changes nothing.
DECLARE
    r roles;
    w workspaces;
    v_user integer;
    v_group integer;
BEGIN
    SELECT * INTO r FROM roles WHERE name = p_role;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'role %: expected one of %', to_jsonb(p_role),
            (SELECT string_agg(name, ', ' ORDER BY cardinality(permissions)) FROM roles)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (p_username IS NULL) = (p_group IS NULL) THEN
        RAISE EXCEPTION 'role %: name exactly one of a user and a group', p_role
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_workspace IS NOT NULL THEN
        IF r.global_only THEN
            RAISE EXCEPTION 'role % is cluster-wide: assign it without a workspace', p_role
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        w := det_user.workspace_find(p_workspace);
        PERFORM det_internal.require('admin_workspace', w.id,
                            format('assign roles in workspace %s', to_jsonb(w.name)));
    ELSE
        PERFORM det_internal.require('admin_cluster', NULL, 'assign cluster-wide roles');
    END IF;
    IF p_username IS NOT NULL THEN
        v_user := (det_user.user_find(p_username)).id;
    ELSE
        SELECT id INTO v_group FROM user_groups WHERE name = p_group;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'group % not found', to_jsonb(p_group) USING ERRCODE = 'no_data_found';
        END IF;
    END IF;
    IF p_assigned THEN
        INSERT INTO role_assignments (role, user_id, group_id, workspace_id)
        VALUES (p_role, v_user, v_group, w.id) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM role_assignments
         WHERE role = p_role AND user_id IS NOT DISTINCT FROM v_user
           AND group_id IS NOT DISTINCT FROM v_group AND workspace_id IS NOT DISTINCT FROM w.id;
    END IF;
    PERFORM det_internal.audit(CASE WHEN p_assigned THEN 'assign_role' ELSE 'unassign_role' END, 'role',
                      p_role, jsonb_build_object('user', p_username, 'group', p_group,
                                                 'workspace', w.name));
END $$;

CREATE OR REPLACE FUNCTION det_user.model_move(p_model text, p_workspace text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model move` (Editor where it is and where it goes).
DECLARE
    m models := det_user.model_find(p_model);
    w workspaces := det_user.workspace_find(p_workspace);
BEGIN
    PERFORM det_internal.require('edit', m.workspace_id, format('move model %s', to_jsonb(m.name)));
    PERFORM det_internal.require('edit', w.id, format('move model %s into workspace %s',
                                             to_jsonb(m.name), to_jsonb(w.name)));
    UPDATE models SET workspace_id = w.id, last_updated_time = now() WHERE id = m.id;
    PERFORM det_internal.audit('move', 'model', m.id::text,
        jsonb_build_object('workspace', w.name));
END $$;

CREATE OR REPLACE FUNCTION det_internal.config_value_problem(
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

CREATE OR REPLACE FUNCTION det_internal.experiment_config_problem(p_config jsonb) RETURNS text
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

CREATE OR REPLACE FUNCTION det_user.create_experiment(
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

CREATE OR REPLACE FUNCTION det_internal.trials_continue() RETURNS trigger LANGUAGE plpgsql
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

CREATE OR REPLACE FUNCTION det_user.experiment_fork(
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

CREATE OR REPLACE FUNCTION det_user.trial_continue(
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

CREATE OR REPLACE FUNCTION det_user.experiment_action(p_id integer, p_action text) RETURNS experiment_state
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

CREATE OR REPLACE FUNCTION det_internal.create_task(
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

CREATE OR REPLACE FUNCTION det_internal.task_find(p_job bigint, p_permission text, p_action text) RETURNS tasks
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

CREATE OR REPLACE FUNCTION det_user.task_kill(p_job bigint) RETURNS void
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

CREATE OR REPLACE FUNCTION det_user.job_update(p_job bigint, p_field text, p_value text) RETURNS void
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

CREATE OR REPLACE FUNCTION det_user.apply_cluster_config(p_config jsonb, p_original text) RETURNS void
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

CREATE OR REPLACE FUNCTION det_user.agent_set_enabled(p_id text, p_enabled boolean) RETURNS agent_state
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

CREATE OR REPLACE FUNCTION det_user.agent_drain(p_id text) RETURNS integer LANGUAGE plpgsql
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

CREATE OR REPLACE FUNCTION det_agent.mark_fenced(p_agent text, p_ids bigint[]) RETURNS void
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

CREATE OR REPLACE FUNCTION det_user.slot_set_enabled(p_agent text, p_slot integer, p_enabled boolean)
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

CREATE OR REPLACE FUNCTION det_internal.model_check(
    p_name text, p_description text, p_labels text[], p_metadata jsonb, p_except integer
) RETURNS void LANGUAGE plpgsql STABLE AS $$
-- Raise invalid_parameter_value, naming the field, if a model's new name, description, labels
-- or metadata (each NULL: unchanged) is unacceptable. p_except is the model being changed,
-- which may keep its own name.
DECLARE
    v_problem text := det_user.model_name_problem(p_name);
BEGIN
    IF p_name IS NOT NULL AND v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'model name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM models WHERE lower(name) = lower(p_name)
                                      AND id IS DISTINCT FROM p_except) THEN
        RAISE EXCEPTION 'model name %: a model of that name already exists (names are compared '
            'regardless of case)', to_jsonb(p_name) USING ERRCODE = 'unique_violation';
    END IF;
    IF length(p_description) > 4096 THEN
        RAISE EXCEPTION 'description: expected at most 4096 characters, got %',
            length(p_description) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_problem := det_user.label_problem(p_labels);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'labels: %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
        RAISE EXCEPTION 'metadata: expected a JSON object, got %', jsonb_typeof(p_metadata)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION det_user.model_create(
    p_name text, p_description text, p_labels text[], p_workspace text
) RETURNS models LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model create`: a new, empty model of the caller's in workspace p_workspace (NULL:
-- Uncategorized), where the caller is an Editor.
DECLARE
    v_ws integer := CASE WHEN p_workspace IS NULL THEN 1
                         ELSE (det_user.workspace_find(p_workspace)).id END;
    v_user text := det_internal.require('edit', v_ws, format('create model %s', to_jsonb(p_name)));
    m models;
BEGIN
    PERFORM det_internal.model_check(p_name, p_description, p_labels, NULL, NULL);
    INSERT INTO models (name, description, labels, owner, workspace_id)
    VALUES (p_name, coalesce(p_description, ''), coalesce(p_labels, '{}'), v_user, v_ws)
    RETURNING * INTO m;
    PERFORM det_internal.audit('create', 'model', m.id::text, jsonb_build_object('name', m.name));
    RETURN m;
END $$;

CREATE OR REPLACE FUNCTION det_user.model_update(
    p_model text, p_name text, p_description text, p_notes text, p_labels text[],
    p_metadata jsonb, p_remove_metadata text[]
) RETURNS models LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model update`: each argument NULL leaves its field as it is. p_labels replaces the
-- labels; p_metadata is merged into the metadata (its top-level keys replace the model's),
-- then the keys in p_remove_metadata are removed. An archived model cannot change.
DECLARE
    m models := det_user.model_find(p_model);
BEGIN
    PERFORM det_internal.require('edit', m.workspace_id, format('change model %s',
        to_jsonb(m.name)));
    SELECT * INTO m FROM models WHERE id = m.id FOR UPDATE;
    IF m.archived THEN
        RAISE EXCEPTION 'model % is archived: unarchive it to change it', to_jsonb(m.name)
            USING ERRCODE = 'check_violation';
    END IF;
    PERFORM det_internal.model_check(p_name, p_description, p_labels, p_metadata, m.id);
    UPDATE models
       SET name = coalesce(p_name, name), description = coalesce(p_description, description),
           notes = coalesce(p_notes, notes), labels = coalesce(p_labels, labels),
           metadata = (metadata || coalesce(p_metadata, '{}')) - coalesce(p_remove_metadata, '{}'),
           last_updated_time = now()
     WHERE id = m.id
    RETURNING * INTO m;
    PERFORM det_internal.audit('update', 'model', m.id::text);
    RETURN m;
END $$;

CREATE OR REPLACE FUNCTION det_user.model_set_archived(p_model text, p_archived boolean) RETURNS models
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model archive | unarchive`: an archived model is hidden from `det model list` (unless
-- --all), takes no new versions and no changes; its versions still pin their checkpoints.
DECLARE
    m models := det_user.model_find(p_model);
BEGIN
    PERFORM det_internal.require('edit', m.workspace_id,
                        format('%s model %s', CASE WHEN p_archived THEN 'archive'
                                                   ELSE 'unarchive' END, to_jsonb(m.name)));
    UPDATE models SET archived = p_archived, last_updated_time = now()
     WHERE id = m.id RETURNING * INTO m;
    PERFORM det_internal.audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END, 'model',
                      m.id::text);
    RETURN m;
END $$;

CREATE OR REPLACE FUNCTION det_user.model_delete(p_model text) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model delete`: the model and all its versions; their checkpoints are no longer pinned.
-- Returns how many versions went with it.
DECLARE
    m models := det_user.model_find(p_model);
    v_versions integer;
BEGIN
    PERFORM det_internal.require('edit', m.workspace_id, format('delete model %s',
        to_jsonb(m.name)));
    SELECT count(*) INTO v_versions FROM model_versions WHERE model_id = m.id;
    DELETE FROM models WHERE id = m.id;
    PERFORM det_internal.audit('delete', 'model', m.id::text, jsonb_build_object('name', m.name));
    RETURN v_versions;
END $$;

CREATE OR REPLACE FUNCTION det_user.model_register_version(
    p_model text, p_checkpoint text, p_name text, p_notes text, p_labels text[],
    p_metadata jsonb
) RETURNS model_versions LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model register-version`: the model's next version (its highest number plus one; the
-- model's row lock serialises concurrent registrations) is the checkpoint p_checkpoint, which
-- must be COMPLETED (Determined: "checkpoints for model versions must be in a COMPLETED
-- state"). The version pins the checkpoint. An archived model takes no new versions. The
-- caller is an Editor of the model's workspace and of the checkpoint's: a pinned checkpoint
-- cannot be deleted by its owner, so viewing it is not enough (the same rule as
-- det_user.create_experiment's searcher.source_checkpoint_uuid).
DECLARE
    m models := det_user.model_find(p_model);
    v_uuid uuid;
    v_state text;
    v_problem text := det_user.label_problem(p_labels);
    r model_versions;
    v_user text := det_internal.require('edit', m.workspace_id,
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
    PERFORM det_internal.require('edit', (SELECT j.workspace_id FROM checkpoints c
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
    PERFORM det_internal.audit('register_version', 'model', m.id::text,
                      jsonb_build_object('version', r.version, 'checkpoint', v_uuid));
    RETURN r;
END $$;

CREATE OR REPLACE FUNCTION det_user.model_version_find(p_model text, p_version integer) RETURNS model_versions
LANGUAGE plpgsql STABLE AS $$
-- Version p_version of the model p_model names; NULL p_version: its latest version. Raises
-- no_data_found.
DECLARE
    m models := det_user.model_find(p_model);
    r model_versions;
BEGIN
    SELECT * INTO r FROM model_versions
     WHERE model_id = m.id AND (p_version IS NULL OR version = p_version)
     ORDER BY version DESC LIMIT 1;
    IF NOT FOUND THEN
        IF p_version IS NULL THEN
            RAISE EXCEPTION 'model % has no versions', to_jsonb(m.name)
                USING ERRCODE = 'no_data_found';
        END IF;
        RAISE EXCEPTION 'model % has no version %', to_jsonb(m.name), p_version
            USING ERRCODE = 'no_data_found';
    END IF;
    RETURN r;
END $$;

CREATE OR REPLACE FUNCTION det_user.model_version_update(
    p_model text, p_version integer, p_name text, p_notes text, p_labels text[],
    p_metadata jsonb, p_remove_metadata text[]
) RETURNS model_versions LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model update NAME --version N`: as det_user.model_update, for one version (its name,
-- notes, labels and metadata). A version of an archived model cannot change.
DECLARE
    r model_versions := det_user.model_version_find(p_model, p_version);
    m models;
    v_problem text := det_user.label_problem(p_labels);
BEGIN
    SELECT * INTO m FROM models WHERE id = r.model_id FOR UPDATE;
    PERFORM det_internal.require('edit', m.workspace_id, format('change model %s',
        to_jsonb(m.name)));
    IF m.archived THEN
        RAISE EXCEPTION 'model % is archived: unarchive it to change its versions',
            to_jsonb(m.name) USING ERRCODE = 'check_violation';
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
    UPDATE model_versions
       SET name = coalesce(p_name, name), notes = coalesce(p_notes, notes),
           labels = coalesce(p_labels, labels),
           metadata = (metadata || coalesce(p_metadata, '{}')) - coalesce(p_remove_metadata, '{}'),
           last_updated_time = now()
     WHERE id = r.id
    RETURNING * INTO r;
    UPDATE models SET last_updated_time = now() WHERE id = r.model_id;
    PERFORM det_internal.audit('update_version', 'model', m.id::text,
                      jsonb_build_object('version', r.version));
    RETURN r;
END $$;

CREATE OR REPLACE FUNCTION det_user.model_version_delete(p_model text, p_version integer) RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model delete-version`: remove one version; returns its checkpoint, no longer pinned by
-- it. The numbers of the other versions stay as they are.
DECLARE
    r model_versions := det_user.model_version_find(p_model, p_version);
BEGIN
    PERFORM det_internal.require('edit', (SELECT workspace_id FROM models WHERE id = r.model_id),
                        format('delete a version of model %s', to_jsonb(p_model)));
    DELETE FROM model_versions WHERE id = r.id;
    UPDATE models SET last_updated_time = now() WHERE id = r.model_id;
    PERFORM det_internal.audit('delete_version', 'model', r.model_id::text,
                      jsonb_build_object('version', r.version));
    RETURN r.checkpoint_uuid;
END $$;

CREATE OR REPLACE FUNCTION det_internal.template_workspace(p_workspace text, p_permission text, p_action text)
RETURNS integer LANGUAGE plpgsql STABLE AS $$
-- The id of workspace p_workspace (NULL: Uncategorized, id 1) once det_internal.require has let the
-- caller do p_action there with p_permission. A workspace that does not exist is refused as
-- one the caller may not view: 'cannot <p_action>: not found' (no_data_found).
DECLARE
    v_id integer := CASE WHEN p_workspace IS NULL THEN 1
                         ELSE (SELECT id FROM workspaces WHERE name = p_workspace) END;
BEGIN
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'cannot %: not found', p_action USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.require(p_permission, v_id, p_action);
    RETURN v_id;
END $$;

CREATE OR REPLACE FUNCTION det_user.template_set(p_workspace text, p_name text, p_config jsonb,
                                 p_original text)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det template set`: create or replace template p_name of workspace p_workspace (NULL:
-- Uncategorized), as an Editor there (a template is its workspace's, not the cluster's). p_config:
-- its YAML (p_original) as a JSON object, checked by det.configs.templates. Returns true when it
-- was created.
DECLARE
    v_ws integer := det_internal.template_workspace(
        p_workspace, 'edit', format('set template %s in workspace %s', to_jsonb(p_name),
                                    to_jsonb(coalesce(p_workspace, 'Uncategorized'))));
    v_problem text := det_user.template_name_problem(p_name);
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
    VALUES (v_ws, p_name, p_config, p_original, det_user.caller())
    ON CONFLICT (workspace_id, name) DO UPDATE
        SET config = excluded.config, original = excluded.original, updated_at = now()
    RETURNING (xmax = 0) INTO v_created;
    PERFORM det_internal.audit(CASE WHEN v_created THEN 'create' ELSE 'update' END,
        'template', p_name,
                      jsonb_build_object('workspace_id', v_ws));
    RETURN v_created;
END $$;

CREATE OR REPLACE FUNCTION det_user.template_remove(p_workspace text, p_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det template remove` (an Editor of its workspace; NULL: Uncategorized): experiments
-- created from it keep their merged configs.
DECLARE
    v_ws integer := det_internal.template_workspace(
        p_workspace, 'edit', format('remove template %s of workspace %s', to_jsonb(p_name),
                                    to_jsonb(coalesce(p_workspace, 'Uncategorized'))));
BEGIN
    DELETE FROM templates WHERE workspace_id = v_ws AND name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'template % not found in workspace %', to_jsonb(p_name),
            to_jsonb(coalesce(p_workspace, 'Uncategorized')) USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.audit('delete', 'template', p_name,
        jsonb_build_object('workspace_id', v_ws));
END $$;

CREATE OR REPLACE FUNCTION det_user.template_expand(p_workspace text, p_name text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The config of template p_name of workspace p_workspace (NULL: Uncategorized), secrets
-- included, for `det experiment create --template` to merge under an experiment it submits
-- there: the one read of a template that is not redacted. It takes what the
-- submission takes, Editor on the workspace, so the secrets go only to those who may run
-- experiments with them (and whose experiments' configs hold them).
DECLARE
    v_ws integer := det_internal.template_workspace(
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

CREATE OR REPLACE FUNCTION det_user.agent_token_create(p_verifier text, p_pool text, p_expires interval)
RETURNS TABLE (role_name text, expires_at timestamptz) LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det agent token create` (ClusterAdmin): a one-time enrollment token for one new agent, in
-- resource pool p_pool (NULL: the agent picks), good for p_expires (more than 0, at most 7
-- days). The token's secret reaches the server only as p_verifier, a client-made SCRAM
-- verifier (det_internal.check_verifier), set as the password of a new login role returned here.
-- Raises invalid_parameter_value (expiry), foreign_key_violation (unknown pool).
#variable_conflict use_column
DECLARE
    v_role text := 'det_enroll_' || left(md5(gen_random_uuid()::text), 16);
    v_expires timestamptz;
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL, 'create an agent enrollment token');
    IF p_verifier IS NULL THEN
        RAISE EXCEPTION 'token: expected a SCRAM-SHA-256 verifier of its secret'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_internal.check_verifier(p_verifier);
    IF p_expires IS NULL OR p_expires <= interval '0' OR p_expires > interval '7 days' THEN
        RAISE EXCEPTION 'expires: expected more than 0 and at most 7 days, got %',
            coalesce(p_expires::text, 'nothing') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_pool IS NOT NULL AND NOT EXISTS (SELECT 1 FROM resource_pools WHERE name = p_pool) THEN
        RAISE EXCEPTION 'pool: no resource pool named "%"', p_pool
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    v_expires := now() + p_expires;
    EXECUTE format('CREATE ROLE %I LOGIN IN ROLE det_enroll PASSWORD %L', v_role, p_verifier);
    INSERT INTO agent_enrollment_tokens (role_name, resource_pool, created_by, expires_at)
    VALUES (v_role, p_pool, det_user.caller(), v_expires);
    PERFORM det_internal.audit('create', 'agent token', v_role,
                      jsonb_build_object('pool', p_pool, 'expires_at', v_expires));
    RETURN QUERY SELECT v_role, v_expires;
END $$;

CREATE OR REPLACE FUNCTION det_enroll.agent_enroll(p_agent text, p_verifier text) RETURNS text LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det agent enroll`, logged in with an enrollment token (det_user.agent_token_create): make agent
-- p_agent's own login det_agent_<id> (a member of det_agent) with password verifier
-- p_verifier, and use the token up (its role may no longer log in). Returns the agent's
-- resource pool (NULL: its choice). Raises invalid_authorization_specification (28000) for a
-- used or expired token, invalid_parameter_value (agent id: 1 to 53 characters, as
-- agents.id, so that the role name fits PostgreSQL's 63), unique_violation (an agent or a
-- role of that name exists).
DECLARE
    t agent_enrollment_tokens;
    v_role text := 'det_agent_' || p_agent;
BEGIN
    SELECT * INTO t FROM agent_enrollment_tokens WHERE role_name = session_user FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'enroll: this login (%) is no enrollment token', session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF t.used_at IS NOT NULL THEN
        RAISE EXCEPTION 'enrollment token: already used at % (by agent %)', t.used_at,
            t.agent_id USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF t.expires_at <= now() THEN
        RAISE EXCEPTION 'enrollment token: expired at %', t.expires_at
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF p_agent IS NULL OR p_agent !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,52}$' THEN
        RAISE EXCEPTION 'agent id: expected 1 to 53 ASCII letters, digits, ''.'', ''_'' or ''-'', '
            'starting with a letter or digit, got %', coalesce(to_jsonb(p_agent)::text, 'nothing')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_internal.check_verifier(p_verifier);
    IF p_verifier IS NULL THEN
        RAISE EXCEPTION 'password: expected a SCRAM-SHA-256 verifier computed by the client'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM agent_logins WHERE agent_id = p_agent)
       OR EXISTS (SELECT 1 FROM agents WHERE id = p_agent) THEN
        RAISE EXCEPTION 'agent id %: an agent of that id exists (enroll under another id)',
            to_jsonb(p_agent) USING ERRCODE = 'unique_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
        RAISE EXCEPTION 'agent id %: the server has a role % already (enroll under another id)',
            to_jsonb(p_agent), v_role USING ERRCODE = 'unique_violation';
    END IF;
    EXECUTE format('CREATE ROLE %I LOGIN IN ROLE det_agent PASSWORD %L', v_role, p_verifier);
    EXECUTE format('ALTER ROLE %I NOLOGIN', t.role_name);
    UPDATE agent_enrollment_tokens SET used_at = now(), agent_id = p_agent
     WHERE role_name = t.role_name;
    INSERT INTO agent_logins (agent_id, role_name, resource_pool)
    VALUES (p_agent, v_role, t.resource_pool);
    PERFORM det_internal.audit('enroll', 'agent', p_agent, jsonb_build_object('token',
        t.role_name));
    RETURN t.resource_pool;
END $$;

CREATE OR REPLACE FUNCTION det_user.agent_revoke(p_agent text) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det agent revoke` (ClusterAdmin): end enrolled agent p_agent's access at once. Its login
-- may no longer log in, its sessions are terminated (pg_terminate_backend: at once, before
-- this commits; one that reconnects meanwhile is refused by det_internal.agent_check_self), and the
-- agent is marked LOST, so the next pass ends its runs as a lost agent's (their tokens die,
-- their trials get new runs elsewhere after the fence, reconciler.passes.FENCE_SECONDS).
-- Returns how many sessions were terminated. Again on a revoked agent: terminates what is
-- left. Raises no_data_found (no enrolled login of that id).
DECLARE
    l agent_logins;
    v_ended integer;
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL, format('revoke agent %s',
        to_jsonb(p_agent)));
    SELECT * INTO l FROM agent_logins WHERE agent_id = p_agent FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent %: no enrolled login of that id (agents of the shared det_agent '
            'login stop with their host''s `det cluster down`)', to_jsonb(p_agent)
            USING ERRCODE = 'no_data_found';
    END IF;
    EXECUTE format('ALTER ROLE %I NOLOGIN', l.role_name);
    UPDATE agent_logins SET revoked_at = coalesce(revoked_at, now()) WHERE agent_id = p_agent;
    UPDATE agents SET state = 'LOST' WHERE id = p_agent AND state <> 'LOST';
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'agent');
    SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) INTO v_ended
      FROM pg_stat_activity WHERE usename = l.role_name;
    PERFORM det_internal.audit('revoke', 'agent', p_agent, jsonb_build_object('sessions', v_ended));
    RETURN v_ended;
END $$;

CREATE OR REPLACE FUNCTION det_agent.register(
    p_id text, p_hostname text, p_pool text, p_runtime text, p_slots jsonb
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent (re)registers its slots: [{slot_id, type, device_uuid, device_name, memory_mb}].
-- Slots it no longer has are removed; a LOST agent becomes ACTIVE again, a stopping one
-- (det_agent.stop_runs) takes work again, a gone one (agents.gone_at) is listed again.
BEGIN
    PERFORM det_internal.agent_check_self(p_id);
    IF NOT EXISTS (SELECT 1 FROM resource_pools WHERE name = p_pool) THEN
        RAISE EXCEPTION 'agent %: no resource pool named "%"', p_id, p_pool
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    INSERT INTO agents (id, hostname, resource_pool, runtime)
    VALUES (p_id, p_hostname, p_pool, p_runtime)
    ON CONFLICT (id) DO UPDATE
        SET hostname = excluded.hostname, resource_pool = excluded.resource_pool,
            runtime = excluded.runtime, last_heartbeat = now(), stopping = false,
            state = CASE WHEN agents.state = 'LOST' THEN 'ACTIVE' ELSE agents.state END,
            gone_at = NULL;
    DELETE FROM slots s WHERE s.agent_id = p_id
        AND s.slot_id NOT IN (SELECT (e ->> 'slot_id')::integer
                              FROM jsonb_array_elements(p_slots) e);
    INSERT INTO slots (agent_id, slot_id, type, device_uuid, device_name, memory_mb)
    SELECT p_id, (e ->> 'slot_id')::integer, e ->> 'type', e ->> 'device_uuid',
           coalesce(e ->> 'device_name', ''), (e ->> 'memory_mb')::bigint
    FROM jsonb_array_elements(p_slots) e
    ON CONFLICT (agent_id, slot_id) DO UPDATE
        SET type = excluded.type, device_uuid = excluded.device_uuid,
            device_name = excluded.device_name, memory_mb = excluded.memory_mb;
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'agent');
END $$;

CREATE OR REPLACE FUNCTION det_agent.heartbeat(p_id text) RETURNS agent_state LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Returns the agent's state; LOST means the reconciler gave up on it and it must re-register.
DECLARE
    v_state agent_state;
BEGIN
    PERFORM det_internal.agent_check_self(p_id);
    UPDATE agents SET last_heartbeat = now() WHERE id = p_id AND state <> 'LOST'
    RETURNING state INTO v_state;
    RETURN coalesce(v_state, 'LOST');
END $$;

CREATE OR REPLACE FUNCTION det_internal.stop_runs_of(p_agent text) RETURNS bigint[] LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A planned stop of agent p_agent's live runs, for det_agent.stop_runs and
-- det_user.agent_drain: each becomes desired STOPPED (a KILLED one stays so) and planned_stop, and
-- its task is woken on its channel to checkpoint and exit as on pause (det_task.should_preempt).
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
    PERFORM pg_notify(det_internal.channel('alloc', x::text), '') FROM unnest(v_ids) x;
    RETURN v_ids;
END $$;

CREATE OR REPLACE FUNCTION det_agent.stop_runs(p_agent text) RETURNS bigint[] LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent is going away (SIGTERM: `det cluster down`, a restart) and stops its live runs
-- as a planned stop (det_internal.stop_runs_of), with no reconciler needed (the same `down` stops
-- it). The agent is marked stopping: no new run is placed on it until it registers again. Returns
-- the ids of the runs.
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    UPDATE agents SET stopping = true WHERE id = p_agent;
    RETURN det_internal.stop_runs_of(p_agent);
END $$;

CREATE OR REPLACE FUNCTION det_agent.leave(p_agent text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent is being ended by another resource manager under its runs (an agent in a Slurm
-- job: scancel, time limit, node drain): marked stopping, so nothing new is placed on it, but
-- its runs are not a planned stop: they end as the failures they are (max_restarts).
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    UPDATE agents SET stopping = true WHERE id = p_agent;
END $$;

CREATE OR REPLACE FUNCTION det_agent.retire(p_agent text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent ends for good, its work done (a one-shot agent whose run ended and was
-- reported, `det agent run --one-shot`): LOST and gone (agents.gone_at), so nothing is placed
-- on it and agent lists hide it; a run it still held would end as on a lost agent.
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    UPDATE agents SET state = 'LOST', stopping = true, gone_at = coalesce(gone_at, now())
     WHERE id = p_agent;
END $$;

CREATE OR REPLACE FUNCTION det_agent.claim_each(p_agent text, p_allocations bigint[])
RETURNS TABLE (allocation_id bigint, token text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The agent is about to launch allocations assigned to it: mint each one's task token
-- (returned once, stored hashed) and move it to STARTING, in one statement (an agent
-- starts its tasks in batches). Allocations no longer this agent's to start (ended,
-- or desired state is not RUNNING) are left out of the result.
#variable_conflict use_column
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
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

CREATE OR REPLACE FUNCTION det_agent.claim(p_agent text, p_allocation bigint) RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det_agent.claim_each for one allocation: its token, or NULL when it is not to start.
SELECT token FROM det_agent.claim_each(p_agent, ARRAY[p_allocation]);
$$;

CREATE OR REPLACE FUNCTION det_agent.report_each(
    p_agent text, p_allocations bigint[], p_state allocation_state,
    p_exit_codes integer[] DEFAULT NULL, p_reasons text[] DEFAULT NULL
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The agent reports what it observed of allocations it runs, all in one state, in one
-- statement; p_exit_codes and p_reasons go with p_allocations element by element.
-- TERMINATED releases the slots and records the exit code and reason; the reconciler settles
-- the trial afterwards. RUNNING of a gang spanning agents leaves it STARTING until every
-- other agent started its share (det_agent.gang_started; det_agent.report_node moves it on then).
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    UPDATE allocations a
       -- a gang's other agents are looked for only where it has any (one index probe)
       SET state = CASE WHEN p_state = 'RUNNING'
                             AND EXISTS (SELECT 1 FROM allocation_slots h
                                          WHERE h.allocation_id = a.id
                                            AND h.agent_id <> p_agent)
                             AND NOT det_agent.gang_started(a.id)
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
        PERFORM pg_notify(det_internal.channel('reconciler', ''), 'allocation');
    END IF;
END $$;

CREATE OR REPLACE FUNCTION det_agent.report(
    p_agent text, p_allocation bigint, p_state allocation_state,
    p_exit_code integer DEFAULT NULL, p_reason text DEFAULT NULL
) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det_agent.report_each for one allocation.
SELECT det_agent.report_each(p_agent, ARRAY[p_allocation], p_state, ARRAY[p_exit_code],
                             ARRAY[p_reason]);
$$;

CREATE OR REPLACE FUNCTION det_agent.gang_started(p_allocation bigint) RETURNS boolean LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Whether every agent of an allocation but the chief's has started its share of the workers
-- (true on one agent). The allocation is RUNNING only once this and the chief's agent say so.
SELECT NOT EXISTS (
    SELECT 1 FROM unnest(det_agent.gang_agents(p_allocation)) WITH ORDINALITY AS g (agent_id, i)
     WHERE g.i > 1
       AND NOT EXISTS (SELECT 1 FROM allocation_nodes n
                        WHERE n.allocation_id = p_allocation AND n.agent_id = g.agent_id
                          AND n.state >= 'RUNNING'));
$$;

CREATE OR REPLACE FUNCTION det_agent.set_rendezvous(
    p_agent text, p_allocation bigint, p_endpoint text
) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The chief's agent records where the workers meet (host:port), after its claim and before it
-- starts its workers.
SELECT det_internal.agent_check_self(p_agent);
UPDATE allocations SET rendezvous = p_endpoint
 WHERE id = p_allocation AND agent_id = p_agent AND state <> 'TERMINATED';
$$;

CREATE OR REPLACE FUNCTION det_agent.claim_node(p_agent text, p_allocation bigint) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Another agent of a gang allocation is about to start its share of the workers: mint its
-- token (returned once, stored hashed) and return {token, node_rank, nodes, rendezvous}.
-- NULL while the chief's agent has not recorded the rendezvous, and when the allocation is no
-- longer to run, this agent holds none of its slots, or its share already ended.
DECLARE
    v_token text := translate(encode(gen_random_uuid()::text::bytea
                                     || gen_random_uuid()::text::bytea, 'base64'),
                              E'+/=\n', '-_');
    a allocations;
    v_nodes text[];
    v_rank integer;
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    SELECT * INTO a FROM allocations
     WHERE id = p_allocation AND agent_id <> p_agent AND rendezvous IS NOT NULL
       AND state IN ('STARTING', 'RUNNING') AND desired_state = 'RUNNING'
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_nodes := det_agent.gang_agents(p_allocation);
    v_rank := array_position(v_nodes, p_agent) - 1;
    IF v_rank IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO allocation_nodes AS n (allocation_id, agent_id, node_rank, token_hash)
    VALUES (p_allocation, p_agent, v_rank, sha256(convert_to(v_token, 'UTF8')))
    ON CONFLICT (allocation_id, agent_id) DO UPDATE SET token_hash = EXCLUDED.token_hash
     WHERE n.state <> 'TERMINATED';
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN jsonb_build_object('token', v_token, 'node_rank', v_rank, 'nodes', v_nodes,
                              'rendezvous', a.rendezvous);
END $$;

CREATE OR REPLACE FUNCTION det_agent.report_node(
    p_agent text, p_allocation bigint, p_state allocation_state,
    p_exit_code integer DEFAULT NULL, p_reason text DEFAULT NULL
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- What an agent other than the chief's observed of its share of an allocation. A share that
-- ends other than with exit code 0 ends the whole allocation, with its code and a reason
-- naming the agent (the chief's agent then stops its workers; the trial restarts from its
-- checkpoint under max_restarts). A share that ends with 0 leaves the run to the chief.
DECLARE
    v_rank integer;
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    UPDATE allocation_nodes
       SET state = greatest(state, p_state),
           exit_code = CASE WHEN p_state = 'TERMINATED' THEN p_exit_code ELSE exit_code END,
           exit_reason = CASE WHEN p_state = 'TERMINATED' THEN p_reason ELSE exit_reason END
     WHERE allocation_id = p_allocation AND agent_id = p_agent AND state <> 'TERMINATED'
    RETURNING node_rank INTO v_rank;
    IF FOUND AND p_state = 'RUNNING' THEN
        UPDATE allocations SET state = 'RUNNING'
         WHERE id = p_allocation AND state < 'RUNNING' AND running_at IS NOT NULL
           AND det_agent.gang_started(p_allocation);
    END IF;
    -- A share that failed before its claim (its launch failed) has no row, and ends the run.
    v_rank := coalesce(v_rank, array_position(det_agent.gang_agents(p_allocation), p_agent) - 1);
    IF v_rank IS NULL OR p_state <> 'TERMINATED' OR p_exit_code IS NOT DISTINCT FROM 0 THEN
        RETURN;
    END IF;
    UPDATE allocations
       SET state = 'TERMINATED', exit_code = p_exit_code, ended_at = now(),
           exit_reason = format('workers of node %s (agent %s) ended: %s', v_rank, p_agent,
                                coalesce(p_reason, 'exit code ' || p_exit_code))
     WHERE id = p_allocation AND state <> 'TERMINATED';
    IF FOUND THEN
        UPDATE allocation_slots SET released = true
         WHERE allocation_id = p_allocation AND NOT released;
        PERFORM pg_notify(det_internal.channel('reconciler', ''), 'allocation');
    END IF;
END $$;

CREATE OR REPLACE FUNCTION det_agent.append_logs(
    p_allocation bigint, p_streams text[], p_lines text[], p_ranks integer[] DEFAULT NULL,
    p_writer uuid DEFAULT NULL, p_seqs bigint[] DEFAULT NULL
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Append a batch of task output lines (one call per batch, never per line), each with the
-- rank that wrote it (p_ranks, NULL where untagged). An untagged stdout / stderr line of a
-- trial run on at most one slot is its one worker's, rank 0 (only a trial on more slots runs
-- under det.launch.torch_distributed, which tags each worker's lines).
-- p_writer and p_seqs (each line's number, ascending) name the lines (see log_batches): a line
-- numbered at or below its writer's last_seq was written before and is skipped; a NULL
-- p_writer asks for no such check. invalid_parameter_value when p_seqs does not match; an
-- enrolled agent's login writes only for allocations it runs a part of
-- (det_internal.agent_check_allocation). Lines of an allocation that no longer exists are dropped
-- without an error: a shipper stops on errors, and its other allocations' lines would stop with it.
DECLARE
    v_last bigint := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM allocations WHERE id = p_allocation) THEN
        RETURN;  -- gone (its experiment deleted): nothing to keep, and no error to stop on
    END IF;
    PERFORM det_internal.agent_check_allocation(p_allocation);
    IF p_writer IS NOT NULL THEN
        IF cardinality(p_seqs) IS DISTINCT FROM cardinality(p_lines)
           OR EXISTS (SELECT FROM unnest(p_seqs) WITH ORDINALITY AS s (n, i)
                       WHERE n IS NULL OR n < 1 OR n <= p_seqs[i - 1]) THEN
            RAISE EXCEPTION 'log batch: p_seqs must number each line, ascending from 1 or more'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT b.last_seq INTO v_last FROM log_batches b
         WHERE b.writer = p_writer AND b.allocation_id = p_allocation FOR UPDATE;
        v_last := coalesce(v_last, 0);
        IF cardinality(p_seqs) > 0 AND p_seqs[cardinality(p_seqs)] > v_last THEN
            INSERT INTO log_batches AS b (writer, allocation_id, last_seq)
            VALUES (p_writer, p_allocation, p_seqs[cardinality(p_seqs)])
            ON CONFLICT (allocation_id, writer) DO UPDATE SET last_seq = excluded.last_seq;
        END IF;
    END IF;
    INSERT INTO task_logs (allocation_id, trial_id, stream, line, rank)
    SELECT p_allocation, a.trial_id, u.s, u.l,
           coalesce(u.r, CASE WHEN a.trial_id IS NOT NULL AND u.s <> 'det'
                               AND a.slots_needed <= 1 THEN 0 END)
    FROM allocations a,
         unnest(p_streams, p_lines, coalesce(p_ranks, '{}'::integer[]),
                coalesce(p_seqs, '{}'::bigint[])) WITH ORDINALITY AS u (s, l, r, n, i)
    WHERE a.id = p_allocation AND (p_writer IS NULL OR u.n > v_last)
    ORDER BY u.i;
END $$;

CREATE OR REPLACE FUNCTION det_internal.trial_best_validation(p_trial integer) RETURNS double precision
LANGUAGE sql STABLE AS $$
-- The best searcher metric (searcher.smaller_is_better decides "best") of the trial's
-- surviving validation rows; NULL without one. det_task.report_metrics_batch keeps
-- trials.best_validation up to date row by row; this recomputes it when rows are superseded.
    SELECT CASE WHEN e.smaller_is_better
                THEN min((m."values" ->> e.searcher_metric)::double precision)
                ELSE max((m."values" ->> e.searcher_metric)::double precision)
                END
      FROM trials t
      JOIN experiments e ON e.id = t.experiment_id
      JOIN metrics m ON m.trial_id = t.id AND m."group" = 'validation'
                    AND m.superseded_by IS NULL
     WHERE t.id = p_trial
       AND jsonb_typeof(m."values" -> e.searcher_metric) = 'number'
     GROUP BY e.id;
$$;

CREATE OR REPLACE FUNCTION det_internal.metrics_supersede(p_allocation bigint) RETURNS integer
LANGUAGE plpgsql AS $$
-- Run p_allocation resumes its trial from the trial's restart point (trials.steps_completed,
-- the step of its latest checkpoint): the rows earlier runs reported after that step are
-- superseded by it (metrics.superseded_by), as the run will report those steps again; rows
-- already superseded keep the run that superseded them first. The trial's best validation is
-- then recomputed from the surviving rows. Once per run start, not per row: the rows are
-- found per group on the (trial, group, steps) index, the groups by a loose index scan.
-- Returns the rows superseded (0 for a run that is not a trial's, or a first run).
DECLARE
    v_trial integer;
    v_steps bigint;
    v_rows integer;
    v_validation boolean;
BEGIN
    SELECT t.id, t.steps_completed INTO v_trial, v_steps
      FROM allocations a JOIN trials t ON t.id = a.trial_id WHERE a.id = p_allocation;
    IF v_trial IS NULL THEN
        RETURN 0;
    END IF;
    WITH RECURSIVE groups (g) AS (
        (SELECT "group" FROM metrics WHERE trial_id = v_trial ORDER BY "group" LIMIT 1)
        UNION ALL
        SELECT (SELECT m."group" FROM metrics m
                 WHERE m.trial_id = v_trial AND m."group" > groups.g
                 ORDER BY m."group" LIMIT 1)
          FROM groups WHERE groups.g IS NOT NULL
    ), marked AS (
        UPDATE metrics m SET superseded_by = p_allocation
          FROM groups
         WHERE m.trial_id = v_trial AND m."group" = groups.g AND m.steps_completed > v_steps
           AND m.superseded_by IS NULL AND m.allocation_id <> p_allocation
        RETURNING m."group"
    )
    SELECT count(*), coalesce(bool_or("group" = 'validation'), false)
      INTO v_rows, v_validation FROM marked;
    IF v_validation THEN
        UPDATE trials SET best_validation = det_internal.trial_best_validation(v_trial)
         WHERE id = v_trial;
    END IF;
    RETURN v_rows;
END $$;

CREATE OR REPLACE FUNCTION det_task.info(p_token text) RETURNS jsonb LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Identity and starting point of the task; also marks the allocation RUNNING and supersedes
-- what earlier runs of its trial reported after that starting point
-- (det_internal.metrics_supersede): the run starts from its trial's latest checkpoint, which this
-- returns.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    UPDATE allocations SET state = 'RUNNING' WHERE id = a.id AND state < 'RUNNING';
    PERFORM det_internal.metrics_supersede(a.id);
    RETURN (
        SELECT jsonb_build_object(
            'allocation_id', a.id, 'trial_id', t.id, 'experiment_id', e.id,
            'config', e.config, 'hparams', t.hparams, 'trial_seed', t.seed,
            'latest_checkpoint', t.latest_checkpoint, 'steps_completed', t.steps_completed,
            'slots', a.slots_needed)
        FROM trials t JOIN experiments e ON e.id = t.experiment_id
        WHERE t.id = a.trial_id);
END $$;

CREATE OR REPLACE FUNCTION det_internal.append_metrics(
    a allocations, p_groups text[], p_steps bigint[], p_values jsonb[]
) RETURNS integer LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
-- Append metrics rows of run a in order: row i is (p_groups[i], p_steps[i], p_values[i]);
-- returns the rows written. Validation rows update the trial's best searcher metric
-- (searcher.smaller_is_better decides "best"). The one home of the metrics-append rule, for a
-- task's reports (det_task.report_metrics_batch) and an unmanaged script's
-- (det_user.unmanaged_report_metrics). Each row is checked first, and the whole batch refused
-- (invalid_parameter_value naming the row's group and step) for: a group that is empty,
-- longer than 255 characters or holds a control character (it is shown on terminals); a step
-- outside 0 to 2^53 - 1 (what a JSON reader such as the WebUI holds exactly; Core API code
-- counts steps in its own unit, so the searcher's length gives no tighter bound); values that
-- are not a JSON object, are over 64 KiB or nest deeper than 32 levels (det_internal.json_problem:
-- any JSON inside, as Determined allows; the harness writes NaN and infinities as strings); a
-- validation's searcher metric that is a number a double cannot hold.
DECLARE
    v_cfg jsonb;
    v_metric text;
    v_best double precision;
    v_rows integer;
    v_bad record;
BEGIN
    IF cardinality(p_groups) IS DISTINCT FROM cardinality(p_steps)
       OR cardinality(p_groups) IS DISTINCT FROM cardinality(p_values) THEN
        RAISE EXCEPTION 'metrics batch: groups, steps and values must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT e.config INTO v_cfg FROM trials t JOIN experiments e ON e.id = t.experiment_id
     WHERE t.id = a.trial_id;
    v_metric := v_cfg #>> '{searcher,metric}';
    SELECT u.g, u.s, CASE
               WHEN u.g IS NULL OR u.g = '' THEN 'metrics group must be a non-empty name'
               WHEN length(u.g) > 255 THEN 'group: longer than 255 characters'
               WHEN u.g ~ '[[:cntrl:]]' THEN 'group: holds a control character'
               WHEN u.s IS NULL OR u.s NOT BETWEEN 0 AND 9007199254740991
                   THEN format('steps_completed: expected 0 to 2^53 - 1, not %s', u.s)
               WHEN det_internal.json_problem(u.v, 65536) IS NOT NULL
                   THEN 'values ' || det_internal.json_problem(u.v, 65536)
               ELSE format('values: searcher metric "%s" is %s, beyond a double', v_metric,
                           u.v -> v_metric) END AS problem
      INTO v_bad
      FROM unnest(p_groups, p_steps, p_values) WITH ORDINALITY AS u (g, s, v, i)
     WHERE u.g IS NULL OR u.g = '' OR length(u.g) > 255 OR u.g ~ '[[:cntrl:]]'
        OR u.s IS NULL OR u.s NOT BETWEEN 0 AND 9007199254740991
        OR det_internal.json_problem(u.v, 65536) IS NOT NULL
        OR (u.g = 'validation' AND jsonb_typeof(u.v -> v_metric) = 'number'
            AND abs((u.v ->> v_metric)::numeric) > 1.7976931348623157e308)
     ORDER BY u.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '%', CASE WHEN v_bad.g IS NULL OR v_bad.g = '' THEN v_bad.problem
            ELSE format('metrics %s at batch %s: %s', to_jsonb(left(v_bad.g, 64)), v_bad.s,
                        v_bad.problem) END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO metrics (trial_id, allocation_id, "group", steps_completed, "values")
    SELECT a.trial_id, a.id, u.g, u.s, u.v
      FROM unnest(p_groups, p_steps, p_values) WITH ORDINALITY AS u (g, s, v, i)
     ORDER BY u.i;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    SELECT CASE WHEN (v_cfg #>> '{searcher,smaller_is_better}')::boolean
                THEN min((u.v ->> v_metric)::double precision)
                ELSE max((u.v ->> v_metric)::double precision) END
      INTO v_best
      FROM unnest(p_groups, p_values) AS u (g, v)
     WHERE u.g = 'validation' AND jsonb_typeof(u.v -> v_metric) = 'number';
    IF v_best IS NOT NULL THEN
        UPDATE trials SET best_validation = CASE
            WHEN best_validation IS NULL THEN v_best
            WHEN (v_cfg #>> '{searcher,smaller_is_better}')::boolean
                THEN least(best_validation, v_best)
            ELSE greatest(best_validation, v_best) END
         WHERE id = a.trial_id;
    END IF;
    RETURN v_rows;
END $$;

CREATE OR REPLACE FUNCTION det_task.report_metrics_batch(
    p_token text, p_writer uuid, p_seq bigint,
    p_groups text[], p_steps bigint[], p_values jsonb[]
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A task appends a batch of metrics rows (det_internal.append_metrics: the rows and what is
-- refused). p_writer and p_seq name the batch (see metric_batches): a batch already recorded is
-- skipped; a NULL p_writer asks for no such check (det_task.report_metrics). Returns the rows
-- written (0 for a skipped batch).
DECLARE
    a allocations := det_internal.auth(p_token);
    v_rows integer;
BEGIN
    IF p_writer IS NOT NULL THEN
        IF p_seq IS NULL OR p_seq < 1 THEN
            RAISE EXCEPTION 'metrics batch number must be 1 or more, not %', p_seq
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        INSERT INTO metric_batches AS b (writer, allocation_id, last_seq)
        VALUES (p_writer, a.id, p_seq)
        ON CONFLICT (writer) DO UPDATE SET last_seq = excluded.last_seq
         WHERE b.last_seq < excluded.last_seq AND b.allocation_id = excluded.allocation_id;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows = 0 THEN
            RETURN 0;
        END IF;
    END IF;
    RETURN det_internal.append_metrics(a, p_groups, p_steps, p_values);
END $$;

CREATE OR REPLACE FUNCTION det_task.report_metrics(
    p_token text, p_group text, p_steps_completed bigint, p_metrics jsonb
) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Append one metrics row (no re-send check: the harness uses det_task.report_metrics_batch).
    SELECT FROM det_task.report_metrics_batch(p_token, NULL, NULL, ARRAY[p_group],
                                         ARRAY[p_steps_completed], ARRAY[p_metrics]);
$$;

CREATE OR REPLACE FUNCTION det_task.report_checkpoint(
    p_token text, p_uuid uuid, p_steps_completed bigint, p_resources jsonb, p_metadata jsonb
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Record a checkpoint the task has finished writing; it becomes the trial's restart point.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    INSERT INTO checkpoints (uuid, trial_id, allocation_id, steps_completed, storage, resources,
                             metadata)
    SELECT p_uuid, a.trial_id, a.id, p_steps_completed, e.config -> 'checkpoint_storage',
           coalesce(p_resources, '{}'), coalesce(p_metadata, '{}')
    FROM trials t JOIN experiments e ON e.id = t.experiment_id WHERE t.id = a.trial_id;
    UPDATE trials SET latest_checkpoint = p_uuid, steps_completed = p_steps_completed
     WHERE id = a.trial_id AND steps_completed <= p_steps_completed;
END $$;

CREATE OR REPLACE FUNCTION det_internal.unmanaged_run(p_allocation bigint) RETURNS allocations
LANGUAGE plpgsql STABLE SET search_path = public, pg_temp AS $$
-- The unmanaged run p_allocation, for its script to report into: refused unless the run is
-- its trial's latest (a later start of the script took over: object_not_in_prerequisite_state),
-- the trial is still live (ended: the same), and the caller is the experiment's owner and
-- still an Editor of its workspace (insufficient_privilege; a caller who cannot view it, or a
-- run of a managed trial: no_data_found). Upstream lets the script's session write into its
-- own trial only; a Viewer of the workspace never can.
DECLARE
    a allocations;
    v_owner text;
    v_ws integer;
    v_state trial_state;
    v_latest integer;
BEGIN
    SELECT * INTO a FROM allocations WHERE id = p_allocation;
    SELECT e.owner, j.workspace_id, t.state, t.runs INTO v_owner, v_ws, v_state, v_latest
      FROM trials t JOIN experiments e ON e.id = t.experiment_id JOIN jobs j ON j.id = e.job_id
     WHERE t.id = a.trial_id AND e.unmanaged;
    IF NOT FOUND OR NOT (det_user.is_owner_session() OR det_user.permitted(det_user.caller(),
        'view', v_ws)) THEN
        RAISE EXCEPTION 'unmanaged run % not found', p_allocation USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.require('edit', v_ws, format('report into trial %s', a.trial_id));
    IF v_owner <> det_user.caller() AND NOT det_user.is_owner_session() THEN
        RAISE EXCEPTION 'permission denied: trial % is %''s unmanaged trial; only its owner '
                        'reports into it', a.trial_id, to_jsonb(v_owner)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF a.run <> v_latest THEN
        RAISE EXCEPTION 'unmanaged run % of trial % was replaced by run % (the script was '
                        'started again)', a.run, a.trial_id, v_latest
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF v_state <> 'ACTIVE' THEN
        RAISE EXCEPTION 'trial % is %: it takes no more reports', a.trial_id, v_state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN a;
END $$;

CREATE OR REPLACE FUNCTION det_user.unmanaged_start(
    p_config jsonb, p_original_config text, p_workspace text, p_project text,
    p_external_experiment text, p_external_trial text, p_hparams jsonb
) RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- core_v2.init of a script outside det (Determined 0.38's unmanaged mode): a new run of a
-- trial of an unmanaged experiment owned by the caller, in one transaction. The experiment is
-- the caller's with external id p_external_experiment if there is one, else a new one
-- submitted as det_user.create_experiment submits (p_config: the expanded config; same checks,
-- placement and permission); the trial is its trial with external id p_external_trial if
-- any, else a new one with hyperparameters p_hparams. A resumed experiment or trial that had
-- ended is ACTIVE again. The run is an allocation born TERMINATED and settled (no pass places
-- or ends it; det_user.unmanaged_end stamps its end); it supersedes what earlier runs reported
-- after the trial's latest checkpoint (det_internal.metrics_supersede), as a managed run's start
-- does. Returns det_task.info's object. Refused: p_external_trial without
-- p_external_experiment (invalid_parameter_value, as upstream requires both); a paused or
-- stopping experiment (object_not_in_prerequisite_state).
DECLARE
    v_user text := det_user.caller();
    e experiments;
    t trials;
    v_exp integer;
    v_alloc bigint;
BEGIN
    IF p_external_trial IS NOT NULL AND p_external_experiment IS NULL THEN
        RAISE EXCEPTION 'external_trial_id: needs external_experiment_id as well'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_hparams IS NOT NULL AND jsonb_typeof(p_hparams) <> 'object' THEN
        RAISE EXCEPTION 'hparams: expected a JSON object, got %', jsonb_typeof(p_hparams)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_external_experiment IS NOT NULL THEN
        -- Two first starts with one external id make one experiment.
        PERFORM pg_advisory_xact_lock(hashtext('det_user.unmanaged_start'),
                                      hashtext(v_user || '/' || p_external_experiment));
        SELECT * INTO e FROM experiments
         WHERE owner = v_user AND external_id = p_external_experiment FOR NO KEY UPDATE;
    END IF;
    IF e.id IS NULL THEN
        v_exp := det_user.create_experiment(p_config, p_original_config, NULL, p_workspace,
                                       p_project);
        UPDATE experiments SET unmanaged = true, external_id = p_external_experiment
         WHERE id = v_exp RETURNING * INTO e;
    ELSIF e.state IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        PERFORM det_internal.require('edit', (SELECT workspace_id FROM jobs WHERE id = e.job_id),
                            format('resume experiment %s', e.id));
        UPDATE experiments SET state = 'ACTIVE', end_time = NULL WHERE id = e.id;
    ELSIF e.state <> 'ACTIVE' THEN
        RAISE EXCEPTION 'experiment % is %: activate it to resume it', e.id, e.state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    ELSE
        PERFORM det_internal.require('edit', (SELECT workspace_id FROM jobs WHERE id = e.job_id),
                            format('resume experiment %s', e.id));
    END IF;
    IF p_external_trial IS NOT NULL THEN
        SELECT * INTO t FROM trials
         WHERE experiment_id = e.id AND external_id = p_external_trial FOR NO KEY UPDATE;
    END IF;
    IF t.id IS NULL THEN
        INSERT INTO trials (experiment_id, request_id, hparams, seed, external_id)
        VALUES (e.id, gen_random_uuid(), coalesce(p_hparams, '{}'),
                coalesce(e.experiment_seed, 0),
                p_external_trial)
        RETURNING * INTO t;
    END IF;
    UPDATE trials SET runs = runs + 1, state = 'ACTIVE', end_time = NULL, exit_reason = NULL
     WHERE id = t.id RETURNING * INTO t;
    INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec, state,
                             settled, started_at, running_at, ended_at, preemptible)
    SELECT e.job_id, t.id, t.runs, j.resource_pool, 0,
           jsonb_build_object('kind', 'unmanaged', 'experiment_id', e.id, 'trial_id', t.id),
           'TERMINATED', true, now(), now(), now(), false
      FROM jobs j WHERE j.id = e.job_id
    RETURNING id INTO v_alloc;
    PERFORM det_internal.metrics_supersede(v_alloc);
    RETURN jsonb_build_object(
        'allocation_id', v_alloc, 'trial_id', t.id, 'experiment_id', e.id,
        'config', (SELECT config FROM experiments WHERE id = e.id), 'hparams', t.hparams,
        'trial_seed', t.seed, 'latest_checkpoint', t.latest_checkpoint,
        'steps_completed', t.steps_completed, 'slots', 1);
END $$;

CREATE OR REPLACE FUNCTION det_user.unmanaged_report_metrics(
    p_allocation bigint, p_group text, p_steps_completed bigint, p_metrics jsonb
) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An unmanaged script's metrics report (det_internal.unmanaged_run: who may;
-- det_internal.append_metrics: what is refused).
    SELECT FROM det_internal.append_metrics(det_internal.unmanaged_run(p_allocation),
        ARRAY[p_group],
                                   ARRAY[p_steps_completed], ARRAY[p_metrics]);
$$;

CREATE OR REPLACE FUNCTION det_user.unmanaged_report_checkpoint(
    p_allocation bigint, p_uuid uuid, p_steps_completed bigint, p_resources jsonb,
    p_metadata jsonb
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An unmanaged script stored a checkpoint (det_internal.unmanaged_run: who may); it becomes the
-- trial's restart point, as det_task.report_checkpoint's. Its files lie where the script wrote
-- them, which det's GC tasks may not reach, so no GC policy applies to it (gc_pending false):
-- upstream collects no unmanaged checkpoint either.
DECLARE
    a allocations := det_internal.unmanaged_run(p_allocation);
BEGIN
    INSERT INTO checkpoints (uuid, trial_id, allocation_id, steps_completed, storage, resources,
                             metadata, gc_pending)
    SELECT p_uuid, a.trial_id, a.id, p_steps_completed, e.config -> 'checkpoint_storage',
           coalesce(p_resources, '{}'), coalesce(p_metadata, '{}'), false
    FROM trials t JOIN experiments e ON e.id = t.experiment_id WHERE t.id = a.trial_id;
    UPDATE trials SET latest_checkpoint = p_uuid, steps_completed = p_steps_completed
     WHERE id = a.trial_id AND steps_completed <= p_steps_completed;
END $$;

CREATE OR REPLACE FUNCTION det_user.unmanaged_progress(p_allocation bigint, p_progress double precision)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- core_v2.train.report_progress: the fraction (0 to 1) of the experiment's work done, shown as
-- its progress. Refused outside [0, 1] (invalid_parameter_value).
DECLARE
    a allocations := det_internal.unmanaged_run(p_allocation);
BEGIN
    IF p_progress IS NULL OR NOT p_progress BETWEEN 0 AND 1 THEN
        RAISE EXCEPTION 'progress: expected 0 to 1, not %', p_progress
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE experiments SET progress = p_progress
     WHERE id = (SELECT experiment_id FROM trials WHERE id = a.trial_id);
END $$;

CREATE OR REPLACE FUNCTION det_user.unmanaged_end(p_allocation bigint, p_error text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- core_v2.close: the run ends, and with it its trial, COMPLETED, or ERROR when p_error (the
-- script's exception, kept as the run's exit reason) is given, as upstream's unmanaged
-- heartbeat sets the trial's state at exit. The experiment ends when it has no live trial
-- left: ERROR if one of its trials errored, else COMPLETED.
DECLARE
    a allocations := det_internal.unmanaged_run(p_allocation);
    v_exp integer;
BEGIN
    UPDATE allocations
       SET ended_at = now(), exit_code = CASE WHEN p_error IS NULL THEN 0 ELSE 1 END,
           exit_reason = coalesce(left(p_error, 4096), 'completed')
     WHERE id = a.id;
    UPDATE trials
       SET state = CASE WHEN p_error IS NULL THEN 'COMPLETED' ELSE 'ERROR' END::trial_state,
           end_time = now(), exit_reason = CASE WHEN p_error IS NOT NULL THEN 'errored' END
     WHERE id = a.trial_id RETURNING experiment_id INTO v_exp;
    UPDATE experiments e
       SET state = CASE WHEN EXISTS (SELECT 1 FROM trials t
                                      WHERE t.experiment_id = e.id AND t.state = 'ERROR')
                        THEN 'ERROR' ELSE 'COMPLETED' END::experiment_state,
           end_time = now(), progress = CASE WHEN p_error IS NULL THEN 1 ELSE e.progress END
     WHERE e.id = v_exp
       AND NOT EXISTS (SELECT 1 FROM trials t WHERE t.experiment_id = e.id
           AND t.state < 'COMPLETED');
END $$;

CREATE OR REPLACE FUNCTION det_task.checkpoint_begin(p_token text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The task is about to write a checkpoint: refused (SQLSTATE 28000, det_internal.auth) once its
-- allocation was ended (agent lost, run killed), so a fenced run writes no files.
-- det_task.report_checkpoint checks again when the files are in place.
BEGIN
    PERFORM det_internal.auth(p_token);
END $$;

CREATE OR REPLACE FUNCTION det_task.report_storage_error(p_token text, p_message text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The task could not write a checkpoint to its storage (no space, quota, read-only, I/O
-- error): p_message, one line naming the path and the OS error, becomes the run's exit reason
-- (allocations.storage_error), control characters made spaces, cut to 1000 characters. A
-- blank message is invalid_parameter_value.
DECLARE
    a allocations := det_internal.auth(p_token);
    v_line text := btrim(regexp_replace(p_message, '[[:cntrl:]]+', ' ', 'g'));
BEGIN
    IF v_line IS NULL OR v_line = '' THEN
        RAISE EXCEPTION 'storage error: a message naming the path and the error is required'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE allocations SET storage_error = left(v_line, 1000) WHERE id = a.id;
END $$;

CREATE OR REPLACE FUNCTION det_task.secrets(p_token text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling task's own secrets: {job_id, jupyter_token, ssh_public_key} (its server needs
-- them; the private key stays with det).
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    RETURN (SELECT jsonb_build_object('job_id', s.job_id, 'jupyter_token', s.jupyter_token,
                                      'ssh_public_key', s.ssh_public_key)
              FROM task_secrets s WHERE s.job_id = a.job_id);
END $$;

CREATE OR REPLACE FUNCTION det_task.ready(p_token text, p_address text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling task's server answers at p_address (host:port; a shell's is user@host:port, the
-- user its sshd lets in): det serve proxies to it. The task's use starts now (last_activity),
-- so the idle clock counts from here.
DECLARE
    a allocations := det_internal.auth(p_token);
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

CREATE OR REPLACE FUNCTION det_task.activity(p_token text, p_at timestamptz) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling task's server saw use at p_at (an open kernel, terminal or SSH session, by its
-- idle type); a time in the future counts as now.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    UPDATE tasks SET last_activity = least(now(), p_at)
     WHERE job_id = a.job_id AND last_activity < least(now(), p_at);
END $$;

CREATE OR REPLACE FUNCTION det_task.tensorboard_sources(p_token text)
RETURNS TABLE (experiment_id integer, trial_id integer, storage jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The event files the calling TensorBoard task shows (det.harness.tensorboard writes them
-- under <storage>/tensorboard/experiment/<id>/trial/<id>): a row per experiment of its
-- experiment_ids (trial_id NULL: all its trials, those that start later too) and a row per
-- trial of its trial_ids, each with its experiment's checkpoint storage, credentials left out
-- (a viewer of the experiment may open the TensorBoard). The token's own task only; no row
-- for another kind of task. Its agent calls it too, to mount the directories in a container.
DECLARE
    a allocations := det_internal.auth(p_token);
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

CREATE OR REPLACE FUNCTION det_user.task_open(p_job bigint)
RETURNS TABLE (type text, state text, address text, jupyter_token text, end_reason text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- What det serve's proxy needs to open task p_job for the caller: its kind, its run's state,
-- its server's address (NULL until it answers), the Jupyter token it injects, and why it
-- ended. Opening a TensorBoard needs view permission; a notebook, shell or command runs code
-- as the task's owner, so opening one needs edit (Editor). Touches last_activity (proxied
-- traffic is use) at most once every 5 seconds, so a busy page costs no write per request.
DECLARE
    t tasks := det_internal.task_find(p_job, 'view', 'open');
BEGIN
    IF t.type <> 'TENSORBOARD' THEN
        PERFORM det_internal.require('edit', (SELECT j.workspace_id FROM jobs j WHERE j.id = p_job),
                            format('open %s %s', lower(t.type), p_job));
    END IF;
    UPDATE tasks SET last_activity = now()
     WHERE job_id = p_job AND last_activity < now() - interval '5 seconds';
    RETURN QUERY
    SELECT t.type, a.state::text, a.address, s.jupyter_token, t.end_reason
      FROM allocations a JOIN task_secrets s ON s.job_id = a.job_id
     WHERE a.job_id = p_job ORDER BY a.run DESC LIMIT 1;
END $$;

CREATE OR REPLACE FUNCTION det_user.task_ssh_key(p_job bigint) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The private key that opens shell p_job (`det shell open`): Editor of its workspace.
DECLARE
    t tasks := det_internal.task_find(p_job, 'edit', 'open');
BEGIN
    IF t.type <> 'SHELL' THEN
        RAISE EXCEPTION 'task %: a %, not a shell', p_job, lower(t.type)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN (SELECT ssh_private_key FROM task_secrets WHERE job_id = p_job);
END $$;

CREATE OR REPLACE FUNCTION det_task.current_op(p_token text) RETURNS jsonb LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The trial's oldest open searcher operation as {id, length}; {"wait": true} while the
-- searcher has not yet read the trial's events (its next op is not decided yet: ask again);
-- NULL when the searcher wants nothing more from it, which marks the allocation out_of_work
-- (the task then checkpoints and exits so its slots go back).
DECLARE
    a allocations := det_internal.auth(p_token);
    v_op jsonb;
BEGIN
    SELECT jsonb_build_object('id', o.id, 'length', o.length) INTO v_op
      FROM searcher_ops o WHERE o.trial_id = a.trial_id AND NOT o.completed
     ORDER BY o.id LIMIT 1;
    IF v_op IS NOT NULL THEN
        RETURN v_op;
    END IF;
    IF EXISTS (SELECT 1 FROM searcher_events v JOIN trials t ON t.experiment_id = v.experiment_id
                WHERE t.id = a.trial_id AND v.trial_id = t.id AND NOT v.consumed) THEN
        RETURN jsonb_build_object('wait', true);
    END IF;
    UPDATE allocations SET out_of_work = true WHERE id = a.id;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION det_task.report_progress(p_token text, p_op_id bigint, p_units double precision)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The units of its op the trial has trained (absolute, in the op's unit: searcher_ops.length;
-- not a fraction). Refused (invalid_parameter_value) unless a finite number >= 0; stored at
-- most the op's length (a length in epochs or records is trained in whole batches, so the
-- last report may pass it by part of a batch).
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    IF p_units IS NULL OR p_units = 'NaN' OR p_units < 0 OR p_units = 'Infinity' THEN
        RAISE EXCEPTION 'progress: expected a finite number of units >= 0, not %',
            coalesce(p_units::text, 'null') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE searcher_ops SET progress = least(p_units, length)
     WHERE id = p_op_id AND trial_id = a.trial_id;
END $$;

CREATE OR REPLACE FUNCTION det_task.complete_op(p_token text, p_op_id bigint, p_metric double precision)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The trial trained to the op's length and validated: record the searcher metric and a
-- validation_completed event, which the searcher reads as it decides (under adaptive ASHA's
-- time_metric, as nothing: the trial's validation rows are its results). Completing an op
-- twice is a no-op.
DECLARE
    a allocations := det_internal.auth(p_token);
    o searcher_ops;
BEGIN
    UPDATE searcher_ops SET completed = true, metric = p_metric, progress = length
     WHERE id = p_op_id AND trial_id = a.trial_id AND NOT completed
    RETURNING * INTO o;
    IF FOUND THEN
        INSERT INTO searcher_events (experiment_id, trial_id, kind, payload)
        SELECT t.experiment_id, t.id, 'validation_completed',
               jsonb_build_object('length', o.length, 'metric', p_metric)
        FROM trials t WHERE t.id = a.trial_id;
        PERFORM pg_notify(det_internal.channel('reconciler', ''), 'searcher');
    END IF;
END $$;

CREATE OR REPLACE FUNCTION det_task.should_preempt(p_token text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN (det_internal.auth(p_token)).desired_state <> 'RUNNING';
END $$;

CREATE OR REPLACE FUNCTION det_task.stop_reason(p_token text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Why det asks the run holding p_token to stop, for the harness's preemption line: the
-- run's stop_reason (written with its desired state, migration 0040: 'paused: its experiment
-- was paused', 'preempted: slots given to experiment 3 (fair share)'); NULL while it is not
-- asked to stop.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    IF a.desired_state = 'RUNNING' THEN
        RETURN NULL;
    END IF;
    RETURN coalesce(a.stop_reason, 'det asked the run to stop');
END $$;

CREATE OR REPLACE FUNCTION det_task.ack_preemption(p_token text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    UPDATE allocations SET preempt_acked = true WHERE id = a.id;
END $$;

CREATE OR REPLACE FUNCTION det_task.report_early_exit(p_token text, p_reason text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The trial ends itself, for one of the early_exit_reason labels.
DECLARE
    a allocations := det_internal.auth(p_token);
    v_reason early_exit_reason;
BEGIN
    BEGIN
        v_reason := p_reason::early_exit_reason;
    EXCEPTION WHEN invalid_text_representation THEN
        RAISE EXCEPTION 'early exit reason must be one of %, not "%"',
            array_to_string(enum_range(NULL::early_exit_reason)::text[], ', '), p_reason
            USING ERRCODE = 'invalid_parameter_value';
    END;
    UPDATE trials SET closed = true, exit_reason = v_reason::text WHERE id = a.trial_id;
    UPDATE searcher_ops SET completed = true WHERE trial_id = a.trial_id AND NOT completed;
END $$;

CREATE OR REPLACE FUNCTION det_task.experiment_best_validation(p_token text) RETURNS double precision
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT CASE WHEN e.smaller_is_better
                THEN min(t.best_validation) ELSE max(t.best_validation) END
    FROM allocations a
    JOIN trials me ON me.id = a.trial_id
    JOIN experiments e ON e.id = me.experiment_id
    JOIN trials t ON t.experiment_id = e.id
    WHERE a.id = (det_internal.auth(p_token)).id
    GROUP BY e.id;
$$;

CREATE OR REPLACE FUNCTION det_internal.preempted_reason(p_job bigint, p_rule text) RETURNS text
LANGUAGE sql STABLE AS $$
-- The stop reason of a run the scheduler preempted: 'preempted: slots given to experiment 3
-- (fair share)'. p_job: the job its slots go to (NULL: not known); p_rule: the scheduler's
-- rule. det_user.run_status knows a preempted run by this prefix.
SELECT format('preempted: slots given to %s (%s)',
              coalesce(det_internal.job_label(p_job), 'a waiting job'), p_rule);
$$;

CREATE OR REPLACE FUNCTION det_user.run_status(p_allocation bigint) RETURNS text
LANGUAGE sql STABLE STRICT AS $$
-- A run as users should read it, agreeing with the job queue (a trial waiting for a slot
-- reads waiting, not "running"): waiting (for slots: pending_reason says why), starting (slots
-- held, its process or container not yet running), running, preempting or stopping (told to stop,
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

CREATE OR REPLACE FUNCTION det_user.run_reason(p_allocation bigint) RETURNS text
LANGUAGE sql STABLE STRICT AS $$
-- The reason that goes with det_user.run_status: the scheduler's while it waits, det's while it
-- is told to stop, det_user.run_end_reason once it ended; NULL while it starts or runs.
SELECT CASE WHEN a.state = 'PENDING' AND a.desired_state = 'RUNNING' THEN a.pending_reason
            WHEN a.state = 'TERMINATED' THEN det_user.run_end_reason(a.id)
            WHEN a.desired_state <> 'RUNNING' THEN a.stop_reason END
  FROM allocations a WHERE a.id = p_allocation;
$$;

CREATE OR REPLACE FUNCTION det_internal.checkpoint_gc(
    p_experiment integer, p_save_experiment_best integer DEFAULT NULL,
    p_save_trial_best integer DEFAULT NULL, p_save_trial_latest integer DEFAULT NULL
) RETURNS integer LANGUAGE plpgsql AS $$
-- Apply the keep rule: what det_user.checkpoints_to_delete returns becomes DELETING (the GC task
-- the reconciler then schedules removes the files). Returns how many were marked.
DECLARE
    v_n integer;
BEGIN
    UPDATE checkpoints c SET state = 'DELETING', delete_requested_at = now()
      FROM det_user.checkpoints_to_delete(p_experiment, p_save_experiment_best, p_save_trial_best,
                                     p_save_trial_latest) d
     WHERE c.uuid = d.uuid AND c.state = 'COMPLETED';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n - det_internal.unpin_deleting();
END $$;

CREATE OR REPLACE FUNCTION det_user.set_gc_policy(
    p_experiment integer, p_save_experiment_best integer, p_save_trial_best integer,
    p_save_trial_latest integer
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment set gc-policy`: store the new save_* values in the experiment's config and,
-- if it has ended, apply them now (a running experiment applies them at its next checkpoint,
-- when the pass looks at its new checkpoints, or when it ends). Returns the checkpoints marked
-- DELETING.
DECLARE
    e experiments;
BEGIN
    PERFORM det_internal.require('edit', det_user.experiment_workspace(p_experiment),
                        format('set the GC policy of experiment %s', p_experiment));
    SELECT * INTO e FROM experiments WHERE id = p_experiment FOR UPDATE;
    IF least(p_save_experiment_best, p_save_trial_best, p_save_trial_latest) < 0 THEN
        RAISE EXCEPTION 'gc policy: save_experiment_best, save_trial_best and save_trial_latest must be 0 or more'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(e.config -> 'checkpoint_storage') IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'experiment %: it has no checkpoint_storage to set a GC policy on',
            p_experiment USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE experiments
       SET config = jsonb_set(config, '{checkpoint_storage}', config -> 'checkpoint_storage'
                              || jsonb_build_object('save_experiment_best', p_save_experiment_best,
                                                    'save_trial_best', p_save_trial_best,
                                                    'save_trial_latest', p_save_trial_latest))
     WHERE id = p_experiment;
    PERFORM det_internal.audit('set_gc_policy', 'experiment', p_experiment::text,
                      jsonb_build_object('save_experiment_best', p_save_experiment_best,
                                         'save_trial_best', p_save_trial_best,
                                         'save_trial_latest', p_save_trial_latest));
    IF e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RETURN 0;
    END IF;
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'checkpoint_gc');
    RETURN det_internal.checkpoint_gc(p_experiment);
END $$;

CREATE OR REPLACE FUNCTION det_user.delete_checkpoints(p_uuids uuid[]) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det checkpoint delete`: the checkpoints become DELETING (one already DELETING is asked
-- again, so a GC that gave up tries again; a DELETED one is left as it is). All or none:
-- refused for an unknown or pinned checkpoint, or one of an experiment that has not ended.
-- Returns the checkpoints asked to be deleted. Editor of each checkpoint's workspace.
DECLARE
    v_missing uuid;
    v_bad record;
    v_n integer;
BEGIN
    SELECT u INTO v_missing FROM unnest(p_uuids) u
     WHERE NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.uuid = u) LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'checkpoint % not found', v_missing USING ERRCODE = 'no_data_found';
    END IF;
    FOR v_bad IN SELECT c.uuid, j.workspace_id FROM checkpoints c
                   JOIN trials t ON t.id = c.trial_id JOIN experiments e ON e.id = t.experiment_id
                   JOIN jobs j ON j.id = e.job_id WHERE c.uuid = ANY(p_uuids) LOOP
        PERFORM det_internal.require('edit', v_bad.workspace_id, format('delete checkpoint %s',
            v_bad.uuid));
    END LOOP;
    SELECT c.uuid INTO v_missing FROM checkpoints c JOIN checkpoint_pins p
        ON p.checkpoint_uuid = c.uuid
     WHERE c.uuid = ANY(p_uuids) LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'checkpoint % is pinned (registered in the model registry, or an experiment warm-starts from it): it cannot be deleted',
            v_missing USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT c.uuid, e.id, e.state INTO v_bad
      FROM checkpoints c JOIN trials t ON t.id = c.trial_id
      JOIN experiments e ON e.id = t.experiment_id
     WHERE c.uuid = ANY(p_uuids) AND e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'checkpoint %: experiment % is %; its checkpoints can be deleted once it has ended',
            v_bad.uuid, v_bad.id, v_bad.state USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE checkpoints SET state = 'DELETING', delete_requested_at = now()
     WHERE uuid = ANY(p_uuids) AND state IN ('COMPLETED', 'DELETING');
    GET DIAGNOSTICS v_n = ROW_COUNT;
    PERFORM det_internal.audit('delete', 'checkpoint', u::text) FROM unnest(p_uuids) u;
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'checkpoint_gc');
    RETURN v_n - det_internal.unpin_deleting();  -- pinned since the check above
END $$;

CREATE OR REPLACE FUNCTION det_user.checkpoint_add_metadata(p_uuid uuid, p_metadata jsonb) RETURNS jsonb
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
    PERFORM det_internal.require('edit', v_workspace,
        format('add metadata to checkpoint %s', p_uuid));
    UPDATE checkpoints SET metadata = metadata || p_metadata WHERE uuid = p_uuid
    RETURNING metadata INTO v_metadata;
    RETURN v_metadata;
END $$;

CREATE OR REPLACE FUNCTION det_user.experiment_archive(p_id integer, p_archived boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment archive | unarchive`: an archived experiment is hidden from default lists
-- (spec: experiment-lifecycle). Only an ended experiment can be archived (else a
-- check_violation: an illegal transition).
DECLARE
    v_state experiment_state;
BEGIN
    PERFORM det_internal.require('edit', det_user.experiment_workspace(p_id),
                        format('%s experiment %s', CASE WHEN p_archived THEN 'archive'
                                                        ELSE 'unarchive' END, p_id));
    SELECT state INTO v_state FROM experiments WHERE id = p_id FOR UPDATE;
    IF p_archived AND v_state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RAISE EXCEPTION 'experiment % is %: only an ended experiment can be archived', p_id,
            v_state USING ERRCODE = 'check_violation';
    END IF;
    UPDATE experiments SET archived = p_archived WHERE id = p_id;
    PERFORM det_internal.audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END,
        'experiment',
                      p_id::text);
END $$;

CREATE OR REPLACE FUNCTION det_internal.purge_experiment(p_id integer) RETURNS boolean LANGUAGE plpgsql AS $$
-- Remove an experiment whose deletion was asked for, with its trials, runs, metrics, logs,
-- checkpoint rows, searcher rows and job (its context too, if no other experiment shares it),
-- once none of its checkpoints is DELETING, none of its runs is live, and its TensorBoard files
-- are gone if a trial of it ever ran (a GC task removes them,
-- det_task.gc_task_tensorboards_deleted). Returns false (and removes nothing) while that is not yet
-- so.
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
    DELETE FROM task_logs l USING allocations a WHERE l.allocation_id = a.id
        AND a.job_id = e.job_id;
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

CREATE OR REPLACE FUNCTION det_user.experiment_delete(p_id integer) RETURNS boolean LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment delete`: for an ended experiment none of whose checkpoints is pinned. Its
-- checkpoints become DELETING (their files are removed by a GC task), and its rows go in one
-- transaction once that is done (det_internal.purge_experiment: here if nothing is left to remove,
-- else by the reconciler). Asking again retries a GC that gave up. Returns true when the
-- rows are already gone.
DECLARE
    v_state experiment_state;
    v_pinned uuid;
BEGIN
    PERFORM det_internal.require('edit', det_user.experiment_workspace(p_id),
                        format('delete experiment %s', p_id));
    SELECT state INTO v_state FROM experiments WHERE id = p_id FOR UPDATE;
    IF v_state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RAISE EXCEPTION 'experiment % is %: only an ended experiment can be deleted (kill it first)',
            p_id, v_state USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT c.uuid INTO v_pinned
      FROM checkpoints c JOIN trials t ON t.id = c.trial_id
      JOIN checkpoint_pins p ON p.checkpoint_uuid = c.uuid
     WHERE t.experiment_id = p_id AND c.state <> 'DELETED' LIMIT 1;
    IF v_pinned IS NOT NULL THEN
        RAISE EXCEPTION 'experiment %: checkpoint % is pinned (registered in the model registry, or an experiment warm-starts from it); the experiment cannot be deleted',
            p_id, v_pinned USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE experiments SET delete_requested_at = now(), checkpoint_gc_error = NULL WHERE id = p_id;
    UPDATE checkpoints c SET state = 'DELETING', delete_requested_at = now()
      FROM trials t
     WHERE t.id = c.trial_id AND t.experiment_id = p_id AND c.state IN ('COMPLETED', 'DELETING');
    PERFORM det_internal.unpin_deleting();  -- pinned since the check above: kept, and so is the experiment
    PERFORM det_internal.audit('delete', 'experiment', p_id::text);
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'checkpoint_gc');
    RETURN det_internal.purge_experiment(p_id);
END $$;

CREATE OR REPLACE FUNCTION det_internal.gc_auth(p_token text) RETURNS allocations LANGUAGE plpgsql STABLE AS $$
-- The live GC task holding this token (det_internal.auth), or an error: a trial's token cannot call
-- the GC task's functions.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    IF a.spec ->> 'kind' IS DISTINCT FROM 'checkpoint_gc' THEN
        RAISE EXCEPTION 'allocation %: only a checkpoint GC task may remove checkpoints', a.id
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    RETURN a;
END $$;

CREATE OR REPLACE FUNCTION det_task.gc_task_checkpoints(p_token text, p_limit integer)
RETURNS TABLE (uuid uuid, storage jsonb, size_bytes bigint) LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Up to p_limit DELETING checkpoints of the GC task's experiment, in order, for the task to
-- remove their files. Pinned ones are first put back (det_internal.unpin_deleting), so a checkpoint
-- pinned since it was marked is never handed out.
DECLARE
    a allocations := det_internal.gc_auth(p_token);
BEGIN
    PERFORM det_internal.unpin_deleting();
    RETURN QUERY
    SELECT c.uuid, c.storage,
           (SELECT sum(r.value::bigint) FROM jsonb_each_text(c.resources) r)::bigint
      FROM experiments e JOIN trials t ON t.experiment_id = e.id
      JOIN checkpoints c ON c.trial_id = t.id
     WHERE e.job_id = a.job_id AND c.state = 'DELETING'
     ORDER BY c.trial_id, c.steps_completed, c.uuid
     LIMIT p_limit;
END $$;

CREATE OR REPLACE FUNCTION det_task.gc_task_tensorboards(p_token text)
RETURNS TABLE (experiment_id integer, storage jsonb) LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The GC task's experiment and its checkpoint storage when a user asked to delete it (its
-- TensorBoard files go too); no row otherwise.
DECLARE
    a allocations := det_internal.gc_auth(p_token);
BEGIN
    RETURN QUERY
    SELECT e.id, e.config -> 'checkpoint_storage'
      FROM experiments e
     WHERE e.job_id = a.job_id AND e.delete_requested_at IS NOT NULL;
END $$;

CREATE OR REPLACE FUNCTION det_task.gc_task_tensorboards_deleted(p_token text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The GC task removed the TensorBoard files of its experiment being deleted: its rows may go
-- (det_internal.purge_experiment).
DECLARE
    a allocations := det_internal.gc_auth(p_token);
BEGIN
    UPDATE experiments SET tensorboards_deleted_at = now()
     WHERE job_id = a.job_id AND delete_requested_at IS NOT NULL;
END $$;

CREATE OR REPLACE FUNCTION det_task.gc_task_deleted(p_token text, p_uuids uuid[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The GC task removed these checkpoints' files: they become DELETED, with the bytes freed.
-- Once none of the experiment's checkpoints is DELETING its GC error is cleared. Returns the
-- rows changed (a repeat changes none).
DECLARE
    a allocations := det_internal.gc_auth(p_token);
    v_exp integer;
    v_n integer;
BEGIN
    SELECT id INTO v_exp FROM experiments WHERE job_id = a.job_id;
    UPDATE checkpoints c
       SET state = 'DELETED', deleted_at = now(),
           freed_bytes = coalesce((SELECT sum(r.value::bigint)
                                     FROM jsonb_each_text(c.resources) r), 0)
      FROM trials t
     WHERE t.id = c.trial_id AND t.experiment_id = v_exp AND c.uuid = ANY(p_uuids)
       AND c.state = 'DELETING';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    UPDATE experiments SET checkpoint_gc_error = NULL
     WHERE id = v_exp AND checkpoint_gc_error IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM checkpoints c JOIN trials t ON t.id = c.trial_id
                        WHERE t.experiment_id = v_exp AND c.state = 'DELETING');
    RETURN v_n;
END $$;

CREATE OR REPLACE FUNCTION det_task.gc_task_failed(p_token text, p_message text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The GC task could not remove files (a storage error): the message is shown on the
-- experiment; the checkpoints stay DELETING.
DECLARE
    a allocations := det_internal.gc_auth(p_token);
BEGIN
    UPDATE experiments SET checkpoint_gc_error = p_message WHERE job_id = a.job_id;
END $$;

CREATE OR REPLACE FUNCTION det_task.gc_task_unrecorded(p_token text, p_uuids uuid[]) RETURNS SETOF uuid
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Of p_uuids (checkpoint directories the GC task found in its experiment's storage), those no
-- checkpoint row names, of any experiment: files a crashed run published but never recorded
-- (det.harness.checkpoint_gc sweeps them once they are old enough).
DECLARE
    a allocations := det_internal.gc_auth(p_token);
BEGIN
    RETURN QUERY
    SELECT u FROM unnest(p_uuids) AS u
     WHERE NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.uuid = u);
END $$;

CREATE OR REPLACE FUNCTION det_internal.web_end_stale_logins(p_user text, p_stamp bytea) RETURNS integer
LANGUAGE plpgsql AS $$
-- End p_user's det serve logins made under another password than the one whose stamp is
-- p_stamp (det_internal.password_stamp, read now); returns how many ended. det's own
-- change-password ends them all itself, so a login left to end here saw a password changed outside
-- det (the user's own ALTER ROLE ... PASSWORD in psql, or a superuser's): the first look after it
-- writes the audit row det's change-password would have written.
DECLARE
    v_ended integer;
BEGIN
    DELETE FROM web_sessions
     WHERE username = p_user AND password_stamp IS DISTINCT FROM p_stamp;
    GET DIAGNOSTICS v_ended = ROW_COUNT;
    IF v_ended > 0 THEN
        INSERT INTO audit_log (actor, action, object_type, object_id, detail)
        VALUES (p_user, 'change_password', 'user', p_user,
                jsonb_build_object('outside_det', true, 'logins_ended', v_ended));
    END IF;
    RETURN v_ended;
END $$;

CREATE OR REPLACE FUNCTION det_web.login(p_token text, p_user text, p_ttl_seconds double precision,
                              p_address text)
RETURNS timestamptz LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Record a login token (minted by det serve once PostgreSQL accepted p_user's password) for
-- active user p_user, good for p_ttl_seconds; returns its expiry. The token keeps the stamp
-- of the password it was minted under (det_internal.password_stamp): det_web.auth refuses it once
-- the password changes. The login is audited (outcome success, client address p_address) and
-- clears p_user's failed attempts (det_web.login_begin counted this one as failed until now).
-- Expired tokens are removed here, so the table stays as small as the live logins.
DECLARE
    v_expires timestamptz;
    v_stamp bytea := det_internal.password_stamp(p_user);
    v_address text := coalesce(p_address, 'unknown');
BEGIN
    IF NOT EXISTS (SELECT 1 FROM users WHERE username = p_user AND active) THEN
        RAISE EXCEPTION 'invalid username or password'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF NOT (p_ttl_seconds > 0 AND p_ttl_seconds <= 366 * 86400) THEN
        RAISE EXCEPTION 'token lifetime: expected seconds > 0 and at most a year, not %',
            p_ttl_seconds USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_token IS NULL OR length(p_token) < 32 THEN
        RAISE EXCEPTION 'token: expected at least 32 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM web_sessions WHERE expires_at <= now();
    PERFORM det_internal.web_end_stale_logins(p_user, v_stamp);
    v_expires := now() + make_interval(secs => p_ttl_seconds);
    INSERT INTO web_sessions (token_hash, username, expires_at, password_stamp)
    VALUES (sha256(convert_to(p_token, 'UTF8')), p_user, v_expires, v_stamp);
    UPDATE login_throttle SET failures = 0, locked_until = NULL
     WHERE kind = 'user' AND key = p_user;
    UPDATE login_throttle
       SET failures = greatest(failures - 1, 0),
           locked_until = CASE WHEN failures - 1 >= 20 THEN locked_until END
     WHERE kind = 'address' AND key = v_address;
    INSERT INTO audit_log (actor, action, object_type, object_id, detail)
    VALUES (p_user, 'login', 'user', p_user,
            jsonb_build_object('outcome', 'success', 'address', v_address));
    RETURN v_expires;
END $$;

CREATE OR REPLACE FUNCTION det_web.auth(p_token text) RETURNS text LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The active user a live login token belongs to, or an error (SQLSTATE 28000). It becomes the
-- transaction's caller (det_user.caller reads det.web_user); det serve then SETs LOCAL ROLE to it,
-- so row-level security applies to the request as to that user's own psql. NULL, with the
-- user's logins ended (det_internal.web_end_stale_logins), when the token's password is no longer
-- the user's: det serve commits that and answers 401.
DECLARE
    v_user text;
    v_stamp bytea;
BEGIN
    SELECT s.username, s.password_stamp INTO v_user, v_stamp
      FROM web_sessions s JOIN users u ON u.username = s.username
     WHERE s.token_hash = sha256(convert_to(p_token, 'UTF8')) AND s.expires_at > now()
       AND u.active;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'invalid or expired token: log in again'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF v_stamp IS DISTINCT FROM det_internal.password_stamp(v_user) THEN
        PERFORM det_internal.web_end_stale_logins(v_user, det_internal.password_stamp(v_user));
        RETURN NULL;
    END IF;
    PERFORM set_config('det.web_user', v_user, true);
    RETURN v_user;
END $$;

CREATE OR REPLACE FUNCTION det_web.login_begin(p_user text, p_address text) RETURNS double precision
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve, before it has PostgreSQL check a password for POST /api/v1/auth/login (so a
-- throttled attempt costs no SCRAM work): the seconds the client must wait (429, Retry-After),
-- or 0 to go on. The rule: 5 failures for one user name p_user (from any address),
-- or 20 from one client address p_address (for any names), each within 15 minutes of the
-- last, lock further attempts for 30 s, doubling with each failure after (at most an hour);
-- a right password is refused too until the lock ends. Going on counts the attempt as failed
-- until det_web.login records its success, so parallel guesses cannot all pass before the
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
        VALUES (det_user.caller(), 'login', 'user', p_user,
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

CREATE OR REPLACE FUNCTION det_web.login_failed(p_user text, p_address text) RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve: PostgreSQL refused the password (or the user) of an attempt det_web.login_begin let
-- through, already counted as failed there. Audited with the name tried and the client's
-- address, never the password.
    INSERT INTO audit_log (actor, action, object_type, object_id, detail)
    VALUES (det_user.caller(), 'login', 'user', p_user,
            jsonb_build_object('outcome', 'failure', 'address', coalesce(p_address, 'unknown')));
$$;

CREATE OR REPLACE FUNCTION det_internal.web_event(p_topics text[]) RETURNS void LANGUAGE sql AS $$
-- Wake det serve's event streams with one NOTIFY on the web channel (det_internal.channel) whose
-- payload is the distinct topics, space-separated (det.db.channels: "experiments",
-- "experiment:<id>", "trial:<id>", "queue", "cluster"), or "*" (every stream) when there are
-- more than 200 of them. A hint only: the servers also look on their own every second.
-- Identical payloads in one transaction are delivered once (PostgreSQL folds them).
    SELECT pg_notify(det_internal.channel('web', ''), CASE WHEN count(*) > 200 THEN '*'
                                     ELSE string_agg(t, ' ' ORDER BY t) END)
      FROM (SELECT DISTINCT t FROM unnest(p_topics) t WHERE t IS NOT NULL) d
    HAVING count(*) > 0;
$$;

CREATE OR REPLACE FUNCTION det_internal.web_event_throttled(p_topics text[]) RETURNS void
    LANGUAGE plpgsql AS $$
-- det_internal.web_event for the hot tables (metrics, task logs): at most one event per topic set
-- every 0.2 s (web_event_marks), so a busy trial costs a few NOTIFYs a second, not one per
-- batch. An event skipped here reaches the streams at the servers' next periodic look.
BEGIN
    INSERT INTO web_event_marks AS m (topic, sent_at)
    VALUES (array_to_string(p_topics, ' '), clock_timestamp())
    ON CONFLICT (topic) DO UPDATE SET sent_at = excluded.sent_at
     WHERE m.sent_at < excluded.sent_at - interval '0.2 seconds';
    IF FOUND THEN
        PERFORM det_internal.web_event(p_topics);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION det_internal.web_on_experiments() RETURNS trigger LANGUAGE plpgsql AS $$
-- Experiments submitted, or changed state, progress or archived.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_internal.web_event('{experiments,queue}'::text[] || array_agg('experiment:' || n.id))
           FROM new_rows n;
    ELSE
        PERFORM det_internal.web_event('{experiments,queue}'::text[] || array_agg('experiment:' || n.id))
           FROM new_rows n JOIN old_rows o ON o.id = n.id
          WHERE (o.state, o.progress, o.archived) IS DISTINCT FROM
                (n.state, n.progress, n.archived)
         HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION det_internal.web_on_trials() RETURNS trigger LANGUAGE plpgsql AS $$
-- Trials created, or changed state, restarts, batches, checkpoint or best validation.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_internal.web_event(array_agg('experiment:' || n.experiment_id)
                              || array_agg('trial:' || n.id))
           FROM new_rows n;
    ELSE
        PERFORM det_internal.web_event(array_agg('experiment:' || n.experiment_id)
                              || array_agg('trial:' || n.id))
           FROM new_rows n JOIN old_rows o ON o.id = n.id
          WHERE (o.state, o.restarts, o.steps_completed, o.latest_checkpoint,
                 o.best_validation) IS DISTINCT FROM
                (n.state, n.restarts, n.steps_completed, n.latest_checkpoint,
                 n.best_validation)
         HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION det_internal.web_on_allocations() RETURNS trigger LANGUAGE plpgsql AS $$
-- Runs created or changed state: the queue (slots acquired), the cluster (slots held) and
-- their trials.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_internal.web_event('{queue,cluster}'::text[] || array_agg('experiment:' || t.experiment_id)
                              || array_agg('trial:' || t.id))
           FROM new_rows n LEFT JOIN trials t ON t.id = n.trial_id;
    ELSE
        PERFORM det_internal.web_event('{queue,cluster}'::text[] || array_agg('experiment:' || t.experiment_id)
                              || array_agg('trial:' || t.id))
           FROM new_rows n JOIN old_rows o ON o.id = n.id
           LEFT JOIN trials t ON t.id = n.trial_id
          WHERE o.state IS DISTINCT FROM n.state
         HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION det_internal.web_on_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
-- A job's priority, weight, position or pool changed (det_user.job_update).
BEGIN
    PERFORM det_internal.web_event('{queue}')
       FROM new_rows n JOIN old_rows o ON o.id = n.id
      WHERE (o.priority, o.weight, o.queue_position, o.resource_pool) IS DISTINCT FROM
            (n.priority, n.weight, n.queue_position, n.resource_pool)
     HAVING count(*) > 0;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION det_internal.web_on_cluster() RETURNS trigger LANGUAGE plpgsql AS $$
-- Agents joined or changed state (enabled, disabled, lost); slots enabled or disabled.
-- Heartbeats (last_heartbeat) send nothing.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_internal.web_event('{cluster,queue}');
    ELSIF TG_TABLE_NAME = 'agents' THEN
        PERFORM det_internal.web_event('{cluster,queue}')
           FROM new_rows n JOIN old_rows o ON o.id = n.id
          WHERE o.state IS DISTINCT FROM n.state
         HAVING count(*) > 0;
    ELSE
        PERFORM det_internal.web_event('{cluster,queue}')
           FROM new_rows n JOIN old_rows o ON (o.agent_id, o.slot_id) = (n.agent_id, n.slot_id)
          WHERE o.enabled IS DISTINCT FROM n.enabled
         HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION det_internal.web_on_reports() RETURNS trigger LANGUAGE plpgsql AS $$
-- Metrics or log lines appended: one statement is one batch of a task's reports, and the
-- event per trial is throttled (det_internal.web_event_throttled).
BEGIN
    PERFORM det_internal.web_event_throttled(ARRAY['experiment:' || t.experiment_id,
        'trial:' || t.id])
       FROM trials t WHERE t.id IN (SELECT DISTINCT trial_id FROM new_rows);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION det_agent.assignments(p_agent text)
RETURNS TABLE (id bigint, desired text, state text, spec jsonb, chief text, node_state text,
               slot_ids integer[], spans boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent's work: the live allocations it is the chief of, and those it holds slots of as
-- another node of a gang (node_state: its share's state once claimed, else NULL). slot_ids:
-- the slots it holds there; spans: whether the allocation holds slots of other agents too.
#variable_conflict use_column
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    RETURN QUERY
    SELECT a.id, a.desired_state::text, a.state::text, a.spec, a.agent_id, NULL::text,
           array(SELECT h.slot_id FROM allocation_slots h
                  WHERE h.allocation_id = a.id AND h.agent_id = p_agent AND NOT h.released
                  ORDER BY h.slot_id),
           a.slots_needed > (SELECT count(*) FROM allocation_slots h
                             WHERE h.allocation_id = a.id AND h.agent_id = p_agent)
      FROM allocations a
     WHERE a.agent_id = p_agent AND a.state <> 'TERMINATED'
    UNION ALL
    SELECT a.id, a.desired_state::text, a.state::text, a.spec, a.agent_id, n.state::text,
           array(SELECT h.slot_id FROM allocation_slots h
                  WHERE h.allocation_id = a.id AND h.agent_id = p_agent AND NOT h.released
                  ORDER BY h.slot_id),
           true
      FROM allocations a
      LEFT JOIN allocation_nodes n ON n.allocation_id = a.id AND n.agent_id = p_agent
     WHERE a.agent_id <> p_agent AND a.state <> 'TERMINATED'
       AND a.id IN (SELECT h.allocation_id FROM allocation_slots h
                     WHERE h.agent_id = p_agent AND NOT h.released)
     ORDER BY 1;
END $$;

CREATE OR REPLACE FUNCTION det_agent.live_allocations(p_agent text)
RETURNS TABLE (id bigint, last_log timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The live allocations an agent is the chief of, with the time of their last shipped log
-- line: what a restarted agent adopts and where its log shipping resumes.
SELECT det_internal.agent_check_self(p_agent);
SELECT a.id, (SELECT l.ts FROM task_logs l WHERE l.allocation_id = a.id
               ORDER BY l.id DESC LIMIT 1)
  FROM allocations a
 WHERE a.agent_id = p_agent AND a.state <> 'TERMINATED';
$$;

CREATE OR REPLACE FUNCTION det_agent.context(p_agent text, p_context bigint) RETURNS bytea
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The packed model definition an agent unpacks for a run: only a context that a live
-- allocation of this agent (its chief's, or one it holds slots of) launches; NULL otherwise.
SELECT det_internal.agent_check_self(p_agent);
SELECT b.data
  FROM context_blobs b
 WHERE b.id = p_context
   AND EXISTS (SELECT 1 FROM allocations a
                WHERE a.state <> 'TERMINATED' AND (a.spec ->> 'context_id')::bigint = b.id
                  AND (a.agent_id = p_agent
                       OR a.id IN (SELECT h.allocation_id FROM allocation_slots h
                                    WHERE h.agent_id = p_agent AND NOT h.released)));
$$;

CREATE OR REPLACE FUNCTION det_user.experiment_create_check(p_workspace text, p_project text) RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Check that the caller may create an experiment in project p_project of workspace
-- p_workspace (both NULL: Uncategorized): Editor of the workspace, neither it nor the project
-- archived, the rules det_user.create_experiment applies when it stores one. det serve calls it
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
        p := det_user.project_find(p_workspace, p_project);
    END IF;
    PERFORM det_internal.require('edit', p.workspace_id,
                        format('create an experiment in project %s', to_jsonb(p.name)));
    IF p.archived OR (SELECT archived FROM workspaces WHERE id = p.workspace_id) THEN
        RAISE EXCEPTION 'project %: it (or its workspace) is archived', to_jsonb(p.name)
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN p.id;
END $$;

CREATE OR REPLACE FUNCTION det_internal.validation_reported() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A validation row of a trial of a searched experiment (not an unmanaged one: it has no
-- searcher) is a validation_reported event naming the row ({"metrics_id": id}): the pass
-- reads the row's values with the event rather than a copy, as consumed events are kept and
-- most searches read nothing of them.
BEGIN
    INSERT INTO searcher_events (experiment_id, trial_id, kind, payload)
    SELECT t.experiment_id, t.id, 'validation_reported', jsonb_build_object('metrics_id', NEW.id)
      FROM trials t JOIN experiments e ON e.id = t.experiment_id
     WHERE t.id = NEW.trial_id AND NOT e.unmanaged;
    IF FOUND THEN
        PERFORM pg_notify(det_internal.channel('reconciler', ''), 'searcher');
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION det_internal.merge_metadata(p_current jsonb, p_addition jsonb,
    p_path text DEFAULT '')
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
                                   det_internal.merge_metadata(p_current -> k, v, v_path));
        ELSE
            RAISE EXCEPTION 'metadata key "%" is already set (to %); a key cannot be changed',
                v_path, p_current -> k USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    RETURN p_current;
END $$;

CREATE OR REPLACE FUNCTION det_task.set_trial_metadata(p_token text, p_metadata jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Merge p_metadata (an object) into the calling trial's metadata (det_internal.merge_metadata);
-- returns the trial's metadata after it. Refused (invalid_parameter_value): p_metadata not
-- an object, over 64 KiB or nested deeper than 32 levels (det_internal.json_problem), or a merged
-- metadata over 1 MiB.
DECLARE
    a allocations := det_internal.auth(p_token);
    v_problem text := det_internal.json_problem(p_metadata, 65536);
    v_merged jsonb;
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'metadata %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE trials SET metadata = det_internal.merge_metadata(metadata, p_metadata)
     WHERE id = a.trial_id RETURNING metadata INTO v_merged;
    IF octet_length(v_merged::text) > 1048576 THEN
        RAISE EXCEPTION 'metadata: the trial''s metadata would be % bytes of JSON, more than '
            'the % allowed', octet_length(v_merged::text), 1048576
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN v_merged;
END $$;

CREATE OR REPLACE FUNCTION det_task.trial_metadata(p_token text) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling trial's metadata.
    SELECT metadata FROM trials WHERE id = (det_internal.auth(p_token)).trial_id;
$$;


-- The comments that name a function.

COMMENT ON TYPE instance_state IS
    'An elastic agent''s machine: REQUESTED (row written, not yet launched), STARTING '
    '(launched, its agent not yet registered), RUNNING (its agent registered), TERMINATING '
    '(asked to stop), GONE. Only moves forward (enum order; det_internal.instance_transition).';

COMMENT ON COLUMN reconciler_leader.agent_timeout IS
    'Seconds without a heartbeat after which the leader declares an agent lost (`det reconcile '
    '--agent-timeout`), recorded by each pass; agents read it (det_agent.timeout) to kill '
    'their own tasks before it expires (self-fencing, det.agent.heartbeat).';

COMMENT ON COLUMN agents.stopping IS
    'The agent is stopping (det_agent.stop_runs): nothing new is placed on it until it '
    'registers again.';

COMMENT ON COLUMN agents.gone_at IS
    'When the agent ended for good (det_agent.retire: a one-shot agent whose run ended; its '
    'instance''s process or Slurm job gone): agent and slot lists hide it. The row stays, '
    'LOST, because the runs it ran name it (allocations.agent_id). NULL again if it '
    'registers again.';

COMMENT ON TABLE agent_logins IS
    'Agents enrolled with a login of their own (det_enroll.agent_enroll): role_name '
    '(det_agent_<id>, a member of det_agent) may act only for agent_id '
    '(det_internal.agent_check_self), in resource_pool when set. Revoked (det_user.agent_revoke): '
    'the role may no longer log in. Agents without a row log in as the shared det_agent role: the '
    'single-host mode of `det cluster up`.';

COMMENT ON TABLE agent_enrollment_tokens IS
    'One-time enrollment tokens (det_user.agent_token_create). A token is the password of its own '
    'login role role_name (det_enroll_<hex>, a member of det_enroll, which may only call '
    'det_enroll.agent_enroll): PostgreSQL keeps it as a SCRAM verifier, its only stored form. Used '
    '(used_at, agent_id) it can no longer log in.';

COMMENT ON TABLE id_counters IS
    'The last id given to each kind of object users type the id of (det_internal.next_id): a row '
    'updated in the creating transaction, so ids are consecutive across crashes and '
    'rollbacks (a sequence jumps by 32 after a crash).';

COMMENT ON COLUMN experiments.unmanaged IS
    'Made by a script that reports from outside det (core_v2.init, det_user.unmanaged_start): no '
    'searcher, no runs placed; its owner''s script reports through det_user.unmanaged_*.';

COMMENT ON COLUMN experiments.tensorboards_deleted_at IS
    'When the GC task of its deletion removed its TensorBoard files (det_internal.purge_experiment '
    'waits for it when a trial of it ran, checkpoints or not).';

COMMENT ON COLUMN trials.metadata IS
    'What the trial''s code recorded with set_metadata (det_task.set_trial_metadata): a JSON '
    'object, merged key by key.';

COMMENT ON COLUMN allocations.out_of_work IS
    'The task asked for its next searcher operation and was told there was none '
    '(det_task.current_op returned NULL). A clean exit then means the run finished its work, even '
    'if the searcher opened an op for the trial meanwhile (an adaptive ASHA promotion): the '
    'trial''s next run takes that op. Without it, a clean exit with an op open means the code '
    'ended its own training.';

COMMENT ON COLUMN allocations.storage_error IS
    'The checkpoint storage error that ended the run: one line naming the path and the OS '
    'error, set by the task (det_task.report_storage_error); its exit reason, over the agent''s. '
    'A failed run with one pauses its experiment, without counting a restart '
    '(det.reconciler.trials.settle).';

COMMENT ON COLUMN allocations.planned_stop IS
    'Its agent stopped it on purpose (det_agent.stop_runs: the agent shut down; '
    'det_agent.mark_fenced: it killed its tasks for want of a heartbeat): however the run '
    'ends, its trial resumes from its latest checkpoint and the end is not a failure '
    '(restarts counts failures only).';

COMMENT ON COLUMN allocations.address IS
    'host:port of an interactive task''s server (Jupyter, TensorBoard, sshd) once it answers, '
    'recorded by the task (det_task.ready); det serve proxies /proxy/<job>/ to it.';

COMMENT ON COLUMN allocations.stop_reason IS
    'Why det asked the run to stop, written with desired_state: a preemption naming whom its slots '
    'went to (det_internal.preempted_reason), a pause, a cancel or kill, the searcher closing its '
    'trial, a kill after preemption_timeout, an interactive task''s end. Its "why it ended" is this '
    'over the run''s own reason (det_user.run_end_reason).';

COMMENT ON TABLE allocation_nodes IS
    'The agents of an allocation beyond its chief''s (node_rank 1, 2, ... in det_agent.gang_agents '
    'order), once each started its share of the workers: the token its workers use, and what '
    'its agent observed. One share failing ends the whole allocation '
    '(det_agent.report_node).';

COMMENT ON COLUMN metrics.superseded_by IS
    'The run (allocation) that resumed the trial from a checkpoint taken before this row''s step, '
    'so that this row, reported by an earlier run after that checkpoint, is no longer part of the '
    'trial''s history (det_internal.metrics_supersede); NULL for the surviving rows. Kept for '
    'audit; readers show and count only rows where it is NULL.';

COMMENT ON COLUMN tasks.last_activity IS
    'The latest sign of use: the task''s server reports it (det_task.activity: open kernels, '
    'terminals, SSH sessions) and det serve''s proxy touches it (det_user.task_open). The pass ends '
    'a task idle past its idle_timeout.';

COMMENT ON TABLE task_secrets IS
    'Per-task secrets, made at submission: the token of a notebook''s Jupyter server (only det '
    'serve''s proxy sends it) and a shell''s key pair. No user reads this table: the task gets its '
    'own through det_task.secrets, a user who may open the task through det_user.task_open and '
    'det_user.task_ssh_key.';

COMMENT ON COLUMN templates.config IS
    'The template as set, secrets included: users may not select it (nor original); '
    'det_user.template_expand gives it to an Editor of the workspace submitting an experiment.';

COMMENT ON COLUMN templates.redacted_config IS
    'config with its secrets replaced by ''********'' (det_user.redact_secrets): what users read.';

COMMENT ON COLUMN web_sessions.password_stamp IS
    'det_internal.password_stamp of the user''s password when the token was minted: the token is '
    'good only while it is still the user''s password. NULL where det cannot read verifiers.';

COMMENT ON TABLE login_throttle IS
    'Failed logins to det serve per user name tried (kind user) and per client address (kind '
    'address), and until when further attempts are refused (det_web.login_begin: the rule). A row '
    'is forgotten at forget_at, 15 minutes after its last failure or the end of its lock.';

COMMENT ON TABLE web_watchers IS
    'det serve processes with open event streams, each until its lease runs out (det_web.watch). '
    'The det_web triggers fire only while one lease is live. Unlogged: after a crash the '
    'servers take their leases again within a second.';

COMMENT ON TABLE channel_key IS
    'The secret det_internal.channel builds NOTIFY channel names from (one row, made with the '
    'schema). Granted to no role: only the owner and its SECURITY DEFINER functions read it.';


-- Policies whose sub-selects took a column name from a function's old name
-- (SELECT det_visible_workspaces() AS det_visible_workspaces): made again.

DROP POLICY visible ON workspaces;
CREATE POLICY visible ON workspaces FOR SELECT
    USING (id = ANY ((SELECT det_user.visible_workspaces())::integer[]));

DROP POLICY visible ON workspace_pools;
CREATE POLICY visible ON workspace_pools FOR SELECT
    USING (workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));

DROP POLICY visible ON projects;
CREATE POLICY visible ON projects FOR SELECT
    USING (workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));

DROP POLICY visible ON role_assignments;
CREATE POLICY visible ON role_assignments FOR SELECT
    USING (workspace_id IS NULL
        OR workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));

DROP POLICY visible ON jobs;
CREATE POLICY visible ON jobs FOR SELECT
    USING (workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));

DROP POLICY visible ON experiments;
CREATE POLICY visible ON experiments FOR SELECT
    USING (project_id = ANY ((SELECT det_user.visible_projects())::integer[]));

DROP POLICY visible ON models;
CREATE POLICY visible ON models FOR SELECT
    USING (workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));

DROP POLICY visible ON templates;
CREATE POLICY visible ON templates FOR SELECT
    USING (workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));

DROP POLICY cluster_admins ON audit_log;
CREATE POLICY cluster_admins ON audit_log FOR SELECT
    USING ((SELECT det_user.permitted(det_user.caller(), 'admin_cluster', NULL)));
