-- Tables: the cluster

CREATE TABLE reconciler_leader (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    holder     text NOT NULL,
    since      timestamptz NOT NULL,
    last_pass  timestamptz,
    agent_timeout double precision CHECK (agent_timeout > 0)
);
COMMENT ON TABLE reconciler_leader IS
    'Who leads (for `det cluster status`). Leadership itself is a session advisory lock held by '
    'the connection that runs every pass, so a leader whose connection dies cannot write.';
COMMENT ON COLUMN reconciler_leader.agent_timeout IS
    'Seconds without a heartbeat after which the leader declares an agent lost (`det reconcile '
    '--agent-timeout`), recorded by each pass; agents read it (det_agent.timeout) to kill '
    'their own tasks before it expires (self-fencing, det.agent.heartbeat).';
GRANT SELECT ON reconciler_leader TO det_user;

CREATE TABLE cluster_config (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    config     jsonb NOT NULL,
    original   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    -- what the control plane reads of it, parsed once when it is applied
    scheduler  jsonb GENERATED ALWAYS AS (config #> '{resource_manager,scheduler}') STORED,
    default_compute_pool text
        GENERATED ALWAYS AS (config #>> '{resource_manager,default_compute_resource_pool}') STORED,
    default_aux_pool text
        GENERATED ALWAYS AS (config #>> '{resource_manager,default_aux_resource_pool}') STORED
);
COMMENT ON TABLE cluster_config IS
    'The applied cluster config (`det cluster config apply`), validated by det.configs.cluster: '
    '{resource_manager: {scheduler, default_compute_resource_pool, default_aux_resource_pool}, '
    'resource_pools: [...]}.';
GRANT SELECT ON cluster_config TO det_user;

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

CREATE TABLE resource_pools (
    name        text PRIMARY KEY,
    description text NOT NULL DEFAULT '',
    scheduler   jsonb,
    max_aux_containers_per_agent integer NOT NULL DEFAULT 100
        CHECK (max_aux_containers_per_agent >= 0),
    provider    jsonb,
    provider_status text NOT NULL DEFAULT ''
);
COMMENT ON TABLE resource_pools IS 'Named groups of agents; every allocation targets one pool.';
COMMENT ON COLUMN resource_pools.scheduler IS
    'The pool''s own scheduler; NULL uses the cluster''s. A pool scheduler replaces the '
    'cluster''s as a whole (spec: Resource Pools).';
COMMENT ON COLUMN resource_pools.provider IS
    'The pool''s provider (det.configs.cluster.ProviderConfig, expanded); NULL: static agents.';
COMMENT ON COLUMN resource_pools.provider_status IS
    'Why the provisioner waits or refuses (e.g. ''at max_instances 2: 3 slots queued''), '
    'written by each pass; empty when it has nothing to say.';
GRANT SELECT ON resource_pools TO det_user;
INSERT INTO resource_pools (name, description) VALUES ('default', 'The default compute pool');

CREATE TABLE agents (
    -- 1-63 plain characters: ids become NOTIFY channel names and log keys (det.db.channels)
    id             text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$'),
    hostname       text NOT NULL,
    resource_pool  text NOT NULL REFERENCES resource_pools (name),
    state          agent_state NOT NULL DEFAULT 'ACTIVE',
    runtime        text NOT NULL CHECK (runtime IN ('process', 'docker')),
    registered_at  timestamptz NOT NULL DEFAULT now(),
    last_heartbeat timestamptz NOT NULL DEFAULT now(),
    stopping       boolean NOT NULL DEFAULT false,
    gone_at        timestamptz
);
COMMENT ON TABLE agents IS
    'One row per host daemon. The reconciler marks an agent LOST when its heartbeat is older '
    'than the timeout, and ends its allocations.';
COMMENT ON COLUMN agents.stopping IS
    'The agent is stopping (det_agent.stop_runs): nothing new is placed on it until it '
    'registers again.';
COMMENT ON COLUMN agents.gone_at IS
    'When the agent ended for good (det_agent.retire: a one-shot agent whose run ended; its '
    'instance''s process or Slurm job gone): agent and slot lists hide it. The row stays, '
    'LOST, because the runs it ran name it (allocations.agent_id). NULL again if it '
    'registers again.';
GRANT SELECT ON agents TO det_user;

CREATE TABLE agent_logins (
    agent_id      text PRIMARY KEY CHECK (agent_id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,52}$'),
    role_name     text NOT NULL UNIQUE,
    resource_pool text REFERENCES resource_pools (name),
    enrolled_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);
COMMENT ON TABLE agent_logins IS
    'Agents enrolled with a login of their own (det_enroll.agent_enroll): role_name '
    '(det_agent_<id>, a member of det_agent) may act only for agent_id '
    '(det_internal.agent_check_self), in resource_pool when set. Revoked (det_user.agent_revoke): '
    'the role may no longer log in. Agents without a row log in as the shared det_agent role: the '
    'single-host mode of `det cluster up`.';

CREATE TABLE agent_enrollment_tokens (
    role_name     text PRIMARY KEY,
    resource_pool text REFERENCES resource_pools (name),
    created_by    text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    used_at       timestamptz,
    agent_id      text
);
COMMENT ON TABLE agent_enrollment_tokens IS
    'One-time enrollment tokens (det_user.agent_token_create). A token is the password of its own '
    'login role role_name (det_enroll_<hex>, a member of det_enroll, which may only call '
    'det_enroll.agent_enroll): PostgreSQL keeps it as a SCRAM verifier, its only stored form. Used '
    '(used_at, agent_id) it can no longer log in.';

CREATE TABLE slots (
    agent_id    text NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    slot_id     integer NOT NULL CHECK (slot_id >= 0),
    type        text NOT NULL CHECK (type IN ('cpu', 'cuda')),
    device_uuid text,
    device_name text NOT NULL DEFAULT '',
    memory_mb   bigint,
    enabled     boolean NOT NULL DEFAULT true,
    PRIMARY KEY (agent_id, slot_id)
);
COMMENT ON TABLE slots IS 'Schedulable devices of an agent: CUDA GPUs, else CPU slots.';
GRANT SELECT ON slots TO det_user;

CREATE TABLE instances (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource_pool  text NOT NULL REFERENCES resource_pools (name) ON DELETE CASCADE,
    provider       text NOT NULL CHECK (provider IN ('local', 'aws', 'slurm')),
    state          instance_state NOT NULL DEFAULT 'REQUESTED',
    -- det-instance-<id>: the agent's id and the name the provider finds the instance by
    -- (a Slurm job's name carries the cluster's id too: slurm_provider.job_name)
    agent_id       text NOT NULL UNIQUE CHECK (agent_id ~ '^det-instance-[0-9]+$'),
    provider_id    text,
    reason         text NOT NULL DEFAULT '',
    requested_at   timestamptz NOT NULL DEFAULT now(),
    launched_at    timestamptz,
    running_at     timestamptz,
    idle_since     timestamptz,
    terminating_at timestamptz,
    gone_at        timestamptz,
    provider_state text NOT NULL DEFAULT '',
    allocation_id  bigint
);
COMMENT ON TABLE instances IS
    'Machines (or local processes) the provisioner started for elastic pools. The row is '
    'written REQUESTED before the launch, and the launch names the instance after the row '
    '(agent_id), so a reconciler killed between the two adopts the instance it finds by that '
    'name instead of launching again.';
COMMENT ON COLUMN instances.provider_id IS
    'The provider''s handle once launched (local: the agent process''s pid, slurm: the job '
    'id).';
COMMENT ON COLUMN instances.reason IS
    'Why it was terminated (idle, agent never registered, agent lost, exited).';
COMMENT ON COLUMN instances.provider_state IS
    'What the provider says of it while it is not running (slurm: ''slurm job 12 PENDING '
    '(Resources)'', squeue''s state and reason); empty once it runs.';
COMMENT ON COLUMN instances.idle_since IS
    'Since when its agent holds no run and no task; NULL while busy (max_idle_agent_period).';
COMMENT ON COLUMN instances.allocation_id IS
    'slurm pools: the one run this instance (one Slurm job) was submitted for; its agent '
    'takes no other and exits when it ends. NULL for an elastic pool''s agents. No foreign '
    'key: an instance''s history outlives a deleted experiment''s runs.';
-- Each pass reads the live instances.
CREATE INDEX instances_live ON instances (resource_pool) WHERE state <> 'GONE';
-- A run has at most one live Slurm job: nothing is queued twice for it.
CREATE UNIQUE INDEX instances_one_per_allocation ON instances (allocation_id)
    WHERE state <> 'GONE';
GRANT SELECT ON instances TO det_user;
