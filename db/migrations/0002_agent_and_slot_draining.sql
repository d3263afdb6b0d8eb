CREATE FUNCTION det_agent_set_enabled(p_id text, p_enabled boolean) RETURNS agent_state
LANGUAGE plpgsql AS $$
-- Disable (drain) or enable an agent: a disabled agent's running work finishes, nothing new
-- is placed on it (spec: agents; issue 5). Returns the agent's new state.
DECLARE
    v_state agent_state;
BEGIN
    UPDATE agents
       SET state = CASE WHEN p_enabled THEN 'ACTIVE' ELSE 'DISABLED' END::agent_state
     WHERE id = p_id AND state <> 'LOST'
    RETURNING state INTO v_state;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent % not found (or lost)', p_id USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM pg_notify('det_reconciler', 'agent');
    RETURN v_state;
END $$;

CREATE FUNCTION det_slot_set_enabled(p_agent text, p_slot integer, p_enabled boolean)
RETURNS void LANGUAGE plpgsql AS $$
-- Disable (drain) or enable one slot of an agent; work holding it runs on.
BEGIN
    UPDATE slots SET enabled = p_enabled WHERE agent_id = p_agent AND slot_id = p_slot;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent % has no slot %', p_agent, p_slot USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM pg_notify('det_reconciler', 'agent');
END $$;
