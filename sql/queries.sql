-- Reads shared by the CLI and det serve (det.queries): one block per statement, grouped by
-- topic (trials, experiments, workspaces, cluster, tasks, models, queue, checkpoints, usage),
-- so that `det experiment list` and GET /api/v1/experiments read the same rows. These only
-- read; writes go through the det_user.* functions of schema.sql.

-- cluster: agents, slots, resource pools, the cluster config

-- name: agents
-- Agents not gone for good (agents.gone_at: a one-shot agent whose run ended, an instance's
-- agent whose process or Slurm job is gone), with their slots and the slots in use.
SELECT g.id, g.hostname, g.resource_pool, g.state::text AS state, g.runtime, g.last_heartbeat,
       count(s.slot_id) AS slots,
       count(h.slot_id) AS used
  FROM agents g
  LEFT JOIN slots s ON s.agent_id = g.id
  LEFT JOIN allocation_slots h ON h.agent_id = s.agent_id AND h.slot_id = s.slot_id
                              AND NOT h.released
 WHERE g.gone_at IS NULL
 GROUP BY g.id ORDER BY g.id

-- name: slots
SELECT agent_id, slot_id, type, device_name, device_uuid, memory_mb, enabled, resource_pool,
       agent_state::text, allocation_id, trial_id
  FROM reporting.slot_usage
 WHERE %(agent)s::text IS NULL OR agent_id = %(agent)s
 ORDER BY agent_id, slot_id

-- name: stored_cluster_config
SELECT config, original, applied_at FROM cluster_config

-- name: pools
SELECT r.name, r.description, det_user.pool_scheduler(r.name) AS scheduler,
       r.max_aux_containers_per_agent,
       (SELECT count(*) FROM agents g WHERE g.resource_pool = r.name AND g.state <> 'LOST')
           AS agents,
       (SELECT count(*) FROM slots s JOIN agents g ON g.id = s.agent_id
         WHERE g.resource_pool = r.name AND g.state = 'ACTIVE' AND s.enabled) AS slots_total,
       (SELECT count(*) FROM allocation_slots h JOIN agents g ON g.id = h.agent_id
         WHERE g.resource_pool = r.name AND NOT h.released) AS slots_used,
       (SELECT count(*) FROM reporting.job_queue q
         WHERE q.resource_pool = r.name AND q.status = 'STATE_QUEUED') AS queued_jobs,
       r.provider, r.provider_status,
       (SELECT count(*) FROM instances i WHERE i.resource_pool = r.name AND i.state <> 'GONE')
           AS instances
  FROM resource_pools r ORDER BY r.name

-- name: pool_instances
-- A pool's instances (elastic pools), the live ones first, then the latest gone.
SELECT id, agent_id, state::text AS state, provider_id, provider_state, reason, requested_at,
       running_at, gone_at
  FROM instances WHERE resource_pool = %(pool)s
 ORDER BY state = 'GONE', id DESC LIMIT %(limit)s

-- models: the registry

-- name: models
SELECT id, name, description, labels, metadata, notes, owner, archived, creation_time,
       last_updated_time, num_versions, latest_version
  FROM reporting.models WHERE %(all)s OR NOT archived ORDER BY id

-- name: find_model
-- The model a user named (by name or id); raises no_data_found.
SELECT id FROM det_user.model_find(%(model)s)

-- name: model
SELECT id, name, description, labels, metadata, notes, owner, archived, creation_time,
       last_updated_time, num_versions, latest_version
  FROM reporting.models WHERE id = %(id)s

-- name: model_versions
SELECT version, name, checkpoint_uuid::text AS checkpoint_uuid, checkpoint_state, trial_id,
       experiment_id, steps_completed, size_bytes, validation_metrics, labels, metadata, notes,
       owner, creation_time, last_updated_time
  FROM reporting.model_versions WHERE model_id = %(id)s
   AND (%(version)s::integer IS NULL OR version = %(version)s::integer)
 ORDER BY version

-- queue: the job queue

-- name: job_queue
-- The queue with what `explain_reasons` needs to say why each job waits; filtered by pool
-- (`det job list`) or by job (`det job explain`). An interactive task has no experiment
-- (its experiment columns are NULL).
SELECT q.queue_order, q.job_id, 'TYPE_' || q.type AS type, q.name, q.priority, q.weight,
       q.submitted_at, q.slots_acquired, q.slots_needed, q.status, q.owner, q.resource_pool,
       q.experiment_id, q.experiment_state, q.pending_reason,
       det_user.pool_scheduler(q.resource_pool) ->> 'type' AS scheduler,
       tc.live_trials, tc.trials, coalesce(ag.n, 0) AS pool_agents,
       e.max_concurrent_trials, e.max_trials
  FROM reporting.job_queue q LEFT JOIN experiments e ON e.id = q.experiment_id
  CROSS JOIN LATERAL (
      SELECT count(*) AS trials,
             count(*) FILTER (WHERE t.state IN ('ACTIVE', 'PAUSED') AND NOT t.closed)
                 AS live_trials
        FROM trials t WHERE t.experiment_id = q.experiment_id) tc
  LEFT JOIN (SELECT resource_pool, count(*) AS n FROM agents WHERE state = 'ACTIVE'
              GROUP BY resource_pool) ag ON ag.resource_pool = q.resource_pool
 WHERE (%(pool)s::text IS NULL OR q.resource_pool = %(pool)s)
   AND (%(job)s::bigint IS NULL OR q.job_id = %(job)s)
 ORDER BY q.resource_pool, q.queue_order

-- name: job_state
-- What an ended job was: its experiment, or its task (the task's run's state).
SELECT 'experiment ' || e.id AS what, e.state::text AS state
  FROM jobs j JOIN experiments e ON e.job_id = j.id WHERE j.id = %(id)s
UNION ALL
SELECT lower(t.kind) || ' ' || t.id, t.state FROM reporting.tasks t WHERE t.id = %(id)s

-- checkpoints

-- name: ranked_checkpoints
SELECT c.uuid::text AS uuid, c.trial_id, t.experiment_id, c.steps_completed, c.state,
       c.reported_at, c.storage, c.metadata, c.resources, v.value AS metric_value
  FROM checkpoints c
  JOIN trials t ON t.id = c.trial_id
  JOIN experiments e ON e.id = t.experiment_id
  CROSS JOIN LATERAL (SELECT coalesce(%(metric)s, e.searcher_metric) AS metric,
                             coalesce(%(smaller)s, e.smaller_is_better, true) AS smaller) s
  -- the validation the trial reported at the checkpoint's batch count (its latest such row)
  LEFT JOIN LATERAL (
       SELECT CASE WHEN jsonb_typeof(m."values" -> s.metric) = 'number'
                   THEN (m."values" ->> s.metric)::double precision END AS value
         FROM metrics m
        WHERE m.trial_id = c.trial_id AND m."group" = 'validation'
          AND m.superseded_by IS NULL AND m.steps_completed = c.steps_completed
        ORDER BY m.id DESC LIMIT 1) v ON true
 WHERE c.state = 'COMPLETED'
   AND (%(experiment)s::integer IS NULL OR t.experiment_id = %(experiment)s::integer)
   AND (%(trial)s::integer IS NULL OR c.trial_id = %(trial)s::integer)
   AND (NOT %(validated)s OR v.value IS NOT NULL)
 ORDER BY CASE WHEN s.smaller THEN v.value END ASC NULLS LAST,
          CASE WHEN NOT s.smaller THEN v.value END DESC NULLS LAST,
          c.steps_completed DESC, c.reported_at DESC

-- usage: allocation hours

-- name: usage
SELECT day, "group", slot_hours FROM det_user.cluster_usage(%(start)s, %(end)s, %(group_by)s)

-- trials: one trial, its logs, its metrics

-- name: trial
SELECT t.id, t.experiment_id, t.state::text AS state, t.hparams, t.seed, t.restarts, t.runs,
       t.steps_completed, t.best_validation, t.latest_checkpoint::text AS latest_checkpoint,
       t.exit_reason, t.start_time, t.end_time, det_user.json_shown(t.metadata) AS metadata,
       greatest(t.steps_completed,
                (SELECT max(m.steps_completed) FROM metrics m
                  WHERE m.trial_id = t.id AND m."group" = 'training'
                    AND m.superseded_by IS NULL)) AS batches
  FROM trials t WHERE t.id = %(id)s

-- name: trial_logs_after
-- A trial's log lines after a log id, each with its run (its allocation's), the rank that
-- wrote it (NULL: det's notes, a launcher's lines) and its level (det_user.log_level).
SELECT l.id, l.ts, l.stream, l.line, l.rank, a.run, det_user.log_level(l.stream, l.line) AS level
  FROM task_logs l JOIN allocations a ON a.id = l.allocation_id
 WHERE l.trial_id = %(trial)s AND l.id > %(after)s ORDER BY l.id LIMIT %(limit)s

-- name: trial_logs_tail
-- The last lines, for a log tail: newest first, reversed by the caller.
SELECT l.id, l.ts, l.stream, l.line, l.rank, a.run, det_user.log_level(l.stream, l.line) AS level
  FROM task_logs l JOIN allocations a ON a.id = l.allocation_id
 WHERE l.trial_id = %(trial)s ORDER BY l.id DESC LIMIT %(limit)s

-- name: experiment_logs_after
-- An experiment's log lines after a log id (every trial's, in the order written), as
-- trial_logs_after with the trial of each.
SELECT l.id, l.ts, l.stream, l.line, l.rank, a.run, l.trial_id,
       det_user.log_level(l.stream, l.line) AS level
  FROM task_logs l JOIN allocations a ON a.id = l.allocation_id
 WHERE l.trial_id IN (SELECT id FROM trials WHERE experiment_id = %(experiment)s)
   AND l.id > %(after)s ORDER BY l.id LIMIT %(limit)s

-- name: experiment_logs_tail
-- The experiment's last lines, newest first (reversed by the caller).
SELECT l.id, l.ts, l.stream, l.line, l.rank, a.run, l.trial_id,
       det_user.log_level(l.stream, l.line) AS level
  FROM task_logs l JOIN allocations a ON a.id = l.allocation_id
 WHERE l.trial_id IN (SELECT id FROM trials WHERE experiment_id = %(experiment)s)
 ORDER BY l.id DESC LIMIT %(limit)s

-- name: trial_runs
-- A trial's runs (its restarts are the runs after the first): where each ran, how it ended
-- and why (det_user.run_end_reason: never blank once ended), and as the queue sees it
-- (det_user.run_status, det_user.run_reason).
SELECT run, state::text AS state, agent_id, slots_needed, exit_code,
       det_user.run_end_reason(a.id) AS exit_reason, created_at, started_at, ended_at,
       pending_reason, det_user.run_status(a.id) AS run_state,
       det_user.run_reason(a.id) AS run_reason
  FROM allocations a WHERE trial_id = %(id)s ORDER BY run

-- name: first_trial
SELECT min(id) AS id FROM trials WHERE experiment_id = %(id)s

-- name: trial_metrics
-- Every reader of metrics reads the trial's surviving history: rows a later run superseded
-- (superseded_by, set when it resumed from an earlier checkpoint) are left out, and values are
-- shown through det_user.json_shown (rows stored before depth was bounded may nest too deep to
-- parse). METRICS shows the superseded rows too when asked (%(superseded)s), with the run
-- (allocations.run) that superseded each.
SELECT m."group", m.steps_completed, det_user.json_shown(m."values") AS "values",
       s.run AS superseded_by_run
  FROM metrics m LEFT JOIN allocations s ON s.id = m.superseded_by
 WHERE m.trial_id = %(id)s AND (m.superseded_by IS NULL OR %(superseded)s)
 ORDER BY m.steps_completed, m.id

-- name: metric_series_sampled
-- At most n rows of one group, spread evenly over its range of batches: n probes of the
-- (trial, group, steps) index, each taking the first row at or after its point, the last
-- at the last batch reported. Its cost grows with n, not with the rows stored (a series of
-- millions of rows answers in milliseconds); rows between two probes are skipped, not
-- averaged, so every point shown is one that was reported.
WITH span AS (
    SELECT (SELECT steps_completed FROM metrics
             WHERE trial_id = %(trial)s AND "group" = %(group)s AND superseded_by IS NULL
             ORDER BY steps_completed LIMIT 1) AS lo,
           (SELECT steps_completed FROM metrics
             WHERE trial_id = %(trial)s AND "group" = %(group)s AND superseded_by IS NULL
             ORDER BY steps_completed DESC LIMIT 1) AS hi
)
SELECT DISTINCT m.id, m.steps_completed, det_user.json_shown(m."values") AS "values", m.reported_at
  FROM span, generate_series(0, %(n)s - 1) k
 CROSS JOIN LATERAL (
       SELECT x.id, x.steps_completed, x."values", x.reported_at FROM metrics x
        WHERE x.trial_id = %(trial)s AND x."group" = %(group)s AND x.superseded_by IS NULL
          AND x.steps_completed >= span.lo + (span.hi - span.lo) * k / (%(n)s - 1)
        ORDER BY x.steps_completed LIMIT 1) m
 WHERE span.lo IS NOT NULL
 ORDER BY m.steps_completed, m.id

-- name: metric_series_all
SELECT id, steps_completed, det_user.json_shown("values") AS "values", reported_at FROM metrics
 WHERE trial_id = %(trial)s AND "group" = %(group)s AND superseded_by IS NULL
 ORDER BY steps_completed, id LIMIT %(limit)s

-- name: checkpoint
SELECT uuid::text AS uuid, state, storage FROM checkpoints WHERE uuid::text = %(uuid)s

-- name: checkpoints_by_prefix
-- The checkpoints whose uuid starts with a prefix a user typed (two, to tell an ambiguous one).
SELECT uuid::text AS uuid, state, storage FROM checkpoints
 WHERE uuid::text LIKE replace(replace(lower(%(prefix)s), '%%', ''), '_', '') || '%%'
 ORDER BY uuid LIMIT 2

-- name: metrics_since
-- Metrics rows of some trials reported after a metrics id: what an event stream has not sent
-- yet. The primary key's range from ``after`` holds only the rows written since (all trials'),
-- so this stays cheap however long the series are.
SELECT id, trial_id, "group", steps_completed, det_user.json_shown("values") AS "values",
       reported_at
  FROM metrics
 WHERE id > %(after)s AND trial_id = ANY (%(trials)s) AND superseded_by IS NULL
 ORDER BY id LIMIT 10000

-- name: last_metric_id
SELECT coalesce(max(id), 0) AS id FROM metrics

-- name: last_trial_log_id
SELECT coalesce(max(id), 0) AS id FROM task_logs WHERE trial_id = %(trial)s

-- workspaces and projects

-- name: workspaces
SELECT w.id, w.name, w.archived, w.created_by, w.created_at, w.default_compute_pool,
       w.default_aux_pool, w.checkpoint_storage,
       (SELECT count(*) FROM projects p WHERE p.workspace_id = w.id) AS projects,
       (SELECT count(*) FROM jobs j WHERE j.workspace_id = w.id) AS experiments,
       coalesce((SELECT array_agg(b.resource_pool ORDER BY b.resource_pool)
                   FROM workspace_pools b WHERE b.workspace_id = w.id), '{}') AS bound_pools
  FROM workspaces w
 WHERE (%(all)s OR NOT w.archived) AND (%(name)s::text IS NULL OR w.name = %(name)s)
 ORDER BY w.id

-- name: workspace_projects
SELECT p.id, p.name, p.description, p.archived, p.created_by, p.created_at,
       (SELECT count(*) FROM experiments e WHERE e.project_id = p.id) AS experiments
  FROM projects p JOIN workspaces w ON w.id = p.workspace_id
 WHERE w.name = %(workspace)s AND (%(all)s OR NOT p.archived)
   AND (%(name)s::text IS NULL OR p.name = %(name)s)
 ORDER BY p.id

-- name: workspace_members
SELECT coalesce(u.username, g.name) AS member, CASE WHEN u.id IS NULL THEN 'group' ELSE 'user'
       END AS kind, a.role, coalesce(w.name, '(all workspaces)') AS workspace
  FROM role_assignments a
  LEFT JOIN users u ON u.id = a.user_id
  LEFT JOIN user_groups g ON g.id = a.group_id
  LEFT JOIN workspaces w ON w.id = a.workspace_id
 WHERE a.workspace_id IS NULL OR w.name = %(workspace)s
 ORDER BY a.workspace_id NULLS FIRST, kind DESC, member, a.role

-- name: project
-- One project by id, with its workspace's name (the WebUI's project page).
SELECT p.id, p.name, p.description, p.archived, p.created_by, p.created_at,
       p.workspace_id, w.name AS workspace,
       (SELECT count(*) FROM experiments e WHERE e.project_id = p.id) AS experiments
  FROM projects p JOIN workspaces w ON w.id = p.workspace_id
 WHERE p.id = %(id)s

-- name: workspace_defaults
-- What a workspace (NULL: Uncategorized) gives its experiments when their config is silent.
SELECT default_compute_pool, checkpoint_storage FROM workspaces
 WHERE name = coalesce(%s, 'Uncategorized')

-- name: workspace_name
SELECT name FROM workspaces WHERE id = %s

-- name: project_place
-- The workspace and project names of a project id (where a new experiment goes).
SELECT w.name AS workspace, p.name AS project FROM projects p
  JOIN workspaces w ON w.id = p.workspace_id WHERE p.id = %s

-- tasks: commands, notebooks, shells, tensorboards

-- name: tasks
-- Live means the task's run has not ended; "mine" is the session's det user (det_user.caller), the
-- owner det_internal.create_task recorded.
SELECT id, kind, state, owner, workspace, project, description, resource_pool, priority,
       slots, submitted_at, started, ended, idle_seconds, end_reason, exit_code, address
  FROM reporting.tasks
 WHERE (%(kind)s::text IS NULL OR kind = %(kind)s)
   AND (%(all)s OR (owner = det_user.caller() AND state <> 'TERMINATED'))
 ORDER BY id

-- name: task
SELECT id, kind, state, desired_state, owner, workspace, project, description, resource_pool,
       priority, weight, slots, submitted_at, started, ended, last_activity, idle_seconds,
       end_reason, exit_code, address, agent_id, pending_reason, experiment_ids, trial_ids,
       allocation_id, config
  FROM reporting.tasks WHERE id = %(id)s

-- name: task_logs_after
-- The task's output in order, from every run of its job (a task has one), after a log id.
SELECT l.id, l.stream, l.line FROM task_logs l
 WHERE l.allocation_id IN (SELECT a.id FROM allocations a WHERE a.job_id = %(job)s)
   AND l.id > %(after)s
 ORDER BY l.id LIMIT %(limit)s

-- name: task_last_error_line
-- The task's last line of stderr (or det's own note): why a server that exited early did.
SELECT l.line FROM task_logs l
 WHERE l.allocation_id IN (SELECT a.id FROM allocations a WHERE a.job_id = %(job)s)
   AND l.stream IN ('stderr', 'det')
 ORDER BY l.id DESC LIMIT 1

-- name: task_run
-- Where a task's run is: its state, the host:port its server answers on once it does, and
-- whether an agent ever took it (a run stopped before that "ends" with exit code 0).
SELECT a.state::text AS state, a.address, a.exit_code, a.started_at IS NOT NULL AS claimed,
       coalesce(t.end_reason, a.storage_error, a.exit_reason) AS end_reason
  FROM tasks t JOIN allocations a ON a.job_id = t.job_id
 WHERE t.job_id = %(id)s ORDER BY a.run DESC LIMIT 1

-- experiments: the list (filters, sort, paging), one experiment, its trials and checkpoints

-- fragment: EXPERIMENTS_SELECTED
-- The filters of det.queries.experiments.ListFilter, over experiments' own columns (which the
-- reporting view keeps): what a page lists and its count counts.
(%(all)s OR NOT archived)
   AND (%(states)s::text[] IS NULL OR state::text = ANY (%(states)s::text[]))
   AND (%(owner)s::text IS NULL OR owner = %(owner)s)
   AND (%(name)s::text IS NULL OR strpos(lower(name), lower(%(name)s)) > 0)
   AND (%(workspace)s::text IS NULL AND %(project)s::text IS NULL
        OR project_id IN (SELECT p.id FROM projects p JOIN workspaces w ON w.id = p.workspace_id
                           WHERE (%(workspace)s::text IS NULL OR w.name = %(workspace)s)
                             AND (%(project)s::text IS NULL OR p.name = %(project)s)))

-- name: list_experiments
-- One page of experiments, the order composed by the caller ({order}: a sort column and id,
-- with psycopg.sql).
SELECT id, name, state::text AS state, round(progress * 100)::integer AS progress, trials,
       owner, start_time AS started, end_time AS ended, best_validation, searcher, metric,
       archived, resource_pool, priority, weight, workspace, project
  FROM reporting.experiments WHERE ${EXPERIMENTS_SELECTED}
 ORDER BY {order} LIMIT %(limit)s OFFSET %(offset)s

-- name: count_experiments
-- How many experiments list_experiments' filters select, ignoring paging (no join needed).
SELECT count(*) AS n FROM experiments WHERE ${EXPERIMENTS_SELECTED}

-- name: trials_done
-- How many of an experiment's trials have ended, of those its searcher has made so far
-- (`det experiment wait`'s bar).
SELECT count(*) FILTER (WHERE state IN ${TERMINAL}) AS done,
       count(*) AS total
  FROM trials WHERE experiment_id = %(id)s

-- det serve's own reads (det.api): Move to Top, a task's log tail, a trial's checkpoints

-- name: queue_head_other_than
-- The job at the head of a pool's queue other than the given one (Move to Top goes ahead of
-- it).
SELECT job_id FROM reporting.job_queue
 WHERE resource_pool = (SELECT resource_pool FROM jobs WHERE id = %(job)s) AND job_id <> %(job)s
 ORDER BY queue_order LIMIT 1

-- name: job_exists
-- Whether a job the caller may see exists, ended or not.
SELECT 1 FROM jobs WHERE id = %s

-- name: task_logs_tail
-- The last lines of a task's output, newest first (the caller reverses them): the Tasks
-- page's log tail. Every run of its job (a task has one), as task_logs_after.
SELECT l.id, l.stream, l.line FROM task_logs l
 WHERE l.allocation_id IN (SELECT a.id FROM allocations a WHERE a.job_id = %(job)s)
 ORDER BY l.id DESC LIMIT %(limit)s

-- name: trial_checkpoints
-- A trial's checkpoints in batch order: state, size in bytes, storage.
SELECT uuid::text AS uuid, trial_id, steps_completed, state, size_bytes, freed_bytes,
       reported_at, deleted_at, storage_type
  FROM reporting.checkpoints WHERE trial_id = %(id)s ORDER BY steps_completed

-- name: experiment
-- The searcher's name, metric and direction are the config's columns (read once, at
-- submission): what describe shows and what decides whether the trials have rungs.
SELECT e.id, e.name, e.description, e.state::text AS state, e.owner, e.progress, e.config,
       e.start_time, e.end_time, j.resource_pool, j.priority, j.weight, j.id AS job_id,
       e.archived, e.checkpoint_gc_error, e.delete_requested_at, e.original_config,
       e.paused_reason, e.searcher_name, e.searcher_metric, e.smaller_is_better
  FROM experiments e JOIN jobs j ON j.id = e.job_id WHERE e.id = %(id)s

-- name: experiment_trials
-- batches: what the trial has trained so far, from its latest training metrics (reported
-- with every batch of metrics), so progress shows before the first checkpoint;
-- steps_completed is the batches as of its latest checkpoint (its restart point);
-- validation: all the metrics of its best validation, which the trials tables show as columns.
SELECT t.id, t.request_id::text AS request_id, t.state::text AS state, t.hparams,
       t.steps_completed, t.best_validation, t.restarts, t.latest_checkpoint, t.exit_reason,
       t.start_time, t.end_time,
       greatest(t.steps_completed,
                (SELECT max(m.steps_completed) FROM metrics m
                  WHERE m.trial_id = t.id AND m."group" = 'training'
                    AND m.superseded_by IS NULL)) AS batches,
       -- The metrics of the validation that gave best_validation (the latest such, on a tie):
       -- det_internal.trial_best_validation's rule picked it, so matching its value finds the row.
       (SELECT det_user.json_shown(m."values") FROM metrics m, experiments e
         WHERE e.id = t.experiment_id AND m.trial_id = t.id AND m."group" = 'validation'
           AND m.superseded_by IS NULL
           AND CASE WHEN jsonb_typeof(m."values" -> e.searcher_metric)
                         = 'number'
                    THEN (m."values" ->> e.searcher_metric)::double precision
                    END = t.best_validation
         ORDER BY m.steps_completed DESC LIMIT 1) AS validation,
       -- its latest run as the job queue sees it (waiting, starting, running, preempting,
       -- stopping, preempted, ended) and why; NULL before its first run
       det_user.run_status(r.id) AS run_state, det_user.run_reason(r.id) AS run_reason
  FROM trials t
  LEFT JOIN LATERAL (SELECT a.id FROM allocations a
                      WHERE a.trial_id = t.id ORDER BY a.run DESC LIMIT 1) r ON true
 WHERE t.experiment_id = %(id)s ORDER BY t.id

-- name: searcher_state
-- Read only for adaptive_asha, whose describe shows each trial's rung (it holds the RNG state,
-- so it stays out of the experiment statement).
SELECT searcher_state FROM experiments WHERE id = %(id)s

-- name: experiment_checkpoints
SELECT c.uuid::text AS uuid, c.trial_id, c.steps_completed, c.state, c.reported_at,
       (SELECT det_user.json_shown(m."values") FROM metrics m
         WHERE m.trial_id = c.trial_id AND m."group" = 'validation'
           AND m.steps_completed = c.steps_completed AND m.superseded_by IS NULL
         ORDER BY m.id DESC LIMIT 1) AS validation
  FROM checkpoints c JOIN trials t ON t.id = c.trial_id
 WHERE t.experiment_id = %(id)s ORDER BY c.trial_id, c.steps_completed

-- name: experiment_state
SELECT state::text AS state FROM experiments WHERE id = %(id)s

-- name: experiment_job
SELECT job_id FROM experiments WHERE id = %(id)s

-- name: live_progress
-- What live progress needs of experiments still running: the config, the searcher's state and
-- each trial's batches trained so far (its latest training metrics).
SELECT e.id, e.config, e.searcher_state,
       coalesce(jsonb_agg(jsonb_build_object(
           'request_id', t.request_id::text, 'hparams', t.hparams,
           'batches', greatest(t.steps_completed,
                               (SELECT max(m.steps_completed) FROM metrics m
                                 WHERE m.trial_id = t.id AND m."group" = 'training'
                                   AND m.superseded_by IS NULL))))
                FILTER (WHERE t.id IS NOT NULL), '[]') AS trials
  FROM experiments e LEFT JOIN trials t ON t.experiment_id = e.id
 WHERE e.id = ANY (%(ids)s) AND e.searcher_state IS NOT NULL
 GROUP BY e.id

-- The CLI's own reads (det audit, det user, det rbac, det template, ...)

-- name: audit_log
-- The audit log, newest first, narrowed by actor and object (row security shows it only to
-- ClusterAdmins).
SELECT id, at, actor, action, object_type, object_id, detail FROM audit_log
 WHERE (%(actor)s::text IS NULL OR actor = %(actor)s)
   AND (%(object_type)s::text IS NULL OR object_type = %(object_type)s)
   AND (%(object_id)s::text IS NULL OR object_id = %(object_id)s)
 ORDER BY id DESC LIMIT %(limit)s

-- name: is_cluster_admin
-- Whether the session may administer the cluster: the schema's owner, or ClusterAdmin.
SELECT det_user.is_owner_session()
       OR det_user.permitted(det_user.caller(), 'admin_cluster', NULL) AS ok

-- name: users
-- Users (active ones unless all), each with whether it is a cluster-wide ClusterAdmin and
-- its groups.
SELECT u.id, u.username, u.active, u.created_at, u.created_by,
       EXISTS (SELECT 1 FROM role_assignments a WHERE a.user_id = u.id AND a.role = 'ClusterAdmin'
                  AND a.workspace_id IS NULL) AS admin,
       coalesce((SELECT array_agg(g.name ORDER BY g.name) FROM user_group_members m
                  JOIN user_groups g ON g.id = m.group_id WHERE m.user_id = u.id), '{}') AS groups
  FROM users u
 WHERE (%(all)s OR u.active) AND (%(name)s::text IS NULL OR u.username = %(name)s)
 ORDER BY u.id

-- name: user_roles
-- The roles a user holds, directly or through its groups, and where.
SELECT a.role, coalesce(w.name, '(all workspaces)') AS workspace,
       CASE WHEN a.user_id IS NULL THEN 'group ' || g.name ELSE 'directly' END AS via
  FROM users u
  JOIN role_assignments a
    ON a.user_id = u.id
    OR a.group_id IN (SELECT m.group_id FROM user_group_members m WHERE m.user_id = u.id)
  LEFT JOIN user_groups g ON g.id = a.group_id
  LEFT JOIN workspaces w ON w.id = a.workspace_id
 WHERE u.username = %(name)s
 ORDER BY a.workspace_id NULLS FIRST, a.role

-- name: user_groups
-- Groups (one, by name, or all) with their members' names.
SELECT g.id, g.name, g.created_at,
       coalesce((SELECT array_agg(u.username ORDER BY u.username) FROM user_group_members m
                  JOIN users u ON u.id = m.user_id WHERE m.group_id = g.id), '{}') AS members
  FROM user_groups g WHERE %(name)s::text IS NULL OR g.name = %(name)s ORDER BY g.id

-- name: roles
-- The roles, what each permits, and where each can be assigned.
SELECT name, permissions, CASE WHEN global_only THEN 'cluster' ELSE 'cluster or workspace'
       END AS scope, description
  FROM roles WHERE NOT (%(exclude_global)s AND global_only) ORDER BY cardinality(permissions), name

-- name: caller_permissions
-- What the session's det user may do, and in which workspace (NULL: all of them).
SELECT DISTINCT coalesce(w.name, '(all workspaces)') AS workspace, p.permission, g.workspace_id
  FROM det_user.user_grants(det_user.caller()) g
  LEFT JOIN workspaces w ON w.id = g.workspace_id
 CROSS JOIN unnest(g.permissions) AS p(permission)
 ORDER BY g.workspace_id NULLS FIRST, p.permission

-- name: templates
-- What users may select of a template (schema.sql grants no more): its config with secrets
-- redacted, and its YAML only when it held none.
SELECT w.name AS workspace, t.name, t.owner, t.created_at, t.updated_at,
       t.redacted_config AS config
  FROM templates t JOIN workspaces w ON w.id = t.workspace_id
 WHERE %(workspace)s::text IS NULL OR w.name = %(workspace)s
 ORDER BY w.name, t.name

-- name: template
-- One template, as templates shows it, with its YAML (redacted_original).
SELECT w.name AS workspace, t.name, t.owner, t.created_at, t.updated_at,
       t.redacted_config AS config, t.redacted_original AS original
  FROM templates t JOIN workspaces w ON w.id = t.workspace_id
 WHERE w.name = %(workspace)s AND t.name = %(name)s

-- name: experiment_exists
SELECT 1 FROM experiments WHERE id = %s

-- name: trial_exists
SELECT 1 FROM trials WHERE id = %s

-- name: checkpoint_sizes
-- An experiment's checkpoints with their size in bytes (the sum of their files') and what
-- deleting each freed.
SELECT c.uuid::text AS uuid, c.trial_id, c.steps_completed, c.state, c.reported_at,
       (SELECT sum(value::bigint) FROM jsonb_each_text(c.resources))::bigint AS size_bytes,
       c.freed_bytes, c.deleted_at
  FROM checkpoints c JOIN trials t ON t.id = c.trial_id
 WHERE t.experiment_id = %(id)s ORDER BY c.trial_id, c.steps_completed

-- name: checkpoint_described
-- One checkpoint whole, with its experiment and the validation metrics reported at its batch.
SELECT c.uuid::text AS uuid, t.experiment_id, c.trial_id, c.steps_completed, c.state,
       c.reported_at, c.storage, c.metadata, c.resources,
       (SELECT m."values" FROM metrics m
         WHERE m.trial_id = c.trial_id AND m."group" = 'validation'
           AND m.superseded_by IS NULL AND m.steps_completed = c.steps_completed
         ORDER BY m.id DESC LIMIT 1) AS validation
  FROM checkpoints c JOIN trials t ON t.id = c.trial_id
 WHERE c.uuid = %(uuid)s::uuid

-- name: version_checkpoint
-- A model version's checkpoint (det_user.model_version_find: the latest version when NULL).
SELECT v.version, v.checkpoint_uuid::text AS checkpoint_uuid, m.name
  FROM det_user.model_version_find(%(model)s, %(version)s) v JOIN models m ON m.id = v.model_id

-- name: pool_bindings
-- Which workspaces each pool (or one) is bound to.
SELECT b.resource_pool, w.name AS workspace FROM workspace_pools b
  JOIN workspaces w ON w.id = b.workspace_id
 WHERE %(pool)s::text IS NULL OR b.resource_pool = %(pool)s ORDER BY 1, 2

-- name: pool_schedulers
SELECT name, det_user.pool_scheduler(name) AS scheduler FROM resource_pools ORDER BY name

-- name: server_info
-- What det version and det master info show of det's database.
SELECT current_setting('server_version') AS server_version, current_database() AS database,
       current_user AS user_name, det.schema_version() AS schema_version

-- name: project_experiments
SELECT id, name, state::text AS state, owner, start_time FROM experiments
 WHERE project_id = %s ORDER BY id

-- det.configs's read: the cluster config that applies (det serve's storage access, the
-- reconciler's pass)

-- name: applied_cluster_config
-- The config of the last `det cluster config apply`; no row: none was applied (the caller
-- takes the default one).
SELECT config FROM cluster_config
