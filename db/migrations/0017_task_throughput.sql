-- Issue 11, trivial-task throughput: the agent's RUNNING report looks for a gang's other
-- agents only where the allocation holds slots on another agent (det_gang_started, two
-- SECURITY DEFINER calls, cost ~0.2 ms of every report).

CREATE OR REPLACE FUNCTION det_agent_report(
    p_agent text, p_allocation bigint, p_state allocation_state,
    p_exit_code integer DEFAULT NULL, p_reason text DEFAULT NULL
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The agent reports what it observed of an allocation it runs. TERMINATED releases the slots
-- and records the exit code and reason; the reconciler settles the trial afterwards. RUNNING
-- of a gang spanning agents leaves it STARTING until every other agent started its share
-- (det_gang_started; det_agent_report_node moves it on then).
BEGIN
    UPDATE allocations
       -- a gang's other agents are looked for only where it has any (one index probe)
       SET state = CASE WHEN p_state = 'RUNNING'
                             AND EXISTS (SELECT 1 FROM allocation_slots h
                                          WHERE h.allocation_id = allocations.id
                                            AND h.agent_id <> p_agent)
                             AND NOT det_gang_started(id)
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
