-- Issue 11: the scheduling pass counts each agent's zero-slot tasks in one scan of this small
-- index rather than probing every agent's live allocations.

CREATE INDEX allocations_aux_live ON allocations (agent_id)
    WHERE slots_needed = 0 AND state <> 'TERMINATED';
