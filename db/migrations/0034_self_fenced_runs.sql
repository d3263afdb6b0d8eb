-- Issue 39: a run its agent killed for want of a heartbeat (self-fencing) is no failure of
-- its trial, like a planned stop: the agent marks it planned_stop before it reports the end.
CREATE FUNCTION det_agent_mark_fenced(p_agent text, p_ids bigint[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent killed its live runs p_ids because it could not heartbeat for its lease
-- (self-fencing, det.agent.heartbeat): the cluster's doing, not the trials' (a database outage
-- longer than the lease does it to every agent), so each is marked planned_stop and its
-- trial resumes from its latest checkpoint without counting a restart. Runs that already
-- ended (the reconciler declared the agent lost first: a failure, as any lost agent's run) or
-- that are not this agent's are left alone.
BEGIN
    UPDATE allocations a SET planned_stop = true
     WHERE a.id = ANY (p_ids) AND a.state <> 'TERMINATED'
       AND (a.agent_id = p_agent
            OR EXISTS (SELECT 1 FROM allocation_slots h
                        WHERE h.allocation_id = a.id AND h.agent_id = p_agent));
END $$;

COMMENT ON COLUMN allocations.planned_stop IS
    'Its agent stopped it on purpose (det_agent_stop_runs: the agent shut down; '
    'det_agent_mark_fenced: it killed its tasks for want of a heartbeat): however the run '
    'ends, its trial resumes from its latest checkpoint and the end is not a failure '
    '(restarts counts failures only).';

GRANT EXECUTE ON FUNCTION det_agent_mark_fenced(text, bigint[]) TO det_agent;
