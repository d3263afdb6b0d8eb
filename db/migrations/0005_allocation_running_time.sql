ALTER TABLE allocations ADD COLUMN running_at timestamptz;
COMMENT ON COLUMN allocations.running_at IS
    'When the agent reported the task running (its process or container started): with '
    'started_at (the claim, before any image pull or container creation) it tells how long a '
    'runtime took to start the task.';

CREATE OR REPLACE FUNCTION det_agent_report(
    p_agent text, p_allocation bigint, p_state allocation_state,
    p_exit_code integer DEFAULT NULL, p_reason text DEFAULT NULL
) RETURNS void LANGUAGE plpgsql AS $$
-- The agent reports what it observed of an allocation it runs. TERMINATED releases the slots
-- and records the exit code and reason; the reconciler settles the trial afterwards.
BEGIN
    UPDATE allocations
       SET state = greatest(state, p_state),
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

CREATE OR REPLACE VIEW reporting.slot_usage AS
SELECT s.agent_id, s.slot_id, s.type, s.device_name, s.enabled, ag.resource_pool,
       ag.state AS agent_state, hs.allocation_id, a.trial_id, s.device_uuid, s.memory_mb
FROM slots s
JOIN agents ag ON ag.id = s.agent_id
LEFT JOIN allocation_slots hs ON hs.agent_id = s.agent_id AND hs.slot_id = s.slot_id
                             AND NOT hs.released
LEFT JOIN allocations a ON a.id = hs.allocation_id;
