-- Agents

CREATE FUNCTION det_user.agent_token_create(p_verifier text, p_pool text, p_expires interval)
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
GRANT EXECUTE ON FUNCTION det_user.agent_token_create(text, text, interval) TO det_user;

CREATE FUNCTION det_enroll.agent_enroll(p_agent text, p_verifier text) RETURNS text LANGUAGE plpgsql
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
GRANT EXECUTE ON FUNCTION det_enroll.agent_enroll(text, text) TO det_enroll;

CREATE FUNCTION det_user.agent_revoke(p_agent text) RETURNS integer LANGUAGE plpgsql
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
GRANT EXECUTE ON FUNCTION det_user.agent_revoke(text) TO det_user;

CREATE FUNCTION det_agent.register(
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
GRANT EXECUTE ON FUNCTION det_agent.register(text, text, text, text, jsonb) TO det_agent;

CREATE FUNCTION det_agent.heartbeat(p_id text) RETURNS agent_state LANGUAGE plpgsql
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
GRANT EXECUTE ON FUNCTION det_agent.heartbeat(text) TO det_agent;

CREATE FUNCTION det_agent.timeout() RETURNS double precision LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The leader's agent timeout in seconds (reconciler_leader.agent_timeout), NULL before any
-- reconciler has run a pass: an agent kills its tasks before it passes (self-fencing).
SELECT agent_timeout FROM reconciler_leader;
$$;
GRANT EXECUTE ON FUNCTION det_agent.timeout() TO det_agent;

CREATE FUNCTION det_internal.stop_runs_of(p_agent text) RETURNS bigint[] LANGUAGE plpgsql
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

CREATE FUNCTION det_agent.stop_runs(p_agent text) RETURNS bigint[] LANGUAGE plpgsql
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
GRANT EXECUTE ON FUNCTION det_agent.stop_runs(text) TO det_agent;

CREATE FUNCTION det_agent.leave(p_agent text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent is being ended by another resource manager under its runs (an agent in a Slurm
-- job: scancel, time limit, node drain): marked stopping, so nothing new is placed on it, but
-- its runs are not a planned stop: they end as the failures they are (max_restarts).
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    UPDATE agents SET stopping = true WHERE id = p_agent;
END $$;
GRANT EXECUTE ON FUNCTION det_agent.leave(text) TO det_agent;

CREATE FUNCTION det_agent.retire(p_agent text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent ends for good, its work done (a one-shot agent whose run ended and was
-- reported, `det agent run --one-shot`): LOST and gone (agents.gone_at), so nothing is placed
-- on it and agent lists hide it; a run it still held would end as on a lost agent.
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    UPDATE agents SET state = 'LOST', stopping = true, gone_at = coalesce(gone_at, now())
     WHERE id = p_agent;
END $$;
GRANT EXECUTE ON FUNCTION det_agent.retire(text) TO det_agent;

CREATE FUNCTION det_agent.claim_each(p_agent text, p_allocations bigint[])
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
GRANT EXECUTE ON FUNCTION det_agent.claim_each(text, bigint[]) TO det_agent;

CREATE FUNCTION det_agent.claim(p_agent text, p_allocation bigint) RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det_agent.claim_each for one allocation: its token, or NULL when it is not to start.
SELECT token FROM det_agent.claim_each(p_agent, ARRAY[p_allocation]);
$$;
GRANT EXECUTE ON FUNCTION det_agent.claim(text, bigint) TO det_agent;

CREATE FUNCTION det_agent.report_each(
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
GRANT EXECUTE ON FUNCTION det_agent.report_each(text, bigint[], allocation_state, integer[], text[])
    TO det_agent;

CREATE FUNCTION det_agent.report(
    p_agent text, p_allocation bigint, p_state allocation_state,
    p_exit_code integer DEFAULT NULL, p_reason text DEFAULT NULL
) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det_agent.report_each for one allocation.
SELECT det_agent.report_each(p_agent, ARRAY[p_allocation], p_state, ARRAY[p_exit_code],
                             ARRAY[p_reason]);
$$;
GRANT EXECUTE ON FUNCTION det_agent.report(text, bigint, allocation_state, integer, text)
    TO det_agent;

CREATE FUNCTION det_agent.gang_agents(p_allocation bigint) RETURNS text[] LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The agents holding slots of an allocation, in node order: the chief's first
-- (allocations.agent_id), then the others by id. Node ranks index this array from 0.
SELECT array_agg(h.agent_id ORDER BY h.agent_id <> a.agent_id, h.agent_id)
  FROM (SELECT DISTINCT agent_id FROM allocation_slots WHERE allocation_id = p_allocation) h,
       allocations a
 WHERE a.id = p_allocation;
$$;
GRANT EXECUTE ON FUNCTION det_agent.gang_agents(bigint) TO det_agent;

CREATE FUNCTION det_agent.gang_started(p_allocation bigint) RETURNS boolean LANGUAGE sql STABLE
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
GRANT EXECUTE ON FUNCTION det_agent.gang_started(bigint) TO det_agent;

CREATE FUNCTION det_agent.set_rendezvous(
    p_agent text, p_allocation bigint, p_endpoint text
) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The chief's agent records where the workers meet (host:port), after its claim and before it
-- starts its workers.
SELECT det_internal.agent_check_self(p_agent);
UPDATE allocations SET rendezvous = p_endpoint
 WHERE id = p_allocation AND agent_id = p_agent AND state <> 'TERMINATED';
$$;
GRANT EXECUTE ON FUNCTION det_agent.set_rendezvous(text, bigint, text) TO det_agent;

CREATE FUNCTION det_agent.claim_node(p_agent text, p_allocation bigint) RETURNS jsonb
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
GRANT EXECUTE ON FUNCTION det_agent.claim_node(text, bigint) TO det_agent;

CREATE FUNCTION det_agent.report_node(
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
GRANT EXECUTE ON FUNCTION det_agent.report_node(text, bigint, allocation_state, integer, text)
    TO det_agent;

CREATE FUNCTION det_agent.append_logs(
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
GRANT EXECUTE ON FUNCTION det_agent.append_logs(bigint, text[], text[], integer[], uuid, bigint[])
    TO det_agent;

CREATE FUNCTION det_user.log_level(p_stream text, p_line text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
-- The level of a log line, read from its text, for the log viewer's filter: 'error',
-- 'warning', 'info' or 'debug'. Python logging's level names at the start (Determined's
-- LOG_FORMAT 'INFO: [pid] name: message', logging's default 'WARNING:root:message'), a
-- traceback's first and last lines and '...Error: ' are errors; Python's warnings
-- ('file.py:3: UserWarning: ...') and det's 'warning:' notes are warnings; anything else info.
SELECT CASE
    WHEN p_line ~ '^\s*(CRITICAL|FATAL|ERROR)\M' OR p_line ~ '^Traceback \(most recent call last\)'
         OR p_line ~ '^[A-Za-z_.]*(Error|Exception)(: |$)' THEN 'error'
    WHEN p_line ~ '^\s*(WARNING|WARN)\M' OR p_line ~ '[A-Za-z]Warning: '
         OR p_line ~ '^det\.[a-z_.]+: warning:' THEN 'warning'
    WHEN p_line ~ '^\s*DEBUG\M' THEN 'debug'
    ELSE 'info'
END
$$;
GRANT EXECUTE ON FUNCTION det_user.log_level(text, text) TO det_user;
