-- The reconciler's statements: its leader's session, then one pass's in pass order
-- (docs/architecture.md, "The reconciler pass"; det.reconciler.passes), then what the leader
-- runs between passes, and the leadership status others read.
--
-- Each statement of the pass is level-triggered: it selects rows by their current state, so
-- running it again after it succeeded changes nothing. Parameters are named. Config values are
-- read from the expanded config (experiments.config), where det.configs filled every default
-- once; nothing here supplies a default again.
--
-- Rows the pass reads to change are locked FOR NO KEY UPDATE, never FOR UPDATE: the pass
-- changes no key, and the stronger lock made every foreign-key check on those rows wait for
-- the pass to commit (a task's det_task.complete_op inserting its searcher event waited ~5 ms a
-- check on the experiment, bench/toy_search.py on pg15 with pg_stat_statements).
--
-- The statements that take arrays (one element a row) are sent by det.reconciler.batch.Writes:
-- one statement for all the objects of a pass.

-- name: hold_lease
-- The leader's lease: the server ends the session after this many milliseconds without a
-- statement, idle or idle in a transaction, and the leader lock with it (PostgreSQL >= 14).
SELECT set_config('idle_session_timeout', %s, false),
       set_config('idle_in_transaction_session_timeout', %s, false)

-- name: try_lead
-- Leadership is a session advisory lock on the connection that runs every pass.
SELECT pg_try_advisory_lock(%s) AS ok

-- name: session_settings
-- The planner's cost of a random page read for the leader's session (PostgreSQL's default,
-- 4, is a disk's). det's tables are small and hot, in shared buffers, where an index probe
-- costs about what a sequential read does. At the default, a pass joined its 1,000 queued runs
-- to their jobs by reading every job ever submitted (the scheduler's input and the fallback
-- look: 28 and 23 ms a pass over 100,000 ended experiments); at 1.1 it probes the
-- jobs it needs, and still reads the whole table where most jobs are queued.
SET random_page_cost = 1.1

-- name: expire_agents
-- 1. Agents.
-- Agents silent for longer than the timeout are lost (docs/architecture.md, "The reconciler pass").
-- Silence is counted from the database server's start at the earliest: after a long outage
-- (the server down, every heartbeat old) agents get the timeout to beat again rather than all
-- being declared lost at once by the first pass.
UPDATE agents SET state = 'LOST'
 WHERE state <> 'LOST'
   AND greatest(last_heartbeat, pg_postmaster_start_time())
       < now() - make_interval(secs => %(timeout)s)
RETURNING id

-- name: end_lost_allocations
-- Runs on lost agents end with no exit code: the settle step counts them as failures (but a
-- planned stop's, see allocations.planned_stop). A gang spanning agents ends when any of its
-- agents is lost. Found from the lost agents (one IN over a UNION, which the
-- planner can join from), not by testing every live run. The old process may live on (a
-- frozen agent cannot kill it): its trial gets no new run for fence seconds
-- (allocations.fenced_until, honoured by create_allocations).
UPDATE allocations a SET state = 'TERMINATED', exit_reason = 'agent lost', ended_at = now(),
       fenced_until = now() + make_interval(secs => %(fence)s)
 WHERE a.state <> 'TERMINATED'
   AND a.id IN (SELECT x.id FROM agents g JOIN allocations x ON x.agent_id = g.id
                 WHERE g.state = 'LOST' AND x.state <> 'TERMINATED'
                UNION
                SELECT h.allocation_id FROM agents g JOIN allocation_slots h
                    ON h.agent_id = g.id AND NOT h.released
                 WHERE g.state = 'LOST')
RETURNING a.id

-- name: release_slots
-- The slots of ended runs are free again.
UPDATE allocation_slots s SET released = true
  FROM allocations a
 WHERE a.id = s.allocation_id AND a.state = 'TERMINATED' AND NOT s.released

-- name: unsettled_runs
-- 2. Settle ended runs.
SELECT a.id AS allocation_id, a.exit_code,
       concat_ws('; ', a.stop_reason, coalesce(a.storage_error, a.exit_reason)) AS exit_reason,
       a.storage_error, t.id AS trial_id,
       t.experiment_id, t.state::text AS trial_state, t.restarts,
       a.desired_state <> 'RUNNING' AS stop_requested,
       a.out_of_work, a.planned_stop,
       EXISTS (SELECT 1 FROM searcher_ops o WHERE o.trial_id = t.id AND NOT o.completed)
           AS open_op,
       e.max_restarts
  FROM allocations a
  JOIN trials t ON t.id = a.trial_id
  JOIN experiments e ON e.id = t.experiment_id
 WHERE a.state = 'TERMINATED' AND NOT a.settled
 ORDER BY a.id
   FOR NO KEY UPDATE OF a, t

-- name: update_settled_trials
-- Each settled run's trial: its state, restarts and whether the searcher closed it.
UPDATE trials t SET state = x.state::trial_state, restarts = x.restarts,
       closed = t.closed OR x.close,
       end_time = CASE WHEN x.state IN ${TERMINAL} THEN now() END
  FROM unnest(%(trial_id)s::integer[], %(state)s::text[], %(restarts)s::integer[],
              %(close)s::boolean[]) AS x(trial_id, state, restarts, close)
 WHERE t.id = x.trial_id

-- name: mark_settled
-- Runs whose end has been settled: no later pass reads them again.
UPDATE allocations SET settled = true WHERE id = ANY(%(allocation_id)s::bigint[])

-- name: pause_for_storage_error
-- A run's checkpoint storage error pauses its experiment, with the reason (settle's rule).
UPDATE experiments e SET state = 'PAUSED', paused_reason = x.reason
  FROM unnest(%(experiment_id)s::integer[], %(reason)s::text[]) AS x(experiment_id, reason)
 WHERE e.id = x.experiment_id AND e.state = 'ACTIVE'

-- name: settle_failed
-- Settling a run raised: the run is marked settled and its trial ends in error with the reason
-- (a stopping trial in its terminal state), so one bad row cannot stall every later pass.
WITH settled AS (
    UPDATE allocations SET settled = true WHERE id = %(allocation_id)s
), event AS (
    INSERT INTO searcher_events (experiment_id, trial_id, kind, payload)
    VALUES (%(experiment_id)s, %(trial_id)s, 'trial_exited_early', '{"reason": "errored"}')
)
UPDATE trials
   SET state = CASE WHEN state::text LIKE 'STOPPING\_%%' THEN det_user.stopped_state(state::text)
                    ELSE 'ERROR' END::trial_state,
       exit_reason = 'det could not settle run ' || %(allocation_id)s || ': ' || %(message)s,
       end_time = now()
 WHERE id = %(trial_id)s AND state NOT IN ${TERMINAL}

-- name: insert_searcher_events
-- In the order given: the searcher reads events in id order.
INSERT INTO searcher_events (experiment_id, trial_id, kind, payload)
SELECT x.experiment_id, x.trial_id, x.kind, x.payload
  FROM unnest(%(experiment_id)s::integer[], %(trial_id)s::integer[], %(kind)s::text[],
              %(payload)s::jsonb[]) WITH ORDINALITY AS x(experiment_id, trial_id, kind, payload, i)
 ORDER BY x.i

-- name: log_decisions
-- Lines in the trials' logs saying what det decided, so `det trial logs` tells the whole story.
INSERT INTO task_logs (allocation_id, trial_id, stream, line)
SELECT x.allocation_id, x.trial_id, 'det', x.line
  FROM unnest(%(allocation_id)s::bigint[], %(trial_id)s::integer[], %(line)s::text[])
       WITH ORDINALITY AS x(allocation_id, trial_id, line, i)
 ORDER BY x.i

-- name: settle_task_runs
-- 2b. Interactive tasks.
-- A task's one run is no trial's: it ends once, is never restarted, and unsettled_runs (which
-- joins trials) never sees it. Its end is settled here, as a GC task's is, and the task keeps
-- why it ended: det's own reason if det ended it (det_user.task_kill, end_tasks), else the run's
-- exit. Found from the unsettled runs (allocations_unsettled), one probe of tasks each.
WITH ended AS (
    UPDATE allocations a SET settled = true
     WHERE a.state = 'TERMINATED' AND NOT a.settled AND a.trial_id IS NULL
       AND EXISTS (SELECT 1 FROM tasks k WHERE k.job_id = a.job_id)
    RETURNING a.job_id, a.exit_code, a.exit_reason
), reasons AS (
    UPDATE tasks k
       SET end_reason = CASE WHEN d.exit_code IS NULL
                             THEN coalesce(d.exit_reason, 'ended with no exit code')
                             ELSE 'exited with code ' || d.exit_code
                                  || coalesce(' (' || d.exit_reason || ')', '') END
      FROM ended d
     WHERE k.job_id = d.job_id AND k.end_reason IS NULL
)
SELECT count(*) AS n FROM ended

-- name: live_task_runs
-- The running notebooks, shells and TensorBoards still wanted, with what det.reconciler.tasks
-- decides their end from, and the transaction's time to measure against (the clock
-- last_activity is written by). Found from the partial index allocations_tasks_running.
SELECT a.id, k.type, k.idle_timeout, k.last_activity,
       a.running_at, a.address, now() AS now
  FROM allocations a JOIN tasks k ON k.job_id = a.job_id
 WHERE a.trial_id IS NULL AND a.state = 'RUNNING' AND a.desired_state = 'RUNNING'
   AND k.type IN ('NOTEBOOK', 'SHELL', 'TENSORBOARD')
 ORDER BY a.id

-- name: end_tasks
-- det ends these runs, each with its reason: desired STOPPED, which the task's harness
-- (det.harness.interactive) hears through det_task.should_preempt and answers by shutting its
-- server down cleanly (Jupyter stops its kernels) and exiting 0; one still running
-- grace seconds later is killed (kill_overdue_tasks). The reason is kept on the
-- task unless a user's kill came first, and written to the task's log.
WITH ended AS (
    UPDATE allocations a SET desired_state = 'STOPPED',
           stop_requested_at = coalesce(a.stop_requested_at, now()),
           stop_reason = coalesce(a.stop_reason, x.reason)
      FROM unnest(%(id)s::bigint[], %(reason)s::text[]) AS x(id, reason)
     WHERE a.id = x.id AND a.state <> 'TERMINATED' AND a.desired_state = 'RUNNING'
    RETURNING a.id, a.job_id, a.agent_id, x.reason
), reasons AS (
    UPDATE tasks k SET end_reason = coalesce(k.end_reason, e.reason)
      FROM ended e WHERE k.job_id = e.job_id
), logged AS (
    INSERT INTO task_logs (allocation_id, stream, line)
    SELECT e.id, 'det', 'det ends the task: ' || e.reason FROM ended e
)
SELECT id, agent_id FROM ended

-- name: kill_overdue_tasks
-- A task asked to stop (end_tasks, or a planned stop: det_user.agent_drain) has no checkpoint to
-- write; one still running grace seconds after the request (a hung server, a command,
-- which nothing asks to exit) is killed, as a trial's run is after its preemption_timeout
-- (kill_overdue). From allocations_stopping.
UPDATE allocations a SET desired_state = 'KILLED',
       stop_reason = concat_ws('; ', a.stop_reason, 'killed: still running '
                               || %(grace)s::float8 || ' s after it was asked to stop')
 WHERE a.desired_state = 'STOPPED' AND a.state <> 'TERMINATED' AND a.trial_id IS NULL
   AND a.stop_requested_at < now() - make_interval(secs => %(grace)s)
   AND EXISTS (SELECT 1 FROM tasks k WHERE k.job_id = a.job_id)
RETURNING a.id, a.agent_id

-- name: pause_trials
-- 3. Experiment state drives trial state, trial state drives desired state.
-- A paused experiment pauses its active trials.
UPDATE trials t SET state = 'PAUSED' FROM experiments e
 WHERE e.id = t.experiment_id AND e.state = 'PAUSED' AND t.state = 'ACTIVE'

-- name: activate_trials
-- An activated experiment activates its paused trials.
UPDATE trials t SET state = 'ACTIVE' FROM experiments e
 WHERE e.id = t.experiment_id AND e.state = 'ACTIVE' AND t.state = 'PAUSED'

-- name: stop_trials
-- A stopping experiment stops its live trials; a kill overrides a cancel.
UPDATE trials t SET state = e.state::text::trial_state FROM experiments e
 WHERE e.id = t.experiment_id
   AND e.state IN ('STOPPING_COMPLETED', 'STOPPING_CANCELED', 'STOPPING_KILLED', 'STOPPING_ERROR')
   AND (t.state IN ('ACTIVE', 'PAUSED')
        OR (e.state = 'STOPPING_KILLED'
            AND t.state IN ('STOPPING_COMPLETED', 'STOPPING_CANCELED', 'STOPPING_ERROR')))

-- name: escalate_desired
-- Desired state only escalates: RUNNING -> STOPPED (checkpoint and exit) -> KILLED. Only a
-- live trial that is not ACTIVE, or is closed, wants its run stopped (a trial ends only once
-- it has no live run: settle and the finishing steps wait for that), so the look starts from
-- those few trials (trials_live, trials_closed_live), not from every live run. Each stop says
-- why (allocations.stop_reason; a kill's over an earlier stop's).
WITH want AS (
    SELECT a.id,
           CASE WHEN t.state = 'STOPPING_KILLED' THEN 'KILLED'
                WHEN t.state <> 'ACTIVE' OR t.closed THEN 'STOPPED'
                ELSE 'RUNNING' END::desired_state AS desired,
           CASE t.state WHEN 'STOPPING_KILLED' THEN 'killed: its experiment was killed'
                        WHEN 'PAUSED' THEN 'paused: its experiment was paused'
                        WHEN 'STOPPING_CANCELED' THEN 'canceled: its experiment was canceled'
                        WHEN 'STOPPING_ERROR' THEN 'stopped: its experiment failed'
                        WHEN 'STOPPING_COMPLETED'
                            THEN 'stopped: its experiment''s search completed'
                        ELSE 'stopped: the searcher closed the trial' END AS why
      FROM trials t JOIN allocations a ON a.trial_id = t.id
     WHERE a.state <> 'TERMINATED'
       AND (t.state IN ('PAUSED', 'STOPPING_COMPLETED', 'STOPPING_CANCELED', 'STOPPING_KILLED',
                        'STOPPING_ERROR')
            OR (t.closed AND t.state < 'COMPLETED'))
)
UPDATE allocations a SET desired_state = w.desired,
       stop_requested_at = coalesce(a.stop_requested_at, now()),
       stop_reason = CASE WHEN w.desired = 'KILLED' THEN w.why
                          ELSE coalesce(a.stop_reason, w.why) END
  FROM want w
 WHERE w.id = a.id AND w.desired > a.desired_state
RETURNING a.id, a.agent_id

-- name: end_unstarted
-- A run told to stop before any agent took it simply ends; that is not a failure.
UPDATE allocations SET state = 'TERMINATED', exit_code = 0,
       exit_reason = 'stopped before it started', ended_at = now()
 WHERE state = 'PENDING' AND desired_state <> 'RUNNING'

-- name: kill_overdue
-- A task that ignores the stop request past preemption_timeout seconds is killed.
UPDATE allocations a SET desired_state = 'KILLED',
       stop_reason = concat_ws('; ', a.stop_reason, 'killed: still running '
                               || e.preemption_timeout
                               || ' s after it was asked to stop (preemption_timeout)')
  FROM trials t JOIN experiments e ON e.id = t.experiment_id
 WHERE t.id = a.trial_id AND a.desired_state = 'STOPPED' AND a.state <> 'TERMINATED'
   AND a.stop_requested_at < now() - make_interval(
           secs => e.preemption_timeout)
RETURNING a.id, a.agent_id

-- name: finish_closed_trials
-- 4. Trials the searcher closed, once their last run is over.
UPDATE trials t
   SET state = CASE WHEN t.exit_reason = 'errored' THEN 'ERROR' ELSE 'COMPLETED' END::trial_state,
       end_time = now()
 WHERE t.closed AND t.state IN ('ACTIVE', 'PAUSED')
   AND NOT EXISTS (SELECT 1 FROM allocations a
                    WHERE a.trial_id = t.id AND (a.state <> 'TERMINATED' OR NOT a.settled))
RETURNING t.id AS trial_id, t.experiment_id, t.exit_reason

-- name: experiments_to_search
-- 5. Searchers.
-- Each experiment with its unread events in order, in one statement (not one query per
-- experiment: a pass may search a thousand). The experiments are found from the unread events
-- and the not yet searched (searcher_events_pending, experiments_unsearched), not by testing
-- every live experiment. An unmanaged experiment (core_v2) has no searcher: its script decides.
-- A validation_reported event comes with its metrics row's values (by primary key: the event
-- names the row rather than copying it).
WITH todo AS (
    SELECT id FROM experiments
     WHERE searcher_state IS NULL AND state IN ('ACTIVE', 'PAUSED') AND NOT unmanaged
    UNION
    SELECT experiment_id FROM searcher_events WHERE NOT consumed
)
SELECT e.id, e.config, e.searcher_state, e.searcher_rng, coalesce(v.events, '[]') AS events
  FROM todo JOIN experiments e ON e.id = todo.id
  LEFT JOIN LATERAL (
        SELECT jsonb_agg(jsonb_build_object('id', v.id, 'kind', v.kind, 'payload', v.payload,
                                            'values', m."values",
                                            'request_id', t.request_id::text)
                         ORDER BY v.id) AS events
          FROM searcher_events v JOIN trials t ON t.id = v.trial_id
          LEFT JOIN metrics m ON v.kind = 'validation_reported'
                             AND m.id = (v.payload ->> 'metrics_id')::bigint
         WHERE v.experiment_id = e.id AND NOT v.consumed) v ON true
 WHERE e.state IN ('ACTIVE', 'PAUSED')
 ORDER BY e.id
   FOR NO KEY UPDATE OF e

-- name: create_trials
-- The trials the searchers created, in the order given; one created before is left as it is.
INSERT INTO trials (experiment_id, request_id, hparams, seed)
SELECT x.experiment_id, x.request_id, x.hparams, x.seed
  FROM unnest(%(experiment_id)s::integer[], %(request_id)s::uuid[], %(hparams)s::jsonb[],
              %(seed)s::bigint[]) WITH ORDINALITY AS x(experiment_id, request_id, hparams, seed, i)
 ORDER BY x.i
ON CONFLICT (experiment_id, request_id) DO NOTHING

-- name: add_ops
-- After create_trials (the trials are found by request id); a trial's ops in the given order.
INSERT INTO searcher_ops (trial_id, length)
SELECT t.id, x.length
  FROM unnest(%(experiment_id)s::integer[], %(request_id)s::uuid[], %(length)s::bigint[])
       WITH ORDINALITY AS x(experiment_id, request_id, length, i)
  JOIN trials t ON t.experiment_id = x.experiment_id AND t.request_id = x.request_id
 ORDER BY x.i

-- name: close_trials
-- Trials the searchers closed: they get no new op.
UPDATE trials t SET closed = true
  FROM unnest(%(experiment_id)s::integer[], %(request_id)s::uuid[]) AS x(experiment_id, request_id)
 WHERE t.experiment_id = x.experiment_id AND t.request_id = x.request_id

-- name: shutdown_experiments
-- Experiments whose searcher cannot go on (it raised) stop, in the state given (STOPPING_ERROR).
UPDATE experiments e SET state = x.state::experiment_state
  FROM unnest(%(experiment_id)s::integer[], %(state)s::text[]) AS x(experiment_id, state)
 WHERE e.id = x.experiment_id

-- name: save_searchers
-- rng NULL: the step drew nothing, the generator stays as stored (and is not written again).
-- outcome NULL: the search goes on; else its shutdown's STOPPING_* state, written with the
-- searcher's state: a second write of an experiment's row in one transaction makes one more
-- row version and checks its two foreign keys again (~20 us each).
UPDATE experiments e SET searcher_state = x.state, searcher_rng = coalesce(x.rng, e.searcher_rng),
       progress = x.progress, state = coalesce(x.outcome::experiment_state, e.state)
  FROM unnest(%(experiment_id)s::integer[], %(state)s::jsonb[], %(rng)s::jsonb[],
              %(progress)s::float8[], %(outcome)s::text[])
       AS x(experiment_id, state, rng, progress, outcome)
 WHERE e.id = x.experiment_id

-- name: consume_events
-- Events the searchers read.
UPDATE searcher_events SET consumed = true WHERE id = ANY(%(id)s::bigint[])

-- name: decided_runs
-- The live runs of the trials whose events the searcher read: their tasks may wait for the
-- next op in det_task.current_op.
SELECT DISTINCT a.id FROM searcher_events v JOIN allocations a ON a.trial_id = v.trial_id
 WHERE v.id = ANY(%(ids)s) AND a.state BETWEEN 'ASSIGNED' AND 'RUNNING'

-- name: finish_stopping_trials
-- 6. Trials and experiments whose stop is done.
-- A stopping trial ends once it has no run left to settle: its last run ended (settled above),
-- or it had none (a paused trial that is cancelled or killed).
UPDATE trials t SET state = det_user.stopped_state(t.state::text)::trial_state, end_time = now()
 WHERE t.state IN ('STOPPING_COMPLETED', 'STOPPING_CANCELED', 'STOPPING_KILLED', 'STOPPING_ERROR')
   AND NOT EXISTS (SELECT 1 FROM allocations a
                    WHERE a.trial_id = t.id AND (a.state <> 'TERMINATED' OR NOT a.settled))
RETURNING t.id AS trial_id, t.experiment_id, t.state::text AS state,
          (SELECT max(a.id) FROM allocations a WHERE a.trial_id = t.id) AS allocation_id

-- name: finish_experiments
UPDATE experiments e
   SET state = det_user.stopped_state(e.state::text)::experiment_state, end_time = now()
 WHERE e.state IN ('STOPPING_COMPLETED', 'STOPPING_CANCELED', 'STOPPING_KILLED', 'STOPPING_ERROR')
   AND NOT EXISTS (SELECT 1 FROM trials t
                    WHERE t.experiment_id = e.id
                      AND t.state NOT IN ${TERMINAL})
RETURNING e.id, EXISTS (SELECT 1 FROM trials t JOIN checkpoints c ON c.trial_id = t.id
                         WHERE t.experiment_id = e.id AND c.state = 'COMPLETED')
                AS has_checkpoints,
          e.config, e.searcher_state,
          -- units each trial trained (its ops' reported progress), by request id
          (SELECT coalesce(jsonb_object_agg(t.request_id::text, o.units), '{}')
             FROM trials t
             CROSS JOIN LATERAL (SELECT max(o.progress) AS units FROM searcher_ops o
                                  WHERE o.trial_id = t.id) o
            WHERE t.experiment_id = e.id AND o.units IS NOT NULL) AS trained

-- name: set_progress
-- An ended experiment's progress: what it trained over what it planned (ended_progress).
UPDATE experiments SET progress = %(progress)s WHERE id = %(experiment_id)s

-- name: checkpoint_gc
-- 6b. Checkpoint GC.
-- An experiment that just ended applies its GC policy (the keep rule is
-- det_user.checkpoints_to_delete), in the transaction that ended it.
SELECT det_internal.checkpoint_gc(%(experiment_id)s) AS n

-- name: live_experiments_with_new_checkpoints
-- GC during runs: the live experiments with checkpoints reported since the last
-- look, whose policy the pass applies now. The same statement clears the flags it read; a
-- checkpoint committed after it keeps its flag for the next pass. An ended experiment's
-- flags are only cleared (the pass that ended it applied its policy). A checkpoint row
-- another transaction holds (a GC task marking it, a user's delete) is skipped, not waited
-- for: the next pass sees it.
WITH seen AS (
    UPDATE checkpoints c SET gc_pending = false
     WHERE c.uuid IN (SELECT uuid FROM checkpoints WHERE gc_pending FOR UPDATE SKIP LOCKED)
    RETURNING c.trial_id
)
SELECT DISTINCT t.experiment_id AS id
  FROM (SELECT DISTINCT trial_id FROM seen) s
  JOIN trials t ON t.id = s.trial_id JOIN experiments e ON e.id = t.experiment_id
 WHERE e.state < 'COMPLETED'
 ORDER BY 1

-- name: settle_gc_runs
-- Ended GC tasks are settled; one that failed without saying why (killed, lost with its agent)
-- leaves its end on the experiment while checkpoints are still to be removed.
WITH ended AS (
    UPDATE allocations a SET settled = true
     WHERE a.state = 'TERMINATED' AND NOT a.settled AND a.spec ->> 'kind' = 'checkpoint_gc'
    RETURNING a.id, a.job_id, a.exit_code, a.exit_reason
), errors AS (
    UPDATE experiments e
       SET checkpoint_gc_error = 'checkpoint GC task (allocation ' || d.id || ') ended with '
           || coalesce('exit code ' || d.exit_code, 'no exit code')
           || coalesce(' (' || d.exit_reason || ')', '')
      FROM ended d
     WHERE e.job_id = d.job_id AND d.exit_code IS DISTINCT FROM 0
       AND e.checkpoint_gc_error IS NULL
       AND (EXISTS (SELECT 1 FROM trials t JOIN checkpoints c ON c.trial_id = t.id
                     WHERE t.experiment_id = e.id AND c.state = 'DELETING')
            OR (e.delete_requested_at IS NOT NULL AND e.tensorboards_deleted_at IS NULL))
)
SELECT count(*) AS n FROM ended

-- name: create_gc_tasks
-- A zero-slot GC task for each experiment with DELETING checkpoints, or being deleted with its
-- TensorBoard files still there, and no live GC task, in the experiment's pool (whose agents
-- reach its storage). A task that fails is tried again
-- while fewer than max_failures have failed since the latest request to delete (a killed
-- GC finishes on the next run); past that the error stays on the experiment until a user asks
-- again (`det checkpoint delete`, `det experiment delete`).
WITH wanted AS (
    SELECT t.experiment_id, max(c.delete_requested_at) AS requested,
           min(c.delete_requested_at) AS oldest
      FROM checkpoints c JOIN trials t ON t.id = c.trial_id
     WHERE c.state = 'DELETING'
     GROUP BY t.experiment_id
    UNION ALL  -- a deleted experiment's TensorBoard files, checkpoints or not
    SELECT e.id, e.delete_requested_at, e.delete_requested_at FROM experiments e
     WHERE e.delete_requested_at IS NOT NULL AND e.tensorboards_deleted_at IS NULL
       AND EXISTS (SELECT 1 FROM trials t WHERE t.experiment_id = e.id AND t.runs > 0)
       AND NOT EXISTS (SELECT 1 FROM checkpoints c JOIN trials t ON t.id = c.trial_id
                        WHERE t.experiment_id = e.id AND c.state = 'DELETING')
)
INSERT INTO allocations (job_id, run, resource_pool, slots_needed, preemptible, spec)
SELECT e.job_id,
       coalesce((SELECT max(a.run) FROM allocations a
                  WHERE a.job_id = e.job_id AND a.spec ->> 'kind' = 'checkpoint_gc'), 0) + 1,
       j.resource_pool, 0, false,
       jsonb_build_object('kind', 'checkpoint_gc', 'environment', e.config -> 'environment',
                          'bind_mounts', e.config -> 'bind_mounts',
                          'resources', e.config -> 'resources',
                          'checkpoint_storage', e.config -> 'checkpoint_storage',
                          'context_id', NULL, 'experiment_id', e.id, 'trial_id', NULL)
  FROM wanted w JOIN experiments e ON e.id = w.experiment_id JOIN jobs j ON j.id = e.job_id
 WHERE NOT EXISTS (SELECT 1 FROM allocations a
                    WHERE a.job_id = e.job_id AND a.spec ->> 'kind' = 'checkpoint_gc'
                      AND a.state <> 'TERMINATED')
   AND (SELECT count(*) FROM allocations a
         WHERE a.job_id = e.job_id AND a.spec ->> 'kind' = 'checkpoint_gc'
           AND a.ended_at > w.requested AND a.exit_code IS DISTINCT FROM 0) < %(max_failures)s
   -- a live experiment's superseded checkpoints are removed together, once the oldest has
   -- waited live_batch seconds: one GC task per that many seconds, not one per checkpoint
   AND (e.state >= 'COMPLETED' OR w.oldest < now() - make_interval(secs => %(live_batch)s))
RETURNING id

-- name: experiments_to_purge
-- Experiments a user deleted: their rows go once their files are (det_internal.purge_experiment).
-- One whose GC or purge failed waits for the user to ask again (which clears the error).
SELECT id FROM experiments
 WHERE delete_requested_at IS NOT NULL AND checkpoint_gc_error IS NULL ORDER BY id

-- name: purge_experiment
-- A deleted experiment's rows go once its files are (det_internal.purge_experiment); gone is false,
-- and nothing removed, while they are not.
SELECT det_internal.purge_experiment(%(experiment_id)s) AS gone

-- name: gc_decision_failed
-- Deciding what to delete, or deleting an experiment's rows, raised: say so on the experiment.
UPDATE experiments SET checkpoint_gc_error = %(message)s WHERE id = %(experiment_id)s

-- name: create_allocations
-- 7. New runs for trials that have work and no run.
-- Not while an earlier run's process may still act (allocations.fenced_until).
WITH runnable AS (
    SELECT t.id FROM trials t JOIN experiments e ON e.id = t.experiment_id
     WHERE e.state = 'ACTIVE' AND t.state = 'ACTIVE' AND NOT t.closed
       AND EXISTS (SELECT 1 FROM searcher_ops o WHERE o.trial_id = t.id AND NOT o.completed)
       AND NOT EXISTS (SELECT 1 FROM allocations a
                        WHERE a.trial_id = t.id
                          AND (a.state <> 'TERMINATED' OR NOT a.settled
                               OR a.fenced_until > now()))
       FOR NO KEY UPDATE OF t
), bumped AS (
    UPDATE trials t SET runs = t.runs + 1 FROM runnable r WHERE t.id = r.id
    RETURNING t.id, t.runs, t.experiment_id
)
INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec)
SELECT e.job_id, b.id, b.runs, j.resource_pool,
       e.slots_per_trial,
       jsonb_build_object('kind', 'trial', 'entrypoint', e.config -> 'entrypoint',
                          'environment', e.config -> 'environment',
                          'bind_mounts', e.config -> 'bind_mounts',
                          'resources', e.config -> 'resources',
                          'checkpoint_storage', e.config -> 'checkpoint_storage',
                          'context_id', e.context_id, 'experiment_id', e.id, 'trial_id', b.id)
  FROM bumped b JOIN experiments e ON e.id = b.experiment_id JOIN jobs j ON j.id = e.job_id

-- name: fall_back
-- 8. Placement.
-- Pool fallback: a waiting run whose job lists other pools goes to the first pool, in the
-- job's order, where one agent has the free slots it needs now (else its first pool).
WITH free AS (
    SELECT g.resource_pool AS pool, count(s.slot_id) AS n
      FROM agents g JOIN slots s ON s.agent_id = g.id AND s.enabled
     WHERE g.state = 'ACTIVE' AND NOT g.stopping
       AND NOT EXISTS (SELECT 1 FROM allocation_slots h WHERE h.agent_id = s.agent_id
                          AND h.slot_id = s.slot_id AND NOT h.released)
     GROUP BY g.id, g.resource_pool
), choice AS (
    SELECT a.id, coalesce(
               (SELECT c.pool FROM unnest(j.resource_pool || j.fallback_pools)
                                   WITH ORDINALITY AS c(pool, i)
                 WHERE EXISTS (SELECT 1 FROM free f WHERE f.pool = c.pool
                                  AND f.n >= a.slots_needed)
                 ORDER BY c.i LIMIT 1),
               j.resource_pool) AS pool
      FROM allocations a JOIN jobs j ON j.id = a.job_id
     WHERE a.state = 'PENDING' AND a.desired_state = 'RUNNING'
       AND cardinality(j.fallback_pools) > 0
)
UPDATE allocations a SET resource_pool = c.pool, pending_reason = NULL
  FROM choice c WHERE c.id = a.id AND a.resource_pool <> c.pool

-- name: pools_with_pending
-- Each pool's scheduler is looked up once, not once per waiting allocation (DISTINCT over the
-- function's result called it for every row: 8 ms a pass with 1,000 waiting); and each pool
-- is asked whether it has a run waiting (allocations_pending: one index probe), rather than
-- every waiting run read for its pool.
-- A slurm pool has no scheduler of det's: each waiting run is a Slurm job of its own
-- (det.reconciler.provision).
SELECT p.name AS resource_pool, det_user.pool_scheduler(p.name) AS scheduler
  FROM resource_pools p
 WHERE p.provider ->> 'type' IS DISTINCT FROM 'slurm'
   AND EXISTS (SELECT 1 FROM allocations a
                WHERE a.resource_pool = p.name AND a.state = 'PENDING'
                  AND a.desired_state = 'RUNNING')
 ORDER BY 1

-- name: pool_agents
-- The pool's schedulable agents, each with its enabled and free slots and live zero-slot tasks.
SELECT g.id AS agent_id,
       coalesce(array_agg(s.slot_id ORDER BY s.slot_id) FILTER (WHERE s.enabled), '{}') AS slots,
       coalesce(array_agg(s.slot_id ORDER BY s.slot_id)
                FILTER (WHERE s.enabled AND h.slot_id IS NULL), '{}') AS free,
       coalesce(z.n, 0) AS aux_running,
       p.max_aux_containers_per_agent AS max_aux
  FROM agents g
  JOIN resource_pools p ON p.name = g.resource_pool
  LEFT JOIN slots s ON s.agent_id = g.id
  LEFT JOIN allocation_slots h ON h.agent_id = s.agent_id AND h.slot_id = s.slot_id
                              AND NOT h.released
  -- live zero-slot tasks per agent, counted once (index allocations_aux_live), not per agent
  LEFT JOIN (SELECT agent_id, count(*) AS n FROM allocations
              WHERE slots_needed = 0 AND state <> 'TERMINATED' GROUP BY agent_id) z
         ON z.agent_id = g.id
 WHERE g.state = 'ACTIVE' AND NOT g.stopping AND g.resource_pool = %(pool)s
 GROUP BY g.id, p.max_aux_containers_per_agent, z.n
 ORDER BY g.id

-- name: pool_tasks
-- Live allocations of the pool in queue order (submission, or where `det job update` put
-- them); pending ones only while still wanted. A running one's seconds since its assignment
-- and whether it checkpointed decide whether it may be preempted yet
-- (det.reconciler.schedulers.preemption; one index probe per running run).
SELECT a.id, a.job_id, a.slots_needed, j.priority, j.weight, j.max_slots, a.preemptible,
       a.state <> 'PENDING' AS running, a.desired_state <> 'RUNNING' AS stopping, a.agent_id,
       a.pending_reason,
       CASE WHEN a.state <> 'PENDING'
            THEN extract(epoch FROM now() - a.assigned_at)::float8 END AS ran,
       CASE WHEN a.state <> 'PENDING'
            THEN EXISTS (SELECT 1 FROM checkpoints c WHERE c.allocation_id = a.id) END
           AS checkpointed
  FROM allocations a JOIN jobs j ON j.id = a.job_id
 WHERE a.resource_pool = %(pool)s AND a.state <> 'TERMINATED'
   AND (a.state <> 'PENDING' OR a.desired_state = 'RUNNING')
 ORDER BY j.queue_position, a.id

-- name: pool_held
-- The slots each live run of the pool holds, by agent.
SELECT h.allocation_id, h.agent_id, array_agg(h.slot_id ORDER BY h.slot_id) AS slots
  FROM allocation_slots h JOIN allocations a ON a.id = h.allocation_id
 WHERE a.resource_pool = %(pool)s AND NOT h.released
 GROUP BY h.allocation_id, h.agent_id

-- name: assign
-- The scheduler placed these waiting runs: each on its (first) agent.
UPDATE allocations a SET state = 'ASSIGNED', agent_id = x.agent_id, assigned_at = now(),
       pending_reason = NULL
  FROM unnest(%(ids)s::bigint[], %(agents)s::text[]) AS x(id, agent_id)
 WHERE a.id = x.id AND a.state = 'PENDING'

-- name: hold_slots
-- The slots the scheduler gave each placed run (allocation_slots keeps a slot to one live run).
INSERT INTO allocation_slots (allocation_id, agent_id, slot_id)
SELECT * FROM unnest(%(ids)s::bigint[], %(agents)s::text[], %(slots)s::integer[])

-- name: preempt
-- The scheduler preempts: the task checkpoints and exits; its trial runs again later. Each
-- says to whom its slots go and by which rule (det_internal.preempted_reason).
UPDATE allocations a
   SET desired_state = 'STOPPED', stop_requested_at = coalesce(a.stop_requested_at, now()),
       stop_reason = det_internal.preempted_reason(x.job, x.rule)
  FROM unnest(%(ids)s::bigint[], %(jobs)s::bigint[], %(rules)s::text[]) AS x(id, job, rule)
 WHERE a.id = x.id AND a.desired_state = 'RUNNING' AND a.state <> 'TERMINATED'
RETURNING a.id, a.agent_id

-- name: set_pending_reasons
-- Why each waiting run waits, as the scheduler said; a reason unchanged is not written again.
UPDATE allocations a SET pending_reason = r.reason
  FROM unnest(%(ids)s::bigint[], %(reasons)s::text[]) AS r(id, reason)
 WHERE a.id = r.id AND a.state = 'PENDING' AND a.pending_reason IS DISTINCT FROM r.reason

-- name: pool_failed
-- The pool's scheduling raised: each waiting run of the pool says why.
UPDATE allocations SET pending_reason = %(reason)s
 WHERE resource_pool = %(pool)s AND state = 'PENDING'
   AND pending_reason IS DISTINCT FROM %(reason)s

-- name: record_pass
-- 9. Bookkeeping.
-- With the leader's agent timeout, which agents read to fence themselves (det_agent.timeout).
INSERT INTO reconciler_leader (holder, since, last_pass, agent_timeout)
VALUES (%(holder)s, now(), now(), %(agent_timeout)s)
ON CONFLICT (singleton) DO UPDATE
   SET last_pass = now(), agent_timeout = excluded.agent_timeout,
       since = CASE WHEN reconciler_leader.holder = excluded.holder
                    THEN reconciler_leader.since ELSE now() END,
       holder = excluded.holder


-- name: stale_tables
-- Between passes. Tables changed since the last analyze (autovacuum's or the leader's) by more
-- than 500 + half their live rows (det.reconciler.statistics).
SELECT relname FROM pg_stat_user_tables
 WHERE relid = ANY(%(tables)s::regclass[]) AND n_mod_since_analyze > 500 + n_live_tup / 2
 ORDER BY relname

-- name: analyze_tables
-- The stale tables (the caller composes their names in); a table autovacuum is working on
-- is left to it.
ANALYZE (SKIP_LOCKED) {}

-- name: current_leader
-- Leadership status. The recorded leader, and whether a session really holds the leader lock
-- now (a leader that died leaves its row behind).
SELECT holder, since, last_pass,
       EXISTS (SELECT 1 FROM pg_locks k
                WHERE k.locktype = 'advisory' AND k.granted AND k.objsubid = 1
                  AND k.database = (SELECT oid FROM pg_database
                                     WHERE datname = current_database())
                  AND (k.classid::bigint << 32 | k.objid::bigint) = %(key)s) AS alive
  FROM reconciler_leader
