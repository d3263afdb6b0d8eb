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
