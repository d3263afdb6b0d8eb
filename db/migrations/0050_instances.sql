-- Issue 36: elastic agents. A pool's provider (cluster config) and the instances the
-- reconciler's provisioner starts and stops for it (det.reconciler.provision).

CREATE TYPE instance_state AS ENUM ('REQUESTED', 'STARTING', 'RUNNING', 'TERMINATING', 'GONE');
COMMENT ON TYPE instance_state IS
    'An elastic agent''s machine: REQUESTED (row written, not yet launched), STARTING '
    '(launched, its agent not yet registered), RUNNING (its agent registered), TERMINATING '
    '(asked to stop), GONE. Only moves forward (enum order; det_instance_transition).';

ALTER TABLE resource_pools
    ADD COLUMN provider jsonb,
    ADD COLUMN provider_status text NOT NULL DEFAULT '';
COMMENT ON COLUMN resource_pools.provider IS
    'The pool''s provider (det.configs.cluster.ProviderConfig, expanded); NULL: static agents.';
COMMENT ON COLUMN resource_pools.provider_status IS
    'Why the provisioner waits or refuses (e.g. ''at max_instances 2: 3 slots queued''), '
    'written by each pass; empty when it has nothing to say.';

CREATE TABLE instances (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource_pool  text NOT NULL REFERENCES resource_pools (name) ON DELETE CASCADE,
    provider       text NOT NULL CHECK (provider IN ('local', 'aws')),
    state          instance_state NOT NULL DEFAULT 'REQUESTED',
    -- det-instance-<id>: the agent's id and the name the provider finds the instance by
    agent_id       text NOT NULL UNIQUE CHECK (agent_id ~ '^det-instance-[0-9]+$'),
    provider_id    text,
    reason         text NOT NULL DEFAULT '',
    requested_at   timestamptz NOT NULL DEFAULT now(),
    launched_at    timestamptz,
    running_at     timestamptz,
    idle_since     timestamptz,
    terminating_at timestamptz,
    gone_at        timestamptz
);
COMMENT ON TABLE instances IS
    'Machines (or local processes) the provisioner started for elastic pools. The row is '
    'written REQUESTED before the launch, and the launch names the instance after the row '
    '(agent_id), so a reconciler killed between the two adopts the instance it finds by that '
    'name instead of launching again.';
COMMENT ON COLUMN instances.provider_id IS
    'The provider''s handle once launched (local: the agent process''s pid).';
COMMENT ON COLUMN instances.reason IS
    'Why it was terminated (idle, agent never registered, agent lost, exited).';
COMMENT ON COLUMN instances.idle_since IS
    'Since when its agent holds no run and no task; NULL while busy (max_idle_agent_period).';
-- Each pass reads the live instances.
CREATE INDEX instances_live ON instances (resource_pool) WHERE state <> 'GONE';

CREATE FUNCTION det_instance_transition() RETURNS trigger LANGUAGE plpgsql AS $$
-- An instance's state only moves forward (instance_state's order): nothing comes back from
-- TERMINATING or GONE.
BEGIN
    IF NEW.state < OLD.state THEN
        RAISE EXCEPTION 'instance %: illegal state change % -> %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER instances_transition BEFORE UPDATE OF state ON instances
    FOR EACH ROW EXECUTE FUNCTION det_instance_transition();

GRANT SELECT ON instances TO det_user;

CREATE OR REPLACE FUNCTION det_apply_cluster_config(p_config jsonb, p_original text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Store a validated cluster config and make resource_pools match it (ClusterAdmin). A pool
-- the config drops is deleted only if nothing uses it (agents and live instances count);
-- otherwise the whole apply is refused. A pool's provider is stored as given.
DECLARE
    v_gone text;
BEGIN
    PERFORM det_require('admin_cluster', NULL, 'apply a cluster config');
    INSERT INTO resource_pools (name, description, scheduler, max_aux_containers_per_agent,
                                provider)
    SELECT p ->> 'name', coalesce(p ->> 'description', ''), nullif(p -> 'scheduler', 'null'),
           coalesce((p ->> 'max_aux_containers_per_agent')::integer, 100),
           nullif(p -> 'provider', 'null')
    FROM jsonb_array_elements(p_config -> 'resource_pools') p
    ON CONFLICT (name) DO UPDATE
        SET description = excluded.description, scheduler = excluded.scheduler,
            max_aux_containers_per_agent = excluded.max_aux_containers_per_agent,
            provider = excluded.provider;
    SELECT name INTO v_gone FROM resource_pools r
     WHERE name NOT IN (SELECT p ->> 'name' FROM jsonb_array_elements(p_config -> 'resource_pools') p)
       AND (EXISTS (SELECT 1 FROM agents g WHERE g.resource_pool = r.name AND g.state <> 'LOST')
            OR EXISTS (SELECT 1 FROM instances i WHERE i.resource_pool = r.name
                                                   AND i.state <> 'GONE')
            OR EXISTS (SELECT 1 FROM jobs j JOIN experiments e ON e.job_id = j.id
                        WHERE j.resource_pool = r.name
                          AND e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR')))
     LIMIT 1;
    IF v_gone IS NOT NULL THEN
        RAISE EXCEPTION 'resource_pools: pool "%" still has agents or active jobs; keep it in the config or drain it first', v_gone
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM resource_pools r
     WHERE name NOT IN (SELECT p ->> 'name' FROM jsonb_array_elements(p_config -> 'resource_pools') p)
       AND NOT EXISTS (SELECT 1 FROM agents g WHERE g.resource_pool = r.name)
       AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.resource_pool = r.name)
       AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.resource_pool = r.name);
    INSERT INTO cluster_config (config, original) VALUES (p_config, p_original)
    ON CONFLICT (singleton) DO UPDATE
        SET config = excluded.config, original = excluded.original, applied_at = now();
    PERFORM det_audit('apply', 'cluster_config', 'cluster', p_config);
    PERFORM pg_notify(det_channel('reconciler', ''), 'cluster');
END $$;
