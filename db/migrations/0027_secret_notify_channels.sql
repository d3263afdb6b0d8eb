-- Issue 32: det's NOTIFY channels get names no user or task can know. PostgreSQL has no
-- privilege on LISTEN or NOTIFY, so any role could LISTEN on det_reconciler and det_web (ids
-- and activity of experiments in workspaces it cannot see) or NOTIFY them ("*" woke every
-- event stream). Each name is now built by det_channel from a random secret that only the
-- owner reads (channel_key); det's processes LISTEN through det_listen, det_web_listen,
-- det_agent_listen and det_task_listen, which never hand the name out.

CREATE TABLE channel_key (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    -- 32 bytes (244 random bits) of two v4 UUIDs: gen_random_uuid draws from the server's
    -- strong random source and needs no extension
    secret    bytea NOT NULL DEFAULT decode(replace(gen_random_uuid()::text
                                                    || gen_random_uuid()::text, '-', ''), 'hex')
);
COMMENT ON TABLE channel_key IS
    'The secret det_channel builds NOTIFY channel names from (one row, made with the schema). '
    'Granted to no role: only the owner and its SECURITY DEFINER functions read it.';
INSERT INTO channel_key DEFAULT VALUES;

CREATE FUNCTION det_channel(p_kind text, p_key text) RETURNS text LANGUAGE plpgsql STABLE
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
        RAISE EXCEPTION 'det_channel: kind must be reconciler, web, agent or alloc, got %',
            coalesce(p_kind, 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_key IS NULL THEN
        RAISE EXCEPTION 'det_channel: key of a % channel must not be NULL', p_kind
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_secret IS NULL THEN
        RAISE EXCEPTION 'det_channel: table channel_key has no secret (the schema made one)'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN 'det_' || p_kind || '_'
        || left(encode(sha256(v_secret || convert_to(p_kind || ':' || p_key, 'UTF8')), 'hex'), 40);
END $$;

CREATE FUNCTION det_listen(p_kind text, p_key text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- This session LISTENs on det_channel(p_kind, p_key) from its transaction's commit on (as a
-- LISTEN statement would). Executable by the owner alone: the reconciler's own channel.
BEGIN
    EXECUTE format('LISTEN %I', det_channel(p_kind, p_key));
END $$;

CREATE FUNCTION det_web_listen() RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve's event listener (det_web) LISTENs on the web channel (det_web_event).
    SELECT det_listen('web', '');
$$;

CREATE FUNCTION det_agent_listen(p_agent text) RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent (det_agent) LISTENs on its own channel: the reconciler wakes it there when its
-- assignments or their desired states change. An agent names itself, as in every function
-- of det_agent's.
    SELECT det_listen('agent', p_agent);
$$;

CREATE FUNCTION det_task_listen(p_token text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A task (det_task) LISTENs on its own allocation's channel, named by its token: woken there
-- when it should preempt (empty payload) or its trial's next searcher op is decided ("op").
DECLARE
    a allocations := det_auth(p_token);
BEGIN
    PERFORM det_listen('alloc', a.id::text);
END $$;

GRANT EXECUTE ON FUNCTION det_web_listen() TO det_web;
GRANT EXECUTE ON FUNCTION det_agent_listen(text) TO det_agent;
GRANT EXECUTE ON FUNCTION det_task_listen(text) TO det_task;

-- Every function that sent NOTIFY det_reconciler or det_web sends on det_channel's names.
-- (det_create_experiment's pg_notify line changes with it: see schema.sql.)

CREATE OR REPLACE FUNCTION det_experiment_action(p_id integer, p_action text) RETURNS experiment_state
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- pause | activate | cancel | kill (spec: run-training-code, Pause and Activate). Returns the
-- new state. The reconciler turns the state into desired states of the trials' allocations.
-- An action the state does not allow is a check_violation (an illegal transition); an
-- unknown action a bad argument.
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
    UPDATE experiments SET state = v_new WHERE id = p_id;
    PERFORM det_audit(p_action, 'experiment', p_id::text);
    PERFORM pg_notify(det_channel('reconciler', ''), 'experiment');
    RETURN v_new;
END $$;

CREATE OR REPLACE FUNCTION det_job_update(p_job bigint, p_field text, p_value text) RETURNS void
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
    PERFORM det_require('edit', j.workspace_id, format('change the %s of job %s', p_field, p_job));
    SELECT e.id, e.state INTO v_exp, v_state FROM experiments e WHERE e.job_id = p_job;
    IF v_state IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RAISE EXCEPTION 'job % (experiment %) is %: it is no longer queued', p_job, v_exp,
            v_state USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_type := det_pool_scheduler(j.resource_pool) ->> 'type';
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
        PERFORM det_check_pools(j.workspace_id, ARRAY[p_value], format('job %s', p_job));
        UPDATE jobs SET resource_pool = p_value, fallback_pools = '{}' WHERE id = p_job;
        UPDATE allocations SET resource_pool = p_value
         WHERE job_id = p_job AND state = 'PENDING';
        UPDATE experiments SET config = jsonb_set(config, '{resources,resource_pool}', to_jsonb(p_value))
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
    PERFORM det_audit('update', 'job', p_job::text,
                      jsonb_build_object('field', p_field, 'value', p_value));
    PERFORM pg_notify(det_channel('reconciler', ''), 'job');
EXCEPTION
    WHEN invalid_text_representation OR numeric_value_out_of_range THEN
        RAISE EXCEPTION 'job %: % expects a number, not "%"', p_job, p_field, p_value
            USING ERRCODE = 'invalid_parameter_value';
END $$;

CREATE OR REPLACE FUNCTION det_apply_cluster_config(p_config jsonb, p_original text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Store a validated cluster config and make resource_pools match it (ClusterAdmin). A pool
-- the config drops is deleted only if nothing uses it; otherwise the whole apply is refused.
DECLARE
    v_gone text;
BEGIN
    PERFORM det_require('admin_cluster', NULL, 'apply a cluster config');
    INSERT INTO resource_pools (name, description, scheduler, max_aux_containers_per_agent)
    SELECT p ->> 'name', coalesce(p ->> 'description', ''), nullif(p -> 'scheduler', 'null'),
           coalesce((p ->> 'max_aux_containers_per_agent')::integer, 100)
    FROM jsonb_array_elements(p_config -> 'resource_pools') p
    ON CONFLICT (name) DO UPDATE
        SET description = excluded.description, scheduler = excluded.scheduler,
            max_aux_containers_per_agent = excluded.max_aux_containers_per_agent;
    SELECT name INTO v_gone FROM resource_pools r
     WHERE name NOT IN (SELECT p ->> 'name' FROM jsonb_array_elements(p_config -> 'resource_pools') p)
       AND (EXISTS (SELECT 1 FROM agents g WHERE g.resource_pool = r.name AND g.state <> 'LOST')
            OR EXISTS (SELECT 1 FROM jobs j JOIN experiments e ON e.job_id = j.id
                        WHERE j.resource_pool = r.name
                          AND e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR')))
     LIMIT 1;
    IF v_gone IS NOT NULL THEN
        RAISE EXCEPTION 'resource_pools: pool "%" still has agents or active jobs; keep it in the config or drain it first', v_gone
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM resource_pools r
     WHERE name NOT IN (SELECT p ->> 'name' FROM jsonb_array_elements(p_config -> 'resource_pools') p)
       AND NOT EXISTS (SELECT 1 FROM agents g WHERE g.resource_pool = r.name)
       AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.resource_pool = r.name)
       AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.resource_pool = r.name);
    INSERT INTO cluster_config (config, original) VALUES (p_config, p_original)
    ON CONFLICT (singleton) DO UPDATE
        SET config = excluded.config, original = excluded.original, applied_at = now();
    PERFORM det_audit('apply', 'cluster_config', 'cluster', p_config);
    PERFORM pg_notify(det_channel('reconciler', ''), 'cluster');
END $$;

CREATE OR REPLACE FUNCTION det_agent_set_enabled(p_id text, p_enabled boolean) RETURNS agent_state
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Disable (drain) or enable an agent (ClusterAdmin): a disabled agent's running work
-- finishes, nothing new is placed on it (spec: agents; issue 5). Returns its new state.
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

CREATE OR REPLACE FUNCTION det_slot_set_enabled(p_agent text, p_slot integer, p_enabled boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Disable (drain) or enable one slot of an agent (ClusterAdmin); work holding it runs on.
BEGIN
    PERFORM det_require('admin_cluster', NULL,
                        format('%s slot %s of agent %s',
                               CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END, p_slot,
                               p_agent));
    UPDATE slots SET enabled = p_enabled WHERE agent_id = p_agent AND slot_id = p_slot;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent % has no slot %', p_agent, p_slot USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_audit(CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END, 'slot',
                      p_agent || '/' || p_slot);
    PERFORM pg_notify(det_channel('reconciler', ''), 'agent');
END $$;

CREATE OR REPLACE FUNCTION det_agent_register(
    p_id text, p_hostname text, p_pool text, p_runtime text, p_slots jsonb
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent (re)registers its slots: [{slot_id, type, device_uuid, device_name, memory_mb}].
-- Slots it no longer has are removed; a LOST agent becomes ACTIVE again.
BEGIN
    IF NOT EXISTS (SELECT 1 FROM resource_pools WHERE name = p_pool) THEN
        RAISE EXCEPTION 'agent %: no resource pool named "%"', p_id, p_pool
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    INSERT INTO agents (id, hostname, resource_pool, runtime)
    VALUES (p_id, p_hostname, p_pool, p_runtime)
    ON CONFLICT (id) DO UPDATE
        SET hostname = excluded.hostname, resource_pool = excluded.resource_pool,
            runtime = excluded.runtime, last_heartbeat = now(),
            state = CASE WHEN agents.state = 'LOST' THEN 'ACTIVE' ELSE agents.state END;
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
    PERFORM pg_notify(det_channel('reconciler', ''), 'agent');
END $$;

CREATE OR REPLACE FUNCTION det_agent_report_each(
    p_agent text, p_allocations bigint[], p_state allocation_state,
    p_exit_codes integer[] DEFAULT NULL, p_reasons text[] DEFAULT NULL
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The agent reports what it observed of allocations it runs, all in one state, in one
-- statement (issue 11); p_exit_codes and p_reasons go with p_allocations element by element.
-- TERMINATED releases the slots and records the exit code and reason; the reconciler settles
-- the trial afterwards. RUNNING of a gang spanning agents leaves it STARTING until every
-- other agent started its share (det_gang_started; det_agent_report_node moves it on then).
BEGIN
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

CREATE OR REPLACE FUNCTION det_agent_report_node(
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
    UPDATE allocation_nodes
       SET state = greatest(state, p_state),
           exit_code = CASE WHEN p_state = 'TERMINATED' THEN p_exit_code ELSE exit_code END,
           exit_reason = CASE WHEN p_state = 'TERMINATED' THEN p_reason ELSE exit_reason END
     WHERE allocation_id = p_allocation AND agent_id = p_agent AND state <> 'TERMINATED'
    RETURNING node_rank INTO v_rank;
    IF FOUND AND p_state = 'RUNNING' THEN
        UPDATE allocations SET state = 'RUNNING'
         WHERE id = p_allocation AND state < 'RUNNING' AND running_at IS NOT NULL
           AND det_gang_started(p_allocation);
    END IF;
    -- A share that failed before its claim (its launch failed) has no row, and ends the run.
    v_rank := coalesce(v_rank, array_position(det_gang_agents(p_allocation), p_agent) - 1);
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
        PERFORM pg_notify(det_channel('reconciler', ''), 'allocation');
    END IF;
END $$;

CREATE OR REPLACE FUNCTION det_complete_op(p_token text, p_op_id bigint, p_metric double precision)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The trial trained to the op's length and validated: record the searcher metric and queue a
-- validation_completed event for the searcher. Completing an op twice is a no-op. Under a
-- searcher with a time metric the validation row itself was the event
-- (det_timed_validation), so none is queued here.
DECLARE
    a allocations := det_auth(p_token);
    o searcher_ops;
BEGIN
    UPDATE searcher_ops SET completed = true, metric = p_metric, progress = length
     WHERE id = p_op_id AND trial_id = a.trial_id AND NOT completed
    RETURNING * INTO o;
    IF FOUND THEN
        INSERT INTO searcher_events (experiment_id, trial_id, kind, payload)
        SELECT t.experiment_id, t.id, 'validation_completed',
               jsonb_build_object('length', o.length, 'metric', p_metric)
        FROM trials t JOIN experiments e ON e.id = t.experiment_id
        WHERE t.id = a.trial_id AND e.config #>> '{searcher,time_metric}' IS NULL;
        PERFORM pg_notify(det_channel('reconciler', ''), 'searcher');
    END IF;
END $$;

CREATE OR REPLACE FUNCTION det_set_gc_policy(
    p_experiment integer, p_save_experiment_best integer, p_save_trial_best integer,
    p_save_trial_latest integer
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment set gc-policy`: store the new save_* values in the experiment's config and,
-- if it has ended, apply them now (a running experiment applies them when it ends). Returns
-- the checkpoints marked DELETING.
DECLARE
    e experiments;
BEGIN
    PERFORM det_require('edit', det_experiment_workspace(p_experiment),
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
    PERFORM det_audit('set_gc_policy', 'experiment', p_experiment::text,
                      jsonb_build_object('save_experiment_best', p_save_experiment_best,
                                         'save_trial_best', p_save_trial_best,
                                         'save_trial_latest', p_save_trial_latest));
    IF e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RETURN 0;
    END IF;
    PERFORM pg_notify(det_channel('reconciler', ''), 'checkpoint_gc');
    RETURN det_checkpoint_gc(p_experiment);
END $$;

CREATE OR REPLACE FUNCTION det_delete_checkpoints(p_uuids uuid[]) RETURNS integer LANGUAGE plpgsql
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
        PERFORM det_require('edit', v_bad.workspace_id, format('delete checkpoint %s', v_bad.uuid));
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
    PERFORM det_audit('delete', 'checkpoint', u::text) FROM unnest(p_uuids) u;
    PERFORM pg_notify(det_channel('reconciler', ''), 'checkpoint_gc');
    RETURN v_n - det_unpin_deleting();  -- pinned since the check above
END $$;

CREATE OR REPLACE FUNCTION det_experiment_delete(p_id integer) RETURNS boolean LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment delete`: for an ended experiment none of whose checkpoints is pinned. Its
-- checkpoints become DELETING (their files are removed by a GC task), and its rows go in one
-- transaction once that is done (det_purge_experiment: here if nothing is left to remove,
-- else by the reconciler). Asking again retries a GC that gave up. Returns true when the
-- rows are already gone.
DECLARE
    v_state experiment_state;
    v_pinned uuid;
BEGIN
    PERFORM det_require('edit', det_experiment_workspace(p_id),
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
    PERFORM det_unpin_deleting();  -- pinned since the check above: kept, and so is the experiment
    PERFORM det_audit('delete', 'experiment', p_id::text);
    PERFORM pg_notify(det_channel('reconciler', ''), 'checkpoint_gc');
    RETURN det_purge_experiment(p_id);
END $$;

CREATE OR REPLACE FUNCTION det_web_event(p_topics text[]) RETURNS void LANGUAGE sql AS $$
-- Wake det serve's event streams with one NOTIFY on the web channel (det_channel) whose
-- payload is the distinct topics, space-separated (det.db.channels: "experiments",
-- "experiment:<id>", "trial:<id>", "queue", "cluster"), or "*" (every stream) when there are
-- more than 200 of them. A hint only: the servers also look on their own every second.
-- Identical payloads in one transaction are delivered once (PostgreSQL folds them).
    SELECT pg_notify(det_channel('web', ''), CASE WHEN count(*) > 200 THEN '*'
                                     ELSE string_agg(t, ' ' ORDER BY t) END)
      FROM (SELECT DISTINCT t FROM unnest(p_topics) t WHERE t IS NOT NULL) d
    HAVING count(*) > 0;
$$;

CREATE OR REPLACE FUNCTION det_timed_validation() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A validation row of a trial whose searcher has a time metric (adaptive_asha's max_time +
-- time_metric) is a validation_completed event at length floor(<time metric>), with the
-- searcher metric (null when not a number: it ranks worst). A row without a numeric time
-- metric is no event; the harness refuses to report one (TrainContext).
DECLARE
    v_searcher jsonb;
    v_time jsonb;
    v_metric jsonb;
BEGIN
    SELECT e.config -> 'searcher' INTO v_searcher
      FROM trials t JOIN experiments e ON e.id = t.experiment_id WHERE t.id = NEW.trial_id;
    IF v_searcher ->> 'time_metric' IS NULL THEN
        RETURN NULL;
    END IF;
    v_time := NEW."values" -> (v_searcher ->> 'time_metric');
    IF jsonb_typeof(v_time) IS DISTINCT FROM 'number' THEN
        RETURN NULL;
    END IF;
    v_metric := NEW."values" -> (v_searcher ->> 'metric');
    INSERT INTO searcher_events (experiment_id, trial_id, kind, payload)
    SELECT t.experiment_id, t.id, 'validation_completed', jsonb_build_object(
               'length', greatest(least(floor(v_time::numeric), 9223372036854775807), 0)::bigint,
               'metric', CASE WHEN jsonb_typeof(v_metric) = 'number' THEN v_metric END)
      FROM trials t WHERE t.id = NEW.trial_id;
    PERFORM pg_notify(det_channel('reconciler', ''), 'searcher');
    RETURN NULL;
END $$;

