-- The submission's statements (det.submission): what the CLI and det serve alike read and call
-- to let an experiment or an interactive task into the cluster.

-- name: template_expand
-- A template of a workspace, secrets included, to merge under a submitted config; takes Editor
-- on the workspace, as the submission does.
SELECT det_user.template_expand(%s, %s) AS c

-- name: pool_capacity
-- Each live agent of a pool with its number of slots: whether any could ever hold the job.
SELECT g.id, count(s.slot_id) AS slots FROM agents g LEFT JOIN slots s ON s.agent_id = g.id
 WHERE g.resource_pool = %(pool)s AND g.state <> 'LOST' GROUP BY g.id

-- name: task_pool_defaults
-- The default compute and auxiliary pools of a task's workspace (None: Uncategorized) and of
-- the cluster config, for a task that names no pool.
SELECT w.default_compute_pool, w.default_aux_pool,
       c.default_compute_pool AS cluster_compute, c.default_aux_pool AS cluster_aux
  FROM (SELECT 1) one
  LEFT JOIN workspaces w ON w.name = coalesce(%(workspace)s, 'Uncategorized')
  LEFT JOIN cluster_config c ON true

-- name: create_task
-- Store an interactive task: kind, expanded config, packed context, placement, the
-- TensorBoard's experiments and trials, and the task's secrets.
SELECT det_internal.create_task(%s, %s, %s, %s, %s, %s, %s, %s) AS id

-- name: source_experiment
-- An experiment as the source of a new one: its original config, packed context, workspace
-- and project.
SELECT e.id, e.original_config, b.data AS context, w.name AS workspace, p.name AS project
  FROM experiments e JOIN projects p ON p.id = e.project_id
  JOIN workspaces w ON w.id = p.workspace_id
  LEFT JOIN context_blobs b ON b.id = e.context_id
 WHERE e.id = %(id)s

-- name: source_trial
-- A trial as the source of a new experiment: its experiment, hyperparameters and latest
-- checkpoint.
SELECT id, experiment_id, hparams, latest_checkpoint::text AS latest_checkpoint
  FROM trials WHERE id = %(id)s
