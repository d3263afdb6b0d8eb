-- det's schema as it is today: the whole control plane, and the contract every actor codes
-- against. Read this file to learn det's states and rules.
--
-- Rules live here, next to the data:
--   * states are enums and every transition is checked by a trigger
--     (det_internal.check_transition);
--   * a slot is held by at most one live allocation, a trial has at most one live allocation
--     (partial unique indexes);
--   * writes that carry rules go through the actors' functions (det_user.*, det_agent.*, ...),
--     called alike by the CLI, the reconciler, agents and the harness (the harness
--     authenticates with an allocation token, stored here only as a SHA-256 hash);
--   * the `reporting` schema holds stable views for users' own SQL.
--
-- Order: roles and default privileges; the schemas of the actors' functions; types; tables (each
-- with its comments, indexes and grants); the transition trigger; functions by actor (user
-- actions in det_user, agents' in det_agent, tasks' in det_task, det serve's in det_web, the
-- reconciler's helpers in det_internal); reporting views; row-level security. Grants sit beside
-- their definitions: each table's, view's and schema's after it, each function's after it (and its
-- COMMENT), one GRANT EXECUTE per function naming every role that may call it.
--
-- How databases get here. This file is not executed by det: databases are built and upgraded
-- by the migrations in db/migrations/ (NNNN_name.sql, applied in order, each in its own
-- transaction, recorded in det_migrations; see db/migrate.py). tests/test_migrations.py builds one
-- database from the migrations and one from this file and asserts their catalogs are
-- identical. To change the schema: add the next migration file, then fold the change in here
-- where the object is defined (a new column goes last in its CREATE TABLE; a replaced function
-- or view replaces its definition, verbatim), so that each object is still defined once.

-- =============================================================================================
-- Roles and privileges
--
-- Nobody but the schema's owner may do anything not granted: a user (det_user) reads through
-- row-level security and changes state only through the user-action functions (SECURITY
-- DEFINER, each checks its caller's permission; its readers run as the caller, under
-- row-level security); an agent (det_agent) and a task (det_task) may only EXECUTE their own
-- functions, and det serve (det_web) its login functions (then it acts as the request's user,
-- SET LOCAL ROLE). Each object's grants follow its definition; tables granted to nobody
-- (tokens, sessions, the searcher's event queue, the reconciler's bookkeeping) are the
-- owner's alone.

DO $$
BEGIN
    -- Roles belong to the server: several det databases on one server share them.
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'det_user') THEN
        CREATE ROLE det_user NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'det_agent') THEN
        CREATE ROLE det_agent LOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'det_task') THEN
        CREATE ROLE det_task LOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'det_web') THEN
        CREATE ROLE det_web LOGIN NOINHERIT;
    END IF;
    -- the one-time logins of enrollment tokens (det_user.agent_token_create) are its members
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'det_enroll') THEN
        CREATE ROLE det_enroll NOLOGIN;
    END IF;
END $$;

-- No function is executable by PUBLIC: each function's grant names the roles that may call
-- it. This is the global default of the role that runs this file or the migrations (a
-- per-schema one cannot take a privilege away), so it covers every function added later.
ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- =============================================================================================
-- Schemas: the functions of each actor in its own
--
-- public holds the tables and types; each function lives in the schema of the actor that calls
-- it (pgmq's layout): det_user (a user's actions, and the readers row-level security calls),
-- det_agent, det_task, det_web (det serve's logins), det_enroll (an enrollment token's one
-- call), det (what every actor asks: the schema's version) and det_internal (called only by
-- other functions, triggers and the schema's owner: the reconciler). A schema groups and names;
-- who may call a function is still its own GRANT EXECUTE, so USAGE is everyone's.

CREATE SCHEMA det;
GRANT USAGE ON SCHEMA det TO PUBLIC;

CREATE SCHEMA det_user;
GRANT USAGE ON SCHEMA det_user TO PUBLIC;

CREATE SCHEMA det_agent;
GRANT USAGE ON SCHEMA det_agent TO PUBLIC;

CREATE SCHEMA det_task;
GRANT USAGE ON SCHEMA det_task TO PUBLIC;

CREATE SCHEMA det_web;
GRANT USAGE ON SCHEMA det_web TO PUBLIC;

CREATE SCHEMA det_enroll;
GRANT USAGE ON SCHEMA det_enroll TO PUBLIC;

CREATE SCHEMA det_internal;
GRANT USAGE ON SCHEMA det_internal TO PUBLIC;

-- =============================================================================================
-- Types

CREATE TYPE experiment_state AS ENUM (
    'ACTIVE', 'PAUSED',
    'STOPPING_COMPLETED', 'STOPPING_CANCELED', 'STOPPING_KILLED', 'STOPPING_ERROR',
    'COMPLETED', 'CANCELED', 'ERROR'
);
COMMENT ON TYPE experiment_state IS
    'Experiment lifecycle (spec: experiment-lifecycle). STOPPING_* wait for the trials to end.';

-- Trial lifecycle: the same states as an experiment's, with the same transition rules
-- (det_internal.check_transition). A trial's STOPPING_* waits for its live allocation to end.
CREATE TYPE trial_state AS ENUM (
    'ACTIVE', 'PAUSED',
    'STOPPING_COMPLETED', 'STOPPING_CANCELED', 'STOPPING_KILLED', 'STOPPING_ERROR',
    'COMPLETED', 'CANCELED', 'ERROR'
);

CREATE TYPE desired_state AS ENUM ('RUNNING', 'STOPPED', 'KILLED');
COMMENT ON TYPE desired_state IS
    'What the reconciler wants of an allocation: RUNNING; STOPPED = checkpoint and exit '
    '(preemption, pause, cancel); KILLED = terminate now.';

CREATE TYPE allocation_state AS ENUM (
    'PENDING', 'ASSIGNED', 'PULLING', 'STARTING', 'RUNNING', 'TERMINATING', 'TERMINATED'
);
COMMENT ON TYPE allocation_state IS
    'Observed state of one run of a task. Only moves forward (enum order); any state may jump '
    'to TERMINATED.';

-- An agent's state: ACTIVE takes new work; DISABLED (drained by `det agent disable`) finishes
-- its running work and takes none; LOST (heartbeat timed out) until it registers again.
CREATE TYPE agent_state AS ENUM ('ACTIVE', 'DISABLED', 'LOST');

-- An elastic agent's machine (det.reconciler.provision).
CREATE TYPE instance_state AS ENUM ('REQUESTED', 'STARTING', 'RUNNING', 'TERMINATING', 'GONE');
COMMENT ON TYPE instance_state IS
    'An elastic agent''s machine: REQUESTED (row written, not yet launched), STARTING '
    '(launched, its agent not yet registered), RUNNING (its agent registered), TERMINATING '
    '(asked to stop), GONE. Only moves forward (enum order; det_internal.instance_transition).';

CREATE TYPE early_exit_reason AS ENUM ('errored', 'invalid_hp', 'user_requested_stop');
COMMENT ON TYPE early_exit_reason IS
    'Why a trial ended early (Python: det.reasons.EarlyExitReason, kept equal by a test): '
    'errored (failed past its restarts), invalid_hp (its code rejected its hyperparameters), '
    'user_requested_stop (its code ended it on purpose).';

-- =============================================================================================
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

-- =============================================================================================
-- Tables: users, workspaces, projects and access control
--
-- A det user is a PostgreSQL role of the same name (LOGIN, member of det_user): PostgreSQL
-- holds the password (SCRAM-SHA-256) and checks it, and row-level security decides which rows
-- each one sees. Roles belong to the server, not to this database: the migration that made
-- this section created det's own when absent (det_user: every user; det_agent and det_task:
-- may only EXECUTE their functions; det_web: det serve, which SETs ROLE to a request's user).
-- The schema's owner (the reconciler, `det cluster up`) bypasses row-level security and acts
-- with every permission.

CREATE FUNCTION det_user.name_problem(p_name text, p_max_bytes integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
-- Why p_name cannot name a user, group, workspace or project, or NULL: not blank, at most
-- p_max_bytes bytes (63 for users: a PostgreSQL role name), no control characters. Any other
-- character is kept verbatim (quotes, semicolons: names are data, never SQL).
SELECT CASE
    WHEN p_name IS NULL OR btrim(p_name) = '' THEN 'must not be blank'
    WHEN octet_length(p_name) > p_max_bytes
        THEN format('expected at most %s bytes, got %s', p_max_bytes, octet_length(p_name))
    WHEN p_name ~ '[[:cntrl:]]' THEN 'must not contain control characters'
END $$;
GRANT EXECUTE ON FUNCTION det_user.name_problem(text, integer) TO det_user;

CREATE TABLE users (
    id           serial PRIMARY KEY,
    username     text NOT NULL UNIQUE CHECK (det_user.name_problem(username, 63) IS NULL),
    active       boolean NOT NULL DEFAULT true,
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text NOT NULL
);
COMMENT ON TABLE users IS
    'det users: each is the PostgreSQL role named username (LOGIN while active, member of '
    'det_user). det stores no password: PostgreSQL keeps a SCRAM-SHA-256 verifier of it.';
GRANT SELECT ON users TO det_user;

CREATE TABLE user_groups (
    id         serial PRIMARY KEY,
    name       text NOT NULL UNIQUE CHECK (det_user.name_problem(name, 255) IS NULL),
    created_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE user_groups IS
    'Groups of users: a role assigned to a group holds for each member.';
GRANT SELECT ON user_groups TO det_user;

CREATE TABLE user_group_members (
    group_id integer NOT NULL REFERENCES user_groups (id) ON DELETE CASCADE,
    user_id  integer NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    PRIMARY KEY (group_id, user_id)
);
CREATE INDEX user_group_members_user ON user_group_members (user_id);
GRANT SELECT ON user_group_members TO det_user;

CREATE TABLE workspaces (
    id                   serial PRIMARY KEY,
    name                 text NOT NULL UNIQUE CHECK (det_user.name_problem(name, 255) IS NULL),
    archived             boolean NOT NULL DEFAULT false,
    created_at           timestamptz NOT NULL DEFAULT now(),
    created_by           text NOT NULL,
    default_compute_pool text REFERENCES resource_pools (name) ON DELETE SET NULL,
    default_aux_pool     text REFERENCES resource_pools (name) ON DELETE SET NULL,
    checkpoint_storage   jsonb CHECK (jsonb_typeof(checkpoint_storage) = 'object')
);
COMMENT ON TABLE workspaces IS
    'Workspaces hold projects, projects hold experiments (spec: Workspaces and Projects). '
    'Row-level security keys every user-data table on its workspace. Workspace 1, '
    '"Uncategorized", holds what names no other; every new user is an Editor there.';
COMMENT ON COLUMN workspaces.default_compute_pool IS
    'The pool its experiments use when their config names none (then the cluster''s default).';
COMMENT ON COLUMN workspaces.checkpoint_storage IS
    'The checkpoint_storage its experiments use when their config has none (then det''s '
    'default).';
GRANT SELECT ON workspaces TO det_user;
-- (a fixed creation time: the release of this schema, the same in every database)
INSERT INTO workspaces (name, created_by, created_at)  -- id 1
VALUES ('Uncategorized', 'det', '2026-11-25 00:00:00+00');

CREATE TABLE workspace_pools (
    workspace_id  integer NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    resource_pool text NOT NULL REFERENCES resource_pools (name) ON DELETE CASCADE,
    PRIMARY KEY (resource_pool, workspace_id)
);
COMMENT ON TABLE workspace_pools IS
    'Pools bound to workspaces: a bound pool serves only the jobs of the workspaces bound to '
    'it; a pool bound to none serves every workspace (Determined: resource pool bindings).';
GRANT SELECT ON workspace_pools TO det_user;

CREATE TABLE projects (
    id           serial PRIMARY KEY,
    workspace_id integer NOT NULL REFERENCES workspaces (id),
    name         text NOT NULL CHECK (det_user.name_problem(name, 255) IS NULL),
    description  text NOT NULL DEFAULT '' CHECK (length(description) <= 4096),
    archived     boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text NOT NULL,
    UNIQUE (workspace_id, name)
);
COMMENT ON TABLE projects IS
    'Projects of a workspace; project 1, "Uncategorized" of workspace 1, holds experiments '
    'submitted without one.';
GRANT SELECT ON projects TO det_user;
INSERT INTO projects (workspace_id, name, created_by, created_at)  -- id 1
VALUES (1, 'Uncategorized', 'det', '2026-11-25 00:00:00+00');

CREATE TABLE roles (
    name        text PRIMARY KEY,
    permissions text[] NOT NULL,
    global_only boolean NOT NULL DEFAULT false,
    description text NOT NULL
);
COMMENT ON TABLE roles IS
    'Determined''s roles and what they permit: view (read a workspace''s experiments, models '
    'and logs), edit (create, pause, kill, reprioritise, move, delete them; projects and '
    'models), admin_workspace (the workspace itself and who may use it), create_workspace, '
    'admin_cluster (users, groups, pools, agents, cluster config, every workspace).';
GRANT SELECT ON roles TO det_user;
INSERT INTO roles (name, permissions, global_only, description) VALUES
    ('Viewer', '{view}', false, 'reads a workspace''s experiments, models and logs'),
    ('Editor', '{view,edit}', false,
     'also creates, pauses, kills, reprioritises, moves and deletes experiments and models'),
    ('WorkspaceAdmin', '{view,edit,admin_workspace}', false,
     'also manages the workspace: archive, delete, projects, members'),
    ('WorkspaceCreator', '{create_workspace}', true,
     'creates workspaces (and becomes WorkspaceAdmin of each)'),
    ('ClusterAdmin', '{view,edit,admin_workspace,create_workspace,admin_cluster}', true,
     'manages users, groups, pools, agents, cluster config and every workspace');

CREATE TABLE role_assignments (
    id           serial PRIMARY KEY,
    role         text NOT NULL REFERENCES roles (name),
    user_id      integer REFERENCES users (id) ON DELETE CASCADE,
    group_id     integer REFERENCES user_groups (id) ON DELETE CASCADE,
    workspace_id integer REFERENCES workspaces (id) ON DELETE CASCADE,
    CHECK ((user_id IS NULL) <> (group_id IS NULL))
);
COMMENT ON TABLE role_assignments IS
    'Who holds which role, globally (workspace_id NULL: in every workspace) or in one '
    'workspace; to a user or to a group.';
CREATE UNIQUE INDEX role_assignments_once ON role_assignments
    (role, coalesce(user_id, 0), coalesce(group_id, 0), coalesce(workspace_id, 0));
CREATE INDEX role_assignments_user ON role_assignments (user_id);
GRANT SELECT ON role_assignments TO det_user;

CREATE TABLE audit_log (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text NOT NULL,
    action      text NOT NULL,
    object_type text NOT NULL,
    object_id   text NOT NULL,
    detail      jsonb NOT NULL DEFAULT '{}'
);
COMMENT ON TABLE audit_log IS
    'Who did what to which object, written by the user-action functions in the transaction of '
    'the change (so an action that fails leaves no entry). ClusterAdmins read it.';
CREATE INDEX audit_log_object ON audit_log (object_type, object_id);
GRANT SELECT ON audit_log TO det_user;

-- =============================================================================================
-- Tables: experiments, trials and the searcher

-- Ids users type (experiments, trials, jobs) come from these counter rows, not sequences:
-- PostgreSQL WAL-logs a sequence 32 values ahead, so ids jumped by ~32 after every crash of
-- the postmaster (CACHE 1 does not stop it).
CREATE TABLE id_counters (
    name       text PRIMARY KEY,
    last_value bigint NOT NULL CHECK (last_value >= 0)
);
COMMENT ON TABLE id_counters IS
    'The last id given to each kind of object users type the id of (det_internal.next_id): a row '
    'updated in the creating transaction, so ids are consecutive across crashes and '
    'rollbacks (a sequence jumps by 32 after a crash).';
INSERT INTO id_counters (name, last_value) VALUES ('experiments', 0), ('jobs', 0), ('trials', 0);

CREATE FUNCTION det_internal.next_id(p_name text) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
-- The next id of p_name (a row of id_counters), the default of experiments.id, trials.id and
-- jobs.id. The row stays locked until the caller's transaction ends, so concurrent creates
-- take ids one after the other (the second waits for the first to commit or roll back; both
-- succeed under READ COMMITTED). Returns NULL for an unknown name (the NOT NULL of the id
-- column then names the table).
    UPDATE id_counters SET last_value = last_value + 1 WHERE name = p_name RETURNING last_value;
$$;

CREATE TABLE context_blobs (
    id         bigserial PRIMARY KEY,
    sha256     bytea NOT NULL UNIQUE,
    size_bytes bigint NOT NULL CHECK (size_bytes <= 95 * 1024 * 1024),
    data       bytea NOT NULL
);
COMMENT ON TABLE context_blobs IS
    'Packed model-definition directories (tar.gz), deduplicated by hash. The spec caps a context '
    'at 95 MiB.';
GRANT SELECT ON context_blobs TO det_user;

CREATE TABLE jobs (
    id             bigint PRIMARY KEY DEFAULT det_internal.next_id('jobs'),
    type           text NOT NULL CHECK (type IN ('EXPERIMENT', 'COMMAND', 'NOTEBOOK', 'SHELL',
                                                 'TENSORBOARD')),
    resource_pool  text NOT NULL REFERENCES resource_pools (name),
    priority       integer NOT NULL DEFAULT 42 CHECK (priority BETWEEN 1 AND 99),
    -- NaN and Infinity are refused: NaN sorts above every number in PostgreSQL, so > 0 holds
    weight         double precision NOT NULL DEFAULT 1 CHECK (weight > 0 AND weight <= 1000000),
    queue_position numeric NOT NULL,
    owner          text NOT NULL,
    submitted_at   timestamptz NOT NULL DEFAULT now(),
    max_slots      integer CHECK (max_slots IS NULL OR max_slots >= 0),
    fallback_pools text[] NOT NULL DEFAULT '{}',
    workspace_id   integer NOT NULL DEFAULT 1 REFERENCES workspaces (id)
);
COMMENT ON TABLE jobs IS
    'The job queue: one row per experiment or task. Scheduling order is (priority, '
    'queue_position); queue_position starts as the submission time in microseconds.';
COMMENT ON COLUMN jobs.fallback_pools IS
    'Pools to try, in order, after resource_pool when it cannot take a waiting run now '
    '(resources.resource_pool given as a list).';
COMMENT ON COLUMN jobs.max_slots IS
    'Caps the job''s demand under fair share (resources.max_slots).';
COMMENT ON COLUMN jobs.workspace_id IS
    'The workspace of the job''s experiment (its project''s): what row-level security keys '
    'jobs, runs and their logs on.';
CREATE INDEX jobs_workspace ON jobs (workspace_id);
GRANT SELECT ON jobs TO det_user;

-- One row per submitted experiment: its expanded config, its state (experiment_state), and
-- the searcher's saved state. end_time is set exactly when the state is terminal.
CREATE TABLE experiments (
    id              integer PRIMARY KEY DEFAULT det_internal.next_id('experiments'),
    job_id          bigint NOT NULL UNIQUE REFERENCES jobs (id),
    name            text NOT NULL,
    description     text NOT NULL DEFAULT '',
    config          jsonb NOT NULL,
    original_config text NOT NULL,
    context_id      bigint REFERENCES context_blobs (id),
    state           experiment_state NOT NULL DEFAULT 'ACTIVE',
    owner           text NOT NULL,
    archived        boolean NOT NULL DEFAULT false,
    searcher_state  jsonb,
    progress        double precision NOT NULL DEFAULT 0 CHECK (progress BETWEEN 0 AND 1),
    start_time      timestamptz NOT NULL DEFAULT now(),
    end_time        timestamptz,
    checkpoint_gc_error text,
    delete_requested_at timestamptz,
    project_id      integer NOT NULL DEFAULT 1 REFERENCES projects (id),
    tensorboards_deleted_at timestamptz,
    searcher_rng    jsonb,
    paused_reason   text,
    unmanaged       boolean NOT NULL DEFAULT false,
    external_id     text,
    -- The config's fields the control plane decides on, parsed once when the config is
    -- written (submission, or an edit of it such as a new checkpoint policy) and never apart
    -- from it. NULL where the config has no value: their defaults are det.configs' alone,
    -- which fills every one of them in the configs it expands. Whole numbers are cast through
    -- numeric, as det_internal.experiment_config_problem accepts 2.0 for 2.
    searcher_name text GENERATED ALWAYS AS (config #>> '{searcher,name}') STORED,
    searcher_metric text GENERATED ALWAYS AS (config #>> '{searcher,metric}') STORED,
    smaller_is_better boolean
        GENERATED ALWAYS AS ((config #>> '{searcher,smaller_is_better}')::boolean) STORED,
    max_trials integer
        GENERATED ALWAYS AS ((config #>> '{searcher,max_trials}')::numeric::integer) STORED,
    max_concurrent_trials bigint GENERATED ALWAYS AS
        ((config #>> '{searcher,max_concurrent_trials}')::numeric::bigint) STORED,
    source_trial_id bigint
        GENERATED ALWAYS AS ((config #>> '{searcher,source_trial_id}')::numeric::bigint) STORED,
    -- NULL unless a checkpoint UUID (det_internal.experiment_config_problem refuses anything else)
    source_checkpoint_uuid uuid GENERATED ALWAYS AS (
        CASE WHEN config #>> '{searcher,source_checkpoint_uuid}'
                  ~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
             THEN (config #>> '{searcher,source_checkpoint_uuid}')::uuid END) STORED,
    max_restarts integer GENERATED ALWAYS AS ((config ->> 'max_restarts')::numeric::integer) STORED,
    preemption_timeout integer
        GENERATED ALWAYS AS ((config ->> 'preemption_timeout')::numeric::integer) STORED,
    slots_per_trial integer
        GENERATED ALWAYS AS ((config #>> '{resources,slots_per_trial}')::numeric::integer) STORED,
    experiment_seed bigint GENERATED ALWAYS AS
        ((config #>> '{reproducibility,experiment_seed}')::numeric::bigint) STORED,
    save_experiment_best integer GENERATED ALWAYS AS
        ((config #>> '{checkpoint_storage,save_experiment_best}')::numeric::integer) STORED,
    save_trial_best integer GENERATED ALWAYS AS
        ((config #>> '{checkpoint_storage,save_trial_best}')::numeric::integer) STORED,
    save_trial_latest integer GENERATED ALWAYS AS
        ((config #>> '{checkpoint_storage,save_trial_latest}')::numeric::integer) STORED,
    CHECK ((end_time IS NULL) = (state NOT IN ('COMPLETED', 'CANCELED', 'ERROR')))
);
COMMENT ON COLUMN experiments.unmanaged IS
    'Made by a script that reports from outside det (core_v2.init, det_user.unmanaged_start): no '
    'searcher, no runs placed; its owner''s script reports through det_user.unmanaged_*.';
COMMENT ON COLUMN experiments.external_id IS
    'core_v2''s external_experiment_id: a later start with the same id (and owner) resumes it.';
-- Determined's core_v2: external ids find the experiment (and trial) a script resumes.
CREATE UNIQUE INDEX experiments_external ON experiments (owner, external_id)
    WHERE external_id IS NOT NULL;
COMMENT ON COLUMN experiments.config IS 'The expanded config: every default filled in.';
COMMENT ON COLUMN experiments.checkpoint_gc_error IS
    'Why the latest checkpoint GC task failed (a storage error, a killed task), shown by '
    '`det experiment describe`; cleared once no checkpoint of the experiment is DELETING.';
COMMENT ON COLUMN experiments.delete_requested_at IS
    '`det experiment delete` asked for it: its rows go once its checkpoints'' files are gone.';
COMMENT ON COLUMN experiments.paused_reason IS
    'Why the cluster paused the experiment (a run''s checkpoint storage error), shown by '
    '`det experiment describe`; cleared when it is activated, canceled or killed.';
COMMENT ON COLUMN experiments.tensorboards_deleted_at IS
    'When the GC task of its deletion removed its TensorBoard files (det_internal.purge_experiment '
    'waits for it when a trial of it ran, checkpoints or not).';
CREATE INDEX experiments_project ON experiments (project_id);
-- Experiments being deleted, looked at by every pass.
CREATE INDEX experiments_deleting ON experiments (id) WHERE delete_requested_at IS NOT NULL;
-- Live experiments (the states before COMPLETED in the enum), looked for by every pass: the
-- pass's queries name live states (state IN (...)) so that they use it, never state::text.
CREATE INDEX experiments_live ON experiments (state) WHERE state < 'COMPLETED';
-- Experiments not yet searched (the pass fills searcher_state at once): rare states get partial
-- indexes, so that a pass looking for them costs what it finds, not the queue's length.
-- Unmanaged experiments have no searcher.
CREATE INDEX experiments_unsearched ON experiments (id)
    WHERE searcher_state IS NULL AND state IN ('ACTIVE', 'PAUSED') AND NOT unmanaged;
COMMENT ON COLUMN experiments.searcher_state IS
    'The searcher''s state (JSON) but its random generator (searcher_rng), written in the same '
    'transaction that consumed the events which changed it. NULL until the searcher has made '
    'its initial decisions.';
-- Its own column: the state is saved at every step, the generator (3.3 KB) only at the steps
-- that drew from it, and an UPDATE that leaves a column alone does not write it again.
COMMENT ON COLUMN experiments.searcher_rng IS
    'The searcher''s random generator (det.reconciler.searchers.rng), written with '
    'searcher_state at the steps that drew from it. NULL until the searcher has begun.';
GRANT SELECT ON experiments TO det_user;

-- One row per trial the searcher created: its hyperparameters and seed, its state
-- (trial_state), how many runs and restarts it has had, and its restart point (the latest
-- checkpoint and the batches trained as of it).
CREATE TABLE trials (
    id                 integer PRIMARY KEY DEFAULT det_internal.next_id('trials'),
    experiment_id      integer NOT NULL REFERENCES experiments (id),
    request_id         uuid NOT NULL,
    hparams            jsonb NOT NULL,
    seed               bigint NOT NULL CHECK (seed >= 0),
    state              trial_state NOT NULL DEFAULT 'ACTIVE',
    closed             boolean NOT NULL DEFAULT false,
    restarts           integer NOT NULL DEFAULT 0 CHECK (restarts >= 0),
    runs               integer NOT NULL DEFAULT 0,
    steps_completed    bigint NOT NULL DEFAULT 0,
    latest_checkpoint  uuid,
    best_validation    double precision,
    exit_reason        text,
    start_time         timestamptz NOT NULL DEFAULT now(),
    end_time           timestamptz,
    metadata           jsonb NOT NULL DEFAULT '{}',
    external_id        text,
    UNIQUE (experiment_id, request_id)
);
COMMENT ON COLUMN trials.external_id IS
    'core_v2''s external_trial_id: a later start with the same id resumes this trial.';
CREATE UNIQUE INDEX trials_external ON trials (experiment_id, external_id)
    WHERE external_id IS NOT NULL;
COMMENT ON COLUMN trials.request_id IS
    'The searcher''s id for the trial; unique per experiment, so replaying a searcher decision '
    'cannot create a trial twice.';
COMMENT ON COLUMN trials.closed IS 'The searcher wants no more work from this trial.';
COMMENT ON COLUMN trials.steps_completed IS 'Batches trained as of the latest checkpoint.';
COMMENT ON COLUMN trials.metadata IS
    'What the trial''s code recorded with set_metadata (det_task.set_trial_metadata): a JSON '
    'object, merged key by key.';
CREATE INDEX trials_experiment ON trials (experiment_id);
-- Live trials, as experiments_live.
CREATE INDEX trials_live ON trials (state) WHERE state < 'COMPLETED';
-- Trials the searcher closed while they still live (their runs are told to stop).
CREATE INDEX trials_closed_live ON trials (id) WHERE closed AND state < 'COMPLETED';
GRANT SELECT ON trials TO det_user;

CREATE TABLE searcher_ops (
    id         bigserial PRIMARY KEY,
    trial_id   integer NOT NULL REFERENCES trials (id),
    length     bigint NOT NULL CHECK (length > 0),
    progress   double precision NOT NULL DEFAULT 0,
    completed  boolean NOT NULL DEFAULT false,
    metric     double precision,
    created_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE searcher_ops IS
    'Searcher operations: "train the trial to <length> units, then validate". Length is '
    'absolute, in the unit of searcher.max_length. A trial works on its oldest open op.';
-- A trial's open ops in order: det_task.current_op reads the first.
CREATE INDEX searcher_ops_open ON searcher_ops (trial_id, id) WHERE NOT completed;
GRANT SELECT ON searcher_ops TO det_user;

CREATE TABLE searcher_events (
    id            bigserial PRIMARY KEY,
    experiment_id integer NOT NULL REFERENCES experiments (id),
    trial_id      integer NOT NULL REFERENCES trials (id),
    -- validation_completed: an op's completion (det_task.complete_op); validation_reported: a
    -- validation row (det_internal.validation_reported); what each means is the searcher's call
    kind          text NOT NULL CHECK (kind IN ('validation_completed', 'validation_reported',
                                                'trial_exited', 'trial_exited_early')),
    payload       jsonb NOT NULL DEFAULT '{}',
    consumed      boolean NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE searcher_events IS
    'What the searcher has to learn about. The reconciler feeds unconsumed events to the '
    'experiment''s searcher and marks them consumed in the transaction that saves its state.';
-- The events a searcher has still to read, per experiment in order.
CREATE INDEX searcher_events_pending ON searcher_events (experiment_id, id) WHERE NOT consumed;

-- =============================================================================================
-- Tables: allocations (runs of tasks) and what they produce

CREATE TABLE allocations (
    id             bigserial PRIMARY KEY,
    job_id         bigint NOT NULL REFERENCES jobs (id),
    trial_id       integer REFERENCES trials (id),
    run            integer NOT NULL,
    resource_pool  text NOT NULL REFERENCES resource_pools (name),
    slots_needed   integer NOT NULL CHECK (slots_needed >= 0),
    spec           jsonb NOT NULL,
    desired_state  desired_state NOT NULL DEFAULT 'RUNNING',
    state          allocation_state NOT NULL DEFAULT 'PENDING',
    agent_id       text REFERENCES agents (id),
    token_hash     bytea,
    exit_code      integer,
    exit_reason    text,
    stop_requested_at timestamptz,
    preempt_acked  boolean NOT NULL DEFAULT false,
    settled        boolean NOT NULL DEFAULT false,
    created_at     timestamptz NOT NULL DEFAULT now(),
    assigned_at    timestamptz,
    started_at     timestamptz,
    ended_at       timestamptz,
    preemptible    boolean NOT NULL DEFAULT true,
    pending_reason text,
    out_of_work    boolean NOT NULL DEFAULT false,
    running_at     timestamptz,
    rendezvous     text,
    storage_error  text,
    planned_stop   boolean NOT NULL DEFAULT false,
    fenced_until   timestamptz,
    address        text,
    stop_reason    text,
    UNIQUE (trial_id, run),
    CHECK ((ended_at IS NULL) = (state <> 'TERMINATED')),
    CHECK (state = 'PENDING' OR state = 'TERMINATED' OR agent_id IS NOT NULL)
);
COMMENT ON TABLE allocations IS
    'One row per run of a task. The reconciler writes desired_state and the assignment; the '
    'agent writes the observed state. (trial_id, run) is unique, so a replayed pass cannot '
    'start a trial twice. spec holds what the agent needs to launch it (argv, env, context).';
COMMENT ON COLUMN allocations.stop_requested_at IS
    'When desired_state left RUNNING; a task still running preemption_timeout seconds later is '
    'killed, so nothing hangs in STOPPED forever.';
COMMENT ON COLUMN allocations.settled IS
    'The reconciler has folded this terminated allocation into its trial''s state.';
COMMENT ON COLUMN allocations.pending_reason IS
    'Why the allocation still waits, in the scheduler''s words from its latest pass.';
COMMENT ON COLUMN allocations.out_of_work IS
    'The task asked for its next searcher operation and was told there was none '
    '(det_task.current_op returned NULL). A clean exit then means the run finished its work, even '
    'if the searcher opened an op for the trial meanwhile (an adaptive ASHA promotion): the '
    'trial''s next run takes that op. Without it, a clean exit with an op open means the code '
    'ended its own training.';
COMMENT ON COLUMN allocations.running_at IS
    'When the agent reported the task running (its process or container started): with '
    'started_at (the claim, before any image pull or container creation) it tells how long a '
    'runtime took to start the task.';
COMMENT ON COLUMN allocations.rendezvous IS
    'host:port where the workers of an allocation spanning agents meet (torchrun''s master '
    'address and port), recorded by the chief''s agent (allocations.agent_id) before it '
    'starts its workers; the other agents start theirs once it is set.';
COMMENT ON COLUMN allocations.storage_error IS
    'The checkpoint storage error that ended the run: one line naming the path and the OS '
    'error, set by the task (det_task.report_storage_error); its exit reason, over the agent''s. '
    'A failed run with one pauses its experiment, without counting a restart '
    '(det.reconciler.trials.settle).';
COMMENT ON COLUMN allocations.planned_stop IS
    'Its agent stopped it on purpose (det_agent.stop_runs: the agent shut down; '
    'det_agent.mark_fenced: it killed its tasks for want of a heartbeat): however the run '
    'ends, its trial resumes from its latest checkpoint and the end is not a failure '
    '(restarts counts failures only).';
COMMENT ON COLUMN allocations.fenced_until IS
    'Set when the reconciler ends the run of a lost agent: until then the old process may '
    'still be alive (a frozen agent cannot kill it), so no new run of its trial is created. '
    'Longer than the task''s preemption watcher''s poll, after which a task whose token was '
    'revoked has exited (det.reconciler.passes.FENCE_SECONDS).';
COMMENT ON COLUMN allocations.address IS
    'host:port of an interactive task''s server (Jupyter, TensorBoard, sshd) once it answers, '
    'recorded by the task (det_task.ready); det serve proxies /proxy/<job>/ to it.';
COMMENT ON COLUMN allocations.stop_reason IS
    'Why det asked the run to stop, written with desired_state: a preemption naming whom its slots '
    'went to (det_internal.preempted_reason), a pause, a cancel or kill, the searcher closing its '
    'trial, a kill after preemption_timeout, an interactive task''s end. Its "why it ended" is this '
    'over the run''s own reason (det_user.run_end_reason).';
-- Each agent's live allocations (what an agent runs, what a lost agent leaves behind).
CREATE INDEX allocations_live ON allocations (agent_id) WHERE state <> 'TERMINATED';
-- Each agent's live zero-slot tasks, counted per agent by the scheduling pass (POOL_AGENTS).
CREATE INDEX allocations_aux_live ON allocations (agent_id)
    WHERE slots_needed = 0 AND state <> 'TERMINATED';
-- The scheduler's input: waiting allocations per pool, oldest first.
CREATE INDEX allocations_pending ON allocations (resource_pool, id) WHERE state = 'PENDING';
-- Ended runs the reconciler has yet to fold into their trials' state.
CREATE INDEX allocations_unsettled ON allocations (id) WHERE state = 'TERMINATED' AND NOT settled;
-- Live runs told to stop (by a pause, a stop, a closed trial or a preemption).
CREATE INDEX allocations_stopping ON allocations (id)
    WHERE desired_state <> 'RUNNING' AND state <> 'TERMINATED';
-- The running runs without a trial still wanted (interactive tasks, GC tasks): what the pass
-- checks for idleness and an unanswering server (LIVE_TASK_RUNS).
CREATE INDEX allocations_tasks_running ON allocations (job_id)
    WHERE trial_id IS NULL AND state = 'RUNNING' AND desired_state = 'RUNNING';
-- A job's runs, latest first: an interactive task's run (reporting.tasks, its logs, det_task.*),
-- one probe per task instead of a scan of every trial's runs (2.1 s -> 28 ms for 200 tasks
-- beside 100,000 runs).
CREATE INDEX allocations_job ON allocations (job_id, run);
-- Invariant: a trial has at most one live run.
CREATE UNIQUE INDEX allocations_one_live_per_trial ON allocations (trial_id)
    WHERE state <> 'TERMINATED';
-- det_internal.auth: a task's token (its hash) to its allocation.
CREATE INDEX allocations_token ON allocations (token_hash) WHERE token_hash IS NOT NULL;
-- allocations without token_hash
GRANT SELECT (id, job_id, trial_id, run, resource_pool, slots_needed, spec, desired_state,
              state, agent_id, exit_code, exit_reason, stop_requested_at, preempt_acked,
              settled, created_at, assigned_at, started_at, ended_at, preemptible,
              pending_reason, out_of_work, running_at, rendezvous, storage_error, planned_stop,
              fenced_until, address, stop_reason)
    ON allocations TO det_user;

CREATE TABLE allocation_slots (
    allocation_id bigint NOT NULL REFERENCES allocations (id),
    agent_id      text NOT NULL,
    slot_id       integer NOT NULL,
    released      boolean NOT NULL DEFAULT false,
    FOREIGN KEY (agent_id, slot_id) REFERENCES slots (agent_id, slot_id) ON DELETE CASCADE
);
COMMENT ON TABLE allocation_slots IS
    'Which slots an allocation holds. A slot is held by at most one live allocation.';
-- Invariant: a slot has at most one holder that has not released it.
CREATE UNIQUE INDEX allocation_slots_one_holder ON allocation_slots (agent_id, slot_id)
    WHERE NOT released;
CREATE INDEX allocation_slots_allocation ON allocation_slots (allocation_id);
GRANT SELECT ON allocation_slots TO det_user;

CREATE TABLE allocation_nodes (
    allocation_id bigint NOT NULL REFERENCES allocations (id),
    agent_id      text NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    node_rank     integer NOT NULL CHECK (node_rank >= 1),
    token_hash    bytea NOT NULL,
    state         allocation_state NOT NULL DEFAULT 'STARTING',
    exit_code     integer,
    exit_reason   text,
    PRIMARY KEY (allocation_id, agent_id),
    UNIQUE (allocation_id, node_rank)
);
COMMENT ON TABLE allocation_nodes IS
    'The agents of an allocation beyond its chief''s (node_rank 1, 2, ... in det_agent.gang_agents '
    'order), once each started its share of the workers: the token its workers use, and what '
    'its agent observed. One share failing ends the whole allocation '
    '(det_agent.report_node).';
-- det_internal.auth: a worker's token (its hash) to its allocation.
CREATE INDEX allocation_nodes_token ON allocation_nodes (token_hash);

CREATE TABLE metrics (
    id              bigserial PRIMARY KEY,
    trial_id        integer NOT NULL,  -- with allocation_id: an allocation of this trial
    allocation_id   bigint NOT NULL,   -- (checked per statement, det_internal.metrics_reference_check)
    "group"         text NOT NULL,
    steps_completed bigint NOT NULL CHECK (steps_completed >= 0),
    "values"        jsonb NOT NULL,
    reported_at     timestamptz NOT NULL DEFAULT now(),
    superseded_by   bigint
);
COMMENT ON TABLE metrics IS
    'Append-only metrics (training, validation, or any other group), read by range on '
    '(trial, group, steps).';
COMMENT ON COLUMN metrics.superseded_by IS
    'The run (allocation) that resumed the trial from a checkpoint taken before this row''s step, '
    'so that this row, reported by an earlier run after that checkpoint, is no longer part of the '
    'trial''s history (det_internal.metrics_supersede); NULL for the surviving rows. Kept for '
    'audit; readers show and count only rows where it is NULL.';
CREATE INDEX metrics_trial_group_steps ON metrics (trial_id, "group", steps_completed);
GRANT SELECT ON metrics TO det_user;

-- metrics' references are checked once per statement, not per row as foreign keys would
-- (two thirds of a row's cost, migration 0020): a task's batch names one allocation.
CREATE FUNCTION det_internal.metrics_reference_check() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- AFTER INSERT or UPDATE ON metrics, per statement: every new row's (allocation_id,
-- trial_id) is an allocation of that trial, locked until commit (SQLSTATE 23503 otherwise).
-- Runs as the owner, as a foreign key's check does.
DECLARE
    v_bad record;
BEGIN
    PERFORM 1 FROM allocations a
     WHERE a.id IN (SELECT DISTINCT allocation_id FROM new_rows)
       FOR KEY SHARE OF a;
    SELECT n.allocation_id, n.trial_id INTO v_bad
      FROM (SELECT DISTINCT allocation_id, trial_id FROM new_rows) n
     WHERE NOT EXISTS (SELECT 1 FROM allocations a
                        WHERE a.id = n.allocation_id AND a.trial_id = n.trial_id)
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'metrics: allocation % of trial % does not exist',
            v_bad.allocation_id, v_bad.trial_id
            USING ERRCODE = 'foreign_key_violation', TABLE = 'metrics';
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION det_internal.metrics_referenced_check() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- AFTER DELETE ON allocations (per statement, old_rows), BEFORE UPDATE OF id, trial_id (per
-- row) and AFTER TRUNCATE: no metrics row may be left naming an allocation that is gone
-- (SQLSTATE 23503). A metrics row's trial is its allocation's, so the trial index finds them.
DECLARE
    v_bad record;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        IF EXISTS (SELECT 1 FROM metrics) THEN
            RAISE EXCEPTION 'allocations: truncated while metrics still name them'
                USING ERRCODE = 'foreign_key_violation', TABLE = 'metrics',
                      HINT = 'Truncate metrics in the same statement.';
        END IF;
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        SELECT OLD.id AS id, OLD.trial_id AS trial_id INTO v_bad
         WHERE EXISTS (SELECT 1 FROM metrics m
                        WHERE m.trial_id = OLD.trial_id AND m.allocation_id = OLD.id);
    ELSE
        SELECT o.id, o.trial_id INTO v_bad
          FROM old_rows o
         WHERE o.trial_id IS NOT NULL
           AND EXISTS (SELECT 1 FROM metrics m
                        WHERE m.trial_id = o.trial_id AND m.allocation_id = o.id)
         LIMIT 1;
    END IF;
    IF FOUND THEN
        RAISE EXCEPTION 'allocation % of trial % is still named by metrics rows',
            v_bad.id, v_bad.trial_id
            USING ERRCODE = 'foreign_key_violation', TABLE = 'metrics';
    END IF;
    RETURN CASE TG_OP WHEN 'UPDATE' THEN NEW END;
END $$;

CREATE TRIGGER metrics_reference_insert AFTER INSERT ON metrics
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_internal.metrics_reference_check();
CREATE TRIGGER metrics_reference_update AFTER UPDATE ON metrics
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_internal.metrics_reference_check();
CREATE TRIGGER allocations_metrics_delete AFTER DELETE ON allocations
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION det_internal.metrics_referenced_check();
CREATE TRIGGER allocations_metrics_update BEFORE UPDATE OF id, trial_id ON allocations
    FOR EACH ROW WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.trial_id IS DISTINCT FROM NEW.trial_id)
    EXECUTE FUNCTION det_internal.metrics_referenced_check();
CREATE TRIGGER allocations_metrics_truncate AFTER TRUNCATE ON allocations
    FOR EACH STATEMENT EXECUTE FUNCTION det_internal.metrics_referenced_check();

CREATE TABLE metric_batches (
    writer        uuid PRIMARY KEY,
    allocation_id bigint NOT NULL REFERENCES allocations (id) ON DELETE CASCADE,
    last_seq      bigint NOT NULL CHECK (last_seq > 0)
);
COMMENT ON TABLE metric_batches IS
    'The last metrics batch each harness writer recorded: one row per writer (a DbTransport, '
    'named by a uuid it draws at start), whose batches are numbered 1, 2, ... and each sent '
    'only once the one before was acknowledged. A batch re-sent after a lost commit '
    'acknowledgement carries a number not above last_seq and is skipped, so no metrics row is '
    'written twice. Rows of terminated allocations are no longer needed (their token is dead).';
CREATE INDEX metric_batches_allocation ON metric_batches (allocation_id);

CREATE TABLE log_batches (
    writer        uuid NOT NULL,
    allocation_id bigint NOT NULL REFERENCES allocations (id) ON DELETE CASCADE,
    last_seq      bigint NOT NULL CHECK (last_seq > 0),
    PRIMARY KEY (allocation_id, writer)
);
COMMENT ON TABLE log_batches IS
    'The last log line each shipper wrote per allocation: one row per writer (an agent''s '
    'LogShipper, named by a uuid it draws at start) and allocation, whose lines are numbered '
    '1, 2, ... and sent in order. A batch re-sent after a lost commit acknowledgement (a '
    'failover) holds lines numbered not above last_seq, which are skipped, so no line is '
    'written twice.';

-- Checkpoints the tasks finished writing (det_task.report_checkpoint): where they are stored (the
-- experiment's checkpoint_storage) and their files. The one with the most steps is its trial's
-- restart point (trials.latest_checkpoint).
CREATE TABLE checkpoints (
    uuid            uuid PRIMARY KEY,
    trial_id        integer NOT NULL REFERENCES trials (id),
    allocation_id   bigint NOT NULL REFERENCES allocations (id),
    steps_completed bigint NOT NULL CHECK (steps_completed >= 0),
    state           text NOT NULL DEFAULT 'COMPLETED'
                    CHECK (state IN ('COMPLETED', 'DELETING', 'DELETED')),
    storage         jsonb NOT NULL,
    resources       jsonb NOT NULL DEFAULT '{}',
    metadata        jsonb NOT NULL DEFAULT '{}',
    reported_at     timestamptz NOT NULL DEFAULT now(),
    delete_requested_at timestamptz,
    deleted_at      timestamptz,
    freed_bytes     bigint,
    gc_pending      boolean NOT NULL DEFAULT true,
    CHECK ((state = 'DELETED') = (deleted_at IS NOT NULL)
           AND (state = 'COMPLETED') = (delete_requested_at IS NULL))
);
COMMENT ON COLUMN checkpoints.resources IS 'Files of the checkpoint: {relative path: bytes}.';
COMMENT ON COLUMN checkpoints.state IS
    'COMPLETED (its files are in storage) -> DELETING (GC or a user chose to delete it; a GC '
    'task removes its files) -> DELETED (files gone; the row stays as a record).';
COMMENT ON COLUMN checkpoints.delete_requested_at IS
    'When the checkpoint was last asked to be deleted; GC tasks that failed since are counted '
    'against it (the reconciler gives up after a few and leaves the error on the experiment).';
COMMENT ON COLUMN checkpoints.freed_bytes IS
    'Bytes of storage the deletion freed: the size of its files (resources), set at DELETED.';
COMMENT ON COLUMN checkpoints.gc_pending IS
    'Reported since the reconciler last applied its experiment''s GC policy: the pass applies '
    'it to the live experiments that have such checkpoints, then clears the flag.';
CREATE INDEX checkpoints_trial ON checkpoints (trial_id, steps_completed);
-- What GC tasks still have to remove, per trial (read by every pass).
CREATE INDEX checkpoints_deleting ON checkpoints (trial_id) WHERE state = 'DELETING';
-- Checkpoints new since the pass last applied the GC policy (read by every pass).
CREATE INDEX checkpoints_gc_pending ON checkpoints (trial_id) WHERE gc_pending;
-- Whether a live run has checkpointed yet (the scheduler's POOL_TASKS: a run that has not is
-- protected from preemption for scheduler.min_run_time): one probe per running run.
CREATE INDEX checkpoints_allocation ON checkpoints (allocation_id);
GRANT SELECT ON checkpoints TO det_user;

CREATE FUNCTION det_internal.checkpoint_input_check() RETURNS trigger LANGUAGE plpgsql AS $$
-- BEFORE INSERT ON checkpoints: what a task records of a checkpoint (det_task.report_checkpoint)
-- is refused (invalid_parameter_value naming the field) unless steps_completed is at most
-- 2^53 - 1 (as metrics' steps), resources is a JSON object of at most 8 MiB mapping each
-- file's path, relative and inside the checkpoint (not empty, not starting with '/', no '..'
-- part, no control character), to its size in bytes (a whole number 0 to 2^63 - 1: the GC
-- sums them as bigint), and metadata is an object of at most 64 KiB nested at most 32 levels.
DECLARE
    v_bad record;
    v_problem text := det_internal.json_problem(NEW.metadata, 65536);
BEGIN
    IF NEW.steps_completed > 9007199254740991 THEN
        RAISE EXCEPTION 'checkpoint steps_completed: expected 0 to 2^53 - 1, not %',
            NEW.steps_completed USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(NEW.resources) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'checkpoint resources: expected a JSON object of file path -> size '
            'in bytes, not %', coalesce(jsonb_typeof(NEW.resources), 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_column_size(NEW.resources) > 8388608 THEN
        RAISE EXCEPTION 'checkpoint resources: % bytes, more than the % allowed',
            pg_column_size(NEW.resources), 8388608 USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT r.key, r.value INTO v_bad FROM jsonb_each(NEW.resources) r
     WHERE r.key = '' OR r.key ~ '^/' OR r.key ~ '(^|/)\.\.(/|$)' OR r.key ~ '[[:cntrl:]]'
        OR jsonb_typeof(r.value) <> 'number'
        OR (r.value #>> '{}')::numeric NOT BETWEEN 0 AND 9223372036854775807
        OR (r.value #>> '{}')::numeric <> trunc((r.value #>> '{}')::numeric)
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'checkpoint resources: entry % -> % is not a relative file path '
            'inside the checkpoint with a whole number of bytes >= 0', to_jsonb(v_bad.key),
            v_bad.value USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'checkpoint metadata %', v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER checkpoints_input_check BEFORE INSERT OR UPDATE OF metadata ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION det_internal.checkpoint_input_check();

CREATE TABLE tasks (
    job_id         bigint PRIMARY KEY REFERENCES jobs (id),
    type           text NOT NULL CHECK (type IN ('COMMAND', 'NOTEBOOK', 'SHELL', 'TENSORBOARD')),
    description    text NOT NULL,
    config         jsonb NOT NULL,
    project_id     integer NOT NULL REFERENCES projects (id),
    context_id     bigint REFERENCES context_blobs (id),
    experiment_ids integer[] NOT NULL DEFAULT '{}',
    trial_ids      integer[] NOT NULL DEFAULT '{}',
    last_activity  timestamptz NOT NULL DEFAULT now(),
    end_reason     text,
    -- seconds without activity before the pass ends the task; parsed once from its config
    idle_timeout   double precision
        GENERATED ALWAYS AS ((config ->> 'idle_timeout')::double precision) STORED
);
COMMENT ON TABLE tasks IS
    'One row per interactive task (command, notebook, shell, TensorBoard); its job row holds '
    'the owner, workspace, pool and priority, its one allocation the run. config is the '
    'expanded task config (det.configs.task, every default filled).';
COMMENT ON COLUMN tasks.experiment_ids IS
    'A TensorBoard''s experiments (with trial_ids, its trials): whose event files it shows.';
COMMENT ON COLUMN tasks.last_activity IS
    'The latest sign of use: the task''s server reports it (det_task.activity: open kernels, '
    'terminals, SSH sessions) and det serve''s proxy touches it (det_user.task_open). The pass ends '
    'a task idle past its idle_timeout.';
COMMENT ON COLUMN tasks.end_reason IS
    'Why the task ended: det''s reason when det ended it ("killed by alice", "idle for 10m0s", '
    '"the task''s server did not answer within 2m0s"), else its run''s end as the pass settled '
    'it ("exited with code 3", "agent lost"). NULL while it runs.';
CREATE INDEX tasks_project ON tasks (project_id);
GRANT SELECT ON tasks TO det_user;

CREATE TABLE task_secrets (
    job_id          bigint PRIMARY KEY REFERENCES tasks (job_id),
    jupyter_token   text NOT NULL,
    ssh_private_key text NOT NULL,
    ssh_public_key  text NOT NULL
);
COMMENT ON TABLE task_secrets IS
    'Per-task secrets, made at submission: the token of a notebook''s Jupyter server (only det '
    'serve''s proxy sends it) and a shell''s key pair. No user reads this table: the task gets its '
    'own through det_task.secrets, a user who may open the task through det_user.task_open and '
    'det_user.task_ssh_key.';

CREATE TABLE task_logs (
    id            bigserial PRIMARY KEY,
    allocation_id bigint NOT NULL REFERENCES allocations (id),
    trial_id      integer REFERENCES trials (id),
    stream        text NOT NULL CHECK (stream IN ('stdout', 'stderr', 'det')),
    ts            timestamptz NOT NULL DEFAULT now(),
    line          text NOT NULL,
    rank          integer CHECK (rank >= 0)
);
COMMENT ON TABLE task_logs IS 'Append-only task output, written by agents in batches.';
COMMENT ON COLUMN task_logs.rank IS
    'The worker (torch rank) that wrote the line: from det.launch.wrap_rank''s [rank=N] tag, '
    'which the agent takes off the line; 0 for the one process of a trial run on at most one '
    'slot; NULL for det''s own notes and lines of no worker (a launcher, a command).';
CREATE INDEX task_logs_trial ON task_logs (trial_id, id);
CREATE INDEX task_logs_allocation ON task_logs (allocation_id, id);
GRANT SELECT ON task_logs TO det_user;

-- =============================================================================================
-- Tables: the model registry and configuration templates

CREATE FUNCTION det_user.model_name_problem(p_name text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
-- Why p_name cannot name a model, or NULL. Determined's rules (master/internal/api_model.go):
-- not blank, no runs of spaces, no slashes, not only digits (a number names a model by its
-- id); det's: at most 255 characters, no control characters (a name is one table cell).
-- Names are also unique regardless of case (models_name_lower).
    SELECT CASE
        WHEN p_name IS NULL OR btrim(p_name) = '' THEN 'cannot be blank'
        WHEN length(p_name) > 255 THEN 'must be at most 255 characters'
        WHEN p_name ~ '[[:cntrl:]]' THEN 'cannot contain line breaks or control characters'
        WHEN strpos(p_name, '  ') > 0 THEN 'cannot have excessive spacing (two spaces in a row)'
        WHEN strpos(p_name, '/') > 0 OR strpos(p_name, '\') > 0 THEN 'cannot have slashes'
        WHEN p_name ~ '^[0-9]+$' THEN 'cannot be only numbers (a number names a model by id)'
    END;
$$;
GRANT EXECUTE ON FUNCTION det_user.model_name_problem(text) TO det_user;

CREATE FUNCTION det_user.label_problem(p_labels text[]) RETURNS text LANGUAGE sql IMMUTABLE AS $$
-- Why a list of labels (of a model or a model version) is not acceptable, or NULL: each label
-- is non-blank, at most 255 characters, without control characters.
    SELECT format('label %s %s', to_jsonb(l),
                  CASE WHEN btrim(l) = '' THEN 'cannot be blank'
                       WHEN length(l) > 255 THEN 'must be at most 255 characters'
                       ELSE 'cannot contain line breaks or control characters' END)
      FROM unnest(p_labels) l
     WHERE l IS NULL OR btrim(l) = '' OR length(l) > 255 OR l ~ '[[:cntrl:]]'
     LIMIT 1;
$$;
GRANT EXECUTE ON FUNCTION det_user.label_problem(text[]) TO det_user;

CREATE TABLE models (
    id                serial PRIMARY KEY,
    name              text NOT NULL CHECK (det_user.model_name_problem(name) IS NULL),
    description       text NOT NULL DEFAULT '' CHECK (length(description) <= 4096),
    notes             text NOT NULL DEFAULT '' CHECK (length(notes) <= 1048576),
    metadata          jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    labels            text[] NOT NULL DEFAULT '{}' CHECK (det_user.label_problem(labels) IS NULL),
    owner             text NOT NULL,
    archived          boolean NOT NULL DEFAULT false,
    creation_time     timestamptz NOT NULL DEFAULT now(),
    last_updated_time timestamptz NOT NULL DEFAULT now(),
    workspace_id      integer NOT NULL DEFAULT 1 REFERENCES workspaces (id)
);
COMMENT ON TABLE models IS
    'The model registry (spec: Model Registry): named groups of checkpoints, possibly from '
    'different experiments, with a description, labels, metadata and Markdown notes. An '
    'archived model takes no new versions and no changes until it is unarchived.';
-- Invariant: model names are unique regardless of case (Determined: "avoid names equal to
-- other models (case-insensitive)"); det_user.model_find looks names up the same way.
CREATE UNIQUE INDEX models_name_lower ON models (lower(name));
GRANT SELECT ON models TO det_user;

CREATE TABLE model_versions (
    id                serial PRIMARY KEY,
    model_id          integer NOT NULL REFERENCES models (id) ON DELETE CASCADE,
    version           integer NOT NULL CHECK (version > 0),
    checkpoint_uuid   uuid NOT NULL REFERENCES checkpoints (uuid) ON DELETE RESTRICT,
    name              text NOT NULL DEFAULT '' CHECK (length(name) <= 255),
    notes             text NOT NULL DEFAULT '' CHECK (length(notes) <= 1048576),
    metadata          jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    labels            text[] NOT NULL DEFAULT '{}' CHECK (det_user.label_problem(labels) IS NULL),
    owner             text NOT NULL,
    creation_time     timestamptz NOT NULL DEFAULT now(),
    last_updated_time timestamptz NOT NULL DEFAULT now(),
    UNIQUE (model_id, version)
);
COMMENT ON TABLE model_versions IS
    'Versions of a model, numbered 1, 2, ... per model, each one checkpoint. A registered '
    'checkpoint is pinned: its row cannot be deleted while a version names it (ON DELETE '
    'RESTRICT), nor can it leave the COMPLETED state (checkpoints_keep_pinned), so checkpoint '
    'GC keeps it.';
-- The pin's lookup when a checkpoint row is deleted, and GC's keep rule.
CREATE INDEX model_versions_checkpoint ON model_versions (checkpoint_uuid);
GRANT SELECT ON model_versions TO det_user;

CREATE FUNCTION det_internal.keep_pinned_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
-- A checkpoint that a model version names stays COMPLETED: GC and deletion may not move it to
-- another state (the pin's second half; ON DELETE RESTRICT is the first). The check runs on
-- the row as it is when the update takes effect, with a fresh snapshot, so a version
-- registered while a GC statement waited for the row still stops it.
DECLARE
    v_model text;
    v_version integer;
BEGIN
    SELECT m.name, v.version INTO v_model, v_version
      FROM model_versions v JOIN models m ON m.id = v.model_id
     WHERE v.checkpoint_uuid = NEW.uuid ORDER BY v.id LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'checkpoint % is registered in the model registry (model %, version %) '
            'and cannot be deleted; delete its model versions first (det model delete-version)',
            NEW.uuid, to_jsonb(v_model), v_version USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER checkpoints_keep_pinned BEFORE UPDATE OF state ON checkpoints
    FOR EACH ROW WHEN (NEW.state <> 'COMPLETED')
        EXECUTE FUNCTION det_internal.keep_pinned_checkpoint();

CREATE FUNCTION det_user.template_name_problem(p_name text) RETURNS text
    LANGUAGE sql IMMUTABLE AS $$
-- Why p_name cannot name a configuration template, or NULL: non-blank, at most 255
-- characters, without control characters.
    SELECT CASE
        WHEN p_name IS NULL OR btrim(p_name) = '' THEN 'cannot be blank'
        WHEN length(p_name) > 255 THEN 'must be at most 255 characters'
        WHEN p_name ~ '[[:cntrl:]]' THEN 'cannot contain line breaks or control characters'
    END;
$$;
GRANT EXECUTE ON FUNCTION det_user.template_name_problem(text) TO det_user;

CREATE FUNCTION det_user.secret_name(p_name text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
-- Whether a config key (or an environment variable's name) holds a secret: S3's access_key
-- and secret_key, registry_auth's password, auth and tokens, and their like (api_key,
-- credentials, AWS_SECRET_ACCESS_KEY, HF_TOKEN). Words are split at '_' and '-', so that
-- max_tokens or tokenizer are not secrets.
SELECT p_name ~* '^(auth|identitytoken|registrytoken|connection_string)$'
    OR p_name ~* '(^|[_-])(secrets?|passwords?|passwd|token|credentials?|access_key|private_key|api_key)([_-]|$)'
$$;
GRANT EXECUTE ON FUNCTION det_user.secret_name(text) TO det_user;

CREATE FUNCTION det_user.redact_secrets(p_value jsonb) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE AS $$
-- p_value with every secret replaced by '********': the value of each key that
-- det_user.secret_name calls a secret, at any depth, and the value of each 'NAME=VALUE' list item
-- (environment_variables) whose NAME is one. A null stays null: it hides nothing.
BEGIN
    CASE jsonb_typeof(p_value)
    WHEN 'object' THEN
        RETURN (SELECT coalesce(jsonb_object_agg(e.k, CASE
                    WHEN det_user.secret_name(e.k) AND jsonb_typeof(e.v) <> 'null' THEN '"********"'
                    ELSE det_user.redact_secrets(e.v) END), '{}')
                  FROM jsonb_each(p_value) AS e(k, v));
    WHEN 'array' THEN
        RETURN (SELECT coalesce(jsonb_agg(CASE
                    WHEN jsonb_typeof(e.v) = 'string' AND strpos(e.v #>> '{}', '=') > 1
                         AND det_user.secret_name(split_part(e.v #>> '{}', '=', 1))
                    THEN to_jsonb(split_part(e.v #>> '{}', '=', 1) || '=********')
                    ELSE det_user.redact_secrets(e.v) END ORDER BY e.i), '[]')
                  FROM jsonb_array_elements(p_value) WITH ORDINALITY AS e(v, i));
    ELSE
        RETURN p_value;
    END CASE;
END $$;
GRANT EXECUTE ON FUNCTION det_user.redact_secrets(jsonb) TO det_user;

CREATE TABLE templates (
    name              text NOT NULL CHECK (det_user.template_name_problem(name) IS NULL),
    config            jsonb NOT NULL CHECK (jsonb_typeof(config) = 'object'),
    original          text NOT NULL,
    owner             text NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    workspace_id      integer NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    redacted_config   jsonb GENERATED ALWAYS AS (det_user.redact_secrets(config)) STORED,
    redacted_original text GENERATED ALWAYS AS (
        CASE WHEN det_user.redact_secrets(config) = config THEN original END) STORED,
    PRIMARY KEY (workspace_id, name)
);
COMMENT ON TABLE templates IS
    'Configuration templates (spec: Configuration Templates): a partial experiment config that '
    '`det experiment create --template NAME` merges under the user''s config '
    '(det.configs.templates). Experiments store the merged config, so changing or removing a '
    'template later changes no experiment. A template is its workspace''s: '
    'readable under the workspace''s row-level security, written by its Editors.';
COMMENT ON COLUMN templates.config IS
    'The template as set, secrets included: users may not select it (nor original); '
    'det_user.template_expand gives it to an Editor of the workspace submitting an experiment.';
COMMENT ON COLUMN templates.redacted_config IS
    'config with its secrets replaced by ''********'' (det_user.redact_secrets): what users read.';
COMMENT ON COLUMN templates.redacted_original IS
    'The YAML as set when it holds no secret, else NULL (its text cannot be redacted).';
-- templates without their secrets: config and original are read only through
-- det_user.template_expand, at submission
REVOKE ALL ON templates FROM PUBLIC;
GRANT SELECT (workspace_id, name, owner, created_at, updated_at, redacted_config,
              redacted_original)
    ON templates TO det_user;

-- =============================================================================================
-- Tables: det serve, the HTTP server

CREATE TABLE web_sessions (
    token_hash bytea PRIMARY KEY,
    username   text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    CHECK (expires_at > created_at),
    password_stamp bytea
);
COMMENT ON TABLE web_sessions IS
    'Login tokens of det serve (POST /api/v1/auth/login), by SHA-256 hash: the token itself is '
    'never stored. A token is good until expires_at; expired rows are removed at each login.';
COMMENT ON COLUMN web_sessions.password_stamp IS
    'det_internal.password_stamp of the user''s password when the token was minted: the token is '
    'good only while it is still the user''s password. NULL where det cannot read verifiers.';

CREATE TABLE login_throttle (
    kind         text NOT NULL CHECK (kind IN ('user', 'address')),
    key          text NOT NULL,
    failures     integer NOT NULL DEFAULT 0 CHECK (failures >= 0),
    locked_until timestamptz,
    forget_at    timestamptz NOT NULL,
    PRIMARY KEY (kind, key)
);
COMMENT ON TABLE login_throttle IS
    'Failed logins to det serve per user name tried (kind user) and per client address (kind '
    'address), and until when further attempts are refused (det_web.login_begin: the rule). A row '
    'is forgotten at forget_at, 15 minutes after its last failure or the end of its lock.';
CREATE INDEX login_throttle_forget ON login_throttle (forget_at);

CREATE UNLOGGED TABLE web_event_marks (
    topic   text PRIMARY KEY,
    sent_at timestamptz NOT NULL
);
COMMENT ON TABLE web_event_marks IS
    'When a throttled det_web event (new metrics or logs of a trial) was last sent, so that a '
    'trial reporting many batches a second wakes the servers at most every 0.2 s (the rest '
    'is picked up by their periodic look). Unlogged: losing it in a crash costs one event.';

CREATE UNLOGGED TABLE web_watchers (
    server text PRIMARY KEY,
    until  timestamptz NOT NULL
);
COMMENT ON TABLE web_watchers IS
    'det serve processes with open event streams, each until its lease runs out (det_web.watch). '
    'The det_web triggers fire only while one lease is live. Unlogged: after a crash the '
    'servers take their leases again within a second.';

-- =============================================================================================
-- NOTIFY channels
--
-- PostgreSQL has no privilege on LISTEN or NOTIFY: any role may listen or notify on any
-- channel it can name. So det's channels have names no user or task can know: each is built
-- by det_internal.channel from a random cluster secret that only the schema's owner reads. det's
-- own processes LISTEN through functions that never hand the name to a caller outside det's
-- roles (det_internal.listen for the owner, det_web.listen, det_agent.listen, det_task.listen), and
-- the LISTEN runs inside the function, so the name never appears in a statement's text
-- (pg_stat_activity shows a session's last statement to every session of its role). NOTIFY
-- stays a hint: every listener also polls, and det serve reads what changed under the
-- request's user's row-level security.

CREATE TABLE channel_key (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    -- 32 bytes (244 random bits) of two v4 UUIDs: gen_random_uuid draws from the server's
    -- strong random source and needs no extension
    secret    bytea NOT NULL DEFAULT decode(replace(gen_random_uuid()::text
                                                    || gen_random_uuid()::text, '-', ''), 'hex')
);
COMMENT ON TABLE channel_key IS
    'The secret det_internal.channel builds NOTIFY channel names from (one row, made with the '
    'schema). Granted to no role: only the owner and its SECURITY DEFINER functions read it.';
INSERT INTO channel_key DEFAULT VALUES;

CREATE FUNCTION det_internal.channel(p_kind text, p_key text) RETURNS text LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The channel of kind ``p_kind`` ("reconciler", "web": p_key ''; "agent": the agent's id;
-- "alloc": the allocation's id) for this cluster: det_<kind>_<40 hex digits of
-- SHA-256(secret || kind:key)>, at most 55 bytes (a channel name is an identifier of 63).
-- The secret is of fixed length and a key is text (never a NUL byte), so no name derives from
-- another's (SHA-256's length extension appends padding with NUL bytes). Executable by the
-- owner alone (det.db.channels).
DECLARE
    v_secret bytea := (SELECT secret FROM channel_key);
BEGIN
    IF p_kind IS NULL OR p_kind NOT IN ('reconciler', 'web', 'agent', 'alloc') THEN
        RAISE EXCEPTION 'det_internal.channel: kind must be reconciler, web, agent or alloc, got %',
            coalesce(p_kind, 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_key IS NULL THEN
        RAISE EXCEPTION 'det_internal.channel: key of a % channel must not be NULL', p_kind
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_secret IS NULL THEN
        RAISE EXCEPTION 'det_internal.channel: table channel_key has no secret (the schema made one)'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN 'det_' || p_kind || '_'
        || left(encode(sha256(v_secret || convert_to(p_kind || ':' || p_key, 'UTF8')), 'hex'), 40);
END $$;

CREATE FUNCTION det_internal.listen(p_kind text, p_key text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- This session LISTENs on det_internal.channel(p_kind, p_key) from its transaction's commit on (as
-- a LISTEN statement would). Executable by the owner alone: the reconciler's own channel.
BEGIN
    EXECUTE format('LISTEN %I', det_internal.channel(p_kind, p_key));
END $$;

CREATE FUNCTION det_web.listen() RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve's event listener (det_web) LISTENs on the web channel (det_internal.web_event).
    SELECT det_internal.listen('web', '');
$$;
-- each of det's roles LISTENs on its own NOTIFY channel, never learning another's
GRANT EXECUTE ON FUNCTION det_web.listen() TO det_web;

CREATE FUNCTION det_internal.agent_check_self(p_agent text) RETURNS void LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Every agent function that names an agent first calls this: a login enrolled as an agent
-- (agent_logins) acts only for its own agent id, and not at all once revoked. Sessions of
-- other roles (the shared det_agent login of the single-host mode, the owner) pass. Raises
-- insufficient_privilege naming both agents; invalid_authorization_specification (28000)
-- for a revoked login (a session that slipped in before det_user.agent_revoke committed).
DECLARE
    l agent_logins;
BEGIN
    SELECT * INTO l FROM agent_logins WHERE role_name = session_user;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF l.revoked_at IS NOT NULL THEN
        RAISE EXCEPTION 'agent %: its login % was revoked at %', l.agent_id, l.role_name,
            l.revoked_at USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF p_agent IS DISTINCT FROM l.agent_id THEN
        RAISE EXCEPTION 'agent %: login % acts only for agent %', coalesce(p_agent, 'NULL'),
            l.role_name, l.agent_id USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;


CREATE FUNCTION det_internal.agent_check_allocation(p_allocation bigint) RETURNS void
    LANGUAGE plpgsql
STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent function that names an allocation rather than an agent calls this: a login enrolled
-- as an agent (agent_logins) acts only for allocations it is the chief of or holds (or held:
-- logs are flushed after a run ends) slots of; otherwise det_internal.agent_check_self refuses it
-- as acting for the allocation's chief. Sessions of other roles pass.
DECLARE
    l agent_logins;
    v_chief text;
BEGIN
    SELECT * INTO l FROM agent_logins WHERE role_name = session_user;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT a.agent_id INTO v_chief FROM allocations a WHERE a.id = p_allocation;
    IF v_chief IS DISTINCT FROM l.agent_id
       AND NOT EXISTS (SELECT 1 FROM allocation_slots h
                        WHERE h.allocation_id = p_allocation AND h.agent_id = l.agent_id) THEN
        PERFORM det_internal.agent_check_self(v_chief);
    END IF;
    PERFORM det_internal.agent_check_self(l.agent_id);
END $$;


CREATE FUNCTION det_agent.listen(p_agent text) RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent (det_agent) LISTENs on its own channel: the reconciler wakes it there when its
-- assignments or their desired states change. An agent names itself, as in every function
-- of det_agent's.
SELECT det_internal.agent_check_self(p_agent);
    SELECT det_internal.listen('agent', p_agent);
$$;
-- each of det's roles LISTENs on its own NOTIFY channel, never learning another's
GRANT EXECUTE ON FUNCTION det_agent.listen(text) TO det_agent;

CREATE FUNCTION det_task.listen(p_token text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A task (det_task) LISTENs on its own allocation's channel, named by its token: woken there
-- when it should preempt (empty payload) or its trial's next searcher op is decided ("op").
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    PERFORM det_internal.listen('alloc', a.id::text);
END $$;
-- each of det's roles LISTENs on its own NOTIFY channel, never learning another's
GRANT EXECUTE ON FUNCTION det_task.listen(text) TO det_task;

-- =============================================================================================
-- Transition rules

CREATE FUNCTION det_user.stopped_state(p_state text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
-- The terminal state a STOPPING_* experiment or trial ends in (STOPPING_KILLED ends CANCELED);
-- any other state is returned as it is. The one home of this rule: the transition trigger,
-- the reconciler's finishing steps and reports all call it.
    SELECT CASE WHEN p_state LIKE 'STOPPING\_%'
                THEN replace(substr(p_state, 10), 'KILLED', 'CANCELED') ELSE p_state END;
$$;
GRANT EXECUTE ON FUNCTION det_user.stopped_state(text) TO det_user;

CREATE FUNCTION det_internal.check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
-- Experiments and trials: terminal states are final (but an unmanaged one's, resumed), and a
-- STOPPING_* state only moves on to its terminal state (det_user.stopped_state), or to a harsher
-- STOPPING_* (a cancel may become a kill). Allocations: the observed state only moves forward.
DECLARE
    old_s text := OLD.state::text;
    new_s text := NEW.state::text;
BEGIN
    IF old_s = new_s THEN
        RETURN NEW;
    END IF;
    IF TG_TABLE_NAME = 'allocations' THEN
        IF NEW.state < OLD.state THEN
            RAISE EXCEPTION 'allocation %: illegal state change % -> %', OLD.id, old_s, new_s
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    -- A later start of an unmanaged script resumes its ended experiment and trial
    -- (det_user.unmanaged_start), as upstream reopens an unmanaged trial.
    IF old_s IN ('COMPLETED', 'CANCELED', 'ERROR') AND new_s = 'ACTIVE'
       AND EXISTS (SELECT 1 FROM experiments e
                    WHERE e.unmanaged AND e.id = CASE TG_TABLE_NAME
                        WHEN 'experiments' THEN OLD.id
                        ELSE (SELECT t.experiment_id FROM trials t WHERE t.id = OLD.id) END) THEN
        RETURN NEW;
    END IF;
    IF old_s IN ('COMPLETED', 'CANCELED', 'ERROR')
       OR (old_s LIKE 'STOPPING_%' AND new_s IN ('ACTIVE', 'PAUSED'))
       OR (old_s = 'STOPPING_KILLED' AND new_s LIKE 'STOPPING_%')
       OR (old_s = 'STOPPING_CANCELED' AND new_s IN ('STOPPING_COMPLETED', 'COMPLETED'))
       OR (old_s LIKE 'STOPPING_%' AND new_s NOT LIKE 'STOPPING_%'
           AND new_s <> det_user.stopped_state(old_s)) THEN
        RAISE EXCEPTION '% %: illegal state change % -> %', TG_TABLE_NAME, OLD.id, old_s, new_s
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER experiments_transition BEFORE UPDATE OF state ON experiments
    FOR EACH ROW EXECUTE FUNCTION det_internal.check_transition();
CREATE TRIGGER trials_transition BEFORE UPDATE OF state ON trials
    FOR EACH ROW EXECUTE FUNCTION det_internal.check_transition();
CREATE TRIGGER allocations_transition BEFORE UPDATE OF state ON allocations
    FOR EACH ROW EXECUTE FUNCTION det_internal.check_transition();

CREATE FUNCTION det_internal.instance_transition() RETURNS trigger LANGUAGE plpgsql AS $$
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
    FOR EACH ROW EXECUTE FUNCTION det_internal.instance_transition();

-- =============================================================================================
-- Access control: who is calling, what they may do, and the audit log. User
-- actions are SECURITY DEFINER functions (they run as the schema's owner, so row-level
-- security does not hide rows from them): each checks its caller's permission with
-- det_internal.require in the transaction of its change.

CREATE FUNCTION det_user.caller() RETURNS text LANGUAGE sql STABLE AS $$
-- The user acting in this session: its login role (session_user, which a SECURITY DEFINER
-- function does not change, unlike current_user), or, for det serve (connected as det_web),
-- the user whose token det_web.auth accepted in this transaction.
SELECT coalesce(CASE WHEN pg_has_role(session_user, 'det_web', 'MEMBER')
                     THEN nullif(current_setting('det.web_user', true), '') END,
                session_user::text)
$$;
GRANT EXECUTE ON FUNCTION det_user.caller() TO det_user;

CREATE FUNCTION det_user.is_owner_session() RETURNS boolean LANGUAGE plpgsql STABLE AS $$
-- Whether the session is the cluster's own (the role owning det's tables, a member of it, or
-- a superuser: the reconciler, `det cluster up`) acting as no det user. It holds every
-- permission.
BEGIN
    RETURN NOT EXISTS (SELECT 1 FROM users WHERE username = det_user.caller())
       AND pg_has_role(session_user, (SELECT relowner FROM pg_class
                                       WHERE oid = 'experiments'::regclass), 'MEMBER');
END $$;
GRANT EXECUTE ON FUNCTION det_user.is_owner_session() TO det_user;

CREATE FUNCTION det_user.user_grants(p_user text)
RETURNS TABLE (workspace_id integer, permissions text[]) LANGUAGE sql STABLE AS $$
-- What active user p_user holds: one row per role assigned to them or to one of their
-- groups, with its workspace (NULL: every workspace) and its permissions (see roles). The
-- one home of that rule: det_user.permitted and det_user.visible_workspaces read it.
SELECT a.workspace_id, r.permissions
  FROM users u
  JOIN role_assignments a
    ON a.user_id = u.id
    OR a.group_id IN (SELECT m.group_id FROM user_group_members m WHERE m.user_id = u.id)
  JOIN roles r ON r.name = a.role
 WHERE u.username = p_user AND u.active
$$;
GRANT EXECUTE ON FUNCTION det_user.user_grants(text) TO det_user;

CREATE FUNCTION det_user.permitted(p_user text, p_permission text, p_workspace integer)
RETURNS boolean LANGUAGE sql STABLE AS $$
-- Whether active user p_user holds p_permission in workspace p_workspace (NULL: globally)
-- through a role held globally or there (det_user.user_grants).
SELECT EXISTS (
    SELECT 1 FROM det_user.user_grants(p_user) g
     WHERE p_permission = ANY (g.permissions)
       AND (g.workspace_id IS NULL OR g.workspace_id = p_workspace))
$$;
GRANT EXECUTE ON FUNCTION det_user.permitted(text, text, integer) TO det_user;

CREATE FUNCTION det_user.visible_workspaces() RETURNS integer[] LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The workspaces the calling user may view (det_user.permitted's rule, as one query): what the
-- row-level security policies key on, called once per query as an InitPlan:
-- `= ANY ((SELECT det_user.visible_workspaces())::integer[])`.
WITH viewable AS (SELECT g.workspace_id FROM det_user.user_grants(det_user.caller()) g
                   WHERE 'view' = ANY (g.permissions))
SELECT CASE WHEN EXISTS (SELECT 1 FROM viewable WHERE workspace_id IS NULL)
            THEN (SELECT coalesce(array_agg(id), '{}') FROM workspaces)
            ELSE (SELECT coalesce(array_agg(DISTINCT workspace_id), '{}') FROM viewable) END
$$;
GRANT EXECUTE ON FUNCTION det_user.visible_workspaces() TO det_user;

CREATE FUNCTION det_user.visible_projects() RETURNS integer[] LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The projects of det_user.visible_workspaces: experiments' policy keys on them, so that a user of
-- few projects reads their experiments through the project index.
SELECT coalesce(array_agg(id), '{}') FROM projects
 WHERE workspace_id = ANY (det_user.visible_workspaces())
$$;
GRANT EXECUTE ON FUNCTION det_user.visible_projects() TO det_user;

CREATE FUNCTION det_user.role_needed(p_permission text) RETURNS text LANGUAGE sql STABLE AS $$
-- The least role that grants p_permission, to name in a refusal.
SELECT name FROM roles WHERE p_permission = ANY (permissions)
 ORDER BY cardinality(permissions), name LIMIT 1
$$;
GRANT EXECUTE ON FUNCTION det_user.role_needed(text) TO det_user;

CREATE FUNCTION det_internal.require(p_permission text, p_workspace integer, p_action text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
-- Check that the caller may do p_action (words for the refusal: 'pause experiment 12') with
-- p_permission in workspace p_workspace (NULL: a cluster-wide permission); returns the
-- caller's name. Refusal is insufficient_privilege, one line naming the role and scope:
-- "permission denied: needs Editor on workspace 'vision' to pause experiment 12". A caller
-- who may not even view the workspace is told what they asked about is not found
-- (no_data_found), as row-level security would show it: no rows.
DECLARE
    v_user text := det_user.caller();
BEGIN
    IF det_user.is_owner_session() THEN
        RETURN v_user;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM users WHERE username = v_user AND active) THEN
        RAISE EXCEPTION 'permission denied: % is not an active det user', to_jsonb(v_user)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF det_user.permitted(v_user, p_permission, p_workspace) THEN
        RETURN v_user;
    END IF;
    IF p_workspace IS NOT NULL AND NOT det_user.permitted(v_user, 'view', p_workspace) THEN
        RAISE EXCEPTION 'cannot %: not found', p_action USING ERRCODE = 'no_data_found';
    END IF;
    RAISE EXCEPTION 'permission denied: needs % % to %', det_user.role_needed(p_permission),
        CASE WHEN p_workspace IS NULL THEN 'on the cluster'
             ELSE format('on workspace ''%s''', (SELECT name FROM workspaces
                                                  WHERE id = p_workspace)) END,
        p_action USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE FUNCTION det_internal.audit(p_action text, p_object_type text, p_object_id text,
                          p_detail jsonb DEFAULT '{}') RETURNS void
LANGUAGE plpgsql AS $$
-- One audit_log entry by the caller, in the transaction of the change it records.
BEGIN
    INSERT INTO audit_log (actor, action, object_type, object_id, detail)
    VALUES (det_user.caller(), p_action, p_object_type, p_object_id, coalesce(p_detail, '{}'));
END $$;

CREATE FUNCTION det_user.experiment_workspace(p_id integer) RETURNS integer LANGUAGE plpgsql
STABLE AS $$
-- The workspace experiment p_id is in. Raises no_data_found.
DECLARE
    v_ws integer;
BEGIN
    SELECT j.workspace_id INTO v_ws FROM experiments e JOIN jobs j ON j.id = e.job_id
     WHERE e.id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'experiment % not found', p_id USING ERRCODE = 'no_data_found';
    END IF;
    RETURN v_ws;
END $$;
GRANT EXECUTE ON FUNCTION det_user.experiment_workspace(integer) TO det_user;

CREATE FUNCTION det_internal.check_experiment_project() RETURNS trigger LANGUAGE plpgsql AS $$
-- An experiment's project is in its job's workspace: row-level security reads the one on
-- experiments and the other on jobs and runs, so they must agree.
BEGIN
    IF NOT EXISTS (SELECT 1 FROM projects p JOIN jobs j ON j.workspace_id = p.workspace_id
                    WHERE p.id = NEW.project_id AND j.id = NEW.job_id) THEN
        RAISE EXCEPTION 'experiment %: project % is not in its job''s workspace', NEW.id,
            NEW.project_id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE CONSTRAINT TRIGGER experiments_project_in_workspace
    AFTER INSERT OR UPDATE OF project_id, job_id ON experiments
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
        EXECUTE FUNCTION det_internal.check_experiment_project();

CREATE FUNCTION det_user.workspace_find(p_name text) RETURNS workspaces
    LANGUAGE plpgsql STABLE AS $$
-- The workspace named p_name (names are exact: any character is part of it). Raises
-- no_data_found, also when the caller may not view it.
DECLARE
    w workspaces;
BEGIN
    SELECT * INTO w FROM workspaces WHERE name = p_name;
    IF NOT FOUND OR NOT (det_user.is_owner_session() OR det_user.permitted(det_user.caller(),
        'view', w.id))
    THEN
        RAISE EXCEPTION 'workspace % not found', to_jsonb(p_name) USING ERRCODE = 'no_data_found';
    END IF;
    RETURN w;
END $$;
GRANT EXECUTE ON FUNCTION det_user.workspace_find(text) TO det_user;

CREATE FUNCTION det_user.project_find(p_workspace text, p_project text) RETURNS projects
LANGUAGE plpgsql STABLE AS $$
-- Project p_project of workspace p_workspace. Raises no_data_found.
DECLARE
    w workspaces := det_user.workspace_find(p_workspace);
    p projects;
BEGIN
    SELECT * INTO p FROM projects WHERE workspace_id = w.id AND name = p_project;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'project % not found in workspace %', to_jsonb(p_project),
            to_jsonb(w.name) USING ERRCODE = 'no_data_found';
    END IF;
    RETURN p;
END $$;
GRANT EXECUTE ON FUNCTION det_user.project_find(text, text) TO det_user;

CREATE FUNCTION det_user.user_find(p_username text) RETURNS users LANGUAGE plpgsql STABLE AS $$
-- The user named p_username. Raises no_data_found.
DECLARE
    u users;
BEGIN
    SELECT * INTO u FROM users WHERE username = p_username;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % not found', to_jsonb(p_username) USING ERRCODE = 'no_data_found';
    END IF;
    RETURN u;
END $$;
GRANT EXECUTE ON FUNCTION det_user.user_find(text) TO det_user;

CREATE FUNCTION det_internal.check_verifier(p_password_verifier text) RETURNS void LANGUAGE plpgsql
IMMUTABLE AS $$
-- A password reaches det only as a SCRAM-SHA-256 verifier made by the client (libpq's
-- PQencryptPasswordConn), never as the password itself.
BEGIN
    IF p_password_verifier IS NOT NULL AND p_password_verifier NOT LIKE 'SCRAM-SHA-256$%' THEN
        RAISE EXCEPTION 'password: expected a SCRAM-SHA-256 verifier computed by the client'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

CREATE FUNCTION det_internal.password_stamp(p_user text) RETURNS bytea LANGUAGE plpgsql STABLE AS $$
-- A digest (SHA-256) of the verifier PostgreSQL keeps for role p_user's password
-- (pg_authid.rolpassword): it changes whenever the password does, however it was changed
-- (a role may always ALTER ROLE its own PASSWORD, and no trigger sees that). NULL when the
-- role has no password, or when the caller may not read pg_authid (a superuser's table;
-- det's SECURITY DEFINER functions call this as det's owner, which the embedded cluster's is:
-- an owner that is not a superuser leaves det blind to a change made outside det). Only
-- det's owner may call it.
BEGIN
    IF NOT has_table_privilege('pg_catalog.pg_authid', 'SELECT') THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT sha256(convert_to(a.rolpassword, 'UTF8'))
              FROM pg_catalog.pg_authid a WHERE a.rolname = p_user);
END $$;

CREATE FUNCTION det_internal.password_policy(p_password_length integer, p_weak_ok boolean,
                                    p_action text) RETURNS void LANGUAGE plpgsql STABLE AS $$
-- The minimum password policy: a new password has at least 8 characters, unless a
-- ClusterAdmin sets p_weak_ok (`--weak-ok`) for p_action ('set the password of user "bob"').
-- det sees a password only as its client-made SCRAM verifier (det_internal.check_verifier), so the
-- client states its length in characters (det's CLI counts it); the cluster's own session,
-- which may ALTER ROLE any password anyway, may leave it unstated (NULL). Raises
-- invalid_parameter_value (too short, or unstated), insufficient_privilege (p_weak_ok by a
-- caller who is no ClusterAdmin).
BEGIN
    IF p_weak_ok THEN
        PERFORM det_internal.require('admin_cluster', NULL, format('%s with --weak-ok', p_action));
        RETURN;
    END IF;
    IF p_password_length IS NULL AND NOT det_user.is_owner_session() THEN
        RAISE EXCEPTION 'password length: expected the new password''s length in characters '
                        '(det requires at least 8)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_password_length < 8 THEN
        RAISE EXCEPTION 'password: expected at least 8 characters, got %; a ClusterAdmin may '
                        'allow a shorter one with --weak-ok', p_password_length
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- =============================================================================================
-- User actions: users, groups, workspaces, projects and roles. Each is one
-- transaction, checks its caller's permission and writes an audit_log entry.

CREATE FUNCTION det_user.user_create(p_username text, p_password_verifier text, p_admin boolean,
                                p_password_length integer DEFAULT NULL,
                                p_weak_ok boolean DEFAULT false)
RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user create` (ClusterAdmin): a det user is a new LOGIN role of the same name, member
-- of det_user (and of det_web, so det serve can act as it), Editor in Uncategorized, and
-- ClusterAdmin too if p_admin. p_password_verifier: see det_internal.check_verifier; NULL leaves
-- the user unable to log in until a password is set. p_password_length, p_weak_ok: the password
-- policy (det_internal.password_policy). Returns the user's id.
DECLARE
    v_problem text := det_user.name_problem(p_username, 63);
    v_id integer;
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL, format('create user %s',
        to_jsonb(p_username)));
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'username %: %', to_jsonb(p_username), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_internal.check_verifier(p_password_verifier);
    IF p_password_verifier IS NOT NULL THEN
        PERFORM det_internal.password_policy(p_password_length, p_weak_ok,
                                    format('create user %s', to_jsonb(p_username)));
    END IF;
    IF EXISTS (SELECT 1 FROM users WHERE username = p_username) THEN
        RAISE EXCEPTION 'username %: a user of that name exists', to_jsonb(p_username)
            USING ERRCODE = 'unique_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = p_username)
       OR p_username ~* '^pg_' OR lower(p_username) IN ('public', 'none', 'current_user',
                                                       'current_role', 'session_user') THEN
        RAISE EXCEPTION 'username %: the name of a PostgreSQL role of the server (not a det user)',
            to_jsonb(p_username) USING ERRCODE = 'unique_violation';
    END IF;
    EXECUTE format('CREATE ROLE %I LOGIN IN ROLE det_user PASSWORD %L', p_username,
                   p_password_verifier);
    EXECUTE format('GRANT %I TO det_web', p_username);
    INSERT INTO users (username, created_by) VALUES (p_username, det_user.caller())
    RETURNING id INTO v_id;
    INSERT INTO role_assignments (role, user_id, workspace_id) VALUES ('Editor', v_id, 1);
    IF p_admin THEN
        INSERT INTO role_assignments (role, user_id) VALUES ('ClusterAdmin', v_id);
    END IF;
    PERFORM det_internal.audit('create', 'user', p_username,
                      jsonb_build_object('admin', p_admin, 'weak_ok', coalesce(p_weak_ok, false)));
    RETURN v_id;
END $$;
GRANT EXECUTE ON FUNCTION det_user.user_create(text, text, boolean, integer, boolean) TO det_user;

CREATE FUNCTION det_user.user_set_password(p_username text, p_password_verifier text,
                                      p_password_length integer DEFAULT NULL,
                                      p_weak_ok boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user change-password`: a user's own, or anyone's by a ClusterAdmin (the CLI asks a
-- user who is no ClusterAdmin for the current password first). p_password_length,
-- p_weak_ok: the password policy (det_internal.password_policy). Every det serve login of the user
-- ends (a token minted under the old password is refused), and the change is audited with how
-- many logins it ended.
DECLARE
    u users := det_user.user_find(p_username);
    v_ended integer;
BEGIN
    IF u.username <> det_user.caller() THEN
        PERFORM det_internal.require('admin_cluster', NULL,
                            format('change the password of user %s', to_jsonb(p_username)));
    END IF;
    IF p_password_verifier IS NULL THEN
        RAISE EXCEPTION 'password: expected a SCRAM-SHA-256 verifier, got nothing'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_internal.check_verifier(p_password_verifier);
    PERFORM det_internal.password_policy(p_password_length, p_weak_ok,
                                format('change the password of user %s', to_jsonb(p_username)));
    EXECUTE format('ALTER ROLE %I PASSWORD %L', u.username, p_password_verifier);
    DELETE FROM web_sessions WHERE username = u.username;
    GET DIAGNOSTICS v_ended = ROW_COUNT;
    PERFORM det_internal.audit('change_password', 'user', u.username,
                      jsonb_build_object('logins_ended', v_ended,
                                         'weak_ok', coalesce(p_weak_ok, false)));
END $$;
GRANT EXECUTE ON FUNCTION det_user.user_set_password(text, text, integer, boolean) TO det_user;

CREATE FUNCTION det_user.user_set_active(p_username text, p_active boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user deactivate | activate` (ClusterAdmin): a deactivated user cannot log in (its role
-- loses LOGIN), holds no permission, and its det serve logins end.
DECLARE
    u users := det_user.user_find(p_username);
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL,
                        format('%s user %s', CASE WHEN p_active THEN 'activate'
                                                  ELSE 'deactivate' END, to_jsonb(p_username)));
    IF NOT p_active AND u.username = det_user.caller() THEN
        RAISE EXCEPTION 'user %: you cannot deactivate yourself', to_jsonb(u.username)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE users SET active = p_active WHERE id = u.id;
    EXECUTE format('ALTER ROLE %I %s', u.username,
        CASE WHEN p_active THEN 'LOGIN' ELSE 'NOLOGIN' END);
    IF NOT p_active THEN
        DELETE FROM web_sessions WHERE username = u.username;
    END IF;
    PERFORM det_internal.audit(CASE WHEN p_active THEN 'activate' ELSE 'deactivate' END, 'user',
                      u.username);
END $$;
GRANT EXECUTE ON FUNCTION det_user.user_set_active(text, boolean) TO det_user;

CREATE FUNCTION det_user.group_create(p_name text) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user-group create` (ClusterAdmin). Returns the group's id.
DECLARE
    v_problem text := det_user.name_problem(p_name, 255);
    v_id integer;
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL, format('create group %s',
        to_jsonb(p_name)));
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'group name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO user_groups (name) VALUES (p_name) RETURNING id INTO v_id;
    PERFORM det_internal.audit('create', 'group', p_name);
    RETURN v_id;
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'group name %: a group of that name exists', to_jsonb(p_name)
        USING ERRCODE = 'unique_violation';
END $$;
GRANT EXECUTE ON FUNCTION det_user.group_create(text) TO det_user;

CREATE FUNCTION det_user.group_delete(p_name text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user-group delete` (ClusterAdmin): its members lose the roles it held.
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL, format('delete group %s',
        to_jsonb(p_name)));
    DELETE FROM user_groups WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'group % not found', to_jsonb(p_name) USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.audit('delete', 'group', p_name);
END $$;
GRANT EXECUTE ON FUNCTION det_user.group_delete(text) TO det_user;

CREATE FUNCTION det_user.group_set_member(p_group text, p_username text, p_member boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user-group add-user | remove-user` (ClusterAdmin). Adding a member twice or removing a
-- non-member changes nothing.
DECLARE
    v_group integer;
    u users := det_user.user_find(p_username);
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL,
                        format('%s group %s', CASE WHEN p_member THEN 'add users to'
                                                   ELSE 'remove users from' END,
                               to_jsonb(p_group)));
    SELECT id INTO v_group FROM user_groups WHERE name = p_group;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'group % not found', to_jsonb(p_group) USING ERRCODE = 'no_data_found';
    END IF;
    IF p_member THEN
        INSERT INTO user_group_members VALUES (v_group, u.id) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM user_group_members WHERE group_id = v_group AND user_id = u.id;
    END IF;
    PERFORM det_internal.audit(CASE WHEN p_member THEN 'add_member' ELSE 'remove_member' END, 'group',
                      p_group, jsonb_build_object('user', u.username));
END $$;
GRANT EXECUTE ON FUNCTION det_user.group_set_member(text, text, boolean) TO det_user;

CREATE FUNCTION det_user.workspace_create(
    p_name text, p_default_compute_pool text, p_default_aux_pool text,
    p_checkpoint_storage jsonb
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det workspace create` (WorkspaceCreator or ClusterAdmin): the creator becomes its
-- WorkspaceAdmin. p_checkpoint_storage was validated by det.configs. Returns its id.
DECLARE
    v_user text := det_internal.require('create_workspace', NULL,
                               format('create workspace %s', to_jsonb(p_name)));
    v_problem text := det_user.name_problem(p_name, 255);
    v_id integer;
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'workspace name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM workspaces WHERE name = p_name) THEN
        RAISE EXCEPTION 'workspace name %: a workspace of that name exists', to_jsonb(p_name)
            USING ERRCODE = 'unique_violation';
    END IF;
    INSERT INTO workspaces (name, created_by, default_compute_pool, default_aux_pool,
                            checkpoint_storage)
    VALUES (p_name, v_user, p_default_compute_pool, p_default_aux_pool, p_checkpoint_storage)
    RETURNING id INTO v_id;
    INSERT INTO role_assignments (role, user_id, workspace_id)
    SELECT 'WorkspaceAdmin', id, v_id FROM users WHERE username = v_user;
    PERFORM det_internal.audit('create', 'workspace', v_id::text,
        jsonb_build_object('name', p_name));
    RETURN v_id;
EXCEPTION WHEN foreign_key_violation THEN
    RAISE EXCEPTION 'workspace %: no resource pool named % or %', to_jsonb(p_name),
        to_jsonb(p_default_compute_pool), to_jsonb(p_default_aux_pool)
        USING ERRCODE = 'foreign_key_violation';
END $$;
GRANT EXECUTE ON FUNCTION det_user.workspace_create(text, text, text, jsonb) TO det_user;

CREATE FUNCTION det_user.workspace_set_archived(p_name text, p_archived boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det workspace archive | unarchive` (WorkspaceAdmin): an archived workspace takes no new
-- experiments or projects and is hidden from `det workspace list` unless --all.
DECLARE
    w workspaces := det_user.workspace_find(p_name);
BEGIN
    PERFORM det_internal.require('admin_workspace', w.id,
                        format('%s workspace %s', CASE WHEN p_archived THEN 'archive'
                                                       ELSE 'unarchive' END, to_jsonb(w.name)));
    IF w.id = 1 THEN
        RAISE EXCEPTION 'workspace "Uncategorized" cannot be archived'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE workspaces SET archived = p_archived WHERE id = w.id;
    PERFORM det_internal.audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END,
        'workspace',
                      w.id::text, jsonb_build_object('name', w.name));
END $$;
GRANT EXECUTE ON FUNCTION det_user.workspace_set_archived(text, boolean) TO det_user;

CREATE FUNCTION det_user.workspace_delete(p_name text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det workspace delete` (WorkspaceAdmin): refused while any experiment or model is in it
-- (move or delete them first); its projects, role assignments and pool bindings go with it.
DECLARE
    w workspaces := det_user.workspace_find(p_name);
    v_n bigint;
BEGIN
    PERFORM det_internal.require('admin_workspace', w.id, format('delete workspace %s',
        to_jsonb(w.name)));
    IF w.id = 1 THEN
        RAISE EXCEPTION 'workspace "Uncategorized" cannot be deleted'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT count(*) INTO v_n FROM jobs WHERE workspace_id = w.id;
    IF v_n > 0 THEN
        RAISE EXCEPTION 'workspace %: it still holds % experiment(s); move or delete them first',
            to_jsonb(w.name), v_n USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
    SELECT count(*) INTO v_n FROM models WHERE workspace_id = w.id;
    IF v_n > 0 THEN
        RAISE EXCEPTION 'workspace %: it still holds % model(s); move or delete them first',
            to_jsonb(w.name), v_n USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
    DELETE FROM projects WHERE workspace_id = w.id;
    DELETE FROM workspaces WHERE id = w.id;
    PERFORM det_internal.audit('delete', 'workspace', w.id::text,
        jsonb_build_object('name', w.name));
END $$;
GRANT EXECUTE ON FUNCTION det_user.workspace_delete(text) TO det_user;

CREATE FUNCTION det_user.workspace_bind_pool(p_workspace text, p_pool text, p_bound boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det resource-pool bindings add | remove` (ClusterAdmin): bind a pool to a workspace, or
-- unbind it. Jobs already queued in the pool stay; new ones are checked at submission.
DECLARE
    w workspaces := det_user.workspace_find(p_workspace);
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL,
                        format('bind resource pool %s', to_jsonb(p_pool)));
    IF NOT EXISTS (SELECT 1 FROM resource_pools WHERE name = p_pool) THEN
        RAISE EXCEPTION 'no resource pool named %', to_jsonb(p_pool)
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF p_bound THEN
        INSERT INTO workspace_pools VALUES (w.id, p_pool) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM workspace_pools WHERE workspace_id = w.id AND resource_pool = p_pool;
    END IF;
    PERFORM det_internal.audit(CASE WHEN p_bound THEN 'bind_pool' ELSE 'unbind_pool' END,
        'workspace',
                      w.id::text, jsonb_build_object('name', w.name, 'pool', p_pool));
END $$;
GRANT EXECUTE ON FUNCTION det_user.workspace_bind_pool(text, text, boolean) TO det_user;

CREATE FUNCTION det_internal.check_pools(p_workspace integer, p_pools text[], p_what text)
RETURNS void LANGUAGE plpgsql STABLE AS $$
-- Each pool exists and serves workspace p_workspace (bound to it, or to no workspace).
DECLARE
    v_pool text;
BEGIN
    SELECT p INTO v_pool FROM unnest(p_pools) p
     WHERE NOT EXISTS (SELECT 1 FROM resource_pools WHERE name = p) LIMIT 1;
    IF v_pool IS NOT NULL THEN
        RAISE EXCEPTION '%: no resource pool named "%"', p_what, v_pool
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    SELECT p INTO v_pool FROM unnest(p_pools) p
     WHERE EXISTS (SELECT 1 FROM workspace_pools b WHERE b.resource_pool = p)
       AND NOT EXISTS (SELECT 1 FROM workspace_pools b
                        WHERE b.resource_pool = p AND b.workspace_id = p_workspace) LIMIT 1;
    IF v_pool IS NOT NULL THEN
        RAISE EXCEPTION '%: resource pool "%" is bound to other workspaces than %', p_what,
            v_pool, to_jsonb((SELECT name FROM workspaces WHERE id = p_workspace))
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;

CREATE FUNCTION det_user.project_create(p_workspace text, p_name text, p_description text)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det project create` (Editor of the workspace). Returns the project's id.
DECLARE
    w workspaces := det_user.workspace_find(p_workspace);
    v_user text := det_internal.require('edit', w.id, format('create a project in workspace %s',
                                                     to_jsonb(w.name)));
    v_problem text := det_user.name_problem(p_name, 255);
    v_id integer;
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'project name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.archived THEN
        RAISE EXCEPTION 'workspace % is archived: unarchive it first', to_jsonb(w.name)
            USING ERRCODE = 'check_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM projects WHERE workspace_id = w.id AND name = p_name) THEN
        RAISE EXCEPTION 'project name %: workspace % has a project of that name',
            to_jsonb(p_name), to_jsonb(w.name) USING ERRCODE = 'unique_violation';
    END IF;
    INSERT INTO projects (workspace_id, name, description, created_by)
    VALUES (w.id, p_name, coalesce(p_description, ''), v_user) RETURNING id INTO v_id;
    PERFORM det_internal.audit('create', 'project', v_id::text,
                      jsonb_build_object('name', p_name, 'workspace', w.name));
    RETURN v_id;
END $$;
GRANT EXECUTE ON FUNCTION det_user.project_create(text, text, text) TO det_user;

CREATE FUNCTION det_user.project_set_archived(p_workspace text, p_name text, p_archived boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det project archive | unarchive` (Editor): an archived project takes no new experiments.
DECLARE
    p projects := det_user.project_find(p_workspace, p_name);
BEGIN
    PERFORM det_internal.require('edit', p.workspace_id,
                        format('%s project %s', CASE WHEN p_archived THEN 'archive'
                                                     ELSE 'unarchive' END, to_jsonb(p.name)));
    IF p.id = 1 THEN
        RAISE EXCEPTION 'project "Uncategorized" cannot be archived'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE projects SET archived = p_archived WHERE id = p.id;
    PERFORM det_internal.audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END, 'project',
                      p.id::text, jsonb_build_object('name', p.name));
END $$;
GRANT EXECUTE ON FUNCTION det_user.project_set_archived(text, text, boolean) TO det_user;

CREATE FUNCTION det_user.project_delete(p_workspace text, p_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det project delete` (Editor): refused while it holds experiments.
DECLARE
    p projects := det_user.project_find(p_workspace, p_name);
    v_n bigint;
BEGIN
    PERFORM det_internal.require('edit', p.workspace_id, format('delete project %s',
        to_jsonb(p.name)));
    IF p.id = 1 THEN
        RAISE EXCEPTION 'project "Uncategorized" cannot be deleted'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT count(*) INTO v_n FROM experiments WHERE project_id = p.id;
    IF v_n > 0 THEN
        RAISE EXCEPTION 'project %: it still holds % experiment(s); move or delete them first',
            to_jsonb(p.name), v_n USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
    DELETE FROM projects WHERE id = p.id;
    PERFORM det_internal.audit('delete', 'project', p.id::text, jsonb_build_object('name', p.name));
END $$;
GRANT EXECUTE ON FUNCTION det_user.project_delete(text, text) TO det_user;

CREATE FUNCTION det_user.experiment_move(p_id integer, p_workspace text, p_project text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment move` (Editor where it is and where it goes): its job (and so its runs,
-- metrics, checkpoints and logs, which row-level security reaches through it) moves too.
-- The destination's pool bindings are not checked: what already runs keeps its pool.
DECLARE
    v_from integer := det_user.experiment_workspace(p_id);
    p projects := det_user.project_find(p_workspace, p_project);
BEGIN
    PERFORM det_internal.require('edit', v_from, format('move experiment %s', p_id));
    PERFORM det_internal.require('edit', p.workspace_id,
                        format('move experiment %s into project %s', p_id, to_jsonb(p.name)));
    IF p.archived THEN
        RAISE EXCEPTION 'project % is archived: unarchive it first', to_jsonb(p.name)
            USING ERRCODE = 'check_violation';
    END IF;
    UPDATE jobs SET workspace_id = p.workspace_id
     WHERE id = (SELECT job_id FROM experiments WHERE id = p_id);
    UPDATE experiments SET project_id = p.id WHERE id = p_id;
    PERFORM det_internal.audit('move', 'experiment', p_id::text,
                      jsonb_build_object('project', p.id, 'workspace', p.workspace_id));
END $$;
GRANT EXECUTE ON FUNCTION det_user.experiment_move(integer, text, text) TO det_user;

CREATE FUNCTION det_user.role_assign(
    p_role text, p_username text, p_group text, p_workspace text, p_assigned boolean
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det rbac assign-role | unassign-role`: role p_role to user p_username or group p_group,
-- in workspace p_workspace (WorkspaceAdmin there) or globally (NULL; ClusterAdmin).
-- WorkspaceCreator and ClusterAdmin are global only. Assigning twice, or unassigning what is
-- not assigned, changes nothing.
DECLARE
    r roles;
    w workspaces;
    v_user integer;
    v_group integer;
BEGIN
    SELECT * INTO r FROM roles WHERE name = p_role;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'role %: expected one of %', to_jsonb(p_role),
            (SELECT string_agg(name, ', ' ORDER BY cardinality(permissions)) FROM roles)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (p_username IS NULL) = (p_group IS NULL) THEN
        RAISE EXCEPTION 'role %: name exactly one of a user and a group', p_role
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_workspace IS NOT NULL THEN
        IF r.global_only THEN
            RAISE EXCEPTION 'role % is cluster-wide: assign it without a workspace', p_role
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        w := det_user.workspace_find(p_workspace);
        PERFORM det_internal.require('admin_workspace', w.id,
                            format('assign roles in workspace %s', to_jsonb(w.name)));
    ELSE
        PERFORM det_internal.require('admin_cluster', NULL, 'assign cluster-wide roles');
    END IF;
    IF p_username IS NOT NULL THEN
        v_user := (det_user.user_find(p_username)).id;
    ELSE
        SELECT id INTO v_group FROM user_groups WHERE name = p_group;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'group % not found', to_jsonb(p_group) USING ERRCODE = 'no_data_found';
        END IF;
    END IF;
    IF p_assigned THEN
        INSERT INTO role_assignments (role, user_id, group_id, workspace_id)
        VALUES (p_role, v_user, v_group, w.id) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM role_assignments
         WHERE role = p_role AND user_id IS NOT DISTINCT FROM v_user
           AND group_id IS NOT DISTINCT FROM v_group AND workspace_id IS NOT DISTINCT FROM w.id;
    END IF;
    PERFORM det_internal.audit(CASE WHEN p_assigned THEN 'assign_role' ELSE 'unassign_role' END, 'role',
                      p_role, jsonb_build_object('user', p_username, 'group', p_group,
                                                 'workspace', w.name));
END $$;
GRANT EXECUTE ON FUNCTION det_user.role_assign(text, text, text, text, boolean) TO det_user;

CREATE FUNCTION det_user.model_move(p_model text, p_workspace text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model move` (Editor where it is and where it goes).
DECLARE
    m models := det_user.model_find(p_model);
    w workspaces := det_user.workspace_find(p_workspace);
BEGIN
    PERFORM det_internal.require('edit', m.workspace_id, format('move model %s', to_jsonb(m.name)));
    PERFORM det_internal.require('edit', w.id, format('move model %s into workspace %s',
                                             to_jsonb(m.name), to_jsonb(w.name)));
    UPDATE models SET workspace_id = w.id, last_updated_time = now() WHERE id = m.id;
    PERFORM det_internal.audit('move', 'model', m.id::text,
        jsonb_build_object('workspace', w.name));
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_move(text, text) TO det_user;

-- =============================================================================================
-- User actions (the CLI). Each is one transaction; each wakes the reconciler.

CREATE FUNCTION det_internal.config_value_problem(
    p_value jsonb, p_key text, p_kind text, p_min numeric DEFAULT NULL,
    p_max numeric DEFAULT NULL, p_required boolean DEFAULT false
) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
-- Why p_value, a config's value at key p_key (dotted, for the message), is not of kind
-- p_kind, or NULL. Kinds: 'integer' (a whole JSON number from p_min to p_max), 'number' (above
-- p_min, at most p_max), 'boolean', 'name' (a non-blank string of at most p_max characters
-- without control characters: it is shown in one table cell), 'text' (a string of at most
-- p_max characters), 'length' (det.configs.length: {batches|records|epochs: N} or a bare N,
-- N from 1 to 2**63 - 1). Absent or JSON null is a problem only if p_required.
DECLARE
    v_type text := jsonb_typeof(p_value);
    v_got text := left(p_value::text, 64);
    v_bad boolean;
BEGIN
    IF v_type IS NULL OR v_type = 'null' THEN
        RETURN CASE WHEN p_required
                    THEN format('%s: required; expected an expanded config (det.configs)', p_key)
               END;
    END IF;
    CASE p_kind
    WHEN 'integer' THEN
        -- CASE: the casts run only on a number (OR's operands have no set order).
        v_bad := CASE WHEN v_type = 'number' THEN p_value::numeric % 1 <> 0
                                                 OR p_value::numeric NOT BETWEEN p_min AND p_max
                      ELSE true END;
        IF v_bad THEN
            RETURN format('%s: expected a whole number from %s to %s, got %s', p_key, p_min,
                          p_max, v_got);
        END IF;
    WHEN 'number' THEN
        v_bad := CASE WHEN v_type = 'number' THEN NOT (p_value::numeric > p_min
                                                       AND p_value::numeric <= p_max)
                      ELSE true END;
        IF v_bad THEN
            RETURN format('%s: expected a number above %s and at most %s, got %s', p_key,
                          p_min, p_max, v_got);
        END IF;
    WHEN 'boolean' THEN
        IF v_type <> 'boolean' THEN
            RETURN format('%s: expected true or false, got %s', p_key, v_got);
        END IF;
    WHEN 'name', 'text' THEN
        IF v_type <> 'string' THEN
            RETURN format('%s: expected a string, got %s', p_key, v_got);
        ELSIF length(p_value #>> '{}') > p_max THEN
            RETURN format('%s: expected at most %s characters, got %s', p_key, p_max,
                          length(p_value #>> '{}'));
        ELSIF p_kind = 'name' AND (btrim(p_value #>> '{}') = ''
                                   OR p_value #>> '{}' ~ '[[:cntrl:]]') THEN
            RETURN format('%s: expected non-blank printable text, got %s', p_key, v_got);
        END IF;
    WHEN 'length' THEN
        v_bad := NOT CASE v_type
            WHEN 'number' THEN det_internal.config_value_problem(p_value, p_key, 'integer', 1,
                                                        9223372036854775807) IS NULL
            WHEN 'object' THEN (SELECT count(*) = 1 AND bool_and(
                                    k IN ('batches', 'records', 'epochs')
                                    AND det_internal.config_value_problem(v, p_key, 'integer', 1,
                                                                 9223372036854775807) IS NULL)
                                  FROM jsonb_each(p_value) AS e (k, v))
            ELSE false END;
        IF v_bad THEN
            RETURN format('%s: expected {batches|records|epochs: N} or N (batches), N from 1 '
                          'to 2**63 - 1, got %s', p_key, v_got);
        END IF;
    END CASE;
    RETURN NULL;
END $$;

CREATE FUNCTION det_internal.experiment_config_problem(p_config jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
-- Why p_config cannot be stored as an experiment's config, or NULL: the first key, dotted,
-- and what was expected. det.configs expands every config before submission (its rules:
-- configs/experiment.py, configs/searcher.py, configs/limits.py); this is the part of them
-- that det_user.create_experiment checks again, so that a config stored from psql past det.configs
-- cannot break the control plane: the values the reconciler's SQL casts
-- (resources.slots_per_trial, max_restarts, preemption_timeout, searcher.source_trial_id,
-- checkpoint_storage.save_*: one bad value would fail the statement for every experiment),
-- the searcher's name and required fields, and what the readers show (name, description,
-- searcher.metric and smaller_is_better). Required: name, searcher.name, searcher.metric,
-- the searcher's required fields, resources.resource_pool, resources.weight and
-- resources.slots_per_trial; the other keys are checked when present. The rest
-- (hyperparameters, entrypoint, environment, ...) is det.configs' alone: the searcher reads
-- the config through it, and a failure there errors that one experiment.
DECLARE
    s jsonb := p_config -> 'searcher';
    r jsonb := p_config -> 'resources';
    v_searcher text;
    v_problem text;
BEGIN
    IF jsonb_typeof(p_config) IS DISTINCT FROM 'object' THEN
        RETURN 'config: expected a JSON object (an expanded config, det.configs)';
    END IF;
    IF jsonb_typeof(s) IS DISTINCT FROM 'object' THEN
        RETURN format('searcher: required, a mapping (an expanded config, det.configs); got %s',
                      coalesce(left(s::text, 64), 'none'));
    END IF;
    IF jsonb_typeof(r) IS DISTINCT FROM 'object' THEN
        RETURN format('resources: required, a mapping (an expanded config, det.configs); got %s',
                      coalesce(left(r::text, 64), 'none'));
    END IF;
    v_searcher := CASE WHEN jsonb_typeof(s -> 'name') = 'string' THEN s ->> 'name' END;
    IF v_searcher IS NULL OR v_searcher NOT IN ('single', 'random', 'grid', 'adaptive_asha',
                                                'tpe') THEN
        RETURN coalesce(det_internal.config_value_problem(s -> 'name', 'searcher.name', 'name',
                                                 p_required => true),
                        format('searcher.name: expected one of single|random|grid|'
                               'adaptive_asha|tpe, got %s', left((s -> 'name')::text, 64)));
    END IF;
    IF s ? 'source_trial_id' AND s ? 'source_checkpoint_uuid'
       AND s -> 'source_trial_id' <> 'null' AND s -> 'source_checkpoint_uuid' <> 'null' THEN
        RETURN 'searcher: expected at most one of source_trial_id, source_checkpoint_uuid';
    END IF;
    IF jsonb_typeof(s -> 'source_checkpoint_uuid') = 'string'
       AND s ->> 'source_checkpoint_uuid'
           !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$' THEN
        RETURN format('searcher.source_checkpoint_uuid: expected a checkpoint UUID, got %s',
                      left((s -> 'source_checkpoint_uuid')::text, 64));
    END IF;
    SELECT x.problem INTO v_problem FROM (VALUES
        (1, det_internal.config_value_problem(p_config -> 'name', 'name', 'text', 0, 255, true)),
        (2, det_internal.config_value_problem(p_config -> 'description', 'description', 'text', 0,
                                     4096)),
        (3, det_internal.config_value_problem(p_config -> 'max_restarts', 'max_restarts',
            'integer', 0,
                                     2147483647)),
        (4, det_internal.config_value_problem(p_config -> 'preemption_timeout',
            'preemption_timeout',
                                     'integer', 0, 2147483647)),
        (5, det_internal.config_value_problem(p_config #> '{reproducibility,experiment_seed}',
                                     'reproducibility.experiment_seed', 'integer', 0,
                                     4294967295)),
        (6, det_internal.config_value_problem(s -> 'metric', 'searcher.metric', 'name', 0,
            255, true)),
        (7, det_internal.config_value_problem(s -> 'smaller_is_better',
            'searcher.smaller_is_better',
                                     'boolean')),
        (8, det_internal.config_value_problem(s -> 'max_trials', 'searcher.max_trials',
            'integer', 1,
                                     10000, v_searcher IN ('random', 'adaptive_asha', 'tpe'))),
        (9, det_internal.config_value_problem(s -> 'max_concurrent_trials',
                                     'searcher.max_concurrent_trials', 'integer', 0,
                                     9223372036854775807)),
        -- adaptive_asha: max_length, or max_time with time_metric (det.configs.searcher).
        (10, det_internal.config_value_problem(s -> 'max_length', 'searcher.max_length', 'length',
                                      p_required => v_searcher = 'tpe'
                                          OR (v_searcher = 'adaptive_asha'
                                              AND coalesce(s -> 'max_time', 'null') = 'null'))),
        (11, det_internal.config_value_problem(s -> 'max_time', 'searcher.max_time', 'integer', 1,
                                      9223372036854775807)),
        (12, det_internal.config_value_problem(s -> 'time_metric',
            'searcher.time_metric', 'name', 0,
                                      255, coalesce(s -> 'max_time', 'null') <> 'null')),
        (13, det_internal.config_value_problem(s -> 'source_trial_id', 'searcher.source_trial_id',
                                      'integer', 1, 9223372036854775807)),
        (14, det_internal.config_value_problem(s -> 'source_checkpoint_uuid',
                                      'searcher.source_checkpoint_uuid', 'text', 0, 36)),
        (15, CASE jsonb_typeof(r -> 'resource_pool')
             WHEN 'array' THEN coalesce(
                 (SELECT det_internal.config_value_problem(v, format('resources.resource_pool[%s]',
                                                            i - 1), 'name', 0, 255)
                    FROM jsonb_array_elements(r -> 'resource_pool') WITH ORDINALITY AS a (v, i)
                   WHERE det_internal.config_value_problem(v, 'x', 'name', 0, 255, true) IS NOT NULL
                   ORDER BY i LIMIT 1),
                 CASE WHEN jsonb_array_length(r -> 'resource_pool') = 0
                      THEN 'resources.resource_pool: expected a pool name or a non-empty list '
                           'of them' END)
             ELSE det_internal.config_value_problem(r -> 'resource_pool', 'resources.resource_pool',
                                           'name', 0, 255, true) END),
        (16, det_internal.config_value_problem(r -> 'weight', 'resources.weight',
            'number', 0, 1000000,
                                      true)),
        (17, det_internal.config_value_problem(r -> 'slots_per_trial', 'resources.slots_per_trial',
                                      'integer', 0, 2147483647, true)),
        (18, det_internal.config_value_problem(r -> 'priority', 'resources.priority',
            'integer', 1, 99)),
        (19, det_internal.config_value_problem(r -> 'max_slots', 'resources.max_slots',
            'integer', 0,
                                      2147483647)),
        (20, det_internal.config_value_problem(p_config #> '{checkpoint_storage,save_experiment_best}',
                                      'checkpoint_storage.save_experiment_best', 'integer', 0,
                                      2147483647)),
        (21, det_internal.config_value_problem(p_config #> '{checkpoint_storage,save_trial_best}',
                                      'checkpoint_storage.save_trial_best', 'integer', 0,
                                      2147483647)),
        (22, det_internal.config_value_problem(p_config #> '{checkpoint_storage,save_trial_latest}',
                                      'checkpoint_storage.save_trial_latest', 'integer', 0,
                                      2147483647)),
        (23, det_internal.config_value_problem(p_config -> 'workspace', 'workspace',
            'name', 0, 255)),
        (24, det_internal.config_value_problem(p_config -> 'project', 'project', 'name', 0, 255))
    ) AS x (n, problem) WHERE x.problem IS NOT NULL ORDER BY x.n LIMIT 1;
    RETURN v_problem;
END $$;

CREATE FUNCTION det_user.create_experiment(
    p_config jsonb, p_original_config text, p_context bytea, p_workspace text DEFAULT NULL,
    p_project text DEFAULT NULL
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Submit an experiment (Editor of its workspace), owned by the caller. p_config is the
-- expanded config (validated by det.configs, every default filled: nothing here supplies one
-- again); what the control plane reads of it is checked again here
-- (det_internal.experiment_config_problem: invalid_parameter_value naming the key), so a caller
-- from psql cannot store a config that breaks the reconciler or the readers. p_context is the
-- packed model definition (tar.gz), stored once per distinct content.
-- It goes to project p_project of workspace p_workspace, else the config's workspace and
-- project (both or neither), else Uncategorized. Its pools must serve that workspace
-- (workspace_pools). The job's priority defaults to its pool scheduler's default_priority
-- (the pool's rule, not the config's).
-- The checkpoint it warm-starts from (searcher.source_checkpoint_uuid, or the checkpoints of
-- trial searcher.source_trial_id) is pinned (checkpoint_pins): its owner can no longer
-- delete it, so the caller must be an Editor of that checkpoint's workspace, not only a
-- viewer (the model registry's rule, det_user.model_register_version). One the caller
-- cannot view, or that does not exist, is not found (no_data_found).
DECLARE
    v_problem text := det_internal.experiment_config_problem(p_config);
    v_workspace text := coalesce(p_workspace, p_config ->> 'workspace');
    v_project text := coalesce(p_project, p_config ->> 'project');
    p projects;
    v_user text;
    v_pools text[] := CASE jsonb_typeof(p_config #> '{resources,resource_pool}')
        WHEN 'array' THEN ARRAY(SELECT jsonb_array_elements_text(
                                    p_config #> '{resources,resource_pool}'))
        ELSE ARRAY[p_config #>> '{resources,resource_pool}'] END;
    v_pool text := v_pools[1];
    v_source_trial bigint;
    v_source_uuid uuid;
    v_source_ws integer;
    v_ctx bigint;
    v_job bigint;
    v_id integer;
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'det_user.create_experiment: %', v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Cast only now: det_internal.experiment_config_problem has checked their kinds.
    v_source_trial := p_config #>> '{searcher,source_trial_id}';
    v_source_uuid := p_config #>> '{searcher,source_checkpoint_uuid}';
    -- Placement and permission: the rule det serve also checks before it unpacks a context.
    SELECT * INTO p FROM projects
     WHERE id = det_user.experiment_create_check(v_workspace, v_project);
    v_user := det_user.caller();
    PERFORM det_internal.check_pools(p.workspace_id, v_pools, 'resources.resource_pool');
    -- The pin's target: FOR KEY SHARE keeps its row from being deleted (an experiment purged)
    -- until this experiment, and so the pin, commits; det_internal.unpin_deleting settles a GC that
    -- marked it meanwhile.
    IF v_source_trial IS NOT NULL THEN
        SELECT j.workspace_id INTO v_source_ws
          FROM trials t JOIN experiments e ON e.id = t.experiment_id JOIN jobs j ON j.id = e.job_id
         WHERE t.id = v_source_trial FOR KEY SHARE OF t;
    ELSIF v_source_uuid IS NOT NULL THEN
        SELECT j.workspace_id INTO v_source_ws
          FROM checkpoints c JOIN trials t ON t.id = c.trial_id
          JOIN experiments e ON e.id = t.experiment_id JOIN jobs j ON j.id = e.job_id
         WHERE c.uuid = v_source_uuid FOR KEY SHARE OF c;
    END IF;
    IF coalesce(v_source_trial::text, v_source_uuid::text) IS NOT NULL THEN
        IF v_source_ws IS NULL
           OR NOT (det_user.is_owner_session() OR det_user.permitted(v_user, 'view',
               v_source_ws)) THEN
            RAISE EXCEPTION '%: % % not found',
                CASE WHEN v_source_trial IS NOT NULL THEN 'searcher.source_trial_id'
                     ELSE 'searcher.source_checkpoint_uuid' END,
                CASE WHEN v_source_trial IS NOT NULL THEN 'trial' ELSE 'checkpoint' END,
                coalesce(v_source_trial::text, v_source_uuid::text)
                USING ERRCODE = 'no_data_found';
        END IF;
        PERFORM det_internal.require('edit', v_source_ws, CASE
            WHEN v_source_trial IS NOT NULL THEN format(
                'warm-start from trial %s (searcher.source_trial_id), which pins its checkpoints',
                v_source_trial)
            ELSE format('warm-start from checkpoint %s (searcher.source_checkpoint_uuid), '
                        'which pins it', v_source_uuid) END);
    END IF;
    IF p_context IS NOT NULL THEN
        INSERT INTO context_blobs (sha256, size_bytes, data)
        VALUES (sha256(p_context), length(p_context), p_context)
        ON CONFLICT (sha256) DO NOTHING;
        SELECT id INTO v_ctx FROM context_blobs WHERE sha256 = sha256(p_context);
    END IF;
    INSERT INTO jobs (type, resource_pool, fallback_pools, priority, weight, max_slots,
                      queue_position, owner, workspace_id)
    VALUES ('EXPERIMENT', v_pool, v_pools[2:],
            coalesce((p_config #>> '{resources,priority}')::integer,
                     (det_user.pool_scheduler(v_pool) ->> 'default_priority')::integer),
            (p_config #>> '{resources,weight}')::double precision,
            (p_config #>> '{resources,max_slots}')::integer,
            extract(epoch FROM clock_timestamp()) * 1000000, v_user, p.workspace_id)
    RETURNING id INTO v_job;
    INSERT INTO experiments (job_id, name, description, config, original_config, context_id,
                             owner, project_id)
    VALUES (v_job, p_config ->> 'name', coalesce(p_config ->> 'description', ''), p_config,
            p_original_config, v_ctx, v_user, p.id)
    RETURNING id INTO v_id;
    PERFORM det_internal.audit('create', 'experiment', v_id::text,
        jsonb_build_object('project', p.id));
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'experiment');
    RETURN v_id;
END $$;
GRANT EXECUTE ON FUNCTION det_user.create_experiment(jsonb, text, bytea, text, text) TO det_user;

-- Experiments made from an existing experiment (det experiment fork) or trial
-- (det trial continue); spec: run-training-code.rst, "Create an Experiment".
CREATE TABLE continuations (
    experiment_id   integer PRIMARY KEY REFERENCES experiments (id) ON DELETE CASCADE,
    source_trial_id integer NOT NULL,
    checkpoint_uuid uuid NOT NULL
);
COMMENT ON TABLE continuations IS
    'Experiments made by det trial continue: their trial starts from checkpoint_uuid (the '
    'latest checkpoint of trial source_trial_id when it was continued), weights and batch '
    'count, as a trial resumes after a pause. The checkpoint is also the config''s '
    'searcher.source_checkpoint_uuid, which pins it (checkpoint_pins).';

CREATE FUNCTION det_internal.trials_continue() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A new trial of a continuation (continuations) starts from its checkpoint: the trial's
-- restart point (latest_checkpoint, steps_completed) is that checkpoint's, so its first run
-- restores it (det_task.info) and counts batches on from the checkpoint's.
DECLARE
    v_uuid uuid;
    v_steps bigint;
BEGIN
    SELECT c.uuid, c.steps_completed INTO v_uuid, v_steps
      FROM continuations k JOIN checkpoints c ON c.uuid = k.checkpoint_uuid
     WHERE k.experiment_id = NEW.experiment_id;
    IF FOUND AND NEW.latest_checkpoint IS NULL THEN
        NEW.latest_checkpoint := v_uuid;
        NEW.steps_completed := v_steps;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER trials_continue BEFORE INSERT ON trials
    FOR EACH ROW EXECUTE FUNCTION det_internal.trials_continue();

CREATE FUNCTION det_user.experiment_fork(
    p_source integer, p_config jsonb, p_original_config text, p_workspace text, p_project text
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment fork`: a new experiment with the model definition (context) of experiment
-- p_source and the expanded config p_config (its YAML p_original_config), stored by
-- det_user.create_experiment (its checks, placement and permissions: Editor where it goes). The
-- caller must be able to view p_source (no_data_found otherwise, as for any experiment they
-- cannot see). Returns the new experiment's id.
DECLARE
    v_ctx bytea;
    v_id integer;
BEGIN
    PERFORM det_internal.require('view', det_user.experiment_workspace(p_source),
                        format('fork experiment %s', p_source));
    SELECT b.data INTO v_ctx
      FROM experiments e LEFT JOIN context_blobs b ON b.id = e.context_id WHERE e.id = p_source;
    v_id := det_user.create_experiment(p_config, p_original_config, v_ctx, p_workspace, p_project);
    PERFORM det_internal.audit('fork', 'experiment', v_id::text,
        jsonb_build_object('source', p_source));
    RETURN v_id;
END $$;
GRANT EXECUTE ON FUNCTION det_user.experiment_fork(integer, jsonb, text, text, text) TO det_user;

CREATE FUNCTION det_user.trial_continue(
    p_trial integer, p_config jsonb, p_original_config text, p_workspace text, p_project text
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det trial continue`: a new experiment of one trial (searcher single) that resumes trial
-- p_trial from its latest checkpoint, weights and batch count (continuations); the model
-- definition is p_trial's experiment's. p_config (expanded; YAML p_original_config) names that
-- checkpoint as searcher.source_checkpoint_uuid, which pins it, and keeps the checkpoint's
-- storage, from which the new trial restores it. Stored by det_user.create_experiment (its checks
-- and permissions: Editor where it goes and of the checkpoint's workspace). Raises
-- no_data_found (a trial the caller cannot view), check_violation (no COMPLETED latest
-- checkpoint) or invalid_parameter_value naming the config key. Returns the new experiment's
-- id.
DECLARE
    v_exp integer;
    v_uuid uuid;
    c checkpoints;
    v_id integer;
BEGIN
    SELECT t.experiment_id, t.latest_checkpoint INTO v_exp, v_uuid
      FROM trials t WHERE t.id = p_trial;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'trial % not found', p_trial USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.require('view', det_user.experiment_workspace(v_exp),
                        format('continue trial %s', p_trial));
    -- FOR KEY SHARE: the checkpoint's row stays until the pin commits.
    SELECT * INTO c FROM checkpoints WHERE uuid = v_uuid FOR KEY SHARE;
    IF NOT FOUND OR c.state <> 'COMPLETED' THEN
        RAISE EXCEPTION 'trial %: no checkpoint to continue from%', p_trial,
            CASE WHEN FOUND THEN format(' (its latest, %s, is %s)', c.uuid, c.state) ELSE '' END
            USING ERRCODE = 'check_violation';
    END IF;
    IF p_config #>> '{searcher,name}' IS DISTINCT FROM 'single' THEN
        RAISE EXCEPTION 'searcher.name: a continued trial is one trial: expected single, got %',
            coalesce(p_config #>> '{searcher,name}', 'none')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_config #>> '{searcher,source_checkpoint_uuid}' IS DISTINCT FROM c.uuid::text THEN
        RAISE EXCEPTION 'searcher.source_checkpoint_uuid: expected % (the latest checkpoint of '
            'trial %), got %', c.uuid, p_trial,
            coalesce(p_config #>> '{searcher,source_checkpoint_uuid}', 'none')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A length in batches (the unit the checkpoint counts) must go past the checkpoint.
    IF jsonb_typeof(p_config #> '{searcher,max_length,batches}') = 'number'
       AND (p_config #>> '{searcher,max_length,batches}')::numeric <= c.steps_completed THEN
        RAISE EXCEPTION 'searcher.max_length: % batches is not past the checkpoint''s %: the '
            'continued trial would train nothing', p_config #>> '{searcher,max_length,batches}',
            c.steps_completed USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Where the files are, not how many GC keeps.
    IF (p_config -> 'checkpoint_storage') - '{save_experiment_best,save_trial_best,save_trial_latest}'::text[]
       IS DISTINCT FROM c.storage - '{save_experiment_best,save_trial_best,save_trial_latest}'::text[] THEN
        RAISE EXCEPTION 'checkpoint_storage: checkpoint % is stored in %, which the continued '
            'trial restores it from; the config names another storage', c.uuid,
            det_user.redact_secrets(c.storage)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_id := det_user.create_experiment(p_config, p_original_config,
                                  (SELECT b.data FROM experiments e
                                     JOIN context_blobs b ON b.id = e.context_id
                                    WHERE e.id = v_exp),
                                  p_workspace, p_project);
    INSERT INTO continuations (experiment_id, source_trial_id, checkpoint_uuid)
    VALUES (v_id, p_trial, c.uuid);
    PERFORM det_internal.audit('continue', 'experiment', v_id::text,
                      jsonb_build_object('trial', p_trial, 'checkpoint', c.uuid));
    RETURN v_id;
END $$;
GRANT EXECUTE ON FUNCTION det_user.trial_continue(integer, jsonb, text, text, text) TO det_user;

CREATE FUNCTION det_user.experiment_action(p_id integer, p_action text) RETURNS experiment_state
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- pause | activate | cancel | kill (spec: run-training-code, Pause and Activate). Returns the
-- new state. The reconciler turns the state into desired states of the trials' allocations.
-- An action the state does not allow is a check_violation (an illegal transition); an
-- unknown action a bad argument. Any action but pause clears the reason the cluster paused
-- the experiment for (experiments.paused_reason).
DECLARE
    v_state experiment_state;
    v_new experiment_state;
BEGIN
    IF p_action IS NULL OR p_action NOT IN ('pause', 'activate', 'cancel', 'kill') THEN
        RAISE EXCEPTION 'action: expected pause, activate, cancel or kill, not %', p_action
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_internal.require('edit', det_user.experiment_workspace(p_id),
                        format('%s experiment %s', p_action, p_id));
    SELECT state INTO v_state FROM experiments WHERE id = p_id FOR UPDATE;
    v_new := CASE
        WHEN p_action = 'pause' AND v_state IN ('ACTIVE', 'PAUSED') THEN 'PAUSED'
        WHEN p_action = 'activate' AND v_state IN ('ACTIVE', 'PAUSED') THEN 'ACTIVE'
        WHEN p_action = 'cancel' AND v_state IN ('ACTIVE', 'PAUSED') THEN 'STOPPING_CANCELED'
        WHEN p_action = 'cancel' AND v_state::text LIKE 'STOPPING_%' THEN v_state
        WHEN p_action = 'kill' AND (v_state IN ('ACTIVE', 'PAUSED')
                                    OR v_state::text LIKE 'STOPPING_%') THEN 'STOPPING_KILLED'
    END::experiment_state;
    IF v_new IS NULL THEN
        RAISE EXCEPTION 'experiment %: cannot % an experiment in state %', p_id, p_action, v_state
            USING ERRCODE = 'check_violation';
    END IF;
    UPDATE experiments
       SET state = v_new, paused_reason = CASE WHEN p_action = 'pause' THEN paused_reason END
     WHERE id = p_id;
    PERFORM det_internal.audit(p_action, 'experiment', p_id::text);
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'experiment');
    RETURN v_new;
END $$;
GRANT EXECUTE ON FUNCTION det_user.experiment_action(integer, text) TO det_user;

CREATE FUNCTION det_internal.create_task(
    p_type text, p_config jsonb, p_context bytea, p_workspace text, p_project text,
    p_experiment_ids integer[], p_trial_ids integer[], p_secrets jsonb
) RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Submit an interactive task of kind p_type (COMMAND, NOTEBOOK, SHELL, TENSORBOARD) with the
-- expanded task config p_config (det.configs.task: every default filled, its pool chosen),
-- owned by the caller, in project p_project of workspace p_workspace (both NULL:
-- Uncategorized): Editor there, as for an experiment (det_user.experiment_create_check). A
-- TensorBoard's experiments p_experiment_ids and trials p_trial_ids must be ones the caller
-- can view (no_data_found naming the first that is not). p_secrets: {jupyter_token,
-- ssh_private_key, ssh_public_key}. Creates the job, the task and its one run (never
-- preempted: the seed's rule for interactive tasks) in this transaction; returns the job id.
DECLARE
    p projects;
    v_user text;
    v_pool text := p_config #>> '{resources,resource_pool}';
    v_slots integer := (p_config #>> '{resources,slots}')::integer;
    v_ctx bigint;
    v_job bigint;
    v_missing text;
BEGIN
    IF p_type IS NULL OR p_type NOT IN ('COMMAND', 'NOTEBOOK', 'SHELL', 'TENSORBOARD') THEN
        RAISE EXCEPTION 'task type: expected COMMAND, NOTEBOOK, SHELL or TENSORBOARD, not %',
            coalesce(p_type, 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_pool IS NULL OR v_slots IS NULL OR v_slots < 0 THEN
        RAISE EXCEPTION 'resources: the expanded config names its pool and slots (>= 0)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_type = 'TENSORBOARD' AND cardinality(p_experiment_ids) + cardinality(p_trial_ids) = 0
    THEN
        RAISE EXCEPTION 'a TensorBoard needs at least one experiment or trial'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO p FROM projects
        WHERE id = det_user.experiment_create_check(p_workspace, p_project);
    v_user := det_user.caller();
    PERFORM det_internal.check_pools(p.workspace_id, ARRAY[v_pool], 'resources.resource_pool');
    SELECT m INTO v_missing FROM (
        SELECT 'experiment ' || x AS m FROM unnest(p_experiment_ids) x
         WHERE NOT EXISTS (SELECT 1 FROM experiments e JOIN jobs j ON j.id = e.job_id
                            WHERE e.id = x AND (det_user.is_owner_session()
                                                OR det_user.permitted(v_user, 'view',
                                                    j.workspace_id)))
        UNION ALL
        SELECT 'trial ' || x FROM unnest(p_trial_ids) x
         WHERE NOT EXISTS (SELECT 1 FROM trials t JOIN experiments e ON e.id = t.experiment_id
                             JOIN jobs j ON j.id = e.job_id
                            WHERE t.id = x AND (det_user.is_owner_session()
                                                OR det_user.permitted(v_user, 'view',
                                                    j.workspace_id)))
    ) missing LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION '%: not found', v_missing USING ERRCODE = 'no_data_found';
    END IF;
    IF p_context IS NOT NULL THEN
        INSERT INTO context_blobs (sha256, size_bytes, data)
        VALUES (sha256(p_context), length(p_context), p_context)
        ON CONFLICT (sha256) DO NOTHING;
        SELECT id INTO v_ctx FROM context_blobs WHERE sha256 = sha256(p_context);
    END IF;
    INSERT INTO jobs (type, resource_pool, priority, weight, queue_position, owner, workspace_id)
    VALUES (p_type, v_pool,
            coalesce((p_config #>> '{resources,priority}')::integer,
                     (det_user.pool_scheduler(v_pool) ->> 'default_priority')::integer),
            (p_config #>> '{resources,weight}')::double precision,
            extract(epoch FROM clock_timestamp()) * 1000000, v_user, p.workspace_id)
    RETURNING id INTO v_job;
    INSERT INTO tasks (job_id, type, description, config, project_id, context_id,
                       experiment_ids, trial_ids)
    VALUES (v_job, p_type,
            coalesce(p_config ->> 'description',
                     format('%s %s', initcap(p_type), v_job)),
            p_config, p.id, v_ctx, coalesce(p_experiment_ids, '{}'), coalesce(p_trial_ids, '{}'));
    INSERT INTO task_secrets (job_id, jupyter_token, ssh_private_key, ssh_public_key)
    VALUES (v_job, p_secrets ->> 'jupyter_token', p_secrets ->> 'ssh_private_key',
            p_secrets ->> 'ssh_public_key');
    INSERT INTO allocations (job_id, run, resource_pool, slots_needed, preemptible, spec)
    VALUES (v_job, 1, v_pool, v_slots, false, jsonb_build_object(
        'kind', lower(p_type), 'entrypoint', p_config -> 'entrypoint',
        'environment', p_config -> 'environment', 'bind_mounts', p_config -> 'bind_mounts',
        'resources', jsonb_build_object(
            'slots_per_trial', v_slots, 'resource_pool', v_pool,
            'priority', p_config #> '{resources,priority}',
            'weight', p_config #> '{resources,weight}',
            'shm_size', p_config #> '{resources,shm_size}',
            'memory_limit', p_config #> '{resources,memory_limit}'),
        'checkpoint_storage', NULL, 'context_id', v_ctx, 'experiment_id', NULL,
        'trial_id', NULL,
        'task', jsonb_build_object(
            'job_id', v_job, 'work_dir', p_config -> 'work_dir',
            'idle_timeout', p_config -> 'idle_timeout',
            'notebook_idle_type', p_config -> 'notebook_idle_type',
            'experiment_ids', to_jsonb(coalesce(p_experiment_ids, '{}')),
            'trial_ids', to_jsonb(coalesce(p_trial_ids, '{}')))));
    PERFORM det_internal.audit('create', lower(p_type), v_job::text,
        jsonb_build_object('project', p.id));
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'task');
    RETURN v_job;
END $$;
GRANT EXECUTE ON FUNCTION
    det_internal.create_task(text, jsonb, bytea, text, text, integer[], integer[], jsonb)
    TO det_user;

CREATE FUNCTION det_internal.task_find(p_job bigint, p_permission text, p_action text) RETURNS tasks
LANGUAGE plpgsql STABLE AS $$
-- Task p_job, once the caller holds p_permission in its workspace (det_internal.require:
-- no_data_found for a task the caller cannot see, as for one that does not exist;
-- insufficient_privilege naming the role for one they see but may not p_action).
DECLARE
    t tasks;
    v_ws integer;
BEGIN
    SELECT * INTO t FROM tasks WHERE job_id = p_job;
    SELECT j.workspace_id INTO v_ws FROM jobs j WHERE j.id = p_job;
    IF t.job_id IS NULL OR NOT (det_user.is_owner_session()
                                OR det_user.permitted(det_user.caller(), 'view', v_ws)) THEN
        RAISE EXCEPTION 'task %: not found', p_job USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.require(p_permission, v_ws, format('%s task %s', p_action, p_job));
    RETURN t;
END $$;

CREATE FUNCTION det_user.task_kill(p_job bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det <kind> kill`: end task p_job (Editor of its workspace). Its live run is desired
-- KILLED (the agent stops it at once: an interactive task has nothing to checkpoint); one
-- not yet placed ends in the next pass. end_reason records who killed it. Killing an ended
-- task changes nothing.
DECLARE
    t tasks := det_internal.task_find(p_job, 'edit', 'kill');
    v_agent text;
BEGIN
    UPDATE allocations SET desired_state = 'KILLED', stop_requested_at = coalesce(
               stop_requested_at, now())
     WHERE job_id = t.job_id AND state <> 'TERMINATED' AND desired_state <> 'KILLED'
    RETURNING agent_id INTO v_agent;
    IF FOUND THEN
        UPDATE tasks SET end_reason = coalesce(end_reason, format('killed by %s',
            det_user.caller()))
         WHERE job_id = t.job_id;
        PERFORM det_internal.audit('kill', lower(t.type), t.job_id::text);
        IF v_agent IS NOT NULL THEN
            PERFORM pg_notify(det_internal.channel('agent', v_agent), '');
        END IF;
        PERFORM pg_notify(det_internal.channel('reconciler', ''), 'task');
    END IF;
END $$;
GRANT EXECUTE ON FUNCTION det_user.task_kill(bigint) TO det_user;

CREATE FUNCTION det_user.job_update(p_job bigint, p_field text, p_value text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- One change to a queued job (spec: run-training-code, Modify the Job Queue): priority only
-- under the priority scheduler, weight only under fair share, ahead-of / behind-of only under
-- priority, resource-pool only for experiments. Several calls in one transaction are
-- `det job update-batch`: all apply or none. Editor of the job's workspace; a new pool must
-- serve it.
DECLARE
    j jobs;
    other jobs;
    v_type text;
    v_neighbour numeric;
    v_int integer;
    v_weight double precision;
    v_exp integer;
    v_state experiment_state;
BEGIN
    SELECT * INTO j FROM jobs WHERE id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % not found', p_job USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.require('edit', j.workspace_id, format('change the %s of job %s',
        p_field, p_job));
    SELECT e.id, e.state INTO v_exp, v_state FROM experiments e WHERE e.job_id = p_job;
    IF v_state IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RAISE EXCEPTION 'job % (experiment %) is %: it is no longer queued', p_job, v_exp,
            v_state USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_type := det_user.pool_scheduler(j.resource_pool) ->> 'type';
    CASE p_field
    WHEN 'priority' THEN
        IF v_type <> 'priority' THEN
            RAISE EXCEPTION 'job %: priority applies only under the priority scheduler; pool "%" uses %',
                p_job, j.resource_pool, v_type USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_int := p_value::integer;
        IF v_int NOT BETWEEN 1 AND 99 THEN
            RAISE EXCEPTION 'job %: priority must be between 1 and 99, not %', p_job, p_value
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- A new priority puts the job back at its submission time within that priority.
        UPDATE jobs SET priority = v_int,
               queue_position = extract(epoch FROM submitted_at) * 1000000
         WHERE id = p_job;
    WHEN 'weight' THEN
        IF v_type <> 'fair_share' THEN
            RAISE EXCEPTION 'job %: weight applies only under the fair_share scheduler; pool "%" uses %',
                p_job, j.resource_pool, v_type USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_weight := p_value::double precision;
        -- NOT (... AND ...) also refuses NaN, which PostgreSQL sorts above every number (so
        -- NaN > 0 holds), and Infinity; the same rule is the jobs.weight CHECK.
        IF NOT (v_weight > 0 AND v_weight <= 1000000) THEN
            RAISE EXCEPTION 'job %: weight must be a finite number > 0 and at most 1e6, not %',
                p_job, p_value USING ERRCODE = 'invalid_parameter_value';
        END IF;
        UPDATE jobs SET weight = v_weight WHERE id = p_job;
    WHEN 'resource-pool' THEN
        IF j.type <> 'EXPERIMENT' THEN
            RAISE EXCEPTION 'job %: only experiments can change resource pool; cancel and resubmit a %',
                p_job, lower(j.type) USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM det_internal.check_pools(j.workspace_id, ARRAY[p_value], format('job %s', p_job));
        UPDATE jobs SET resource_pool = p_value, fallback_pools = '{}' WHERE id = p_job;
        UPDATE allocations SET resource_pool = p_value
         WHERE job_id = p_job AND state = 'PENDING';
        UPDATE experiments SET config = jsonb_set(config, '{resources,resource_pool}',
            to_jsonb(p_value))
         WHERE job_id = p_job;
    WHEN 'ahead-of', 'behind-of' THEN
        IF v_type <> 'priority' THEN
            RAISE EXCEPTION 'job %: % applies only under the priority scheduler; pool "%" uses %',
                p_job, p_field, j.resource_pool, v_type USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT * INTO other FROM jobs WHERE id = p_value::bigint;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'job %: no job % to move %', p_job, p_value, replace(p_field, '-of', '')
                USING ERRCODE = 'no_data_found';
        END IF;
        IF other.resource_pool <> j.resource_pool THEN
            RAISE EXCEPTION 'job %: job % is in pool "%", not "%"', p_job, other.id,
                other.resource_pool, j.resource_pool USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- Take the other job's priority and a position just before (after) it: the midpoint
        -- with its neighbour, so no other job moves.
        IF p_field = 'ahead-of' THEN
            SELECT max(queue_position) INTO v_neighbour FROM jobs
             WHERE resource_pool = other.resource_pool AND priority = other.priority
               AND queue_position < other.queue_position AND id <> p_job;
            v_neighbour := coalesce(v_neighbour, other.queue_position - 2);
        ELSE
            SELECT min(queue_position) INTO v_neighbour FROM jobs
             WHERE resource_pool = other.resource_pool AND priority = other.priority
               AND queue_position > other.queue_position AND id <> p_job;
            v_neighbour := coalesce(v_neighbour, other.queue_position + 2);
        END IF;
        UPDATE jobs SET priority = other.priority,
               queue_position = (other.queue_position + v_neighbour) / 2
         WHERE id = p_job;
    ELSE
        RAISE EXCEPTION 'unknown job field "%"; expected priority, weight, resource-pool, ahead-of or behind-of',
            p_field USING ERRCODE = 'invalid_parameter_value';
    END CASE;
    PERFORM det_internal.audit('update', 'job', p_job::text,
                      jsonb_build_object('field', p_field, 'value', p_value));
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'job');
EXCEPTION
    WHEN invalid_text_representation OR numeric_value_out_of_range THEN
        RAISE EXCEPTION 'job %: % expects a number, not "%"', p_job, p_field, p_value
            USING ERRCODE = 'invalid_parameter_value';
END $$;
GRANT EXECUTE ON FUNCTION det_user.job_update(bigint, text, text) TO det_user;

CREATE FUNCTION det_user.apply_cluster_config(p_config jsonb, p_original text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Store a validated cluster config and make resource_pools match it (ClusterAdmin). A pool
-- the config drops is deleted only if nothing uses it (agents and live instances count);
-- otherwise the whole apply is refused. A pool's provider is stored as given.
DECLARE
    v_gone text;
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL, 'apply a cluster config');
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
     WHERE name NOT IN (SELECT p ->> 'name'
         FROM jsonb_array_elements(p_config -> 'resource_pools') p)
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
     WHERE name NOT IN (SELECT p ->> 'name'
         FROM jsonb_array_elements(p_config -> 'resource_pools') p)
       AND NOT EXISTS (SELECT 1 FROM agents g WHERE g.resource_pool = r.name)
       AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.resource_pool = r.name)
       AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.resource_pool = r.name);
    INSERT INTO cluster_config (config, original) VALUES (p_config, p_original)
    ON CONFLICT (singleton) DO UPDATE
        SET config = excluded.config, original = excluded.original, applied_at = now();
    PERFORM det_internal.audit('apply', 'cluster_config', 'cluster', p_config);
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'cluster');
END $$;
GRANT EXECUTE ON FUNCTION det_user.apply_cluster_config(jsonb, text) TO det_user;

CREATE FUNCTION det_user.agent_set_enabled(p_id text, p_enabled boolean) RETURNS agent_state
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Disable (drain) or enable an agent (ClusterAdmin): a disabled agent's running work
-- finishes, nothing new is placed on it (Determined's `det agent disable`). Returns its new
-- state.
DECLARE
    v_state agent_state;
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL,
                        format('%s agent %s', CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END,
                               p_id));
    UPDATE agents
       SET state = CASE WHEN p_enabled THEN 'ACTIVE' ELSE 'DISABLED' END::agent_state
     WHERE id = p_id AND state <> 'LOST'
    RETURNING state INTO v_state;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent % not found (or lost)', p_id USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.audit(CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END, 'agent', p_id);
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'agent');
    RETURN v_state;
END $$;
GRANT EXECUTE ON FUNCTION det_user.agent_set_enabled(text, boolean) TO det_user;

CREATE FUNCTION det_user.agent_drain(p_id text) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det agent disable --drain` (ClusterAdmin): disable agent p_id (det_user.agent_set_enabled) and
-- stop its live runs as a planned stop (det_internal.stop_runs_of): each trial checkpoints and
-- exits as on pause and resumes on another agent from that checkpoint, its end no failure.
-- A task that ignores the request is killed after its preemption_timeout (the reconciler's
-- KILL_OVERDUE), still no failure. Returns how many runs were asked to stop.
BEGIN
    PERFORM det_user.agent_set_enabled(p_id, false);
    RETURN cardinality(det_internal.stop_runs_of(p_id));
END $$;
GRANT EXECUTE ON FUNCTION det_user.agent_drain(text) TO det_user;

CREATE FUNCTION det_agent.mark_fenced(p_agent text, p_ids bigint[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent killed its live runs p_ids because it could not heartbeat for its lease
-- (self-fencing, det.agent.heartbeat): the cluster's doing, not the trials' (a database outage
-- longer than the lease does it to every agent), so each is marked planned_stop and its
-- trial resumes from its latest checkpoint without counting a restart. Runs that already
-- ended (the reconciler declared the agent lost first: a failure, as any lost agent's run) or
-- that are not this agent's are left alone.
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    UPDATE allocations a SET planned_stop = true
     WHERE a.id = ANY (p_ids) AND a.state <> 'TERMINATED'
       AND (a.agent_id = p_agent
            OR EXISTS (SELECT 1 FROM allocation_slots h
                        WHERE h.allocation_id = a.id AND h.agent_id = p_agent));
END $$;
GRANT EXECUTE ON FUNCTION det_agent.mark_fenced(text, bigint[]) TO det_agent;

CREATE FUNCTION det_user.slot_set_enabled(p_agent text, p_slot integer, p_enabled boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Disable (drain) or enable one slot of an agent (ClusterAdmin); work holding it runs on.
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL,
                        format('%s slot %s of agent %s',
                               CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END, p_slot,
                               p_agent));
    UPDATE slots SET enabled = p_enabled WHERE agent_id = p_agent AND slot_id = p_slot;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent % has no slot %', p_agent, p_slot USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.audit(CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END, 'slot',
                      p_agent || '/' || p_slot);
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'agent');
END $$;
GRANT EXECUTE ON FUNCTION det_user.slot_set_enabled(text, integer, boolean) TO det_user;

-- =============================================================================================
-- User actions: the model registry and configuration templates. Each is one
-- transaction. A model is named by its name (compared regardless of case) or by its id.

CREATE FUNCTION det_user.model_find(p_model text) RETURNS models LANGUAGE plpgsql STABLE AS $$
-- The model that p_model names: all digits is an id (names cannot be only numbers), anything
-- else a name, compared regardless of case. Raises no_data_found.
DECLARE
    m models;
BEGIN
    IF p_model ~ '^[0-9]{1,9}$' THEN
        SELECT * INTO m FROM models WHERE id = p_model::integer;
    ELSE
        SELECT * INTO m FROM models WHERE lower(name) = lower(p_model);
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'model % not found', to_jsonb(p_model) USING ERRCODE = 'no_data_found';
    END IF;
    RETURN m;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_find(text) TO det_user;

CREATE FUNCTION det_internal.model_check(
    p_name text, p_description text, p_labels text[], p_metadata jsonb, p_except integer
) RETURNS void LANGUAGE plpgsql STABLE AS $$
-- Raise invalid_parameter_value, naming the field, if a model's new name, description, labels
-- or metadata (each NULL: unchanged) is unacceptable. p_except is the model being changed,
-- which may keep its own name.
DECLARE
    v_problem text := det_user.model_name_problem(p_name);
BEGIN
    IF p_name IS NOT NULL AND v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'model name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM models WHERE lower(name) = lower(p_name)
                                      AND id IS DISTINCT FROM p_except) THEN
        RAISE EXCEPTION 'model name %: a model of that name already exists (names are compared '
            'regardless of case)', to_jsonb(p_name) USING ERRCODE = 'unique_violation';
    END IF;
    IF length(p_description) > 4096 THEN
        RAISE EXCEPTION 'description: expected at most 4096 characters, got %',
            length(p_description) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_problem := det_user.label_problem(p_labels);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'labels: %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
        RAISE EXCEPTION 'metadata: expected a JSON object, got %', jsonb_typeof(p_metadata)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

CREATE FUNCTION det_user.model_create(
    p_name text, p_description text, p_labels text[], p_workspace text
) RETURNS models LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model create`: a new, empty model of the caller's in workspace p_workspace (NULL:
-- Uncategorized), where the caller is an Editor.
DECLARE
    v_ws integer := CASE WHEN p_workspace IS NULL THEN 1
                         ELSE (det_user.workspace_find(p_workspace)).id END;
    v_user text := det_internal.require('edit', v_ws, format('create model %s', to_jsonb(p_name)));
    m models;
BEGIN
    PERFORM det_internal.model_check(p_name, p_description, p_labels, NULL, NULL);
    INSERT INTO models (name, description, labels, owner, workspace_id)
    VALUES (p_name, coalesce(p_description, ''), coalesce(p_labels, '{}'), v_user, v_ws)
    RETURNING * INTO m;
    PERFORM det_internal.audit('create', 'model', m.id::text, jsonb_build_object('name', m.name));
    RETURN m;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_create(text, text, text[], text) TO det_user;

CREATE FUNCTION det_user.model_update(
    p_model text, p_name text, p_description text, p_notes text, p_labels text[],
    p_metadata jsonb, p_remove_metadata text[]
) RETURNS models LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model update`: each argument NULL leaves its field as it is. p_labels replaces the
-- labels; p_metadata is merged into the metadata (its top-level keys replace the model's),
-- then the keys in p_remove_metadata are removed. An archived model cannot change.
DECLARE
    m models := det_user.model_find(p_model);
BEGIN
    PERFORM det_internal.require('edit', m.workspace_id, format('change model %s',
        to_jsonb(m.name)));
    SELECT * INTO m FROM models WHERE id = m.id FOR UPDATE;
    IF m.archived THEN
        RAISE EXCEPTION 'model % is archived: unarchive it to change it', to_jsonb(m.name)
            USING ERRCODE = 'check_violation';
    END IF;
    PERFORM det_internal.model_check(p_name, p_description, p_labels, p_metadata, m.id);
    UPDATE models
       SET name = coalesce(p_name, name), description = coalesce(p_description, description),
           notes = coalesce(p_notes, notes), labels = coalesce(p_labels, labels),
           metadata = (metadata || coalesce(p_metadata, '{}')) - coalesce(p_remove_metadata, '{}'),
           last_updated_time = now()
     WHERE id = m.id
    RETURNING * INTO m;
    PERFORM det_internal.audit('update', 'model', m.id::text);
    RETURN m;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_update(text, text, text, text, text[], jsonb, text[])
    TO det_user;

CREATE FUNCTION det_user.model_set_archived(p_model text, p_archived boolean) RETURNS models
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model archive | unarchive`: an archived model is hidden from `det model list` (unless
-- --all), takes no new versions and no changes; its versions still pin their checkpoints.
DECLARE
    m models := det_user.model_find(p_model);
BEGIN
    PERFORM det_internal.require('edit', m.workspace_id,
                        format('%s model %s', CASE WHEN p_archived THEN 'archive'
                                                   ELSE 'unarchive' END, to_jsonb(m.name)));
    UPDATE models SET archived = p_archived, last_updated_time = now()
     WHERE id = m.id RETURNING * INTO m;
    PERFORM det_internal.audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END, 'model',
                      m.id::text);
    RETURN m;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_set_archived(text, boolean) TO det_user;

CREATE FUNCTION det_user.model_delete(p_model text) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model delete`: the model and all its versions; their checkpoints are no longer pinned.
-- Returns how many versions went with it.
DECLARE
    m models := det_user.model_find(p_model);
    v_versions integer;
BEGIN
    PERFORM det_internal.require('edit', m.workspace_id, format('delete model %s',
        to_jsonb(m.name)));
    SELECT count(*) INTO v_versions FROM model_versions WHERE model_id = m.id;
    DELETE FROM models WHERE id = m.id;
    PERFORM det_internal.audit('delete', 'model', m.id::text, jsonb_build_object('name', m.name));
    RETURN v_versions;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_delete(text) TO det_user;

CREATE FUNCTION det_user.model_register_version(
    p_model text, p_checkpoint text, p_name text, p_notes text, p_labels text[],
    p_metadata jsonb
) RETURNS model_versions LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model register-version`: the model's next version (its highest number plus one; the
-- model's row lock serialises concurrent registrations) is the checkpoint p_checkpoint, which
-- must be COMPLETED (Determined: "checkpoints for model versions must be in a COMPLETED
-- state"). The version pins the checkpoint. An archived model takes no new versions. The
-- caller is an Editor of the model's workspace and of the checkpoint's: a pinned checkpoint
-- cannot be deleted by its owner, so viewing it is not enough (the same rule as
-- det_user.create_experiment's searcher.source_checkpoint_uuid).
DECLARE
    m models := det_user.model_find(p_model);
    v_uuid uuid;
    v_state text;
    v_problem text := det_user.label_problem(p_labels);
    r model_versions;
    v_user text := det_internal.require('edit', m.workspace_id,
                               format('register a version of model %s', to_jsonb(m.name)));
BEGIN
    SELECT * INTO m FROM models WHERE id = m.id FOR UPDATE;
    IF m.archived THEN
        RAISE EXCEPTION 'model % is archived: unarchive it to register new versions',
            to_jsonb(m.name) USING ERRCODE = 'check_violation';
    END IF;
    BEGIN
        v_uuid := p_checkpoint::uuid;
    EXCEPTION WHEN invalid_text_representation THEN
        RAISE EXCEPTION 'checkpoint: expected a checkpoint UUID, got %', to_jsonb(p_checkpoint)
            USING ERRCODE = 'invalid_parameter_value';
    END;
    -- FOR SHARE: the checkpoint cannot change state or go away until this version commits.
    SELECT state INTO v_state FROM checkpoints WHERE uuid = v_uuid FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'checkpoint % not found', v_uuid USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.require('edit', (SELECT j.workspace_id FROM checkpoints c
                                   JOIN trials t ON t.id = c.trial_id
                                   JOIN experiments e ON e.id = t.experiment_id
                                   JOIN jobs j ON j.id = e.job_id WHERE c.uuid = v_uuid),
                        format('register checkpoint %s, which pins it', v_uuid));
    IF v_state <> 'COMPLETED' THEN
        RAISE EXCEPTION 'checkpoint % is %: only a COMPLETED checkpoint can be registered',
            v_uuid, v_state USING ERRCODE = 'check_violation';
    END IF;
    IF length(p_name) > 255 THEN
        RAISE EXCEPTION 'version name: expected at most 255 characters, got %', length(p_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'labels: %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
        RAISE EXCEPTION 'metadata: expected a JSON object, got %', jsonb_typeof(p_metadata)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO model_versions (model_id, version, checkpoint_uuid, name, notes, labels,
                                metadata, owner)
    SELECT m.id, coalesce(max(v.version), 0) + 1, v_uuid, coalesce(p_name, ''),
           coalesce(p_notes, ''), coalesce(p_labels, '{}'), coalesce(p_metadata, '{}'), v_user
      FROM model_versions v WHERE v.model_id = m.id
    RETURNING * INTO r;
    UPDATE models SET last_updated_time = now() WHERE id = m.id;
    PERFORM det_internal.audit('register_version', 'model', m.id::text,
                      jsonb_build_object('version', r.version, 'checkpoint', v_uuid));
    RETURN r;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_register_version(text, text, text, text, text[], jsonb)
    TO det_user;

CREATE FUNCTION det_user.model_version_find(p_model text, p_version integer) RETURNS model_versions
LANGUAGE plpgsql STABLE AS $$
-- Version p_version of the model p_model names; NULL p_version: its latest version. Raises
-- no_data_found.
DECLARE
    m models := det_user.model_find(p_model);
    r model_versions;
BEGIN
    SELECT * INTO r FROM model_versions
     WHERE model_id = m.id AND (p_version IS NULL OR version = p_version)
     ORDER BY version DESC LIMIT 1;
    IF NOT FOUND THEN
        IF p_version IS NULL THEN
            RAISE EXCEPTION 'model % has no versions', to_jsonb(m.name)
                USING ERRCODE = 'no_data_found';
        END IF;
        RAISE EXCEPTION 'model % has no version %', to_jsonb(m.name), p_version
            USING ERRCODE = 'no_data_found';
    END IF;
    RETURN r;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_version_find(text, integer) TO det_user;

CREATE FUNCTION det_user.model_version_update(
    p_model text, p_version integer, p_name text, p_notes text, p_labels text[],
    p_metadata jsonb, p_remove_metadata text[]
) RETURNS model_versions LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model update NAME --version N`: as det_user.model_update, for one version (its name,
-- notes, labels and metadata). A version of an archived model cannot change.
DECLARE
    r model_versions := det_user.model_version_find(p_model, p_version);
    m models;
    v_problem text := det_user.label_problem(p_labels);
BEGIN
    SELECT * INTO m FROM models WHERE id = r.model_id FOR UPDATE;
    PERFORM det_internal.require('edit', m.workspace_id, format('change model %s',
        to_jsonb(m.name)));
    IF m.archived THEN
        RAISE EXCEPTION 'model % is archived: unarchive it to change its versions',
            to_jsonb(m.name) USING ERRCODE = 'check_violation';
    END IF;
    IF length(p_name) > 255 THEN
        RAISE EXCEPTION 'version name: expected at most 255 characters, got %', length(p_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'labels: %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
        RAISE EXCEPTION 'metadata: expected a JSON object, got %', jsonb_typeof(p_metadata)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE model_versions
       SET name = coalesce(p_name, name), notes = coalesce(p_notes, notes),
           labels = coalesce(p_labels, labels),
           metadata = (metadata || coalesce(p_metadata, '{}')) - coalesce(p_remove_metadata, '{}'),
           last_updated_time = now()
     WHERE id = r.id
    RETURNING * INTO r;
    UPDATE models SET last_updated_time = now() WHERE id = r.model_id;
    PERFORM det_internal.audit('update_version', 'model', m.id::text,
                      jsonb_build_object('version', r.version));
    RETURN r;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_version_update(text, integer, text, text, text[],
    jsonb, text[]) TO det_user;

CREATE FUNCTION det_user.model_version_delete(p_model text, p_version integer) RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model delete-version`: remove one version; returns its checkpoint, no longer pinned by
-- it. The numbers of the other versions stay as they are.
DECLARE
    r model_versions := det_user.model_version_find(p_model, p_version);
BEGIN
    PERFORM det_internal.require('edit', (SELECT workspace_id FROM models WHERE id = r.model_id),
                        format('delete a version of model %s', to_jsonb(p_model)));
    DELETE FROM model_versions WHERE id = r.id;
    UPDATE models SET last_updated_time = now() WHERE id = r.model_id;
    PERFORM det_internal.audit('delete_version', 'model', r.model_id::text,
                      jsonb_build_object('version', r.version));
    RETURN r.checkpoint_uuid;
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_version_delete(text, integer) TO det_user;

CREATE FUNCTION det_internal.template_workspace(p_workspace text, p_permission text, p_action text)
RETURNS integer LANGUAGE plpgsql STABLE AS $$
-- The id of workspace p_workspace (NULL: Uncategorized, id 1) once det_internal.require has let the
-- caller do p_action there with p_permission. A workspace that does not exist is refused as
-- one the caller may not view: 'cannot <p_action>: not found' (no_data_found).
DECLARE
    v_id integer := CASE WHEN p_workspace IS NULL THEN 1
                         ELSE (SELECT id FROM workspaces WHERE name = p_workspace) END;
BEGIN
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'cannot %: not found', p_action USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.require(p_permission, v_id, p_action);
    RETURN v_id;
END $$;

CREATE FUNCTION det_user.template_set(p_workspace text, p_name text, p_config jsonb,
                                 p_original text)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det template set`: create or replace template p_name of workspace p_workspace (NULL:
-- Uncategorized), as an Editor there (a template is its workspace's, not the cluster's). p_config:
-- its YAML (p_original) as a JSON object, checked by det.configs.templates. Returns true when it
-- was created.
DECLARE
    v_ws integer := det_internal.template_workspace(
        p_workspace, 'edit', format('set template %s in workspace %s', to_jsonb(p_name),
                                    to_jsonb(coalesce(p_workspace, 'Uncategorized'))));
    v_problem text := det_user.template_name_problem(p_name);
    v_created boolean;
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'template name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(p_config) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'template %: expected a mapping at the top level', to_jsonb(p_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO templates AS t (workspace_id, name, config, original, owner)
    VALUES (v_ws, p_name, p_config, p_original, det_user.caller())
    ON CONFLICT (workspace_id, name) DO UPDATE
        SET config = excluded.config, original = excluded.original, updated_at = now()
    RETURNING (xmax = 0) INTO v_created;
    PERFORM det_internal.audit(CASE WHEN v_created THEN 'create' ELSE 'update' END,
        'template', p_name,
                      jsonb_build_object('workspace_id', v_ws));
    RETURN v_created;
END $$;
GRANT EXECUTE ON FUNCTION det_user.template_set(text, text, jsonb, text) TO det_user;

CREATE FUNCTION det_user.template_remove(p_workspace text, p_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det template remove` (an Editor of its workspace; NULL: Uncategorized): experiments
-- created from it keep their merged configs.
DECLARE
    v_ws integer := det_internal.template_workspace(
        p_workspace, 'edit', format('remove template %s of workspace %s', to_jsonb(p_name),
                                    to_jsonb(coalesce(p_workspace, 'Uncategorized'))));
BEGIN
    DELETE FROM templates WHERE workspace_id = v_ws AND name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'template % not found in workspace %', to_jsonb(p_name),
            to_jsonb(coalesce(p_workspace, 'Uncategorized')) USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.audit('delete', 'template', p_name,
        jsonb_build_object('workspace_id', v_ws));
END $$;
GRANT EXECUTE ON FUNCTION det_user.template_remove(text, text) TO det_user;

CREATE FUNCTION det_user.template_expand(p_workspace text, p_name text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The config of template p_name of workspace p_workspace (NULL: Uncategorized), secrets
-- included, for `det experiment create --template` to merge under an experiment it submits
-- there: the one read of a template that is not redacted. It takes what the
-- submission takes, Editor on the workspace, so the secrets go only to those who may run
-- experiments with them (and whose experiments' configs hold them).
DECLARE
    v_ws integer := det_internal.template_workspace(
        p_workspace, 'edit', format('use template %s of workspace %s', to_jsonb(p_name),
                                    to_jsonb(coalesce(p_workspace, 'Uncategorized'))));
    v_config jsonb := (SELECT config FROM templates WHERE workspace_id = v_ws AND name = p_name);
BEGIN
    IF v_config IS NULL THEN
        RAISE EXCEPTION 'template % not found in workspace %', to_jsonb(p_name),
            to_jsonb(coalesce(p_workspace, 'Uncategorized')) USING ERRCODE = 'no_data_found';
    END IF;
    RETURN v_config;
END $$;
GRANT EXECUTE ON FUNCTION det_user.template_expand(text, text) TO det_user;

-- =============================================================================================
-- Agents

CREATE FUNCTION det_user.agent_token_create(p_verifier text, p_pool text, p_expires interval)
RETURNS TABLE (role_name text, expires_at timestamptz) LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det agent token create` (ClusterAdmin): a one-time enrollment token for one new agent, in
-- resource pool p_pool (NULL: the agent picks), good for p_expires (more than 0, at most 7
-- days). The token's secret reaches the server only as p_verifier, a client-made SCRAM
-- verifier (det_internal.check_verifier), set as the password of a new login role returned here.
-- Raises invalid_parameter_value (expiry), foreign_key_violation (unknown pool).
#variable_conflict use_column
DECLARE
    v_role text := 'det_enroll_' || left(md5(gen_random_uuid()::text), 16);
    v_expires timestamptz;
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL, 'create an agent enrollment token');
    IF p_verifier IS NULL THEN
        RAISE EXCEPTION 'token: expected a SCRAM-SHA-256 verifier of its secret'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_internal.check_verifier(p_verifier);
    IF p_expires IS NULL OR p_expires <= interval '0' OR p_expires > interval '7 days' THEN
        RAISE EXCEPTION 'expires: expected more than 0 and at most 7 days, got %',
            coalesce(p_expires::text, 'nothing') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_pool IS NOT NULL AND NOT EXISTS (SELECT 1 FROM resource_pools WHERE name = p_pool) THEN
        RAISE EXCEPTION 'pool: no resource pool named "%"', p_pool
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    v_expires := now() + p_expires;
    EXECUTE format('CREATE ROLE %I LOGIN IN ROLE det_enroll PASSWORD %L', v_role, p_verifier);
    INSERT INTO agent_enrollment_tokens (role_name, resource_pool, created_by, expires_at)
    VALUES (v_role, p_pool, det_user.caller(), v_expires);
    PERFORM det_internal.audit('create', 'agent token', v_role,
                      jsonb_build_object('pool', p_pool, 'expires_at', v_expires));
    RETURN QUERY SELECT v_role, v_expires;
END $$;
GRANT EXECUTE ON FUNCTION det_user.agent_token_create(text, text, interval) TO det_user;

CREATE FUNCTION det_enroll.agent_enroll(p_agent text, p_verifier text) RETURNS text LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det agent enroll`, logged in with an enrollment token (det_user.agent_token_create): make agent
-- p_agent's own login det_agent_<id> (a member of det_agent) with password verifier
-- p_verifier, and use the token up (its role may no longer log in). Returns the agent's
-- resource pool (NULL: its choice). Raises invalid_authorization_specification (28000) for a
-- used or expired token, invalid_parameter_value (agent id: 1 to 53 characters, as
-- agents.id, so that the role name fits PostgreSQL's 63), unique_violation (an agent or a
-- role of that name exists).
DECLARE
    t agent_enrollment_tokens;
    v_role text := 'det_agent_' || p_agent;
BEGIN
    SELECT * INTO t FROM agent_enrollment_tokens WHERE role_name = session_user FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'enroll: this login (%) is no enrollment token', session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF t.used_at IS NOT NULL THEN
        RAISE EXCEPTION 'enrollment token: already used at % (by agent %)', t.used_at,
            t.agent_id USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF t.expires_at <= now() THEN
        RAISE EXCEPTION 'enrollment token: expired at %', t.expires_at
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF p_agent IS NULL OR p_agent !~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,52}$' THEN
        RAISE EXCEPTION 'agent id: expected 1 to 53 ASCII letters, digits, ''.'', ''_'' or ''-'', '
            'starting with a letter or digit, got %', coalesce(to_jsonb(p_agent)::text, 'nothing')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_internal.check_verifier(p_verifier);
    IF p_verifier IS NULL THEN
        RAISE EXCEPTION 'password: expected a SCRAM-SHA-256 verifier computed by the client'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM agent_logins WHERE agent_id = p_agent)
       OR EXISTS (SELECT 1 FROM agents WHERE id = p_agent) THEN
        RAISE EXCEPTION 'agent id %: an agent of that id exists (enroll under another id)',
            to_jsonb(p_agent) USING ERRCODE = 'unique_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
        RAISE EXCEPTION 'agent id %: the server has a role % already (enroll under another id)',
            to_jsonb(p_agent), v_role USING ERRCODE = 'unique_violation';
    END IF;
    EXECUTE format('CREATE ROLE %I LOGIN IN ROLE det_agent PASSWORD %L', v_role, p_verifier);
    EXECUTE format('ALTER ROLE %I NOLOGIN', t.role_name);
    UPDATE agent_enrollment_tokens SET used_at = now(), agent_id = p_agent
     WHERE role_name = t.role_name;
    INSERT INTO agent_logins (agent_id, role_name, resource_pool)
    VALUES (p_agent, v_role, t.resource_pool);
    PERFORM det_internal.audit('enroll', 'agent', p_agent, jsonb_build_object('token',
        t.role_name));
    RETURN t.resource_pool;
END $$;
GRANT EXECUTE ON FUNCTION det_enroll.agent_enroll(text, text) TO det_enroll;

CREATE FUNCTION det_user.agent_revoke(p_agent text) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det agent revoke` (ClusterAdmin): end enrolled agent p_agent's access at once. Its login
-- may no longer log in, its sessions are terminated (pg_terminate_backend: at once, before
-- this commits; one that reconnects meanwhile is refused by det_internal.agent_check_self), and the
-- agent is marked LOST, so the next pass ends its runs as a lost agent's (their tokens die,
-- their trials get new runs elsewhere after the fence, reconciler.passes.FENCE_SECONDS).
-- Returns how many sessions were terminated. Again on a revoked agent: terminates what is
-- left. Raises no_data_found (no enrolled login of that id).
DECLARE
    l agent_logins;
    v_ended integer;
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL, format('revoke agent %s',
        to_jsonb(p_agent)));
    SELECT * INTO l FROM agent_logins WHERE agent_id = p_agent FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent %: no enrolled login of that id (agents of the shared det_agent '
            'login stop with their host''s `det cluster down`)', to_jsonb(p_agent)
            USING ERRCODE = 'no_data_found';
    END IF;
    EXECUTE format('ALTER ROLE %I NOLOGIN', l.role_name);
    UPDATE agent_logins SET revoked_at = coalesce(revoked_at, now()) WHERE agent_id = p_agent;
    UPDATE agents SET state = 'LOST' WHERE id = p_agent AND state <> 'LOST';
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'agent');
    SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) INTO v_ended
      FROM pg_stat_activity WHERE usename = l.role_name;
    PERFORM det_internal.audit('revoke', 'agent', p_agent, jsonb_build_object('sessions', v_ended));
    RETURN v_ended;
END $$;
GRANT EXECUTE ON FUNCTION det_user.agent_revoke(text) TO det_user;

CREATE FUNCTION det_agent.register(
    p_id text, p_hostname text, p_pool text, p_runtime text, p_slots jsonb
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent (re)registers its slots: [{slot_id, type, device_uuid, device_name, memory_mb}].
-- Slots it no longer has are removed; a LOST agent becomes ACTIVE again, a stopping one
-- (det_agent.stop_runs) takes work again, a gone one (agents.gone_at) is listed again.
BEGIN
    PERFORM det_internal.agent_check_self(p_id);
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
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'agent');
END $$;
GRANT EXECUTE ON FUNCTION det_agent.register(text, text, text, text, jsonb) TO det_agent;

CREATE FUNCTION det_agent.heartbeat(p_id text) RETURNS agent_state LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Returns the agent's state; LOST means the reconciler gave up on it and it must re-register.
DECLARE
    v_state agent_state;
BEGIN
    PERFORM det_internal.agent_check_self(p_id);
    UPDATE agents SET last_heartbeat = now() WHERE id = p_id AND state <> 'LOST'
    RETURNING state INTO v_state;
    RETURN coalesce(v_state, 'LOST');
END $$;
GRANT EXECUTE ON FUNCTION det_agent.heartbeat(text) TO det_agent;

CREATE FUNCTION det_agent.timeout() RETURNS double precision LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The leader's agent timeout in seconds (reconciler_leader.agent_timeout), NULL before any
-- reconciler has run a pass: an agent kills its tasks before it passes (self-fencing).
SELECT agent_timeout FROM reconciler_leader;
$$;
GRANT EXECUTE ON FUNCTION det_agent.timeout() TO det_agent;

CREATE FUNCTION det_internal.stop_runs_of(p_agent text) RETURNS bigint[] LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A planned stop of agent p_agent's live runs, for det_agent.stop_runs and
-- det_user.agent_drain: each becomes desired STOPPED (a KILLED one stays so) and planned_stop, and
-- its task is woken on its channel to checkpoint and exit as on pause (det_task.should_preempt).
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
    PERFORM pg_notify(det_internal.channel('alloc', x::text), '') FROM unnest(v_ids) x;
    RETURN v_ids;
END $$;

CREATE FUNCTION det_agent.stop_runs(p_agent text) RETURNS bigint[] LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent is going away (SIGTERM: `det cluster down`, a restart) and stops its live runs
-- as a planned stop (det_internal.stop_runs_of), with no reconciler needed (the same `down` stops
-- it). The agent is marked stopping: no new run is placed on it until it registers again. Returns
-- the ids of the runs.
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    UPDATE agents SET stopping = true WHERE id = p_agent;
    RETURN det_internal.stop_runs_of(p_agent);
END $$;
GRANT EXECUTE ON FUNCTION det_agent.stop_runs(text) TO det_agent;

CREATE FUNCTION det_agent.leave(p_agent text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent is being ended by another resource manager under its runs (an agent in a Slurm
-- job: scancel, time limit, node drain): marked stopping, so nothing new is placed on it, but
-- its runs are not a planned stop: they end as the failures they are (max_restarts).
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    UPDATE agents SET stopping = true WHERE id = p_agent;
END $$;
GRANT EXECUTE ON FUNCTION det_agent.leave(text) TO det_agent;

CREATE FUNCTION det_agent.retire(p_agent text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Agent p_agent ends for good, its work done (a one-shot agent whose run ended and was
-- reported, `det agent run --one-shot`): LOST and gone (agents.gone_at), so nothing is placed
-- on it and agent lists hide it; a run it still held would end as on a lost agent.
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    UPDATE agents SET state = 'LOST', stopping = true, gone_at = coalesce(gone_at, now())
     WHERE id = p_agent;
END $$;
GRANT EXECUTE ON FUNCTION det_agent.retire(text) TO det_agent;

CREATE FUNCTION det_agent.claim_each(p_agent text, p_allocations bigint[])
RETURNS TABLE (allocation_id bigint, token text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The agent is about to launch allocations assigned to it: mint each one's task token
-- (returned once, stored hashed) and move it to STARTING, in one statement (an agent
-- starts its tasks in batches). Allocations no longer this agent's to start (ended,
-- or desired state is not RUNNING) are left out of the result.
#variable_conflict use_column
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    RETURN QUERY
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
END $$;
GRANT EXECUTE ON FUNCTION det_agent.claim_each(text, bigint[]) TO det_agent;

CREATE FUNCTION det_agent.claim(p_agent text, p_allocation bigint) RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det_agent.claim_each for one allocation: its token, or NULL when it is not to start.
SELECT token FROM det_agent.claim_each(p_agent, ARRAY[p_allocation]);
$$;
GRANT EXECUTE ON FUNCTION det_agent.claim(text, bigint) TO det_agent;

CREATE FUNCTION det_agent.report_each(
    p_agent text, p_allocations bigint[], p_state allocation_state,
    p_exit_codes integer[] DEFAULT NULL, p_reasons text[] DEFAULT NULL
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The agent reports what it observed of allocations it runs, all in one state, in one
-- statement; p_exit_codes and p_reasons go with p_allocations element by element.
-- TERMINATED releases the slots and records the exit code and reason; the reconciler settles
-- the trial afterwards. RUNNING of a gang spanning agents leaves it STARTING until every
-- other agent started its share (det_agent.gang_started; det_agent.report_node moves it on then).
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    UPDATE allocations a
       -- a gang's other agents are looked for only where it has any (one index probe)
       SET state = CASE WHEN p_state = 'RUNNING'
                             AND EXISTS (SELECT 1 FROM allocation_slots h
                                          WHERE h.allocation_id = a.id
                                            AND h.agent_id <> p_agent)
                             AND NOT det_agent.gang_started(a.id)
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
        PERFORM pg_notify(det_internal.channel('reconciler', ''), 'allocation');
    END IF;
END $$;
GRANT EXECUTE ON FUNCTION det_agent.report_each(text, bigint[], allocation_state, integer[], text[])
    TO det_agent;

CREATE FUNCTION det_agent.report(
    p_agent text, p_allocation bigint, p_state allocation_state,
    p_exit_code integer DEFAULT NULL, p_reason text DEFAULT NULL
) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det_agent.report_each for one allocation.
SELECT det_agent.report_each(p_agent, ARRAY[p_allocation], p_state, ARRAY[p_exit_code],
                             ARRAY[p_reason]);
$$;
GRANT EXECUTE ON FUNCTION det_agent.report(text, bigint, allocation_state, integer, text)
    TO det_agent;

CREATE FUNCTION det_agent.gang_agents(p_allocation bigint) RETURNS text[] LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The agents holding slots of an allocation, in node order: the chief's first
-- (allocations.agent_id), then the others by id. Node ranks index this array from 0.
SELECT array_agg(h.agent_id ORDER BY h.agent_id <> a.agent_id, h.agent_id)
  FROM (SELECT DISTINCT agent_id FROM allocation_slots WHERE allocation_id = p_allocation) h,
       allocations a
 WHERE a.id = p_allocation;
$$;
GRANT EXECUTE ON FUNCTION det_agent.gang_agents(bigint) TO det_agent;

CREATE FUNCTION det_agent.gang_started(p_allocation bigint) RETURNS boolean LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Whether every agent of an allocation but the chief's has started its share of the workers
-- (true on one agent). The allocation is RUNNING only once this and the chief's agent say so.
SELECT NOT EXISTS (
    SELECT 1 FROM unnest(det_agent.gang_agents(p_allocation)) WITH ORDINALITY AS g (agent_id, i)
     WHERE g.i > 1
       AND NOT EXISTS (SELECT 1 FROM allocation_nodes n
                        WHERE n.allocation_id = p_allocation AND n.agent_id = g.agent_id
                          AND n.state >= 'RUNNING'));
$$;
GRANT EXECUTE ON FUNCTION det_agent.gang_started(bigint) TO det_agent;

CREATE FUNCTION det_agent.set_rendezvous(
    p_agent text, p_allocation bigint, p_endpoint text
) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The chief's agent records where the workers meet (host:port), after its claim and before it
-- starts its workers.
SELECT det_internal.agent_check_self(p_agent);
UPDATE allocations SET rendezvous = p_endpoint
 WHERE id = p_allocation AND agent_id = p_agent AND state <> 'TERMINATED';
$$;
GRANT EXECUTE ON FUNCTION det_agent.set_rendezvous(text, bigint, text) TO det_agent;

CREATE FUNCTION det_agent.claim_node(p_agent text, p_allocation bigint) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Another agent of a gang allocation is about to start its share of the workers: mint its
-- token (returned once, stored hashed) and return {token, node_rank, nodes, rendezvous}.
-- NULL while the chief's agent has not recorded the rendezvous, and when the allocation is no
-- longer to run, this agent holds none of its slots, or its share already ended.
DECLARE
    v_token text := translate(encode(gen_random_uuid()::text::bytea
                                     || gen_random_uuid()::text::bytea, 'base64'),
                              E'+/=\n', '-_');
    a allocations;
    v_nodes text[];
    v_rank integer;
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    SELECT * INTO a FROM allocations
     WHERE id = p_allocation AND agent_id <> p_agent AND rendezvous IS NOT NULL
       AND state IN ('STARTING', 'RUNNING') AND desired_state = 'RUNNING'
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_nodes := det_agent.gang_agents(p_allocation);
    v_rank := array_position(v_nodes, p_agent) - 1;
    IF v_rank IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO allocation_nodes AS n (allocation_id, agent_id, node_rank, token_hash)
    VALUES (p_allocation, p_agent, v_rank, sha256(convert_to(v_token, 'UTF8')))
    ON CONFLICT (allocation_id, agent_id) DO UPDATE SET token_hash = EXCLUDED.token_hash
     WHERE n.state <> 'TERMINATED';
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN jsonb_build_object('token', v_token, 'node_rank', v_rank, 'nodes', v_nodes,
                              'rendezvous', a.rendezvous);
END $$;
GRANT EXECUTE ON FUNCTION det_agent.claim_node(text, bigint) TO det_agent;

CREATE FUNCTION det_agent.report_node(
    p_agent text, p_allocation bigint, p_state allocation_state,
    p_exit_code integer DEFAULT NULL, p_reason text DEFAULT NULL
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- What an agent other than the chief's observed of its share of an allocation. A share that
-- ends other than with exit code 0 ends the whole allocation, with its code and a reason
-- naming the agent (the chief's agent then stops its workers; the trial restarts from its
-- checkpoint under max_restarts). A share that ends with 0 leaves the run to the chief.
DECLARE
    v_rank integer;
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    UPDATE allocation_nodes
       SET state = greatest(state, p_state),
           exit_code = CASE WHEN p_state = 'TERMINATED' THEN p_exit_code ELSE exit_code END,
           exit_reason = CASE WHEN p_state = 'TERMINATED' THEN p_reason ELSE exit_reason END
     WHERE allocation_id = p_allocation AND agent_id = p_agent AND state <> 'TERMINATED'
    RETURNING node_rank INTO v_rank;
    IF FOUND AND p_state = 'RUNNING' THEN
        UPDATE allocations SET state = 'RUNNING'
         WHERE id = p_allocation AND state < 'RUNNING' AND running_at IS NOT NULL
           AND det_agent.gang_started(p_allocation);
    END IF;
    -- A share that failed before its claim (its launch failed) has no row, and ends the run.
    v_rank := coalesce(v_rank, array_position(det_agent.gang_agents(p_allocation), p_agent) - 1);
    IF v_rank IS NULL OR p_state <> 'TERMINATED' OR p_exit_code IS NOT DISTINCT FROM 0 THEN
        RETURN;
    END IF;
    UPDATE allocations
       SET state = 'TERMINATED', exit_code = p_exit_code, ended_at = now(),
           exit_reason = format('workers of node %s (agent %s) ended: %s', v_rank, p_agent,
                                coalesce(p_reason, 'exit code ' || p_exit_code))
     WHERE id = p_allocation AND state <> 'TERMINATED';
    IF FOUND THEN
        UPDATE allocation_slots SET released = true
         WHERE allocation_id = p_allocation AND NOT released;
        PERFORM pg_notify(det_internal.channel('reconciler', ''), 'allocation');
    END IF;
END $$;
GRANT EXECUTE ON FUNCTION det_agent.report_node(text, bigint, allocation_state, integer, text)
    TO det_agent;

CREATE FUNCTION det_agent.append_logs(
    p_allocation bigint, p_streams text[], p_lines text[], p_ranks integer[] DEFAULT NULL,
    p_writer uuid DEFAULT NULL, p_seqs bigint[] DEFAULT NULL
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Append a batch of task output lines (one call per batch, never per line), each with the
-- rank that wrote it (p_ranks, NULL where untagged). An untagged stdout / stderr line of a
-- trial run on at most one slot is its one worker's, rank 0 (only a trial on more slots runs
-- under det.launch.torch_distributed, which tags each worker's lines).
-- p_writer and p_seqs (each line's number, ascending) name the lines (see log_batches): a line
-- numbered at or below its writer's last_seq was written before and is skipped; a NULL
-- p_writer asks for no such check. invalid_parameter_value when p_seqs does not match; an
-- enrolled agent's login writes only for allocations it runs a part of
-- (det_internal.agent_check_allocation). Lines of an allocation that no longer exists are dropped
-- without an error: a shipper stops on errors, and its other allocations' lines would stop with it.
DECLARE
    v_last bigint := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM allocations WHERE id = p_allocation) THEN
        RETURN;  -- gone (its experiment deleted): nothing to keep, and no error to stop on
    END IF;
    PERFORM det_internal.agent_check_allocation(p_allocation);
    IF p_writer IS NOT NULL THEN
        IF cardinality(p_seqs) IS DISTINCT FROM cardinality(p_lines)
           OR EXISTS (SELECT FROM unnest(p_seqs) WITH ORDINALITY AS s (n, i)
                       WHERE n IS NULL OR n < 1 OR n <= p_seqs[i - 1]) THEN
            RAISE EXCEPTION 'log batch: p_seqs must number each line, ascending from 1 or more'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT b.last_seq INTO v_last FROM log_batches b
         WHERE b.writer = p_writer AND b.allocation_id = p_allocation FOR UPDATE;
        v_last := coalesce(v_last, 0);
        IF cardinality(p_seqs) > 0 AND p_seqs[cardinality(p_seqs)] > v_last THEN
            INSERT INTO log_batches AS b (writer, allocation_id, last_seq)
            VALUES (p_writer, p_allocation, p_seqs[cardinality(p_seqs)])
            ON CONFLICT (allocation_id, writer) DO UPDATE SET last_seq = excluded.last_seq;
        END IF;
    END IF;
    INSERT INTO task_logs (allocation_id, trial_id, stream, line, rank)
    SELECT p_allocation, a.trial_id, u.s, u.l,
           coalesce(u.r, CASE WHEN a.trial_id IS NOT NULL AND u.s <> 'det'
                               AND a.slots_needed <= 1 THEN 0 END)
    FROM allocations a,
         unnest(p_streams, p_lines, coalesce(p_ranks, '{}'::integer[]),
                coalesce(p_seqs, '{}'::bigint[])) WITH ORDINALITY AS u (s, l, r, n, i)
    WHERE a.id = p_allocation AND (p_writer IS NULL OR u.n > v_last)
    ORDER BY u.i;
END $$;
GRANT EXECUTE ON FUNCTION det_agent.append_logs(bigint, text[], text[], integer[], uuid, bigint[])
    TO det_agent;

CREATE FUNCTION det_user.log_level(p_stream text, p_line text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
-- The level of a log line, read from its text, for the log viewer's filter: 'error',
-- 'warning', 'info' or 'debug'. Python logging's level names at the start (Determined's
-- LOG_FORMAT 'INFO: [pid] name: message', logging's default 'WARNING:root:message'), a
-- traceback's first and last lines and '...Error: ' are errors; Python's warnings
-- ('file.py:3: UserWarning: ...') and det's 'warning:' notes are warnings; anything else info.
SELECT CASE
    WHEN p_line ~ '^\s*(CRITICAL|FATAL|ERROR)\M' OR p_line ~ '^Traceback \(most recent call last\)'
         OR p_line ~ '^[A-Za-z_.]*(Error|Exception)(: |$)' THEN 'error'
    WHEN p_line ~ '^\s*(WARNING|WARN)\M' OR p_line ~ '[A-Za-z]Warning: '
         OR p_line ~ '^det\.[a-z_.]+: warning:' THEN 'warning'
    WHEN p_line ~ '^\s*DEBUG\M' THEN 'debug'
    ELSE 'info'
END
$$;
GRANT EXECUTE ON FUNCTION det_user.log_level(text, text) TO det_user;

-- =============================================================================================
-- The task's API (the harness). Every call names its allocation by token.

CREATE FUNCTION det_internal.auth(p_token text) RETURNS allocations
LANGUAGE plpgsql STABLE AS $$
-- The live allocation holding this token (the chief's, or one of allocation_nodes' for the
-- workers on the other agents of a gang), or an error (SQLSTATE 28000).
DECLARE
    v allocations;
    v_hash bytea := sha256(convert_to(p_token, 'UTF8'));
BEGIN
    SELECT * INTO v FROM allocations WHERE token_hash = v_hash AND state <> 'TERMINATED';
    IF NOT FOUND THEN
        SELECT a.* INTO v FROM allocation_nodes n JOIN allocations a ON a.id = n.allocation_id
         WHERE n.token_hash = v_hash AND a.state <> 'TERMINATED';
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'invalid or expired allocation token'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    RETURN v;
END $$;

CREATE FUNCTION det_internal.json_problem(p_value jsonb, p_max_bytes integer) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
-- What is wrong with a JSON object a task sends to store (metric values, metadata), or NULL:
-- not an object, larger than p_max_bytes (jsonb's size, of the value as sent: a stored value
-- may be compressed), or a value nested deeper than 32 levels (a top-level value is level 1;
-- deeper documents break readers that recurse, such as Python's json). A jsonb that deep
-- takes 8 bytes or more per level, so smaller ones skip the walk (most metrics rows are
-- about 100 bytes). Plain SQL, so that a query over many rows inlines it.
    SELECT CASE
        WHEN jsonb_typeof(p_value) IS DISTINCT FROM 'object'
            THEN 'must be a JSON object, not ' || coalesce(jsonb_typeof(p_value), 'null')
        WHEN pg_column_size(p_value) > p_max_bytes
            THEN format('is %s bytes, more than the %s allowed', pg_column_size(p_value),
                        p_max_bytes)
        WHEN pg_column_size(p_value) >= 256 AND jsonb_path_exists(p_value, 'strict $.**{33}')
            THEN 'nests deeper than 32 levels' END;
$$;

CREATE FUNCTION det_user.json_shown(p_value jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
-- p_value as readers show it: a value nested deeper than 32 levels (stored before the task's
-- functions refused those, migration 0032) becomes a string saying so, since clients that
-- parse JSON recursively (Python's json, hence det trial describe) fail on deep documents.
    SELECT CASE WHEN jsonb_path_exists(p_value, 'strict $.**{33}')
                THEN to_jsonb('(not shown: nested deeper than 32 levels)'::text)
                ELSE p_value END;
$$;
-- readers show stored JSON through it
GRANT EXECUTE ON FUNCTION det_user.json_shown(jsonb) TO det_user;

CREATE FUNCTION det_internal.trial_best_validation(p_trial integer) RETURNS double precision
LANGUAGE sql STABLE AS $$
-- The best searcher metric (searcher.smaller_is_better decides "best") of the trial's
-- surviving validation rows; NULL without one. det_task.report_metrics_batch keeps
-- trials.best_validation up to date row by row; this recomputes it when rows are superseded.
    SELECT CASE WHEN e.smaller_is_better
                THEN min((m."values" ->> e.searcher_metric)::double precision)
                ELSE max((m."values" ->> e.searcher_metric)::double precision)
                END
      FROM trials t
      JOIN experiments e ON e.id = t.experiment_id
      JOIN metrics m ON m.trial_id = t.id AND m."group" = 'validation'
                    AND m.superseded_by IS NULL
     WHERE t.id = p_trial
       AND jsonb_typeof(m."values" -> e.searcher_metric) = 'number'
     GROUP BY e.id;
$$;

CREATE FUNCTION det_internal.metrics_supersede(p_allocation bigint) RETURNS integer
LANGUAGE plpgsql AS $$
-- Run p_allocation resumes its trial from the trial's restart point (trials.steps_completed,
-- the step of its latest checkpoint): the rows earlier runs reported after that step are
-- superseded by it (metrics.superseded_by), as the run will report those steps again; rows
-- already superseded keep the run that superseded them first. The trial's best validation is
-- then recomputed from the surviving rows. Once per run start, not per row: the rows are
-- found per group on the (trial, group, steps) index, the groups by a loose index scan.
-- Returns the rows superseded (0 for a run that is not a trial's, or a first run).
DECLARE
    v_trial integer;
    v_steps bigint;
    v_rows integer;
    v_validation boolean;
BEGIN
    SELECT t.id, t.steps_completed INTO v_trial, v_steps
      FROM allocations a JOIN trials t ON t.id = a.trial_id WHERE a.id = p_allocation;
    IF v_trial IS NULL THEN
        RETURN 0;
    END IF;
    WITH RECURSIVE groups (g) AS (
        (SELECT "group" FROM metrics WHERE trial_id = v_trial ORDER BY "group" LIMIT 1)
        UNION ALL
        SELECT (SELECT m."group" FROM metrics m
                 WHERE m.trial_id = v_trial AND m."group" > groups.g
                 ORDER BY m."group" LIMIT 1)
          FROM groups WHERE groups.g IS NOT NULL
    ), marked AS (
        UPDATE metrics m SET superseded_by = p_allocation
          FROM groups
         WHERE m.trial_id = v_trial AND m."group" = groups.g AND m.steps_completed > v_steps
           AND m.superseded_by IS NULL AND m.allocation_id <> p_allocation
        RETURNING m."group"
    )
    SELECT count(*), coalesce(bool_or("group" = 'validation'), false)
      INTO v_rows, v_validation FROM marked;
    IF v_validation THEN
        UPDATE trials SET best_validation = det_internal.trial_best_validation(v_trial)
         WHERE id = v_trial;
    END IF;
    RETURN v_rows;
END $$;

CREATE FUNCTION det_task.info(p_token text) RETURNS jsonb LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Identity and starting point of the task; also marks the allocation RUNNING and supersedes
-- what earlier runs of its trial reported after that starting point
-- (det_internal.metrics_supersede): the run starts from its trial's latest checkpoint, which this
-- returns.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    UPDATE allocations SET state = 'RUNNING' WHERE id = a.id AND state < 'RUNNING';
    PERFORM det_internal.metrics_supersede(a.id);
    RETURN (
        SELECT jsonb_build_object(
            'allocation_id', a.id, 'trial_id', t.id, 'experiment_id', e.id,
            'config', e.config, 'hparams', t.hparams, 'trial_seed', t.seed,
            'latest_checkpoint', t.latest_checkpoint, 'steps_completed', t.steps_completed,
            'slots', a.slots_needed)
        FROM trials t JOIN experiments e ON e.id = t.experiment_id
        WHERE t.id = a.trial_id);
END $$;
GRANT EXECUTE ON FUNCTION det_task.info(text) TO det_task;

CREATE FUNCTION det_internal.append_metrics(
    a allocations, p_groups text[], p_steps bigint[], p_values jsonb[]
) RETURNS integer LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
-- Append metrics rows of run a in order: row i is (p_groups[i], p_steps[i], p_values[i]);
-- returns the rows written. Validation rows update the trial's best searcher metric
-- (searcher.smaller_is_better decides "best"). The one home of the metrics-append rule, for a
-- task's reports (det_task.report_metrics_batch) and an unmanaged script's
-- (det_user.unmanaged_report_metrics). Each row is checked first, and the whole batch refused
-- (invalid_parameter_value naming the row's group and step) for: a group that is empty,
-- longer than 255 characters or holds a control character (it is shown on terminals); a step
-- outside 0 to 2^53 - 1 (what a JSON reader such as the WebUI holds exactly; Core API code
-- counts steps in its own unit, so the searcher's length gives no tighter bound); values that
-- are not a JSON object, are over 64 KiB or nest deeper than 32 levels (det_internal.json_problem:
-- any JSON inside, as Determined allows; the harness writes NaN and infinities as strings); a
-- validation's searcher metric that is a number a double cannot hold.
DECLARE
    v_cfg jsonb;
    v_metric text;
    v_best double precision;
    v_rows integer;
    v_bad record;
BEGIN
    IF cardinality(p_groups) IS DISTINCT FROM cardinality(p_steps)
       OR cardinality(p_groups) IS DISTINCT FROM cardinality(p_values) THEN
        RAISE EXCEPTION 'metrics batch: groups, steps and values must have the same length'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT e.config INTO v_cfg FROM trials t JOIN experiments e ON e.id = t.experiment_id
     WHERE t.id = a.trial_id;
    v_metric := v_cfg #>> '{searcher,metric}';
    SELECT u.g, u.s, CASE
               WHEN u.g IS NULL OR u.g = '' THEN 'metrics group must be a non-empty name'
               WHEN length(u.g) > 255 THEN 'group: longer than 255 characters'
               WHEN u.g ~ '[[:cntrl:]]' THEN 'group: holds a control character'
               WHEN u.s IS NULL OR u.s NOT BETWEEN 0 AND 9007199254740991
                   THEN format('steps_completed: expected 0 to 2^53 - 1, not %s', u.s)
               WHEN det_internal.json_problem(u.v, 65536) IS NOT NULL
                   THEN 'values ' || det_internal.json_problem(u.v, 65536)
               ELSE format('values: searcher metric "%s" is %s, beyond a double', v_metric,
                           u.v -> v_metric) END AS problem
      INTO v_bad
      FROM unnest(p_groups, p_steps, p_values) WITH ORDINALITY AS u (g, s, v, i)
     WHERE u.g IS NULL OR u.g = '' OR length(u.g) > 255 OR u.g ~ '[[:cntrl:]]'
        OR u.s IS NULL OR u.s NOT BETWEEN 0 AND 9007199254740991
        OR det_internal.json_problem(u.v, 65536) IS NOT NULL
        OR (u.g = 'validation' AND jsonb_typeof(u.v -> v_metric) = 'number'
            AND abs((u.v ->> v_metric)::numeric) > 1.7976931348623157e308)
     ORDER BY u.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '%', CASE WHEN v_bad.g IS NULL OR v_bad.g = '' THEN v_bad.problem
            ELSE format('metrics %s at batch %s: %s', to_jsonb(left(v_bad.g, 64)), v_bad.s,
                        v_bad.problem) END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO metrics (trial_id, allocation_id, "group", steps_completed, "values")
    SELECT a.trial_id, a.id, u.g, u.s, u.v
      FROM unnest(p_groups, p_steps, p_values) WITH ORDINALITY AS u (g, s, v, i)
     ORDER BY u.i;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    SELECT CASE WHEN (v_cfg #>> '{searcher,smaller_is_better}')::boolean
                THEN min((u.v ->> v_metric)::double precision)
                ELSE max((u.v ->> v_metric)::double precision) END
      INTO v_best
      FROM unnest(p_groups, p_values) AS u (g, v)
     WHERE u.g = 'validation' AND jsonb_typeof(u.v -> v_metric) = 'number';
    IF v_best IS NOT NULL THEN
        UPDATE trials SET best_validation = CASE
            WHEN best_validation IS NULL THEN v_best
            WHEN (v_cfg #>> '{searcher,smaller_is_better}')::boolean
                THEN least(best_validation, v_best)
            ELSE greatest(best_validation, v_best) END
         WHERE id = a.trial_id;
    END IF;
    RETURN v_rows;
END $$;

CREATE FUNCTION det_task.report_metrics_batch(
    p_token text, p_writer uuid, p_seq bigint,
    p_groups text[], p_steps bigint[], p_values jsonb[]
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A task appends a batch of metrics rows (det_internal.append_metrics: the rows and what is
-- refused). p_writer and p_seq name the batch (see metric_batches): a batch already recorded is
-- skipped; a NULL p_writer asks for no such check (det_task.report_metrics). Returns the rows
-- written (0 for a skipped batch).
DECLARE
    a allocations := det_internal.auth(p_token);
    v_rows integer;
BEGIN
    IF p_writer IS NOT NULL THEN
        IF p_seq IS NULL OR p_seq < 1 THEN
            RAISE EXCEPTION 'metrics batch number must be 1 or more, not %', p_seq
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        INSERT INTO metric_batches AS b (writer, allocation_id, last_seq)
        VALUES (p_writer, a.id, p_seq)
        ON CONFLICT (writer) DO UPDATE SET last_seq = excluded.last_seq
         WHERE b.last_seq < excluded.last_seq AND b.allocation_id = excluded.allocation_id;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows = 0 THEN
            RETURN 0;
        END IF;
    END IF;
    RETURN det_internal.append_metrics(a, p_groups, p_steps, p_values);
END $$;
GRANT EXECUTE ON FUNCTION det_task.report_metrics_batch(text, uuid, bigint, text[],
    bigint[], jsonb[]) TO det_task;

CREATE FUNCTION det_task.report_metrics(
    p_token text, p_group text, p_steps_completed bigint, p_metrics jsonb
) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Append one metrics row (no re-send check: the harness uses det_task.report_metrics_batch).
    SELECT FROM det_task.report_metrics_batch(p_token, NULL, NULL, ARRAY[p_group],
                                         ARRAY[p_steps_completed], ARRAY[p_metrics]);
$$;
GRANT EXECUTE ON FUNCTION det_task.report_metrics(text, text, bigint, jsonb) TO det_task;

CREATE FUNCTION det_task.report_checkpoint(
    p_token text, p_uuid uuid, p_steps_completed bigint, p_resources jsonb, p_metadata jsonb
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Record a checkpoint the task has finished writing; it becomes the trial's restart point.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    INSERT INTO checkpoints (uuid, trial_id, allocation_id, steps_completed, storage, resources,
                             metadata)
    SELECT p_uuid, a.trial_id, a.id, p_steps_completed, e.config -> 'checkpoint_storage',
           coalesce(p_resources, '{}'), coalesce(p_metadata, '{}')
    FROM trials t JOIN experiments e ON e.id = t.experiment_id WHERE t.id = a.trial_id;
    UPDATE trials SET latest_checkpoint = p_uuid, steps_completed = p_steps_completed
     WHERE id = a.trial_id AND steps_completed <= p_steps_completed;
END $$;
GRANT EXECUTE ON FUNCTION det_task.report_checkpoint(text, uuid, bigint, jsonb, jsonb) TO det_task;

-- Unmanaged runs (Determined 0.38's determined.experimental.core_v2): a script run
-- outside det, as a det user, reports into an experiment with one trial that det never
-- schedules. Each start of the script is one run of the trial, an allocation row born
-- TERMINATED and settled, which no pass places, settles or ends.
CREATE FUNCTION det_internal.unmanaged_run(p_allocation bigint) RETURNS allocations
LANGUAGE plpgsql STABLE SET search_path = public, pg_temp AS $$
-- The unmanaged run p_allocation, for its script to report into: refused unless the run is
-- its trial's latest (a later start of the script took over: object_not_in_prerequisite_state),
-- the trial is still live (ended: the same), and the caller is the experiment's owner and
-- still an Editor of its workspace (insufficient_privilege; a caller who cannot view it, or a
-- run of a managed trial: no_data_found). Upstream lets the script's session write into its
-- own trial only; a Viewer of the workspace never can.
DECLARE
    a allocations;
    v_owner text;
    v_ws integer;
    v_state trial_state;
    v_latest integer;
BEGIN
    SELECT * INTO a FROM allocations WHERE id = p_allocation;
    SELECT e.owner, j.workspace_id, t.state, t.runs INTO v_owner, v_ws, v_state, v_latest
      FROM trials t JOIN experiments e ON e.id = t.experiment_id JOIN jobs j ON j.id = e.job_id
     WHERE t.id = a.trial_id AND e.unmanaged;
    IF NOT FOUND OR NOT (det_user.is_owner_session() OR det_user.permitted(det_user.caller(),
        'view', v_ws)) THEN
        RAISE EXCEPTION 'unmanaged run % not found', p_allocation USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.require('edit', v_ws, format('report into trial %s', a.trial_id));
    IF v_owner <> det_user.caller() AND NOT det_user.is_owner_session() THEN
        RAISE EXCEPTION 'permission denied: trial % is %''s unmanaged trial; only its owner '
                        'reports into it', a.trial_id, to_jsonb(v_owner)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF a.run <> v_latest THEN
        RAISE EXCEPTION 'unmanaged run % of trial % was replaced by run % (the script was '
                        'started again)', a.run, a.trial_id, v_latest
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF v_state <> 'ACTIVE' THEN
        RAISE EXCEPTION 'trial % is %: it takes no more reports', a.trial_id, v_state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN a;
END $$;

CREATE FUNCTION det_user.unmanaged_start(
    p_config jsonb, p_original_config text, p_workspace text, p_project text,
    p_external_experiment text, p_external_trial text, p_hparams jsonb
) RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- core_v2.init of a script outside det (Determined 0.38's unmanaged mode): a new run of a
-- trial of an unmanaged experiment owned by the caller, in one transaction. The experiment is
-- the caller's with external id p_external_experiment if there is one, else a new one
-- submitted as det_user.create_experiment submits (p_config: the expanded config; same checks,
-- placement and permission); the trial is its trial with external id p_external_trial if
-- any, else a new one with hyperparameters p_hparams. A resumed experiment or trial that had
-- ended is ACTIVE again. The run is an allocation born TERMINATED and settled (no pass places
-- or ends it; det_user.unmanaged_end stamps its end); it supersedes what earlier runs reported
-- after the trial's latest checkpoint (det_internal.metrics_supersede), as a managed run's start
-- does. Returns det_task.info's object. Refused: p_external_trial without
-- p_external_experiment (invalid_parameter_value, as upstream requires both); a paused or
-- stopping experiment (object_not_in_prerequisite_state).
DECLARE
    v_user text := det_user.caller();
    e experiments;
    t trials;
    v_exp integer;
    v_alloc bigint;
BEGIN
    IF p_external_trial IS NOT NULL AND p_external_experiment IS NULL THEN
        RAISE EXCEPTION 'external_trial_id: needs external_experiment_id as well'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_hparams IS NOT NULL AND jsonb_typeof(p_hparams) <> 'object' THEN
        RAISE EXCEPTION 'hparams: expected a JSON object, got %', jsonb_typeof(p_hparams)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_external_experiment IS NOT NULL THEN
        -- Two first starts with one external id make one experiment.
        PERFORM pg_advisory_xact_lock(hashtext('det_user.unmanaged_start'),
                                      hashtext(v_user || '/' || p_external_experiment));
        SELECT * INTO e FROM experiments
         WHERE owner = v_user AND external_id = p_external_experiment FOR NO KEY UPDATE;
    END IF;
    IF e.id IS NULL THEN
        v_exp := det_user.create_experiment(p_config, p_original_config, NULL, p_workspace,
                                       p_project);
        UPDATE experiments SET unmanaged = true, external_id = p_external_experiment
         WHERE id = v_exp RETURNING * INTO e;
    ELSIF e.state IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        PERFORM det_internal.require('edit', (SELECT workspace_id FROM jobs WHERE id = e.job_id),
                            format('resume experiment %s', e.id));
        UPDATE experiments SET state = 'ACTIVE', end_time = NULL WHERE id = e.id;
    ELSIF e.state <> 'ACTIVE' THEN
        RAISE EXCEPTION 'experiment % is %: activate it to resume it', e.id, e.state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    ELSE
        PERFORM det_internal.require('edit', (SELECT workspace_id FROM jobs WHERE id = e.job_id),
                            format('resume experiment %s', e.id));
    END IF;
    IF p_external_trial IS NOT NULL THEN
        SELECT * INTO t FROM trials
         WHERE experiment_id = e.id AND external_id = p_external_trial FOR NO KEY UPDATE;
    END IF;
    IF t.id IS NULL THEN
        INSERT INTO trials (experiment_id, request_id, hparams, seed, external_id)
        VALUES (e.id, gen_random_uuid(), coalesce(p_hparams, '{}'),
                coalesce(e.experiment_seed, 0),
                p_external_trial)
        RETURNING * INTO t;
    END IF;
    UPDATE trials SET runs = runs + 1, state = 'ACTIVE', end_time = NULL, exit_reason = NULL
     WHERE id = t.id RETURNING * INTO t;
    INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec, state,
                             settled, started_at, running_at, ended_at, preemptible)
    SELECT e.job_id, t.id, t.runs, j.resource_pool, 0,
           jsonb_build_object('kind', 'unmanaged', 'experiment_id', e.id, 'trial_id', t.id),
           'TERMINATED', true, now(), now(), now(), false
      FROM jobs j WHERE j.id = e.job_id
    RETURNING id INTO v_alloc;
    PERFORM det_internal.metrics_supersede(v_alloc);
    RETURN jsonb_build_object(
        'allocation_id', v_alloc, 'trial_id', t.id, 'experiment_id', e.id,
        'config', (SELECT config FROM experiments WHERE id = e.id), 'hparams', t.hparams,
        'trial_seed', t.seed, 'latest_checkpoint', t.latest_checkpoint,
        'steps_completed', t.steps_completed, 'slots', 1);
END $$;
GRANT EXECUTE ON FUNCTION det_user.unmanaged_start(jsonb, text, text, text, text, text, jsonb)
    TO det_user;

CREATE FUNCTION det_user.unmanaged_report_metrics(
    p_allocation bigint, p_group text, p_steps_completed bigint, p_metrics jsonb
) RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An unmanaged script's metrics report (det_internal.unmanaged_run: who may;
-- det_internal.append_metrics: what is refused).
    SELECT FROM det_internal.append_metrics(det_internal.unmanaged_run(p_allocation),
        ARRAY[p_group],
                                   ARRAY[p_steps_completed], ARRAY[p_metrics]);
$$;
GRANT EXECUTE ON FUNCTION det_user.unmanaged_report_metrics(bigint, text, bigint,
    jsonb) TO det_user;

CREATE FUNCTION det_user.unmanaged_report_checkpoint(
    p_allocation bigint, p_uuid uuid, p_steps_completed bigint, p_resources jsonb,
    p_metadata jsonb
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An unmanaged script stored a checkpoint (det_internal.unmanaged_run: who may); it becomes the
-- trial's restart point, as det_task.report_checkpoint's. Its files lie where the script wrote
-- them, which det's GC tasks may not reach, so no GC policy applies to it (gc_pending false):
-- upstream collects no unmanaged checkpoint either.
DECLARE
    a allocations := det_internal.unmanaged_run(p_allocation);
BEGIN
    INSERT INTO checkpoints (uuid, trial_id, allocation_id, steps_completed, storage, resources,
                             metadata, gc_pending)
    SELECT p_uuid, a.trial_id, a.id, p_steps_completed, e.config -> 'checkpoint_storage',
           coalesce(p_resources, '{}'), coalesce(p_metadata, '{}'), false
    FROM trials t JOIN experiments e ON e.id = t.experiment_id WHERE t.id = a.trial_id;
    UPDATE trials SET latest_checkpoint = p_uuid, steps_completed = p_steps_completed
     WHERE id = a.trial_id AND steps_completed <= p_steps_completed;
END $$;
GRANT EXECUTE ON FUNCTION det_user.unmanaged_report_checkpoint(bigint, uuid, bigint, jsonb, jsonb)
    TO det_user;

CREATE FUNCTION det_user.unmanaged_progress(p_allocation bigint, p_progress double precision)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- core_v2.train.report_progress: the fraction (0 to 1) of the experiment's work done, shown as
-- its progress. Refused outside [0, 1] (invalid_parameter_value).
DECLARE
    a allocations := det_internal.unmanaged_run(p_allocation);
BEGIN
    IF p_progress IS NULL OR NOT p_progress BETWEEN 0 AND 1 THEN
        RAISE EXCEPTION 'progress: expected 0 to 1, not %', p_progress
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE experiments SET progress = p_progress
     WHERE id = (SELECT experiment_id FROM trials WHERE id = a.trial_id);
END $$;
GRANT EXECUTE ON FUNCTION det_user.unmanaged_progress(bigint, double precision) TO det_user;

CREATE FUNCTION det_user.unmanaged_end(p_allocation bigint, p_error text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- core_v2.close: the run ends, and with it its trial, COMPLETED, or ERROR when p_error (the
-- script's exception, kept as the run's exit reason) is given, as upstream's unmanaged
-- heartbeat sets the trial's state at exit. The experiment ends when it has no live trial
-- left: ERROR if one of its trials errored, else COMPLETED.
DECLARE
    a allocations := det_internal.unmanaged_run(p_allocation);
    v_exp integer;
BEGIN
    UPDATE allocations
       SET ended_at = now(), exit_code = CASE WHEN p_error IS NULL THEN 0 ELSE 1 END,
           exit_reason = coalesce(left(p_error, 4096), 'completed')
     WHERE id = a.id;
    UPDATE trials
       SET state = CASE WHEN p_error IS NULL THEN 'COMPLETED' ELSE 'ERROR' END::trial_state,
           end_time = now(), exit_reason = CASE WHEN p_error IS NOT NULL THEN 'errored' END
     WHERE id = a.trial_id RETURNING experiment_id INTO v_exp;
    UPDATE experiments e
       SET state = CASE WHEN EXISTS (SELECT 1 FROM trials t
                                      WHERE t.experiment_id = e.id AND t.state = 'ERROR')
                        THEN 'ERROR' ELSE 'COMPLETED' END::experiment_state,
           end_time = now(), progress = CASE WHEN p_error IS NULL THEN 1 ELSE e.progress END
     WHERE e.id = v_exp
       AND NOT EXISTS (SELECT 1 FROM trials t WHERE t.experiment_id = e.id
           AND t.state < 'COMPLETED');
END $$;
GRANT EXECUTE ON FUNCTION det_user.unmanaged_end(bigint, text) TO det_user;

CREATE FUNCTION det_task.checkpoint_begin(p_token text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The task is about to write a checkpoint: refused (SQLSTATE 28000, det_internal.auth) once its
-- allocation was ended (agent lost, run killed), so a fenced run writes no files.
-- det_task.report_checkpoint checks again when the files are in place.
BEGIN
    PERFORM det_internal.auth(p_token);
END $$;
GRANT EXECUTE ON FUNCTION det_task.checkpoint_begin(text) TO det_task;

CREATE FUNCTION det_task.report_storage_error(p_token text, p_message text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The task could not write a checkpoint to its storage (no space, quota, read-only, I/O
-- error): p_message, one line naming the path and the OS error, becomes the run's exit reason
-- (allocations.storage_error), control characters made spaces, cut to 1000 characters. A
-- blank message is invalid_parameter_value.
DECLARE
    a allocations := det_internal.auth(p_token);
    v_line text := btrim(regexp_replace(p_message, '[[:cntrl:]]+', ' ', 'g'));
BEGIN
    IF v_line IS NULL OR v_line = '' THEN
        RAISE EXCEPTION 'storage error: a message naming the path and the error is required'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE allocations SET storage_error = left(v_line, 1000) WHERE id = a.id;
END $$;
GRANT EXECUTE ON FUNCTION det_task.report_storage_error(text, text) TO det_task;

CREATE FUNCTION det_task.secrets(p_token text) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling task's own secrets: {job_id, jupyter_token, ssh_public_key} (its server needs
-- them; the private key stays with det).
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    RETURN (SELECT jsonb_build_object('job_id', s.job_id, 'jupyter_token', s.jupyter_token,
                                      'ssh_public_key', s.ssh_public_key)
              FROM task_secrets s WHERE s.job_id = a.job_id);
END $$;
GRANT EXECUTE ON FUNCTION det_task.secrets(text) TO det_task;

CREATE FUNCTION det_task.ready(p_token text, p_address text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling task's server answers at p_address (host:port; a shell's is user@host:port, the
-- user its sshd lets in): det serve proxies to it. The task's use starts now (last_activity),
-- so the idle clock counts from here.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    IF p_address IS NULL
       OR p_address !~ '^([A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9.:\[\]-]+:[0-9]{1,5}$' THEN
        RAISE EXCEPTION 'address: expected host:port or user@host:port, got %',
                        coalesce(p_address, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE allocations SET address = p_address WHERE id = a.id;
    UPDATE tasks SET last_activity = now() WHERE job_id = a.job_id;
END $$;
GRANT EXECUTE ON FUNCTION det_task.ready(text, text) TO det_task;

CREATE FUNCTION det_task.activity(p_token text, p_at timestamptz) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling task's server saw use at p_at (an open kernel, terminal or SSH session, by its
-- idle type); a time in the future counts as now.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    UPDATE tasks SET last_activity = least(now(), p_at)
     WHERE job_id = a.job_id AND last_activity < least(now(), p_at);
END $$;
GRANT EXECUTE ON FUNCTION det_task.activity(text, timestamptz) TO det_task;

CREATE FUNCTION det_task.tensorboard_sources(p_token text)
RETURNS TABLE (experiment_id integer, trial_id integer, storage jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The event files the calling TensorBoard task shows (det.harness.tensorboard writes them
-- under <storage>/tensorboard/experiment/<id>/trial/<id>): a row per experiment of its
-- experiment_ids (trial_id NULL: all its trials, those that start later too) and a row per
-- trial of its trial_ids, each with its experiment's checkpoint storage, credentials left out
-- (a viewer of the experiment may open the TensorBoard). The token's own task only; no row
-- for another kind of task. Its agent calls it too, to mount the directories in a container.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    RETURN QUERY
    SELECT s.experiment_id, s.trial_id,
           s.storage - 'access_key' - 'secret_key'
      FROM (SELECT e.id AS experiment_id, NULL::integer AS trial_id,
                   e.config -> 'checkpoint_storage' AS storage
              FROM tasks k JOIN experiments e ON e.id = ANY (k.experiment_ids)
             WHERE k.job_id = a.job_id AND k.type = 'TENSORBOARD'
            UNION ALL
            SELECT t.experiment_id, t.id, e.config -> 'checkpoint_storage'
              FROM tasks k JOIN trials t ON t.id = ANY (k.trial_ids)
              JOIN experiments e ON e.id = t.experiment_id
             WHERE k.job_id = a.job_id AND k.type = 'TENSORBOARD') s
     ORDER BY s.experiment_id, s.trial_id NULLS FIRST;
END $$;
-- a TensorBoard's agent mounts its event files' directories in its container
GRANT EXECUTE ON FUNCTION det_task.tensorboard_sources(text) TO det_task, det_agent;

CREATE FUNCTION det_user.task_open(p_job bigint)
RETURNS TABLE (type text, state text, address text, jupyter_token text, end_reason text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- What det serve's proxy needs to open task p_job for the caller: its kind, its run's state,
-- its server's address (NULL until it answers), the Jupyter token it injects, and why it
-- ended. Opening a TensorBoard needs view permission; a notebook, shell or command runs code
-- as the task's owner, so opening one needs edit (Editor). Touches last_activity (proxied
-- traffic is use) at most once every 5 seconds, so a busy page costs no write per request.
DECLARE
    t tasks := det_internal.task_find(p_job, 'view', 'open');
BEGIN
    IF t.type <> 'TENSORBOARD' THEN
        PERFORM det_internal.require('edit', (SELECT j.workspace_id FROM jobs j WHERE j.id = p_job),
                            format('open %s %s', lower(t.type), p_job));
    END IF;
    UPDATE tasks SET last_activity = now()
     WHERE job_id = p_job AND last_activity < now() - interval '5 seconds';
    RETURN QUERY
    SELECT t.type, a.state::text, a.address, s.jupyter_token, t.end_reason
      FROM allocations a JOIN task_secrets s ON s.job_id = a.job_id
     WHERE a.job_id = p_job ORDER BY a.run DESC LIMIT 1;
END $$;
GRANT EXECUTE ON FUNCTION det_user.task_open(bigint) TO det_user;

CREATE FUNCTION det_user.task_ssh_key(p_job bigint) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The private key that opens shell p_job (`det shell open`): Editor of its workspace.
DECLARE
    t tasks := det_internal.task_find(p_job, 'edit', 'open');
BEGIN
    IF t.type <> 'SHELL' THEN
        RAISE EXCEPTION 'task %: a %, not a shell', p_job, lower(t.type)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN (SELECT ssh_private_key FROM task_secrets WHERE job_id = p_job);
END $$;
GRANT EXECUTE ON FUNCTION det_user.task_ssh_key(bigint) TO det_user;

CREATE FUNCTION det_task.current_op(p_token text) RETURNS jsonb LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The trial's oldest open searcher operation as {id, length}; {"wait": true} while the
-- searcher has not yet read the trial's events (its next op is not decided yet: ask again);
-- NULL when the searcher wants nothing more from it, which marks the allocation out_of_work
-- (the task then checkpoints and exits so its slots go back).
DECLARE
    a allocations := det_internal.auth(p_token);
    v_op jsonb;
BEGIN
    SELECT jsonb_build_object('id', o.id, 'length', o.length) INTO v_op
      FROM searcher_ops o WHERE o.trial_id = a.trial_id AND NOT o.completed
     ORDER BY o.id LIMIT 1;
    IF v_op IS NOT NULL THEN
        RETURN v_op;
    END IF;
    IF EXISTS (SELECT 1 FROM searcher_events v JOIN trials t ON t.experiment_id = v.experiment_id
                WHERE t.id = a.trial_id AND v.trial_id = t.id AND NOT v.consumed) THEN
        RETURN jsonb_build_object('wait', true);
    END IF;
    UPDATE allocations SET out_of_work = true WHERE id = a.id;
    RETURN NULL;
END $$;
GRANT EXECUTE ON FUNCTION det_task.current_op(text) TO det_task;

CREATE FUNCTION det_task.report_progress(p_token text, p_op_id bigint, p_units double precision)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The units of its op the trial has trained (absolute, in the op's unit: searcher_ops.length;
-- not a fraction). Refused (invalid_parameter_value) unless a finite number >= 0; stored at
-- most the op's length (a length in epochs or records is trained in whole batches, so the
-- last report may pass it by part of a batch).
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    IF p_units IS NULL OR p_units = 'NaN' OR p_units < 0 OR p_units = 'Infinity' THEN
        RAISE EXCEPTION 'progress: expected a finite number of units >= 0, not %',
            coalesce(p_units::text, 'null') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE searcher_ops SET progress = least(p_units, length)
     WHERE id = p_op_id AND trial_id = a.trial_id;
END $$;
GRANT EXECUTE ON FUNCTION det_task.report_progress(text, bigint, double precision) TO det_task;

CREATE FUNCTION det_task.complete_op(p_token text, p_op_id bigint, p_metric double precision)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The trial trained to the op's length and validated: record the searcher metric and a
-- validation_completed event, which the searcher reads as it decides (under adaptive ASHA's
-- time_metric, as nothing: the trial's validation rows are its results). Completing an op
-- twice is a no-op.
DECLARE
    a allocations := det_internal.auth(p_token);
    o searcher_ops;
BEGIN
    UPDATE searcher_ops SET completed = true, metric = p_metric, progress = length
     WHERE id = p_op_id AND trial_id = a.trial_id AND NOT completed
    RETURNING * INTO o;
    IF FOUND THEN
        INSERT INTO searcher_events (experiment_id, trial_id, kind, payload)
        SELECT t.experiment_id, t.id, 'validation_completed',
               jsonb_build_object('length', o.length, 'metric', p_metric)
        FROM trials t WHERE t.id = a.trial_id;
        PERFORM pg_notify(det_internal.channel('reconciler', ''), 'searcher');
    END IF;
END $$;
GRANT EXECUTE ON FUNCTION det_task.complete_op(text, bigint, double precision) TO det_task;

CREATE FUNCTION det_task.should_preempt(p_token text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN (det_internal.auth(p_token)).desired_state <> 'RUNNING';
END $$;
GRANT EXECUTE ON FUNCTION det_task.should_preempt(text) TO det_task;

CREATE FUNCTION det_task.stop_reason(p_token text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Why det asks the run holding p_token to stop, for the harness's preemption line: the
-- run's stop_reason (written with its desired state, migration 0040: 'paused: its experiment
-- was paused', 'preempted: slots given to experiment 3 (fair share)'); NULL while it is not
-- asked to stop.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    IF a.desired_state = 'RUNNING' THEN
        RETURN NULL;
    END IF;
    RETURN coalesce(a.stop_reason, 'det asked the run to stop');
END $$;
GRANT EXECUTE ON FUNCTION det_task.stop_reason(text) TO det_task;

CREATE FUNCTION det_task.ack_preemption(p_token text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    UPDATE allocations SET preempt_acked = true WHERE id = a.id;
END $$;
GRANT EXECUTE ON FUNCTION det_task.ack_preemption(text) TO det_task;

CREATE FUNCTION det_task.report_early_exit(p_token text, p_reason text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The trial ends itself, for one of the early_exit_reason labels.
DECLARE
    a allocations := det_internal.auth(p_token);
    v_reason early_exit_reason;
BEGIN
    BEGIN
        v_reason := p_reason::early_exit_reason;
    EXCEPTION WHEN invalid_text_representation THEN
        RAISE EXCEPTION 'early exit reason must be one of %, not "%"',
            array_to_string(enum_range(NULL::early_exit_reason)::text[], ', '), p_reason
            USING ERRCODE = 'invalid_parameter_value';
    END;
    UPDATE trials SET closed = true, exit_reason = v_reason::text WHERE id = a.trial_id;
    UPDATE searcher_ops SET completed = true WHERE trial_id = a.trial_id AND NOT completed;
END $$;
GRANT EXECUTE ON FUNCTION det_task.report_early_exit(text, text) TO det_task;

CREATE FUNCTION det_task.experiment_best_validation(p_token text) RETURNS double precision
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT CASE WHEN e.smaller_is_better
                THEN min(t.best_validation) ELSE max(t.best_validation) END
    FROM allocations a
    JOIN trials me ON me.id = a.trial_id
    JOIN experiments e ON e.id = me.experiment_id
    JOIN trials t ON t.experiment_id = e.id
    WHERE a.id = (det_internal.auth(p_token)).id
    GROUP BY e.id;
$$;
GRANT EXECUTE ON FUNCTION det_task.experiment_best_validation(text) TO det_task;

-- =============================================================================================
-- Reconciler helpers (also read by user actions: a job's default priority, `det job update`)

CREATE FUNCTION det_user.pool_scheduler(p_pool text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
-- The scheduler a pool really uses, every default filled in: the pool's own, else the
-- cluster's, else fair_share (the spec's default for a blank type: Resource Pools).
-- min_run_time: seconds a run without a checkpoint is not preempted. The defaults are
-- det.configs.cluster's (SchedulerConfig), the values a cluster config gets before it is
-- stored; they are here for a cluster that has none applied yet.
BEGIN
    RETURN jsonb_build_object('type', 'fair_share', 'preemption', false,
                              'fitting_policy', 'best', 'default_priority', 42,
                              'min_run_time', 60)
           || coalesce((SELECT nullif(scheduler, 'null') FROM resource_pools WHERE name = p_pool),
                       (SELECT scheduler FROM cluster_config),
                       '{}');
END $$;
GRANT EXECUTE ON FUNCTION det_user.pool_scheduler(text) TO det_user;

CREATE FUNCTION det_internal.job_label(p_job bigint) RETURNS text
LANGUAGE sql STABLE AS $$
-- A job as reasons name it to users: 'experiment 3', 'notebook 12' (a task's id is its job's),
-- else 'job N'.
SELECT coalesce((SELECT 'experiment ' || e.id FROM experiments e WHERE e.job_id = p_job),
                (SELECT lower(t.type) || ' ' || t.job_id FROM tasks t WHERE t.job_id = p_job),
                'job ' || p_job);
$$;

CREATE FUNCTION det_internal.preempted_reason(p_job bigint, p_rule text) RETURNS text
LANGUAGE sql STABLE AS $$
-- The stop reason of a run the scheduler preempted: 'preempted: slots given to experiment 3
-- (fair share)'. p_job: the job its slots go to (NULL: not known); p_rule: the scheduler's
-- rule. det_user.run_status knows a preempted run by this prefix.
SELECT format('preempted: slots given to %s (%s)',
              coalesce(det_internal.job_label(p_job), 'a waiting job'), p_rule);
$$;

CREATE FUNCTION det_user.run_end_reason(p_allocation bigint) RETURNS text
LANGUAGE sql STABLE STRICT AS $$
-- Why a run ended (the WebUI's "Why it ended"; NULL while it lives), never blank once it has:
-- why det stopped it (stop_reason), then what the run said (its checkpoint storage error, the
-- agent's or det's reason: a signal, 'agent lost', 'stopped before it started'), else what
-- its flags and exit code tell (so a preempted run's is not blank). By id, not by row: a
-- whole allocations row includes token_hash, which no user may read.
SELECT CASE WHEN a.state = 'TERMINATED' THEN concat_ws('; ', a.stop_reason, coalesce(
    a.storage_error, a.exit_reason,
    CASE WHEN a.stop_reason IS NOT NULL AND a.exit_code = 0 THEN NULL
         WHEN a.planned_stop THEN 'its agent stopped it (a planned stop)'
         WHEN a.exit_code = 0 AND a.out_of_work THEN 'finished its work (exit code 0)'
         WHEN a.exit_code = 0 THEN 'its code exited (exit code 0)'
         WHEN a.exit_code IS NULL THEN 'ended without an exit code'
         ELSE 'exit code ' || a.exit_code END)) END
  FROM allocations a WHERE a.id = p_allocation;
$$;
-- users' queries (a trial's runs, an experiment's trials) show it
GRANT EXECUTE ON FUNCTION det_user.run_end_reason(bigint) TO det_user;

CREATE FUNCTION det_user.run_status(p_allocation bigint) RETURNS text
LANGUAGE sql STABLE STRICT AS $$
-- A run as users should read it, agreeing with the job queue (a trial waiting for a slot
-- reads waiting, not "running"): waiting (for slots: pending_reason says why), starting (slots
-- held, its process or container not yet running), running, preempting or stopping (told to stop,
-- not yet gone), preempted or ended.
SELECT CASE WHEN a.state = 'PENDING' AND a.desired_state = 'RUNNING' THEN 'waiting'
            WHEN a.state = 'TERMINATED'
                THEN CASE WHEN a.stop_reason LIKE 'preempted:%' THEN 'preempted' ELSE 'ended' END
            WHEN a.desired_state <> 'RUNNING'
                THEN CASE WHEN a.stop_reason LIKE 'preempted:%' THEN 'preempting'
                          ELSE 'stopping' END
            WHEN a.state = 'RUNNING' THEN 'running'
            ELSE 'starting' END
  FROM allocations a WHERE a.id = p_allocation;
$$;
-- users' queries (a trial's runs, an experiment's trials) show it
GRANT EXECUTE ON FUNCTION det_user.run_status(bigint) TO det_user;

CREATE FUNCTION det_user.run_reason(p_allocation bigint) RETURNS text
LANGUAGE sql STABLE STRICT AS $$
-- The reason that goes with det_user.run_status: the scheduler's while it waits, det's while it
-- is told to stop, det_user.run_end_reason once it ended; NULL while it starts or runs.
SELECT CASE WHEN a.state = 'PENDING' AND a.desired_state = 'RUNNING' THEN a.pending_reason
            WHEN a.state = 'TERMINATED' THEN det_user.run_end_reason(a.id)
            WHEN a.desired_state <> 'RUNNING' THEN a.stop_reason END
  FROM allocations a WHERE a.id = p_allocation;
$$;
-- users' queries (a trial's runs, an experiment's trials) show it
GRANT EXECUTE ON FUNCTION det_user.run_reason(bigint) TO det_user;

-- =============================================================================================
-- Checkpoint GC, archive and delete. The keep rule is one statement
-- (det_user.checkpoints_to_delete); the checkpoints never deleted are the view checkpoint_pins.

CREATE VIEW checkpoint_pins WITH (security_invoker = true) AS
-- Checkpoints that are not deleted, whatever the GC policy or a user asks: the versions of
-- the model registry, the checkpoints experiments warm-start from
-- (searcher.source_checkpoint_uuid, or the latest checkpoint of searcher.source_trial_id;
-- as Determined 0.38 keeps them), and while a trial lives its restart point (its latest
-- checkpoint: GC runs during runs). It is the one home of "pinned".
SELECT checkpoint_uuid FROM model_versions
UNION
SELECT e.source_checkpoint_uuid FROM experiments e WHERE e.source_checkpoint_uuid IS NOT NULL
UNION
SELECT t.latest_checkpoint
  FROM experiments e
  JOIN trials t ON t.id = e.source_trial_id
 WHERE t.latest_checkpoint IS NOT NULL
UNION
SELECT t.latest_checkpoint FROM trials t
 WHERE t.state < 'COMPLETED' AND t.latest_checkpoint IS NOT NULL;
GRANT SELECT ON checkpoint_pins TO det_user;

CREATE FUNCTION det_user.checkpoints_to_delete(
    p_experiment integer, p_save_experiment_best integer DEFAULT NULL,
    p_save_trial_best integer DEFAULT NULL, p_save_trial_latest integer DEFAULT NULL
) RETURNS TABLE (uuid uuid, trial_id integer, steps_completed bigint, size_bytes bigint,
                 metric double precision)
LANGUAGE sql STABLE AS $$
-- The GC keep rule (Determined 0.38's checkpoint GC policy), one statement. Of the experiment's
-- COMPLETED checkpoints keep the union of
--   * the save_experiment_best best by the searcher metric across the experiment,
--   * each trial's save_trial_best best,
--   * each trial's save_trial_latest latest (by steps_completed);
-- and return the rest, less the pinned ones (checkpoint_pins). A checkpoint's metric is the
-- searcher metric of its trial's validation at the checkpoint's step (the last one reported
-- there); without one it is never "best". Ties share a rank (rank()), so tied checkpoints are
-- all kept. The policy is the experiment's checkpoint_storage save_* values unless given; if
-- it has none, nothing is returned.
WITH x AS (
    SELECT e.id,
           CASE WHEN e.smaller_is_better THEN 1 ELSE -1 END
               AS sign,
           e.searcher_metric AS metric,
           coalesce(p_save_experiment_best,
                    e.save_experiment_best) AS seb,
           coalesce(p_save_trial_best,
                    e.save_trial_best) AS stb,
           coalesce(p_save_trial_latest,
                    e.save_trial_latest) AS stl
      FROM experiments e WHERE e.id = p_experiment
), scored AS (
    SELECT c.uuid, c.trial_id, c.steps_completed,
           (SELECT sum(r.value::bigint) FROM jsonb_each_text(c.resources) r)::bigint AS size_bytes,
           CASE WHEN jsonb_typeof(v."values" -> x.metric) = 'number'
                THEN (v."values" ->> x.metric)::double precision END AS metric,
           x.sign
      FROM x
      JOIN trials t ON t.experiment_id = x.id
      JOIN checkpoints c ON c.trial_id = t.id AND c.state = 'COMPLETED'
      LEFT JOIN LATERAL (
          SELECT m."values" FROM metrics m
           WHERE m.trial_id = c.trial_id AND m."group" = 'validation'
             AND m.steps_completed = c.steps_completed AND m.superseded_by IS NULL
           ORDER BY m.id DESC LIMIT 1) v ON true
), ranked AS (
    SELECT s.*,
           CASE WHEN s.metric IS NOT NULL
                THEN rank() OVER (ORDER BY s.sign * s.metric NULLS LAST) END AS experiment_rank,
           CASE WHEN s.metric IS NOT NULL
                THEN rank() OVER (PARTITION BY s.trial_id ORDER BY s.sign * s.metric NULLS LAST)
                END AS trial_rank,
           rank() OVER (PARTITION BY s.trial_id ORDER BY s.steps_completed DESC) AS latest_rank
      FROM scored s
)
SELECT r.uuid, r.trial_id, r.steps_completed, r.size_bytes, r.metric
  FROM ranked r, x
 WHERE x.seb IS NOT NULL AND x.stb IS NOT NULL AND x.stl IS NOT NULL
   AND NOT (coalesce(r.experiment_rank <= x.seb, false)
            OR coalesce(r.trial_rank <= x.stb, false)
            OR r.latest_rank <= x.stl)
   AND NOT EXISTS (SELECT 1 FROM checkpoint_pins p WHERE p.checkpoint_uuid = r.uuid)
 ORDER BY r.trial_id, r.steps_completed;
$$;
GRANT EXECUTE ON FUNCTION det_user.checkpoints_to_delete(integer, integer, integer,
    integer) TO det_user;

CREATE FUNCTION det_internal.unpin_deleting() RETURNS integer LANGUAGE plpgsql AS $$
-- A pinned checkpoint is never deleted: one that became pinned while a GC marked it DELETING
-- (the pin committed between the GC's snapshot and its write) goes back to COMPLETED. Run in
-- its own statement, so it sees pins committed up to now. Returns the checkpoints restored.
DECLARE
    v_n integer;
BEGIN
    UPDATE checkpoints c SET state = 'COMPLETED', delete_requested_at = NULL
      FROM checkpoint_pins p
     WHERE p.checkpoint_uuid = c.uuid AND c.state = 'DELETING';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END $$;

CREATE FUNCTION det_internal.checkpoint_gc(
    p_experiment integer, p_save_experiment_best integer DEFAULT NULL,
    p_save_trial_best integer DEFAULT NULL, p_save_trial_latest integer DEFAULT NULL
) RETURNS integer LANGUAGE plpgsql AS $$
-- Apply the keep rule: what det_user.checkpoints_to_delete returns becomes DELETING (the GC task
-- the reconciler then schedules removes the files). Returns how many were marked.
DECLARE
    v_n integer;
BEGIN
    UPDATE checkpoints c SET state = 'DELETING', delete_requested_at = now()
      FROM det_user.checkpoints_to_delete(p_experiment, p_save_experiment_best, p_save_trial_best,
                                     p_save_trial_latest) d
     WHERE c.uuid = d.uuid AND c.state = 'COMPLETED';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n - det_internal.unpin_deleting();
END $$;

CREATE FUNCTION det_user.set_gc_policy(
    p_experiment integer, p_save_experiment_best integer, p_save_trial_best integer,
    p_save_trial_latest integer
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment set gc-policy`: store the new save_* values in the experiment's config and,
-- if it has ended, apply them now (a running experiment applies them at its next checkpoint,
-- when the pass looks at its new checkpoints, or when it ends). Returns the checkpoints marked
-- DELETING.
DECLARE
    e experiments;
BEGIN
    PERFORM det_internal.require('edit', det_user.experiment_workspace(p_experiment),
                        format('set the GC policy of experiment %s', p_experiment));
    SELECT * INTO e FROM experiments WHERE id = p_experiment FOR UPDATE;
    IF least(p_save_experiment_best, p_save_trial_best, p_save_trial_latest) < 0 THEN
        RAISE EXCEPTION 'gc policy: save_experiment_best, save_trial_best and save_trial_latest must be 0 or more'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(e.config -> 'checkpoint_storage') IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'experiment %: it has no checkpoint_storage to set a GC policy on',
            p_experiment USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE experiments
       SET config = jsonb_set(config, '{checkpoint_storage}', config -> 'checkpoint_storage'
                              || jsonb_build_object('save_experiment_best', p_save_experiment_best,
                                                    'save_trial_best', p_save_trial_best,
                                                    'save_trial_latest', p_save_trial_latest))
     WHERE id = p_experiment;
    PERFORM det_internal.audit('set_gc_policy', 'experiment', p_experiment::text,
                      jsonb_build_object('save_experiment_best', p_save_experiment_best,
                                         'save_trial_best', p_save_trial_best,
                                         'save_trial_latest', p_save_trial_latest));
    IF e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RETURN 0;
    END IF;
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'checkpoint_gc');
    RETURN det_internal.checkpoint_gc(p_experiment);
END $$;
GRANT EXECUTE ON FUNCTION det_user.set_gc_policy(integer, integer, integer, integer) TO det_user;

CREATE FUNCTION det_user.delete_checkpoints(p_uuids uuid[]) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det checkpoint delete`: the checkpoints become DELETING (one already DELETING is asked
-- again, so a GC that gave up tries again; a DELETED one is left as it is). All or none:
-- refused for an unknown or pinned checkpoint, or one of an experiment that has not ended.
-- Returns the checkpoints asked to be deleted. Editor of each checkpoint's workspace.
DECLARE
    v_missing uuid;
    v_bad record;
    v_n integer;
BEGIN
    SELECT u INTO v_missing FROM unnest(p_uuids) u
     WHERE NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.uuid = u) LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'checkpoint % not found', v_missing USING ERRCODE = 'no_data_found';
    END IF;
    FOR v_bad IN SELECT c.uuid, j.workspace_id FROM checkpoints c
                   JOIN trials t ON t.id = c.trial_id JOIN experiments e ON e.id = t.experiment_id
                   JOIN jobs j ON j.id = e.job_id WHERE c.uuid = ANY(p_uuids) LOOP
        PERFORM det_internal.require('edit', v_bad.workspace_id, format('delete checkpoint %s',
            v_bad.uuid));
    END LOOP;
    SELECT c.uuid INTO v_missing FROM checkpoints c JOIN checkpoint_pins p
        ON p.checkpoint_uuid = c.uuid
     WHERE c.uuid = ANY(p_uuids) LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'checkpoint % is pinned (registered in the model registry, or an experiment warm-starts from it): it cannot be deleted',
            v_missing USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT c.uuid, e.id, e.state INTO v_bad
      FROM checkpoints c JOIN trials t ON t.id = c.trial_id
      JOIN experiments e ON e.id = t.experiment_id
     WHERE c.uuid = ANY(p_uuids) AND e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'checkpoint %: experiment % is %; its checkpoints can be deleted once it has ended',
            v_bad.uuid, v_bad.id, v_bad.state USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE checkpoints SET state = 'DELETING', delete_requested_at = now()
     WHERE uuid = ANY(p_uuids) AND state IN ('COMPLETED', 'DELETING');
    GET DIAGNOSTICS v_n = ROW_COUNT;
    PERFORM det_internal.audit('delete', 'checkpoint', u::text) FROM unnest(p_uuids) u;
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'checkpoint_gc');
    RETURN v_n - det_internal.unpin_deleting();  -- pinned since the check above
END $$;
GRANT EXECUTE ON FUNCTION det_user.delete_checkpoints(uuid[]) TO det_user;

CREATE FUNCTION det_user.checkpoint_add_metadata(p_uuid uuid, p_metadata jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The SDK's Checkpoint.add_metadata (Determined 0.38): p_metadata's top-level keys replace or
-- join the checkpoint's metadata (its row, not the metadata.json in its storage, as in 0.38);
-- returns the metadata. Editor of the checkpoint's workspace. The result obeys a task's rule
-- (checkpoints_input_check, also on UPDATE OF metadata: at most 64 KiB, 32 levels deep).
DECLARE
    v_workspace integer;
    v_metadata jsonb;
BEGIN
    IF jsonb_typeof(p_metadata) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'metadata: expected a JSON object, got %',
            coalesce(jsonb_typeof(p_metadata), 'null') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT j.workspace_id INTO v_workspace
      FROM checkpoints c JOIN trials t ON t.id = c.trial_id
      JOIN experiments e ON e.id = t.experiment_id JOIN jobs j ON j.id = e.job_id
     WHERE c.uuid = p_uuid;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'checkpoint % not found', p_uuid USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.require('edit', v_workspace,
        format('add metadata to checkpoint %s', p_uuid));
    UPDATE checkpoints SET metadata = metadata || p_metadata WHERE uuid = p_uuid
    RETURNING metadata INTO v_metadata;
    RETURN v_metadata;
END $$;
GRANT EXECUTE ON FUNCTION det_user.checkpoint_add_metadata(uuid, jsonb) TO det_user;

CREATE FUNCTION det_user.experiment_archive(p_id integer, p_archived boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment archive | unarchive`: an archived experiment is hidden from default lists
-- (spec: experiment-lifecycle). Only an ended experiment can be archived (else a
-- check_violation: an illegal transition).
DECLARE
    v_state experiment_state;
BEGIN
    PERFORM det_internal.require('edit', det_user.experiment_workspace(p_id),
                        format('%s experiment %s', CASE WHEN p_archived THEN 'archive'
                                                        ELSE 'unarchive' END, p_id));
    SELECT state INTO v_state FROM experiments WHERE id = p_id FOR UPDATE;
    IF p_archived AND v_state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RAISE EXCEPTION 'experiment % is %: only an ended experiment can be archived', p_id,
            v_state USING ERRCODE = 'check_violation';
    END IF;
    UPDATE experiments SET archived = p_archived WHERE id = p_id;
    PERFORM det_internal.audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END,
        'experiment',
                      p_id::text);
END $$;
GRANT EXECUTE ON FUNCTION det_user.experiment_archive(integer, boolean) TO det_user;

CREATE FUNCTION det_internal.purge_experiment(p_id integer) RETURNS boolean LANGUAGE plpgsql AS $$
-- Remove an experiment whose deletion was asked for, with its trials, runs, metrics, logs,
-- checkpoint rows, searcher rows and job (its context too, if no other experiment shares it),
-- once none of its checkpoints is DELETING, none of its runs is live, and its TensorBoard files
-- are gone if a trial of it ever ran (a GC task removes them,
-- det_task.gc_task_tensorboards_deleted). Returns false (and removes nothing) while that is not yet
-- so.
DECLARE
    e experiments;
BEGIN
    SELECT * INTO e FROM experiments WHERE id = p_id AND delete_requested_at IS NOT NULL
       FOR UPDATE;
    IF NOT FOUND
       OR EXISTS (SELECT 1 FROM checkpoints c JOIN trials t ON t.id = c.trial_id
                   WHERE t.experiment_id = p_id AND c.state <> 'DELETED')
       OR EXISTS (SELECT 1 FROM allocations a
                   WHERE a.job_id = e.job_id AND a.state <> 'TERMINATED')
       OR (e.tensorboards_deleted_at IS NULL
           AND EXISTS (SELECT 1 FROM trials t WHERE t.experiment_id = p_id AND t.runs > 0)) THEN
        RETURN false;
    END IF;
    DELETE FROM task_logs l USING allocations a WHERE l.allocation_id = a.id
        AND a.job_id = e.job_id;
    DELETE FROM metrics m USING trials t WHERE m.trial_id = t.id AND t.experiment_id = p_id;
    DELETE FROM checkpoints c USING trials t WHERE c.trial_id = t.id AND t.experiment_id = p_id;
    DELETE FROM allocation_slots s USING allocations a
     WHERE s.allocation_id = a.id AND a.job_id = e.job_id;
    DELETE FROM allocations WHERE job_id = e.job_id;
    DELETE FROM searcher_events WHERE experiment_id = p_id;
    DELETE FROM searcher_ops o USING trials t WHERE o.trial_id = t.id AND t.experiment_id = p_id;
    DELETE FROM trials WHERE experiment_id = p_id;
    DELETE FROM experiments WHERE id = p_id;
    DELETE FROM jobs WHERE id = e.job_id;
    DELETE FROM context_blobs b WHERE b.id = e.context_id
       AND NOT EXISTS (SELECT 1 FROM experiments x WHERE x.context_id = b.id);
    RETURN true;
END $$;

CREATE FUNCTION det_user.experiment_delete(p_id integer) RETURNS boolean LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment delete`: for an ended experiment none of whose checkpoints is pinned. Its
-- checkpoints become DELETING (their files are removed by a GC task), and its rows go in one
-- transaction once that is done (det_internal.purge_experiment: here if nothing is left to remove,
-- else by the reconciler). Asking again retries a GC that gave up. Returns true when the
-- rows are already gone.
DECLARE
    v_state experiment_state;
    v_pinned uuid;
BEGIN
    PERFORM det_internal.require('edit', det_user.experiment_workspace(p_id),
                        format('delete experiment %s', p_id));
    SELECT state INTO v_state FROM experiments WHERE id = p_id FOR UPDATE;
    IF v_state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RAISE EXCEPTION 'experiment % is %: only an ended experiment can be deleted (kill it first)',
            p_id, v_state USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT c.uuid INTO v_pinned
      FROM checkpoints c JOIN trials t ON t.id = c.trial_id
      JOIN checkpoint_pins p ON p.checkpoint_uuid = c.uuid
     WHERE t.experiment_id = p_id AND c.state <> 'DELETED' LIMIT 1;
    IF v_pinned IS NOT NULL THEN
        RAISE EXCEPTION 'experiment %: checkpoint % is pinned (registered in the model registry, or an experiment warm-starts from it); the experiment cannot be deleted',
            p_id, v_pinned USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE experiments SET delete_requested_at = now(), checkpoint_gc_error = NULL WHERE id = p_id;
    UPDATE checkpoints c SET state = 'DELETING', delete_requested_at = now()
      FROM trials t
     WHERE t.id = c.trial_id AND t.experiment_id = p_id AND c.state IN ('COMPLETED', 'DELETING');
    PERFORM det_internal.unpin_deleting();  -- pinned since the check above: kept, and so is the experiment
    PERFORM det_internal.audit('delete', 'experiment', p_id::text);
    PERFORM pg_notify(det_internal.channel('reconciler', ''), 'checkpoint_gc');
    RETURN det_internal.purge_experiment(p_id);
END $$;
GRANT EXECUTE ON FUNCTION det_user.experiment_delete(integer) TO det_user;

-- The GC task's API (det.harness.checkpoint_gc); it names its allocation by token.

CREATE FUNCTION det_internal.gc_auth(p_token text) RETURNS allocations LANGUAGE plpgsql STABLE AS $$
-- The live GC task holding this token (det_internal.auth), or an error: a trial's token cannot call
-- the GC task's functions.
DECLARE
    a allocations := det_internal.auth(p_token);
BEGIN
    IF a.spec ->> 'kind' IS DISTINCT FROM 'checkpoint_gc' THEN
        RAISE EXCEPTION 'allocation %: only a checkpoint GC task may remove checkpoints', a.id
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    RETURN a;
END $$;

CREATE FUNCTION det_task.gc_task_checkpoints(p_token text, p_limit integer)
RETURNS TABLE (uuid uuid, storage jsonb, size_bytes bigint) LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Up to p_limit DELETING checkpoints of the GC task's experiment, in order, for the task to
-- remove their files. Pinned ones are first put back (det_internal.unpin_deleting), so a checkpoint
-- pinned since it was marked is never handed out.
DECLARE
    a allocations := det_internal.gc_auth(p_token);
BEGIN
    PERFORM det_internal.unpin_deleting();
    RETURN QUERY
    SELECT c.uuid, c.storage,
           (SELECT sum(r.value::bigint) FROM jsonb_each_text(c.resources) r)::bigint
      FROM experiments e JOIN trials t ON t.experiment_id = e.id
      JOIN checkpoints c ON c.trial_id = t.id
     WHERE e.job_id = a.job_id AND c.state = 'DELETING'
     ORDER BY c.trial_id, c.steps_completed, c.uuid
     LIMIT p_limit;
END $$;
GRANT EXECUTE ON FUNCTION det_task.gc_task_checkpoints(text, integer) TO det_task;

CREATE FUNCTION det_task.gc_task_tensorboards(p_token text)
RETURNS TABLE (experiment_id integer, storage jsonb) LANGUAGE plpgsql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The GC task's experiment and its checkpoint storage when a user asked to delete it (its
-- TensorBoard files go too); no row otherwise.
DECLARE
    a allocations := det_internal.gc_auth(p_token);
BEGIN
    RETURN QUERY
    SELECT e.id, e.config -> 'checkpoint_storage'
      FROM experiments e
     WHERE e.job_id = a.job_id AND e.delete_requested_at IS NOT NULL;
END $$;
GRANT EXECUTE ON FUNCTION det_task.gc_task_tensorboards(text) TO det_task;

CREATE FUNCTION det_task.gc_task_tensorboards_deleted(p_token text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The GC task removed the TensorBoard files of its experiment being deleted: its rows may go
-- (det_internal.purge_experiment).
DECLARE
    a allocations := det_internal.gc_auth(p_token);
BEGIN
    UPDATE experiments SET tensorboards_deleted_at = now()
     WHERE job_id = a.job_id AND delete_requested_at IS NOT NULL;
END $$;
GRANT EXECUTE ON FUNCTION det_task.gc_task_tensorboards_deleted(text) TO det_task;

CREATE FUNCTION det_task.gc_task_deleted(p_token text, p_uuids uuid[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The GC task removed these checkpoints' files: they become DELETED, with the bytes freed.
-- Once none of the experiment's checkpoints is DELETING its GC error is cleared. Returns the
-- rows changed (a repeat changes none).
DECLARE
    a allocations := det_internal.gc_auth(p_token);
    v_exp integer;
    v_n integer;
BEGIN
    SELECT id INTO v_exp FROM experiments WHERE job_id = a.job_id;
    UPDATE checkpoints c
       SET state = 'DELETED', deleted_at = now(),
           freed_bytes = coalesce((SELECT sum(r.value::bigint)
                                     FROM jsonb_each_text(c.resources) r), 0)
      FROM trials t
     WHERE t.id = c.trial_id AND t.experiment_id = v_exp AND c.uuid = ANY(p_uuids)
       AND c.state = 'DELETING';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    UPDATE experiments SET checkpoint_gc_error = NULL
     WHERE id = v_exp AND checkpoint_gc_error IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM checkpoints c JOIN trials t ON t.id = c.trial_id
                        WHERE t.experiment_id = v_exp AND c.state = 'DELETING');
    RETURN v_n;
END $$;
GRANT EXECUTE ON FUNCTION det_task.gc_task_deleted(text, uuid[]) TO det_task;

CREATE FUNCTION det_task.gc_task_failed(p_token text, p_message text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The GC task could not remove files (a storage error): the message is shown on the
-- experiment; the checkpoints stay DELETING.
DECLARE
    a allocations := det_internal.gc_auth(p_token);
BEGIN
    UPDATE experiments SET checkpoint_gc_error = p_message WHERE job_id = a.job_id;
END $$;
GRANT EXECUTE ON FUNCTION det_task.gc_task_failed(text, text) TO det_task;

CREATE FUNCTION det_task.gc_task_unrecorded(p_token text, p_uuids uuid[]) RETURNS SETOF uuid
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Of p_uuids (checkpoint directories the GC task found in its experiment's storage), those no
-- checkpoint row names, of any experiment: files a crashed run published but never recorded
-- (det.harness.checkpoint_gc sweeps them once they are old enough).
DECLARE
    a allocations := det_internal.gc_auth(p_token);
BEGIN
    RETURN QUERY
    SELECT u FROM unnest(p_uuids) AS u
     WHERE NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.uuid = u);
END $$;
GRANT EXECUTE ON FUNCTION det_task.gc_task_unrecorded(text, uuid[]) TO det_task;

-- =============================================================================================
-- det serve: login tokens and the events its streams wake on

CREATE FUNCTION det_internal.web_end_stale_logins(p_user text, p_stamp bytea) RETURNS integer
LANGUAGE plpgsql AS $$
-- End p_user's det serve logins made under another password than the one whose stamp is
-- p_stamp (det_internal.password_stamp, read now); returns how many ended. det's own
-- change-password ends them all itself, so a login left to end here saw a password changed outside
-- det (the user's own ALTER ROLE ... PASSWORD in psql, or a superuser's): the first look after it
-- writes the audit row det's change-password would have written.
DECLARE
    v_ended integer;
BEGIN
    DELETE FROM web_sessions
     WHERE username = p_user AND password_stamp IS DISTINCT FROM p_stamp;
    GET DIAGNOSTICS v_ended = ROW_COUNT;
    IF v_ended > 0 THEN
        INSERT INTO audit_log (actor, action, object_type, object_id, detail)
        VALUES (p_user, 'change_password', 'user', p_user,
                jsonb_build_object('outside_det', true, 'logins_ended', v_ended));
    END IF;
    RETURN v_ended;
END $$;

CREATE FUNCTION det_web.login(p_token text, p_user text, p_ttl_seconds double precision,
                              p_address text)
RETURNS timestamptz LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Record a login token (minted by det serve once PostgreSQL accepted p_user's password) for
-- active user p_user, good for p_ttl_seconds; returns its expiry. The token keeps the stamp
-- of the password it was minted under (det_internal.password_stamp): det_web.auth refuses it once
-- the password changes. The login is audited (outcome success, client address p_address) and
-- clears p_user's failed attempts (det_web.login_begin counted this one as failed until now).
-- Expired tokens are removed here, so the table stays as small as the live logins.
DECLARE
    v_expires timestamptz;
    v_stamp bytea := det_internal.password_stamp(p_user);
    v_address text := coalesce(p_address, 'unknown');
BEGIN
    IF NOT EXISTS (SELECT 1 FROM users WHERE username = p_user AND active) THEN
        RAISE EXCEPTION 'invalid username or password'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF NOT (p_ttl_seconds > 0 AND p_ttl_seconds <= 366 * 86400) THEN
        RAISE EXCEPTION 'token lifetime: expected seconds > 0 and at most a year, not %',
            p_ttl_seconds USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_token IS NULL OR length(p_token) < 32 THEN
        RAISE EXCEPTION 'token: expected at least 32 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM web_sessions WHERE expires_at <= now();
    PERFORM det_internal.web_end_stale_logins(p_user, v_stamp);
    v_expires := now() + make_interval(secs => p_ttl_seconds);
    INSERT INTO web_sessions (token_hash, username, expires_at, password_stamp)
    VALUES (sha256(convert_to(p_token, 'UTF8')), p_user, v_expires, v_stamp);
    UPDATE login_throttle SET failures = 0, locked_until = NULL
     WHERE kind = 'user' AND key = p_user;
    UPDATE login_throttle
       SET failures = greatest(failures - 1, 0),
           locked_until = CASE WHEN failures - 1 >= 20 THEN locked_until END
     WHERE kind = 'address' AND key = v_address;
    INSERT INTO audit_log (actor, action, object_type, object_id, detail)
    VALUES (p_user, 'login', 'user', p_user,
            jsonb_build_object('outcome', 'success', 'address', v_address));
    RETURN v_expires;
END $$;
GRANT EXECUTE ON FUNCTION det_web.login(text, text, double precision, text) TO det_web;

CREATE FUNCTION det_web.auth(p_token text) RETURNS text LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The active user a live login token belongs to, or an error (SQLSTATE 28000). It becomes the
-- transaction's caller (det_user.caller reads det.web_user); det serve then SETs LOCAL ROLE to it,
-- so row-level security applies to the request as to that user's own psql. NULL, with the
-- user's logins ended (det_internal.web_end_stale_logins), when the token's password is no longer
-- the user's: det serve commits that and answers 401.
DECLARE
    v_user text;
    v_stamp bytea;
BEGIN
    SELECT s.username, s.password_stamp INTO v_user, v_stamp
      FROM web_sessions s JOIN users u ON u.username = s.username
     WHERE s.token_hash = sha256(convert_to(p_token, 'UTF8')) AND s.expires_at > now()
       AND u.active;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'invalid or expired token: log in again'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF v_stamp IS DISTINCT FROM det_internal.password_stamp(v_user) THEN
        PERFORM det_internal.web_end_stale_logins(v_user, det_internal.password_stamp(v_user));
        RETURN NULL;
    END IF;
    PERFORM set_config('det.web_user', v_user, true);
    RETURN v_user;
END $$;
GRANT EXECUTE ON FUNCTION det_web.auth(text) TO det_web;

CREATE FUNCTION det_web.logout(p_token text) RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- End a login: its token is good no more.
    DELETE FROM web_sessions WHERE token_hash = sha256(convert_to(p_token, 'UTF8'));
$$;
-- a request logs out after det serve took its user's role: ending a login takes its token
GRANT EXECUTE ON FUNCTION det_web.logout(text) TO det_web, det_user;

CREATE FUNCTION det_web.login_begin(p_user text, p_address text) RETURNS double precision
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve, before it has PostgreSQL check a password for POST /api/v1/auth/login (so a
-- throttled attempt costs no SCRAM work): the seconds the client must wait (429, Retry-After),
-- or 0 to go on. The rule: 5 failures for one user name p_user (from any address),
-- or 20 from one client address p_address (for any names), each within 15 minutes of the
-- last, lock further attempts for 30 s, doubling with each failure after (at most an hour);
-- a right password is refused too until the lock ends. Going on counts the attempt as failed
-- until det_web.login records its success, so parallel guesses cannot all pass before the
-- first failure is counted; a refused attempt counts nothing and is audited. The counters are
-- rows of login_throttle, shared by every det serve process and locked in one order (the
-- user's, then the address's).
DECLARE
    v_address text := coalesce(p_address, 'unknown');
    v_until timestamptz;
BEGIN
    DELETE FROM login_throttle WHERE forget_at <= now();
    INSERT INTO login_throttle AS t (kind, key, forget_at)
    VALUES ('user', p_user, now() + interval '15 minutes'),
           ('address', v_address, now() + interval '15 minutes')
    ON CONFLICT (kind, key) DO UPDATE SET forget_at = t.forget_at;
    SELECT max(locked_until) INTO v_until FROM login_throttle
     WHERE (kind, key) IN (('user', p_user), ('address', v_address));
    IF v_until > now() THEN
        INSERT INTO audit_log (actor, action, object_type, object_id, detail)
        VALUES (det_user.caller(), 'login', 'user', p_user,
                jsonb_build_object('outcome', 'throttled', 'address', v_address,
                                   'locked_until', v_until));
        RETURN extract(epoch FROM v_until - now());
    END IF;
    WITH counted AS (
        SELECT kind, key, failures + 1 AS failures,
               CASE kind WHEN 'user' THEN 5 ELSE 20 END AS lim
          FROM login_throttle
         WHERE (kind, key) IN (('user', p_user), ('address', v_address))
    ), locked AS (
        SELECT kind, key, failures,
               CASE WHEN failures >= lim
                    THEN now() + make_interval(secs => least(30 * 2 ^ (failures - lim), 3600))
               END AS until
          FROM counted
    )
    UPDATE login_throttle t
       SET failures = l.failures, locked_until = l.until,
           forget_at = coalesce(l.until, now()) + interval '15 minutes'
      FROM locked l
     WHERE t.kind = l.kind AND t.key = l.key;
    RETURN 0;
END $$;
GRANT EXECUTE ON FUNCTION det_web.login_begin(text, text) TO det_web;

CREATE FUNCTION det_web.login_failed(p_user text, p_address text) RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve: PostgreSQL refused the password (or the user) of an attempt det_web.login_begin let
-- through, already counted as failed there. Audited with the name tried and the client's
-- address, never the password.
    INSERT INTO audit_log (actor, action, object_type, object_id, detail)
    VALUES (det_user.caller(), 'login', 'user', p_user,
            jsonb_build_object('outcome', 'failure', 'address', coalesce(p_address, 'unknown')));
$$;
GRANT EXECUTE ON FUNCTION det_web.login_failed(text, text) TO det_web;

CREATE FUNCTION det_internal.web_event(p_topics text[]) RETURNS void LANGUAGE sql AS $$
-- Wake det serve's event streams with one NOTIFY on the web channel (det_internal.channel) whose
-- payload is the distinct topics, space-separated (det.db.channels: "experiments",
-- "experiment:<id>", "trial:<id>", "queue", "cluster"), or "*" (every stream) when there are
-- more than 200 of them. A hint only: the servers also look on their own every second.
-- Identical payloads in one transaction are delivered once (PostgreSQL folds them).
    SELECT pg_notify(det_internal.channel('web', ''), CASE WHEN count(*) > 200 THEN '*'
                                     ELSE string_agg(t, ' ' ORDER BY t) END)
      FROM (SELECT DISTINCT t FROM unnest(p_topics) t WHERE t IS NOT NULL) d
    HAVING count(*) > 0;
$$;

CREATE FUNCTION det_internal.web_event_throttled(p_topics text[]) RETURNS void
    LANGUAGE plpgsql AS $$
-- det_internal.web_event for the hot tables (metrics, task logs): at most one event per topic set
-- every 0.2 s (web_event_marks), so a busy trial costs a few NOTIFYs a second, not one per
-- batch. An event skipped here reaches the streams at the servers' next periodic look.
BEGIN
    INSERT INTO web_event_marks AS m (topic, sent_at)
    VALUES (array_to_string(p_topics, ' '), clock_timestamp())
    ON CONFLICT (topic) DO UPDATE SET sent_at = excluded.sent_at
     WHERE m.sent_at < excluded.sent_at - interval '0.2 seconds';
    IF FOUND THEN
        PERFORM det_internal.web_event(p_topics);
    END IF;
END $$;

CREATE FUNCTION det_internal.web_watched() RETURNS boolean LANGUAGE plpgsql STABLE AS $$
-- Whether some det serve streams pages now: the condition of every det_web trigger.
BEGIN
    RETURN EXISTS (SELECT 1 FROM web_watchers WHERE until > now());
END $$;

CREATE FUNCTION det_web.watch(p_server text, p_seconds double precision) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- det serve's listener ``p_server`` has open streams: send det_web events for the next
-- ``p_seconds`` seconds (0 ends its lease). Leases of servers gone for a minute are dropped.
    DELETE FROM web_watchers WHERE until < now() - interval '1 minute';
    INSERT INTO web_watchers AS w (server, until)
    VALUES (p_server, now() + make_interval(secs => p_seconds))
    ON CONFLICT (server) DO UPDATE SET until = excluded.until;
$$;
GRANT EXECUTE ON FUNCTION det_web.watch(text, double precision) TO det_web;

-- The triggers below fire once per statement (never per row: docs/architecture.md,
-- "The HTTP server") and send at most
-- one NOTIFY each, naming what changed in a way a page shows.
-- They fire only while a det serve streams pages (det_internal.web_watched): events no one reads
-- cost a trivial task ~1 ms of PostgreSQL time.

CREATE FUNCTION det_internal.web_on_experiments() RETURNS trigger LANGUAGE plpgsql AS $$
-- Experiments submitted, or changed state, progress or archived.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_internal.web_event('{experiments,queue}'::text[] || array_agg('experiment:' || n.id))
           FROM new_rows n;
    ELSE
        PERFORM det_internal.web_event('{experiments,queue}'::text[] || array_agg('experiment:' || n.id))
           FROM new_rows n JOIN old_rows o ON o.id = n.id
          WHERE (o.state, o.progress, o.archived) IS DISTINCT FROM
                (n.state, n.progress, n.archived)
         HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER experiments_web_insert AFTER INSERT ON experiments
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_experiments();
CREATE TRIGGER experiments_web_update AFTER UPDATE ON experiments
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_experiments();

CREATE FUNCTION det_internal.web_on_trials() RETURNS trigger LANGUAGE plpgsql AS $$
-- Trials created, or changed state, restarts, batches, checkpoint or best validation.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_internal.web_event(array_agg('experiment:' || n.experiment_id)
                              || array_agg('trial:' || n.id))
           FROM new_rows n;
    ELSE
        PERFORM det_internal.web_event(array_agg('experiment:' || n.experiment_id)
                              || array_agg('trial:' || n.id))
           FROM new_rows n JOIN old_rows o ON o.id = n.id
          WHERE (o.state, o.restarts, o.steps_completed, o.latest_checkpoint,
                 o.best_validation) IS DISTINCT FROM
                (n.state, n.restarts, n.steps_completed, n.latest_checkpoint,
                 n.best_validation)
         HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER trials_web_insert AFTER INSERT ON trials
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_trials();
CREATE TRIGGER trials_web_update AFTER UPDATE ON trials
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_trials();

CREATE FUNCTION det_internal.web_on_allocations() RETURNS trigger LANGUAGE plpgsql AS $$
-- Runs created or changed state: the queue (slots acquired), the cluster (slots held) and
-- their trials.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_internal.web_event('{queue,cluster}'::text[] || array_agg('experiment:' || t.experiment_id)
                              || array_agg('trial:' || t.id))
           FROM new_rows n LEFT JOIN trials t ON t.id = n.trial_id;
    ELSE
        PERFORM det_internal.web_event('{queue,cluster}'::text[] || array_agg('experiment:' || t.experiment_id)
                              || array_agg('trial:' || t.id))
           FROM new_rows n JOIN old_rows o ON o.id = n.id
           LEFT JOIN trials t ON t.id = n.trial_id
          WHERE o.state IS DISTINCT FROM n.state
         HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER allocations_web_insert AFTER INSERT ON allocations
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_allocations();
CREATE TRIGGER allocations_web_update AFTER UPDATE ON allocations
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_allocations();

CREATE FUNCTION det_internal.web_on_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
-- A job's priority, weight, position or pool changed (det_user.job_update).
BEGIN
    PERFORM det_internal.web_event('{queue}')
       FROM new_rows n JOIN old_rows o ON o.id = n.id
      WHERE (o.priority, o.weight, o.queue_position, o.resource_pool) IS DISTINCT FROM
            (n.priority, n.weight, n.queue_position, n.resource_pool)
     HAVING count(*) > 0;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_web_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_jobs();

CREATE FUNCTION det_internal.web_on_cluster() RETURNS trigger LANGUAGE plpgsql AS $$
-- Agents joined or changed state (enabled, disabled, lost); slots enabled or disabled.
-- Heartbeats (last_heartbeat) send nothing.
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM det_internal.web_event('{cluster,queue}');
    ELSIF TG_TABLE_NAME = 'agents' THEN
        PERFORM det_internal.web_event('{cluster,queue}')
           FROM new_rows n JOIN old_rows o ON o.id = n.id
          WHERE o.state IS DISTINCT FROM n.state
         HAVING count(*) > 0;
    ELSE
        PERFORM det_internal.web_event('{cluster,queue}')
           FROM new_rows n JOIN old_rows o ON (o.agent_id, o.slot_id) = (n.agent_id, n.slot_id)
          WHERE o.enabled IS DISTINCT FROM n.enabled
         HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER agents_web_insert AFTER INSERT ON agents
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_cluster();
CREATE TRIGGER agents_web_update AFTER UPDATE ON agents
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_cluster();
CREATE TRIGGER slots_web_update AFTER UPDATE ON slots
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_cluster();

CREATE FUNCTION det_internal.web_on_reports() RETURNS trigger LANGUAGE plpgsql AS $$
-- Metrics or log lines appended: one statement is one batch of a task's reports, and the
-- event per trial is throttled (det_internal.web_event_throttled).
BEGIN
    PERFORM det_internal.web_event_throttled(ARRAY['experiment:' || t.experiment_id,
        'trial:' || t.id])
       FROM trials t WHERE t.id IN (SELECT DISTINCT trial_id FROM new_rows);
    RETURN NULL;
END $$;

CREATE TRIGGER metrics_web_insert AFTER INSERT ON metrics
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_reports();
CREATE TRIGGER task_logs_web_insert AFTER INSERT ON task_logs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT WHEN (det_internal.web_watched())
        EXECUTE FUNCTION det_internal.web_on_reports();

-- =============================================================================================
-- Reporting views: a stable read model for users' own SQL.

CREATE SCHEMA reporting;
REVOKE ALL ON SCHEMA reporting FROM PUBLIC;
GRANT USAGE ON SCHEMA reporting TO det_user;

CREATE VIEW reporting.experiments WITH (security_invoker = true) AS
SELECT e.id, e.name, e.state, e.owner, e.progress, e.start_time, e.end_time, e.archived,
       e.searcher_name AS searcher,
       e.searcher_metric AS metric,
       (SELECT count(*) FROM trials t WHERE t.experiment_id = e.id) AS trials,
       (SELECT CASE WHEN e.smaller_is_better
                    THEN min(t.best_validation) ELSE max(t.best_validation) END
          FROM trials t WHERE t.experiment_id = e.id) AS best_validation,
       j.resource_pool, j.priority, j.weight, e.project_id, p.name AS project,
       p.workspace_id, w.name AS workspace
FROM experiments e JOIN jobs j ON j.id = e.job_id
JOIN projects p ON p.id = e.project_id JOIN workspaces w ON w.id = p.workspace_id;
GRANT SELECT ON reporting.experiments TO det_user;

CREATE VIEW reporting.trials WITH (security_invoker = true) AS
SELECT t.id, t.experiment_id, t.state, t.hparams, t.restarts, t.steps_completed,
       t.best_validation, t.latest_checkpoint, t.start_time, t.end_time, t.exit_reason,
       (SELECT m."values" FROM metrics m
         WHERE m.trial_id = t.id AND m."group" = 'validation' AND m.superseded_by IS NULL
         ORDER BY m.steps_completed DESC, m.id DESC LIMIT 1) AS latest_validation
FROM trials t;
GRANT SELECT ON reporting.trials TO det_user;

CREATE VIEW reporting.job_queue WITH (security_invoker = true) AS
-- Active jobs in scheduling order per pool, with slots acquired / needed and the scheduler's
-- reasons for what still waits. An interactive task is active while its run lives; its name
-- is its description. An unmanaged experiment (core_v2) is no job: det schedules nothing of it.
SELECT j.id AS job_id, j.type, j.resource_pool, j.priority, j.weight, j.owner, j.submitted_at,
       j.queue_position, e.id AS experiment_id, coalesce(e.name, t.description) AS name,
       e.state::text AS experiment_state,
       coalesce(sum(a.slots_needed) FILTER (WHERE a.state > 'PENDING'), 0) AS slots_acquired,
       -- an active job with no run yet (the reconciler has not created one) still needs
       -- one trial's slots
       CASE WHEN count(a.id) = 0 AND e.state = 'ACTIVE'
            THEN e.slots_per_trial
            ELSE coalesce(sum(a.slots_needed), 0) END AS slots_needed,
       CASE WHEN bool_or(a.state > 'PENDING') THEN 'STATE_SCHEDULED'
            ELSE 'STATE_QUEUED' END AS status,
       -- the scheduler's reasons, then what the pool's provider says of what the job still
       -- waits for: the Slurm job of each of its waiting runs (state and reason in Slurm's
       -- queue), or an elastic pool's instances not yet running
       nullif(concat_ws(' | ',
           string_agg(DISTINCT a.pending_reason, ' | ') FILTER (WHERE a.state = 'PENDING'),
           CASE WHEN bool_or(a.state = 'PENDING') THEN
               (SELECT string_agg(i.provider_state, ' | ' ORDER BY i.id) FROM instances i
                 WHERE i.resource_pool = j.resource_pool AND i.state < 'RUNNING'
                   AND i.provider_state <> ''
                   AND (i.allocation_id IS NULL
                        OR i.allocation_id IN (SELECT x.id FROM allocations x
                                                WHERE x.job_id = j.id
                                                  AND x.state = 'PENDING'))) END),
           '') AS pending_reason,
       row_number() OVER (PARTITION BY j.resource_pool
                          ORDER BY j.priority, j.queue_position, j.id) - 1 AS queue_order
FROM jobs j
LEFT JOIN experiments e ON e.job_id = j.id
LEFT JOIN tasks t ON t.job_id = j.id
LEFT JOIN allocations a ON a.job_id = j.id AND a.state <> 'TERMINATED'
WHERE (e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') AND NOT e.unmanaged)
   OR (t.job_id IS NOT NULL AND a.id IS NOT NULL)
GROUP BY j.id, e.id, t.job_id;
GRANT SELECT ON reporting.job_queue TO det_user;

CREATE VIEW reporting.tasks WITH (security_invoker = true) AS
-- Every interactive task (command, notebook, shell, TensorBoard) with its one run: its state
-- (the run's allocation_state), owner, workspace, when it was submitted, started (its process
-- or container running) and ended, how long since its last use while it runs
-- (idle_seconds, from tasks.last_activity), why it ended (det's reason over the run's), and
-- the host:port its server answers on. config has its secrets redacted.
SELECT t.job_id AS id, t.type AS kind, a.state::text AS state,
       a.desired_state::text AS desired_state, j.owner, w.name AS workspace,
       p.name AS project, t.description, j.resource_pool, j.priority, j.weight,
       a.slots_needed AS slots, j.submitted_at, a.running_at AS started, a.ended_at AS ended,
       t.last_activity,
       CASE WHEN a.state = 'RUNNING'
            THEN extract(epoch FROM now() - greatest(t.last_activity, a.running_at))::float8
       END AS idle_seconds,
       coalesce(t.end_reason, a.storage_error, a.exit_reason) AS end_reason, a.exit_code,
       a.address, a.agent_id, a.pending_reason, t.experiment_ids, t.trial_ids,
       a.id AS allocation_id, det_user.redact_secrets(t.config) AS config
FROM tasks t
JOIN jobs j ON j.id = t.job_id
JOIN projects p ON p.id = t.project_id
JOIN workspaces w ON w.id = p.workspace_id
LEFT JOIN LATERAL (
    SELECT x.id, x.state, x.desired_state, x.slots_needed, x.running_at, x.ended_at,
           x.storage_error, x.exit_reason, x.exit_code, x.address, x.agent_id,
           x.pending_reason
      FROM allocations x WHERE x.job_id = t.job_id ORDER BY x.run DESC LIMIT 1) a ON true;
GRANT SELECT ON reporting.tasks TO det_user;

CREATE VIEW reporting.slot_usage WITH (security_invoker = true) AS
-- The slots of agents not gone for good (agents.gone_at), each with the run holding it.
SELECT s.agent_id, s.slot_id, s.type, s.device_name, s.enabled, ag.resource_pool,
       ag.state AS agent_state, hs.allocation_id, a.trial_id, s.device_uuid, s.memory_mb
FROM slots s
JOIN agents ag ON ag.id = s.agent_id AND ag.gone_at IS NULL
LEFT JOIN allocation_slots hs ON hs.agent_id = s.agent_id AND hs.slot_id = s.slot_id
                             AND NOT hs.released
LEFT JOIN allocations a ON a.id = hs.allocation_id;
GRANT SELECT ON reporting.slot_usage TO det_user;

CREATE VIEW reporting.checkpoints WITH (security_invoker = true) AS
-- Every checkpoint with its state (COMPLETED, DELETING, DELETED), size and the bytes its
-- deletion freed.
SELECT c.uuid, t.experiment_id, c.trial_id, c.steps_completed, c.state,
       (SELECT sum(r.value::bigint) FROM jsonb_each_text(c.resources) r)::bigint AS size_bytes,
       c.freed_bytes, c.reported_at, c.deleted_at, c.storage ->> 'type' AS storage_type
FROM checkpoints c JOIN trials t ON t.id = c.trial_id;
GRANT SELECT ON reporting.checkpoints TO det_user;

CREATE VIEW reporting.models WITH (security_invoker = true) AS
-- The model registry: each model with its number of versions and its latest version.
SELECT m.id, m.name, m.description, m.labels, m.metadata, m.notes, m.owner, m.archived,
       m.creation_time, m.last_updated_time,
       count(v.id) AS num_versions, max(v.version) AS latest_version
FROM models m LEFT JOIN model_versions v ON v.model_id = m.id
GROUP BY m.id;
GRANT SELECT ON reporting.models TO det_user;

CREATE VIEW reporting.model_versions WITH (security_invoker = true) AS
-- Every model version with the checkpoint it pins: where it came from (trial, experiment,
-- batches), its size in bytes and the validation metrics reported at its step.
SELECT v.id, v.model_id, m.name AS model_name, v.version, v.name, v.notes, v.labels,
       v.metadata, v.owner, v.creation_time, v.last_updated_time, v.checkpoint_uuid,
       c.state AS checkpoint_state, c.trial_id, t.experiment_id, c.steps_completed,
       (SELECT sum(r.value::bigint)::bigint FROM jsonb_each_text(c.resources) r) AS size_bytes,
       (SELECT x."values" FROM metrics x
         WHERE x.trial_id = c.trial_id AND x."group" = 'validation'
           AND x.steps_completed = c.steps_completed AND x.superseded_by IS NULL
         ORDER BY x.id DESC LIMIT 1) AS validation_metrics
FROM model_versions v
JOIN models m ON m.id = v.model_id
JOIN checkpoints c ON c.uuid = v.checkpoint_uuid
JOIN trials t ON t.id = c.trial_id;
GRANT SELECT ON reporting.model_versions TO det_user;

CREATE VIEW reporting.templates WITH (security_invoker = true) AS
-- Configuration templates with their secrets replaced by '********', and their
-- workspace's name.
SELECT t.workspace_id, w.name AS workspace, t.name, t.owner, t.created_at, t.updated_at,
       t.redacted_config AS config, t.redacted_original AS original
FROM templates t JOIN workspaces w ON w.id = t.workspace_id;
GRANT SELECT ON reporting.templates TO det_user;

-- Cluster historical usage.
CREATE VIEW reporting.slot_hours WITH (security_invoker = true) AS
-- Slot-hours each run (allocation) held, one row per UTC day it held slots: its slots times
-- the part of [assigned_at, ended_at) in that day, ended_at being now() while it runs (a run
-- holds its slots from its assignment, image pull and start included, as Determined counts an
-- allocation). A run never assigned held nothing. With its job's type, owner, workspace and
-- pool, its experiment's labels ('{}' for a task or an unlabelled experiment), and the run's
-- assigned_at and ended_at (a query for a period filters on them before days are made).
SELECT s.day, s.allocation_id, s.job_id, s.job_type, s.trial_id, s.experiment_id, s.username,
       s.workspace, s.resource_pool, s.labels, s.slots, s.assigned_at, s.ended_at,
       s.slots * extract(epoch FROM least(s.until, s.day + 1) - greatest(s.since, s.day))::float8
           / 3600 AS slot_hours
FROM (
    SELECT d.day::date AS day, a.id AS allocation_id, a.job_id, j.type AS job_type, a.trial_id,
           e.id AS experiment_id, j.owner AS username, w.name AS workspace, a.resource_pool,
           coalesce(ARRAY(SELECT jsonb_array_elements_text(e.config -> 'labels')), '{}')
               AS labels,
           a.slots_needed AS slots, a.assigned_at, a.ended_at,
           a.assigned_at AT TIME ZONE 'UTC' AS since,
           coalesce(a.ended_at, now()) AT TIME ZONE 'UTC' AS until
    FROM allocations a
    JOIN jobs j ON j.id = a.job_id
    JOIN workspaces w ON w.id = j.workspace_id
    LEFT JOIN experiments e ON e.job_id = j.id
    CROSS JOIN LATERAL generate_series(date_trunc('day', a.assigned_at AT TIME ZONE 'UTC'),
                                       coalesce(a.ended_at, now()) AT TIME ZONE 'UTC',
                                       interval '1 day') d (day)
    WHERE a.assigned_at IS NOT NULL
) s;
GRANT SELECT ON reporting.slot_hours TO det_user;

CREATE FUNCTION det_user.cluster_usage(p_start date, p_end date, p_group_by text)
RETURNS TABLE (day date, "group" text, slot_hours double precision)
LANGUAGE plpgsql STABLE AS $$
-- Slot-hours per UTC day from p_start to p_end (both included) and per group: p_group_by is
-- workspace, user, label or pool. A run with several labels counts in each ('label' totals
-- may exceed the cluster's); a run with none is in the group NULL. Days and groups with no
-- usage have no row. Runs as its caller: a user sees the runs of the workspaces they may view
-- (reporting.slot_hours under row-level security). Raises invalid_parameter_value naming the
-- argument for an unknown grouping, a missing date or an end before the start.
BEGIN
    IF p_group_by IS NULL OR p_group_by NOT IN ('workspace', 'user', 'label', 'pool') THEN
        RAISE EXCEPTION 'group_by: expected workspace, user, label or pool, got %',
            coalesce(p_group_by, 'nothing') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_start IS NULL OR p_end IS NULL THEN
        RAISE EXCEPTION '%: a date is required', CASE WHEN p_start IS NULL THEN 'start'
                                                      ELSE 'end' END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_end < p_start THEN
        RAISE EXCEPTION 'end: % is before start %', p_end, p_start
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    SELECT u.day, g.name, sum(u.slot_hours)
      FROM reporting.slot_hours u
      CROSS JOIN LATERAL (
          SELECT CASE p_group_by WHEN 'workspace' THEN u.workspace WHEN 'user' THEN u.username
                                 WHEN 'pool' THEN u.resource_pool END AS name
           WHERE p_group_by <> 'label'
          UNION ALL
          SELECT l FROM unnest(CASE WHEN u.labels = '{}' THEN '{NULL}'::text[]
                                    ELSE u.labels END) l
           WHERE p_group_by = 'label') g
     WHERE u.day BETWEEN p_start AND p_end AND u.slot_hours > 0
       -- the runs that overlap the period, before their days are made (14 days of 100,000 runs:
       -- 0.83 s -> 0.24 s)
       AND u.assigned_at < (p_end + 1)::timestamp AT TIME ZONE 'UTC'
       AND (u.ended_at IS NULL OR u.ended_at > p_start::timestamp AT TIME ZONE 'UTC')
     GROUP BY u.day, g.name
     ORDER BY u.day, g.name NULLS LAST;
END $$;
GRANT EXECUTE ON FUNCTION det_user.cluster_usage(date, date, text) TO det_user;

-- =============================================================================================
-- Row-level security
--
-- A user sees a workspace's rows when a role of theirs (or of a group of theirs) lets
-- them view it. The workspace is read from the row's job (jobs, allocations and
-- what hangs off them) or project (experiments and what hangs off them); a constraint
-- trigger keeps the two in agreement. `(SELECT det_user.visible_workspaces())` (and
-- det_user.visible_projects) is computed once per query.
ALTER TABLE workspaces ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON workspaces FOR SELECT
    USING (id = ANY ((SELECT det_user.visible_workspaces())::integer[]));
ALTER TABLE workspace_pools ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON workspace_pools FOR SELECT
    USING (workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));
ALTER TABLE projects ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON projects FOR SELECT
    USING (workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));
ALTER TABLE role_assignments ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON role_assignments FOR SELECT
    USING (workspace_id IS NULL
        OR workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));
ALTER TABLE jobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON jobs FOR SELECT
    USING (workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));
ALTER TABLE experiments ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON experiments FOR SELECT
    USING (project_id = ANY ((SELECT det_user.visible_projects())::integer[]));
ALTER TABLE context_blobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON context_blobs FOR SELECT
    USING (id IN (SELECT context_id FROM experiments));
ALTER TABLE trials ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON trials FOR SELECT
    USING (experiment_id IN (SELECT id FROM experiments));
ALTER TABLE searcher_ops ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON searcher_ops FOR SELECT
    USING (trial_id IN (SELECT id FROM trials));
ALTER TABLE allocations ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON allocations FOR SELECT
    USING (job_id IN (SELECT id FROM jobs));
ALTER TABLE metrics ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON metrics FOR SELECT
    USING (trial_id IN (SELECT id FROM trials));
ALTER TABLE checkpoints ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON checkpoints FOR SELECT
    USING (trial_id IN (SELECT id FROM trials));
ALTER TABLE task_logs ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON task_logs FOR SELECT
    USING (allocation_id IN (SELECT id FROM allocations));
ALTER TABLE tasks ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON tasks FOR SELECT USING (job_id IN (SELECT id FROM jobs));
ALTER TABLE models ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON models FOR SELECT
    USING (workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));
ALTER TABLE model_versions ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON model_versions FOR SELECT
    USING (model_id IN (SELECT id FROM models));
ALTER TABLE templates ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON templates FOR SELECT
    USING (workspace_id = ANY ((SELECT det_user.visible_workspaces())::integer[]));
ALTER TABLE audit_log ENABLE ROW LEVEL SECURITY;
CREATE POLICY cluster_admins ON audit_log FOR SELECT
    USING ((SELECT det_user.permitted(det_user.caller(), 'admin_cluster', NULL)));

-- Reads of the agent: det_agent holds no table privileges.
CREATE FUNCTION det_agent.assignments(p_agent text)
RETURNS TABLE (id bigint, desired text, state text, spec jsonb, chief text, node_state text,
               slot_ids integer[], spans boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- An agent's work: the live allocations it is the chief of, and those it holds slots of as
-- another node of a gang (node_state: its share's state once claimed, else NULL). slot_ids:
-- the slots it holds there; spans: whether the allocation holds slots of other agents too.
#variable_conflict use_column
BEGIN
    PERFORM det_internal.agent_check_self(p_agent);
    RETURN QUERY
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
END $$;
GRANT EXECUTE ON FUNCTION det_agent.assignments(text) TO det_agent;

CREATE FUNCTION det_agent.live_allocations(p_agent text)
RETURNS TABLE (id bigint, last_log timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The live allocations an agent is the chief of, with the time of their last shipped log
-- line: what a restarted agent adopts and where its log shipping resumes.
SELECT det_internal.agent_check_self(p_agent);
SELECT a.id, (SELECT l.ts FROM task_logs l WHERE l.allocation_id = a.id
               ORDER BY l.id DESC LIMIT 1)
  FROM allocations a
 WHERE a.agent_id = p_agent AND a.state <> 'TERMINATED';
$$;
GRANT EXECUTE ON FUNCTION det_agent.live_allocations(text) TO det_agent;

CREATE FUNCTION det_agent.context(p_agent text, p_context bigint) RETURNS bytea
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The packed model definition an agent unpacks for a run: only a context that a live
-- allocation of this agent (its chief's, or one it holds slots of) launches; NULL otherwise.
SELECT det_internal.agent_check_self(p_agent);
SELECT b.data
  FROM context_blobs b
 WHERE b.id = p_context
   AND EXISTS (SELECT 1 FROM allocations a
                WHERE a.state <> 'TERMINATED' AND (a.spec ->> 'context_id')::bigint = b.id
                  AND (a.agent_id = p_agent
                       OR a.id IN (SELECT h.allocation_id FROM allocation_slots h
                                    WHERE h.agent_id = p_agent AND NOT h.released)));
$$;
GRANT EXECUTE ON FUNCTION det_agent.context(text, bigint) TO det_agent;

CREATE FUNCTION det.schema_version() RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The newest migration this database applied (db/migrate.py records them): a client that
-- knows a newer one tells its user to run `det cluster up`, which migrates.
BEGIN
    RETURN (SELECT max(version) FROM det_migrations);
END $$;
GRANT EXECUTE ON FUNCTION det.schema_version() TO det_user, det_agent, det_web;

-- Permission to create an experiment, checked before its context is unpacked.
CREATE FUNCTION det_user.experiment_create_check(p_workspace text, p_project text) RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Check that the caller may create an experiment in project p_project of workspace
-- p_workspace (both NULL: Uncategorized): Editor of the workspace, neither it nor the project
-- archived, the rules det_user.create_experiment applies when it stores one. det serve calls it
-- before it unpacks a byte of the context (so a refused Viewer's context is never
-- unpacked). Returns the project's id. Raises insufficient_privilege, no_data_found (a
-- workspace or project the caller cannot see), check_violation (archived) or
-- invalid_parameter_value (only one of the two named).
DECLARE
    p projects;
BEGIN
    IF (p_workspace IS NULL) <> (p_project IS NULL) THEN
        RAISE EXCEPTION 'workspace and project: give both or neither (neither: Uncategorized)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_workspace IS NULL THEN
        SELECT * INTO p FROM projects WHERE id = 1;
    ELSE
        p := det_user.project_find(p_workspace, p_project);
    END IF;
    PERFORM det_internal.require('edit', p.workspace_id,
                        format('create an experiment in project %s', to_jsonb(p.name)));
    IF p.archived OR (SELECT archived FROM workspaces WHERE id = p.workspace_id) THEN
        RAISE EXCEPTION 'project %: it (or its workspace) is archived', to_jsonb(p.name)
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN p.id;
END $$;
GRANT EXECUTE ON FUNCTION det_user.experiment_create_check(text, text) TO det_user;

-- Validation rows are recorded for the searcher, which decides what each means
-- (det.reconciler.searchers: under adaptive ASHA's time_metric, Determined 0.38's form, a
-- result at the time metric's value; otherwise nothing).

CREATE FUNCTION det_internal.validation_reported() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- A validation row of a trial of a searched experiment (not an unmanaged one: it has no
-- searcher) is a validation_reported event naming the row ({"metrics_id": id}): the pass
-- reads the row's values with the event rather than a copy, as consumed events are kept and
-- most searches read nothing of them.
BEGIN
    INSERT INTO searcher_events (experiment_id, trial_id, kind, payload)
    SELECT t.experiment_id, t.id, 'validation_reported', jsonb_build_object('metrics_id', NEW.id)
      FROM trials t JOIN experiments e ON e.id = t.experiment_id
     WHERE t.id = NEW.trial_id AND NOT e.unmanaged;
    IF FOUND THEN
        PERFORM pg_notify(det_internal.channel('reconciler', ''), 'searcher');
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER metrics_validation_reported AFTER INSERT ON metrics
    FOR EACH ROW WHEN (NEW."group" = 'validation')
        EXECUTE FUNCTION det_internal.validation_reported();

-- Trial metadata (Determined 0.38's TrainContext.set_metadata / get_metadata).

CREATE FUNCTION det_internal.merge_metadata(p_current jsonb, p_addition jsonb,
    p_path text DEFAULT '')
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE SET search_path = public, pg_temp AS $$
-- p_addition merged into p_current (both objects): objects merge key by key, a new key is
-- added, and a key that already holds another value is refused, naming its dotted path (the
-- reference's run metadata never overwrites a key). Setting a key to the value it holds is a
-- no-op, so a call retried after a lost commit acknowledgement succeeds.
DECLARE
    k text;
    v jsonb;
    v_path text;
BEGIN
    FOR k, v IN SELECT * FROM jsonb_each(p_addition) LOOP
        v_path := CASE WHEN p_path = '' THEN k ELSE p_path || '.' || k END;
        IF NOT p_current ? k OR p_current -> k = v THEN
            p_current := jsonb_set(p_current, ARRAY[k], v);
        ELSIF jsonb_typeof(v) = 'object' AND jsonb_typeof(p_current -> k) = 'object' THEN
            p_current := jsonb_set(p_current, ARRAY[k],
                                   det_internal.merge_metadata(p_current -> k, v, v_path));
        ELSE
            RAISE EXCEPTION 'metadata key "%" is already set (to %); a key cannot be changed',
                v_path, p_current -> k USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    RETURN p_current;
END $$;

CREATE FUNCTION det_task.set_trial_metadata(p_token text, p_metadata jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Merge p_metadata (an object) into the calling trial's metadata (det_internal.merge_metadata);
-- returns the trial's metadata after it. Refused (invalid_parameter_value): p_metadata not
-- an object, over 64 KiB or nested deeper than 32 levels (det_internal.json_problem), or a merged
-- metadata over 1 MiB.
DECLARE
    a allocations := det_internal.auth(p_token);
    v_problem text := det_internal.json_problem(p_metadata, 65536);
    v_merged jsonb;
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'metadata %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE trials SET metadata = det_internal.merge_metadata(metadata, p_metadata)
     WHERE id = a.trial_id RETURNING metadata INTO v_merged;
    IF octet_length(v_merged::text) > 1048576 THEN
        RAISE EXCEPTION 'metadata: the trial''s metadata would be % bytes of JSON, more than '
            'the % allowed', octet_length(v_merged::text), 1048576
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN v_merged;
END $$;
GRANT EXECUTE ON FUNCTION det_task.set_trial_metadata(text, jsonb) TO det_task;

CREATE FUNCTION det_task.trial_metadata(p_token text) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The calling trial's metadata.
    SELECT metadata FROM trials WHERE id = (det_internal.auth(p_token)).trial_id;
$$;
GRANT EXECUTE ON FUNCTION det_task.trial_metadata(text) TO det_task;
