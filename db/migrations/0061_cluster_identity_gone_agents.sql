-- Two det clusters may share one Slurm, and agents that ended for good leave the lists.
-- Each det database gets an identity of its own (cluster_identity): a slurm pool's job names
-- carry it (det.reconciler.slurm_provider.job_name), so a reconciler finds, adopts and cancels
-- only its own cluster's jobs. An agent gone for good (a one-shot agent whose run ended, the
-- agent of an instance whose process or Slurm job is gone) is marked so (agents.gone_at):
-- agent and slot lists hide it, while the runs that name it keep their history.

CREATE TABLE cluster_identity (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    id         uuid NOT NULL DEFAULT gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE cluster_identity IS
    'This det cluster''s identity (one row, made with the schema): what tells its jobs in a '
    'shared Slurm from another det cluster''s (their names carry the first 8 hex digits of '
    'id). Per database, unlike the server''s system_identifier; a copy of the database (a '
    'restored backup, CREATE DATABASE ... TEMPLATE) is the same cluster until id is changed.';
INSERT INTO cluster_identity DEFAULT VALUES;

ALTER TABLE agents ADD COLUMN gone_at timestamptz;
COMMENT ON COLUMN agents.gone_at IS
    'When the agent ended for good (det_agent_retire: a one-shot agent whose run ended; its '
    'instance''s process or Slurm job gone): agent and slot lists hide it. The row stays, '
    'LOST, because the runs it ran name it (allocations.agent_id). NULL again if it '
    'registers again.';

CREATE OR REPLACE FUNCTION det_agent_register(
    p_id text, p_hostname text, p_pool text, p_runtime text, p_slots jsonb
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent (re)registers its slots: [{slot_id, type, device_uuid, device_name, memory_mb}].
-- Slots it no longer has are removed; a LOST agent becomes ACTIVE again, a stopping one
-- (det_agent_stop_runs) takes work again, a gone one (agents.gone_at) is listed again.
BEGIN
    PERFORM det_agent_check_self(p_id);
    IF NOT EXISTS (SELECT 1 FROM resource_pools WHERE name = p_pool) THEN
        RAISE EXCEPTION 'agent %: no resource pool named "%"', p_id, p_pool
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    INSERT INTO agents (id, hostname, resource_pool, runtime)
    VALUES (p_id, p_hostname, p_pool, p_runtime)
    ON CONFLICT (id) DO UPDATE
        SET hostname = excluded.hostname, resource_pool = excluded.resource_pool,
            runtime = excluded.runtime, last_heartbeat = now(), stopping = false,
            state = CASE WHEN agents.state = 'LOST' THEN 'ACTIVE' ELSE agents.state END,
            gone_at = NULL;
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

CREATE FUNCTION det_agent_retire(p_agent text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent ends for good, its work done (a one-shot agent whose run ended and was
-- reported, `det agent run --one-shot`): LOST and gone (agents.gone_at), so nothing is placed
-- on it and agent lists hide it; a run it still held would end as on a lost agent.
BEGIN
    PERFORM det_agent_check_self(p_agent);
    UPDATE agents SET state = 'LOST', stopping = true, gone_at = coalesce(gone_at, now())
     WHERE id = p_agent;
END $$;
GRANT EXECUTE ON FUNCTION det_agent_retire(text) TO det_agent;

CREATE OR REPLACE VIEW reporting.slot_usage WITH (security_invoker = true) AS
-- The slots of agents not gone for good (agents.gone_at), each with the run holding it.
SELECT s.agent_id, s.slot_id, s.type, s.device_name, s.enabled, ag.resource_pool,
       ag.state AS agent_state, hs.allocation_id, a.trial_id, s.device_uuid, s.memory_mb
FROM slots s
JOIN agents ag ON ag.id = s.agent_id AND ag.gone_at IS NULL
LEFT JOIN allocation_slots hs ON hs.agent_id = s.agent_id AND hs.slot_id = s.slot_id
                             AND NOT hs.released
LEFT JOIN allocations a ON a.id = hs.allocation_id;
