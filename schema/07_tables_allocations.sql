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
