-- Issue 11, trivial-task throughput: an agent claims the runs it starts in a batch, and reports
-- them RUNNING or ended, one statement a batch (det_agent_claim_each, det_agent_report_each;
-- the one-allocation functions call them); the RUNNING report looks for a gang's other agents
-- only where the allocation holds slots on another agent (det_gang_started, two SECURITY
-- DEFINER calls, cost ~0.2 ms of every report).

CREATE FUNCTION det_agent_claim_each(p_agent text, p_allocations bigint[])
RETURNS TABLE (allocation_id bigint, token text)
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The agent is about to launch allocations assigned to it: mint each one's task token
-- (returned once, stored hashed) and move it to STARTING, in one statement (issue 11: an
-- agent starts its tasks in batches). Allocations no longer this agent's to start (ended,
-- or desired state is not RUNNING) are left out of the result.
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
$$;

CREATE OR REPLACE FUNCTION det_agent_claim(p_agent text, p_allocation bigint) RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det_agent_claim_each for one allocation: its token, or NULL when it is not to start.
SELECT token FROM det_agent_claim_each(p_agent, ARRAY[p_allocation]);
$$;

CREATE FUNCTION det_agent_report_each(
    p_agent text, p_allocations bigint[], p_state allocation_state,
    p_exit_codes integer[] DEFAULT NULL, p_reasons text[] DEFAULT NULL
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The agent reports what it observed of allocations it runs, all in one state, in one
-- statement (issue 11); p_exit_codes and p_reasons go with p_allocations element by element.
-- TERMINATED releases the slots and records the exit code and reason; the reconciler settles
-- the trial afterwards. RUNNING of a gang spanning agents leaves it STARTING until every
-- other agent started its share (det_gang_started; det_agent_report_node moves it on then).
BEGIN
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
        PERFORM pg_notify('det_reconciler', 'allocation');
    END IF;
END $$;

CREATE OR REPLACE FUNCTION det_agent_report(
    p_agent text, p_allocation bigint, p_state allocation_state,
    p_exit_code integer DEFAULT NULL, p_reason text DEFAULT NULL
) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det_agent_report_each for one allocation.
SELECT det_agent_report_each(p_agent, ARRAY[p_allocation], p_state, ARRAY[p_exit_code],
                             ARRAY[p_reason]);
$$;

REVOKE EXECUTE ON FUNCTION det_agent_claim_each(text, bigint[]),
    det_agent_report_each(text, bigint[], allocation_state, integer[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION det_agent_claim_each(text, bigint[]),
    det_agent_report_each(text, bigint[], allocation_state, integer[], text[]) TO det_agent;
