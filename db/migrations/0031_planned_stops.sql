-- Issue 39, items 2 and 3: a planned stop (an agent's SIGTERM, `det cluster down`) is not a
-- failure, and a run is re-placed only once its old process can no longer act (fencing).

ALTER TABLE reconciler_leader ADD COLUMN agent_timeout double precision
    CHECK (agent_timeout > 0);
COMMENT ON COLUMN reconciler_leader.agent_timeout IS
    'Seconds without a heartbeat after which the leader declares an agent lost (`det reconcile '
    '--agent-timeout`), recorded by each pass; agents read it (det_agent_timeout) to kill '
    'their own tasks before it expires (self-fencing, det.agent.heartbeat).';

ALTER TABLE agents ADD COLUMN stopping boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN agents.stopping IS
    'The agent is stopping (det_agent_stop_runs): nothing new is placed on it until it '
    'registers again.';

ALTER TABLE allocations ADD COLUMN planned_stop boolean NOT NULL DEFAULT false;
ALTER TABLE allocations ADD COLUMN fenced_until timestamptz;
COMMENT ON COLUMN allocations.planned_stop IS
    'Its agent stopped it on purpose (det_agent_stop_runs: the agent shut down): however the '
    'run ends, its trial resumes from its latest checkpoint and the end is not a failure '
    '(restarts counts failures only).';
COMMENT ON COLUMN allocations.fenced_until IS
    'Set when the reconciler ends the run of a lost agent: until then the old process may '
    'still be alive (a frozen agent cannot kill it), so no new run of its trial is created. '
    'Longer than the task''s preemption watcher''s poll, after which a task whose token was '
    'revoked has exited (det.reconciler.passes.FENCE_SECONDS).';

GRANT SELECT (planned_stop, fenced_until) ON allocations TO det_user;

CREATE OR REPLACE FUNCTION det_agent_register(
    p_id text, p_hostname text, p_pool text, p_runtime text, p_slots jsonb
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent (re)registers its slots: [{slot_id, type, device_uuid, device_name, memory_mb}].
-- Slots it no longer has are removed; a LOST agent becomes ACTIVE again, a stopping one
-- (det_agent_stop_runs) takes work again.
BEGIN
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

CREATE FUNCTION det_agent_timeout() RETURNS double precision LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The leader's agent timeout in seconds (reconciler_leader.agent_timeout), NULL before any
-- reconciler has run a pass: an agent kills its tasks before it passes (self-fencing).
SELECT agent_timeout FROM reconciler_leader;
$$;

CREATE FUNCTION det_stop_runs_of(p_agent text) RETURNS bigint[] LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A planned stop of agent p_agent's live runs (issue 39), for det_agent_stop_runs and
-- det_agent_drain: each becomes desired STOPPED (a KILLED one stays so) and planned_stop, and
-- its task is woken on its channel to checkpoint and exit as on pause (det_should_preempt).
-- Runs it holds a share of (a gang whose chief is elsewhere) stop too. Returns their ids,
-- ascending. Executable by the owner alone.
DECLARE
    v_ids bigint[];
BEGIN
    WITH stopped AS (
        UPDATE allocations a
           SET desired_state = greatest(a.desired_state, 'STOPPED'), planned_stop = true,
               stop_requested_at = coalesce(a.stop_requested_at, now())
         WHERE a.state <> 'TERMINATED'
           AND a.id IN (SELECT x.id FROM allocations x
                         WHERE x.agent_id = p_agent AND x.state <> 'TERMINATED'
                        UNION
                        SELECT h.allocation_id FROM allocation_slots h
                         WHERE h.agent_id = p_agent AND NOT h.released)
        RETURNING a.id
    )
    SELECT coalesce(array_agg(s.id ORDER BY s.id), '{}') INTO v_ids FROM stopped s;
    PERFORM pg_notify(det_channel('alloc', x::text), '') FROM unnest(v_ids) x;
    RETURN v_ids;
END $$;

CREATE FUNCTION det_agent_stop_runs(p_agent text) RETURNS bigint[] LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent is going away (SIGTERM: `det cluster down`, a restart) and stops its live runs
-- as a planned stop (det_stop_runs_of), with no reconciler needed (the same `down` stops it).
-- The agent is marked stopping: no new run is placed on it until it registers again. Returns
-- the ids of the runs.
BEGIN
    UPDATE agents SET stopping = true WHERE id = p_agent;
    RETURN det_stop_runs_of(p_agent);
END $$;

CREATE FUNCTION det_agent_drain(p_id text) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det agent disable --drain` (ClusterAdmin): disable agent p_id (det_agent_set_enabled) and
-- stop its live runs as a planned stop (det_stop_runs_of): each trial checkpoints and exits as
-- on pause and resumes on another agent from that checkpoint, its end no failure (issue 39).
-- A task that ignores the request is killed after its preemption_timeout (the reconciler's
-- KILL_OVERDUE), still no failure. Returns how many runs were asked to stop.
BEGIN
    PERFORM det_agent_set_enabled(p_id, false);
    RETURN cardinality(det_stop_runs_of(p_id));
END $$;

GRANT EXECUTE ON FUNCTION det_agent_timeout(), det_agent_stop_runs(text) TO det_agent;
GRANT EXECUTE ON FUNCTION det_agent_drain(text) TO det_user;
