-- Issue 35: agents on other hosts, each with its own identity. `det agent token create`
-- (det_agent_token_create) makes a one-time enrollment token: the password of a login role
-- of its own that may only call det_agent_enroll, which makes the agent's own login
-- det_agent_<id> (a member of det_agent) and uses the token up. Every agent function that
-- names an agent checks that an enrolled login names its own (det_agent_check_self);
-- det_agent_revoke ends an enrolled agent's access at once. The shared det_agent login stays
-- for the single-host mode (`det cluster up`'s own agent).

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'det_enroll') THEN
        CREATE ROLE det_enroll NOLOGIN;
    END IF;
END $$;

CREATE TABLE agent_logins (
    agent_id      text PRIMARY KEY CHECK (agent_id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,52}$'),
    role_name     text NOT NULL UNIQUE,
    resource_pool text REFERENCES resource_pools (name),
    enrolled_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);
COMMENT ON TABLE agent_logins IS
    'Agents enrolled with a login of their own (det_agent_enroll): role_name (det_agent_<id>, '
    'a member of det_agent) may act only for agent_id (det_agent_check_self), in resource_pool '
    'when set. Revoked (det_agent_revoke): the role may no longer log in. Agents without a row '
    'log in as the shared det_agent role: the single-host mode of `det cluster up`.';

CREATE TABLE agent_enrollment_tokens (
    role_name     text PRIMARY KEY,
    resource_pool text REFERENCES resource_pools (name),
    created_by    text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    used_at       timestamptz,
    agent_id      text
);
COMMENT ON TABLE agent_enrollment_tokens IS
    'One-time enrollment tokens (det_agent_token_create). A token is the password of its own '
    'login role role_name (det_enroll_<hex>, a member of det_enroll, which may only call '
    'det_agent_enroll): PostgreSQL keeps it as a SCRAM verifier, its only stored form. Used '
    '(used_at, agent_id) it can no longer log in.';

CREATE FUNCTION det_agent_check_self(p_agent text) RETURNS void LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Every agent function that names an agent first calls this: a login enrolled as an agent
-- (agent_logins) acts only for its own agent id, and not at all once revoked. Sessions of
-- other roles (the shared det_agent login of the single-host mode, the owner) pass. Raises
-- insufficient_privilege naming both agents; invalid_authorization_specification (28000)
-- for a revoked login (a session that slipped in before det_agent_revoke committed).
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

CREATE FUNCTION det_agent_token_create(p_verifier text, p_pool text, p_expires interval)
RETURNS TABLE (role_name text, expires_at timestamptz) LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det agent token create` (ClusterAdmin): a one-time enrollment token for one new agent, in
-- resource pool p_pool (NULL: the agent picks), good for p_expires (more than 0, at most 7
-- days). The token's secret reaches the server only as p_verifier, a client-made SCRAM
-- verifier (det_check_verifier), set as the password of a new login role returned here.
-- Raises invalid_parameter_value (expiry), foreign_key_violation (unknown pool).
#variable_conflict use_column
DECLARE
    v_role text := 'det_enroll_' || left(md5(gen_random_uuid()::text), 16);
    v_expires timestamptz;
BEGIN
    PERFORM det_require('admin_cluster', NULL, 'create an agent enrollment token');
    IF p_verifier IS NULL THEN
        RAISE EXCEPTION 'token: expected a SCRAM-SHA-256 verifier of its secret'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_check_verifier(p_verifier);
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
    VALUES (v_role, p_pool, det_caller(), v_expires);
    PERFORM det_audit('create', 'agent token', v_role,
                      jsonb_build_object('pool', p_pool, 'expires_at', v_expires));
    RETURN QUERY SELECT v_role, v_expires;
END $$;

CREATE FUNCTION det_agent_enroll(p_agent text, p_verifier text) RETURNS text LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det agent enroll`, logged in with an enrollment token (det_agent_token_create): make agent
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
    PERFORM det_check_verifier(p_verifier);
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
    PERFORM det_audit('enroll', 'agent', p_agent, jsonb_build_object('token', t.role_name));
    RETURN t.resource_pool;
END $$;

CREATE FUNCTION det_agent_revoke(p_agent text) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det agent revoke` (ClusterAdmin): end enrolled agent p_agent's access at once. Its login
-- may no longer log in, its sessions are terminated (pg_terminate_backend: at once, before
-- this commits; one that reconnects meanwhile is refused by det_agent_check_self), and the
-- agent is marked LOST, so the next pass ends its runs as a lost agent's (their tokens die,
-- their trials get new runs elsewhere after the fence, reconciler.passes.FENCE_SECONDS).
-- Returns how many sessions were terminated. Again on a revoked agent: terminates what is
-- left. Raises no_data_found (no enrolled login of that id).
DECLARE
    l agent_logins;
    v_ended integer;
BEGIN
    PERFORM det_require('admin_cluster', NULL, format('revoke agent %s', to_jsonb(p_agent)));
    SELECT * INTO l FROM agent_logins WHERE agent_id = p_agent FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent %: no enrolled login of that id (agents of the shared det_agent '
            'login stop with their host''s `det cluster down`)', to_jsonb(p_agent)
            USING ERRCODE = 'no_data_found';
    END IF;
    EXECUTE format('ALTER ROLE %I NOLOGIN', l.role_name);
    UPDATE agent_logins SET revoked_at = coalesce(revoked_at, now()) WHERE agent_id = p_agent;
    UPDATE agents SET state = 'LOST' WHERE id = p_agent AND state <> 'LOST';
    PERFORM pg_notify(det_channel('reconciler', ''), 'agent');
    SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) INTO v_ended
      FROM pg_stat_activity WHERE usename = l.role_name;
    PERFORM det_audit('revoke', 'agent', p_agent, jsonb_build_object('sessions', v_ended));
    RETURN v_ended;
END $$;

CREATE OR REPLACE FUNCTION det_agent_listen(p_agent text) RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent (det_agent) LISTENs on its own channel: the reconciler wakes it there when its
-- assignments or their desired states change. An agent names itself, as in every function
-- of det_agent's.
SELECT det_agent_check_self(p_agent);
    SELECT det_listen('agent', p_agent);
$$;

CREATE OR REPLACE FUNCTION det_agent_mark_fenced(p_agent text, p_ids bigint[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent killed its live runs p_ids because it could not heartbeat for its lease
-- (self-fencing, det.agent.heartbeat): the cluster's doing, not the trials' (a database outage
-- longer than the lease does it to every agent), so each is marked planned_stop and its
-- trial resumes from its latest checkpoint without counting a restart. Runs that already
-- ended (the reconciler declared the agent lost first: a failure, as any lost agent's run) or
-- that are not this agent's are left alone.
BEGIN
    PERFORM det_agent_check_self(p_agent);
    UPDATE allocations a SET planned_stop = true
     WHERE a.id = ANY (p_ids) AND a.state <> 'TERMINATED'
       AND (a.agent_id = p_agent
            OR EXISTS (SELECT 1 FROM allocation_slots h
                        WHERE h.allocation_id = a.id AND h.agent_id = p_agent));
END $$;

CREATE OR REPLACE FUNCTION det_agent_register(
    p_id text, p_hostname text, p_pool text, p_runtime text, p_slots jsonb
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent (re)registers its slots: [{slot_id, type, device_uuid, device_name, memory_mb}].
-- Slots it no longer has are removed; a LOST agent becomes ACTIVE again, a stopping one
-- (det_agent_stop_runs) takes work again.
BEGIN
    PERFORM det_agent_check_self(p_id);
    IF NOT EXISTS (SELECT 1 FROM resource_pools WHERE name = p_pool) THEN
        RAISE EXCEPTION 'agent %: no resource pool named "%"', p_id, p_pool
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    INSERT INTO agents (id, hostname, resource_pool, runtime)
    VALUES (p_id, p_hostname, p_pool, p_runtime)
    ON CONFLICT (id) DO UPDATE
        SET hostname = excluded.hostname, resource_pool = excluded.resource_pool,
            runtime = excluded.runtime, last_heartbeat = now(), stopping = false,
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

CREATE OR REPLACE FUNCTION det_agent_heartbeat(p_id text) RETURNS agent_state LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Returns the agent's state; LOST means the reconciler gave up on it and it must re-register.
DECLARE
    v_state agent_state;
BEGIN
    PERFORM det_agent_check_self(p_id);
    UPDATE agents SET last_heartbeat = now() WHERE id = p_id AND state <> 'LOST'
    RETURNING state INTO v_state;
    RETURN coalesce(v_state, 'LOST');
END $$;

CREATE OR REPLACE FUNCTION det_agent_stop_runs(p_agent text) RETURNS bigint[] LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent is going away (SIGTERM: `det cluster down`, a restart) and stops its live runs
-- as a planned stop (det_stop_runs_of), with no reconciler needed (the same `down` stops it).
-- The agent is marked stopping: no new run is placed on it until it registers again. Returns
-- the ids of the runs.
BEGIN
    PERFORM det_agent_check_self(p_agent);
    UPDATE agents SET stopping = true WHERE id = p_agent;
    RETURN det_stop_runs_of(p_agent);
END $$;

CREATE OR REPLACE FUNCTION det_agent_claim_each(p_agent text, p_allocations bigint[])
RETURNS TABLE (allocation_id bigint, token text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The agent is about to launch allocations assigned to it: mint each one's task token
-- (returned once, stored hashed) and move it to STARTING, in one statement (issue 11: an
-- agent starts its tasks in batches). Allocations no longer this agent's to start (ended,
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
-- statement (issue 11); p_exit_codes and p_reasons go with p_allocations element by element.
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

CREATE OR REPLACE FUNCTION det_agent_set_rendezvous(
    p_agent text, p_allocation bigint, p_endpoint text
) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The chief's agent records where the workers meet (host:port), after its claim and before it
-- starts its workers.
SELECT det_agent_check_self(p_agent);
UPDATE allocations SET rendezvous = p_endpoint
 WHERE id = p_allocation AND agent_id = p_agent AND state <> 'TERMINATED';
$$;

CREATE OR REPLACE FUNCTION det_agent_claim_node(p_agent text, p_allocation bigint) RETURNS jsonb
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
    PERFORM det_agent_check_self(p_agent);
    SELECT * INTO a FROM allocations
     WHERE id = p_allocation AND agent_id <> p_agent AND rendezvous IS NOT NULL
       AND state IN ('STARTING', 'RUNNING') AND desired_state = 'RUNNING'
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_nodes := det_gang_agents(p_allocation);
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
    PERFORM det_agent_check_self(p_agent);
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

CREATE OR REPLACE FUNCTION det_agent_assignments(p_agent text)
RETURNS TABLE (id bigint, desired text, state text, spec jsonb, chief text, node_state text,
               slot_ids integer[], spans boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent's work: the live allocations it is the chief of, and those it holds slots of as
-- another node of a gang (node_state: its share's state once claimed, else NULL). slot_ids:
-- the slots it holds there; spans: whether the allocation holds slots of other agents too.
#variable_conflict use_column
BEGIN
    PERFORM det_agent_check_self(p_agent);
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

CREATE OR REPLACE FUNCTION det_agent_live_allocations(p_agent text)
RETURNS TABLE (id bigint, last_log timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The live allocations an agent is the chief of, with the time of their last shipped log
-- line: what a restarted agent adopts and where its log shipping resumes.
SELECT det_agent_check_self(p_agent);
SELECT a.id, (SELECT l.ts FROM task_logs l WHERE l.allocation_id = a.id
               ORDER BY l.id DESC LIMIT 1)
  FROM allocations a
 WHERE a.agent_id = p_agent AND a.state <> 'TERMINATED';
$$;

CREATE OR REPLACE FUNCTION det_agent_context(p_agent text, p_context bigint) RETURNS bytea
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The packed model definition an agent unpacks for a run: only a context that a live
-- allocation of this agent (its chief's, or one it holds slots of) launches; NULL otherwise.
SELECT det_agent_check_self(p_agent);
SELECT b.data
  FROM context_blobs b
 WHERE b.id = p_context
   AND EXISTS (SELECT 1 FROM allocations a
                WHERE a.state <> 'TERMINATED' AND (a.spec ->> 'context_id')::bigint = b.id
                  AND (a.agent_id = p_agent
                       OR a.id IN (SELECT h.allocation_id FROM allocation_slots h
                                    WHERE h.agent_id = p_agent AND NOT h.released)));
$$;

GRANT EXECUTE ON FUNCTION det_agent_token_create(text, text, interval), det_agent_revoke(text)
TO det_user;
GRANT EXECUTE ON FUNCTION det_agent_enroll(text, text) TO det_enroll;
