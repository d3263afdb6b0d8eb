-- Distributed training across agents (issue 12): the rendezvous endpoint the chief's agent
-- records, one row per other agent of a gang allocation (its token, state and exit), and the
-- functions the agents call.

ALTER TABLE allocations ADD COLUMN rendezvous text;
COMMENT ON COLUMN allocations.rendezvous IS
    'host:port where the workers of an allocation spanning agents meet (torchrun''s master '
    'address and port), recorded by the chief''s agent (allocations.agent_id) before it '
    'starts its workers; the other agents start theirs once it is set.';

CREATE TABLE allocation_nodes (
    allocation_id bigint NOT NULL REFERENCES allocations (id),
    agent_id      text NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    node_rank     integer NOT NULL CHECK (node_rank >= 1),
    token_hash    bytea NOT NULL,
    state         allocation_state NOT NULL DEFAULT 'STARTING',
    exit_code     integer,
    exit_reason   text,
    PRIMARY KEY (allocation_id, agent_id),
    UNIQUE (allocation_id, node_rank)
);
COMMENT ON TABLE allocation_nodes IS
    'The agents of an allocation beyond its chief''s (node_rank 1, 2, ... in det_gang_agents '
    'order), once each started its share of the workers: the token its workers use, and what '
    'its agent observed. One share failing ends the whole allocation '
    '(det_agent_report_node).';
-- det_auth: a worker's token (its hash) to its allocation.
CREATE INDEX allocation_nodes_token ON allocation_nodes (token_hash);

CREATE FUNCTION det_gang_agents(p_allocation bigint) RETURNS text[] LANGUAGE sql STABLE AS $$
-- The agents holding slots of an allocation, in node order: the chief's first
-- (allocations.agent_id), then the others by id. Node ranks index this array from 0.
SELECT array_agg(h.agent_id ORDER BY h.agent_id <> a.agent_id, h.agent_id)
  FROM (SELECT DISTINCT agent_id FROM allocation_slots WHERE allocation_id = p_allocation) h,
       allocations a
 WHERE a.id = p_allocation;
$$;

CREATE FUNCTION det_gang_started(p_allocation bigint) RETURNS boolean LANGUAGE sql STABLE AS $$
-- Whether every agent of an allocation but the chief's has started its share of the workers
-- (true on one agent). The allocation is RUNNING only once this and the chief's agent say so.
SELECT NOT EXISTS (
    SELECT 1 FROM unnest(det_gang_agents(p_allocation)) WITH ORDINALITY AS g (agent_id, i)
     WHERE g.i > 1
       AND NOT EXISTS (SELECT 1 FROM allocation_nodes n
                        WHERE n.allocation_id = p_allocation AND n.agent_id = g.agent_id
                          AND n.state >= 'RUNNING'));
$$;

CREATE FUNCTION det_agent_set_rendezvous(
    p_agent text, p_allocation bigint, p_endpoint text
) RETURNS void LANGUAGE sql AS $$
-- The chief's agent records where the workers meet (host:port), after its claim and before it
-- starts its workers.
UPDATE allocations SET rendezvous = p_endpoint
 WHERE id = p_allocation AND agent_id = p_agent AND state <> 'TERMINATED';
$$;

CREATE FUNCTION det_agent_claim_node(p_agent text, p_allocation bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
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

CREATE FUNCTION det_agent_report_node(
    p_agent text, p_allocation bigint, p_state allocation_state,
    p_exit_code integer DEFAULT NULL, p_reason text DEFAULT NULL
) RETURNS void LANGUAGE plpgsql AS $$
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
        PERFORM pg_notify('det_reconciler', 'allocation');
    END IF;
END $$;

CREATE OR REPLACE FUNCTION det_auth(p_token text) RETURNS allocations
LANGUAGE plpgsql STABLE AS $$
-- The live allocation holding this token (the chief's, or one of allocation_nodes' for the
-- workers on the other agents of a gang), or an error (SQLSTATE 28000).
DECLARE
    v allocations;
    v_hash bytea := sha256(convert_to(p_token, 'UTF8'));
BEGIN
    SELECT * INTO v FROM allocations WHERE token_hash = v_hash AND state <> 'TERMINATED';
    IF NOT FOUND THEN
        SELECT a.* INTO v FROM allocation_nodes n JOIN allocations a ON a.id = n.allocation_id
         WHERE n.token_hash = v_hash AND a.state <> 'TERMINATED';
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'invalid or expired allocation token'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    RETURN v;
END $$;

CREATE OR REPLACE FUNCTION det_agent_report(
    p_agent text, p_allocation bigint, p_state allocation_state,
    p_exit_code integer DEFAULT NULL, p_reason text DEFAULT NULL
) RETURNS void LANGUAGE plpgsql AS $$
-- The agent reports what it observed of an allocation it runs. TERMINATED releases the slots
-- and records the exit code and reason; the reconciler settles the trial afterwards. RUNNING
-- of a gang spanning agents leaves it STARTING until every other agent started its share
-- (det_gang_started; det_agent_report_node moves it on then).
BEGIN
    UPDATE allocations
       SET state = CASE WHEN p_state = 'RUNNING' AND NOT det_gang_started(id)
                        THEN greatest(state, 'STARTING') ELSE greatest(state, p_state) END,
           exit_code = CASE WHEN p_state = 'TERMINATED' THEN p_exit_code ELSE exit_code END,
           exit_reason = CASE WHEN p_state = 'TERMINATED' THEN p_reason ELSE exit_reason END,
           ended_at = CASE WHEN p_state = 'TERMINATED' THEN coalesce(ended_at, now()) END,
           running_at = CASE WHEN p_state = 'RUNNING' THEN coalesce(running_at, now())
                             ELSE running_at END
     WHERE id = p_allocation AND agent_id = p_agent AND state <> 'TERMINATED';
    IF p_state = 'TERMINATED' THEN
        UPDATE allocation_slots SET released = true
         WHERE allocation_id = p_allocation AND NOT released;
        PERFORM pg_notify('det_reconciler', 'allocation');
    END IF;
END $$;
