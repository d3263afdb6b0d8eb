-- Issue 11: a SQL-language function that PostgreSQL cannot inline (one with a subquery, a
-- write, or SECURITY DEFINER) has its body parsed and planned again at each statement that
-- calls it; a PL/pgSQL function keeps its plans for the session. The functions below run
-- on every write to a watched table, every submission, every pass, every agent claim and
-- sync and every task's preemption check. On PostgreSQL 15, det_web_watched took 55 us a call
-- as SQL and 8 us as PL/pgSQL (2,000 calls in one DO block); PostgreSQL 18 keeps SQL
-- functions' plans too, and the PL/pgSQL versions are still 1.5-2x faster there
-- (bench/README.md). Their bodies are unchanged.

CREATE OR REPLACE FUNCTION det_web_watched() RETURNS boolean LANGUAGE plpgsql STABLE AS $$
-- Whether some det serve streams pages now: the condition of every det_web trigger.
BEGIN
    RETURN EXISTS (SELECT 1 FROM web_watchers WHERE until > now());
END $$;

CREATE OR REPLACE FUNCTION det_pool_scheduler(p_pool text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
-- The scheduler a pool really uses, every default filled in: the pool's own, else the
-- cluster's, else fair_share (the spec's default for a blank type: Resource Pools).
BEGIN
    RETURN jsonb_build_object('type', 'fair_share', 'preemption', false,
                              'fitting_policy', 'best', 'default_priority', 42)
           || coalesce((SELECT nullif(scheduler, 'null') FROM resource_pools WHERE name = p_pool),
                       (SELECT config #> '{resource_manager,scheduler}' FROM cluster_config),
                       '{}');
END $$;

CREATE OR REPLACE FUNCTION det_is_owner_session() RETURNS boolean LANGUAGE plpgsql STABLE AS $$
-- Whether the session is the cluster's own (the role owning det's tables, a member of it, or
-- a superuser: the reconciler, `det cluster up`) acting as no det user. It holds every
-- permission.
BEGIN
    RETURN NOT EXISTS (SELECT 1 FROM users WHERE username = det_caller())
       AND pg_has_role(session_user, (SELECT relowner FROM pg_class
                                       WHERE oid = 'experiments'::regclass), 'MEMBER');
END $$;

CREATE OR REPLACE FUNCTION det_audit(p_action text, p_object_type text, p_object_id text,
                                     p_detail jsonb DEFAULT '{}') RETURNS void
LANGUAGE plpgsql AS $$
-- One audit_log entry by the caller, in the transaction of the change it records.
BEGIN
    INSERT INTO audit_log (actor, action, object_type, object_id, detail)
    VALUES (det_caller(), p_action, p_object_type, p_object_id, coalesce(p_detail, '{}'));
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

CREATE OR REPLACE FUNCTION det_should_preempt(p_token text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN (det_auth(p_token)).desired_state <> 'RUNNING';
END $$;

CREATE OR REPLACE FUNCTION det_append_logs(
    p_allocation bigint, p_streams text[], p_lines text[]
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Append a batch of task output lines (one call per batch, never per line).
BEGIN
    INSERT INTO task_logs (allocation_id, trial_id, stream, line)
    SELECT p_allocation, a.trial_id, s, l
    FROM allocations a, unnest(p_streams, p_lines) AS u (s, l)
    WHERE a.id = p_allocation;
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
