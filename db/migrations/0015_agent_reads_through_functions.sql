-- Agents read through functions too (issue 14): det_agent holds no table privileges, so the
-- three reads an agent made with plain SELECTs (its assignments, its live allocations with
-- their last log line, a context to unpack) become SECURITY DEFINER functions, each limited to
-- the allocations of the agent that asks. det_schema_version lets any det role (a CLI user, an
-- agent) tell whether the schema is current without reading det_migrations.

CREATE FUNCTION det_agent_assignments(p_agent text)
RETURNS TABLE (id bigint, desired text, state text, spec jsonb, chief text, node_state text,
               slot_ids integer[], spans boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent's work: the live allocations it is the chief of, and those it holds slots of as
-- another node of a gang (node_state: its share's state once claimed, else NULL). slot_ids:
-- the slots it holds there; spans: whether the allocation holds slots of other agents too.
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
$$;

CREATE FUNCTION det_agent_live_allocations(p_agent text)
RETURNS TABLE (id bigint, last_log timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The live allocations an agent is the chief of, with the time of their last shipped log
-- line: what a restarted agent adopts and where its log shipping resumes.
SELECT a.id, (SELECT l.ts FROM task_logs l WHERE l.allocation_id = a.id
               ORDER BY l.id DESC LIMIT 1)
  FROM allocations a
 WHERE a.agent_id = p_agent AND a.state <> 'TERMINATED';
$$;

CREATE FUNCTION det_agent_context(p_agent text, p_context bigint) RETURNS bytea
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The packed model definition an agent unpacks for a run: only a context that a live
-- allocation of this agent (its chief's, or one it holds slots of) launches; NULL otherwise.
SELECT b.data
  FROM context_blobs b
 WHERE b.id = p_context
   AND EXISTS (SELECT 1 FROM allocations a
                WHERE a.state <> 'TERMINATED' AND (a.spec ->> 'context_id')::bigint = b.id
                  AND (a.agent_id = p_agent
                       OR a.id IN (SELECT h.allocation_id FROM allocation_slots h
                                    WHERE h.agent_id = p_agent AND NOT h.released)));
$$;

CREATE FUNCTION det_schema_version() RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The newest migration this database applied (db/migrate.py records them): a client that
-- knows a newer one tells its user to run `det cluster up`, which migrates.
BEGIN
    RETURN (SELECT max(version) FROM det_migrations);
END $$;

REVOKE EXECUTE ON FUNCTION det_agent_assignments(text), det_agent_live_allocations(text),
    det_agent_context(text, bigint), det_schema_version() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION det_agent_assignments(text), det_agent_live_allocations(text),
    det_agent_context(text, bigint) TO det_agent;
GRANT EXECUTE ON FUNCTION det_schema_version() TO det_user, det_agent, det_web;
