-- The SDK's statements: Determined 0.38's Python API over det (the `determined` package),
-- sent as the client's user, so row-level security decides what each reads and may change.
-- determined.experimental.client (experiments, trials, checkpoints, models) and
-- determined.experimental.core_v2 (unmanaged runs: each report one det_user.unmanaged_* call,
-- which only the trial's owner may make).

-- name: checkpoints
-- Checkpoints with what the SDK shows of each: its trial, experiment (config),
-- hyperparameters and the validation metrics reported at its batch. Narrowed by experiment,
-- trial or uuid (each NULL for any).
SELECT c.uuid::text AS uuid, c.state::text AS state, c.storage, c.resources,
       det_user.json_shown(c.metadata) AS metadata, c.reported_at, c.steps_completed, c.trial_id,
       t.experiment_id, t.hparams, e.config AS experiment_config,
       (SELECT det_user.json_shown(m."values") FROM metrics m
         WHERE m.trial_id = c.trial_id AND m."group" = 'validation'
           AND m.steps_completed = c.steps_completed AND m.superseded_by IS NULL
         ORDER BY m.id DESC LIMIT 1) AS validation
  FROM checkpoints c JOIN trials t ON t.id = c.trial_id
  JOIN experiments e ON e.id = t.experiment_id
 WHERE (%(experiment)s::integer IS NULL OR t.experiment_id = %(experiment)s::integer)
   AND (%(trial)s::integer IS NULL OR c.trial_id = %(trial)s::integer)
   AND (%(uuid)s::text IS NULL OR c.uuid::text = lower(%(uuid)s::text))
 ORDER BY c.trial_id, c.steps_completed

-- name: delete_checkpoints
-- Have det delete a checkpoint's files: it becomes DELETING, then a GC task removes them.
SELECT det_user.delete_checkpoints(%s::uuid[])

-- name: checkpoint_add_metadata
-- Merge a JSON object's top-level keys into a checkpoint's metadata; answers the result.
SELECT det_user.checkpoint_add_metadata(%s, %s) AS m

-- name: trial_ids
-- An experiment's trials, by id.
SELECT id FROM trials WHERE experiment_id = %(id)s ORDER BY id

-- name: metrics
-- A page of a trial's metrics of one group after a metrics row id, each with the run that
-- reported it (0.38's trial_run_id); rows a later run superseded left out.
SELECT m.id, m.steps_completed, det_user.json_shown(m."values") AS "values", m.reported_at, a.run
  FROM metrics m JOIN allocations a ON a.id = m.allocation_id
 WHERE m.trial_id = %(trial)s AND m."group" = %(group)s AND m.superseded_by IS NULL
   AND m.id > %(after)s
 ORDER BY m.id LIMIT %(limit)s

-- name: experiment_action
-- An experiment's pause, activate, cancel or kill, as the CLI's.
SELECT det_user.experiment_action(%s, %s)

-- name: create_experiment
-- Submit an experiment: expanded config, its original text, the packed context, workspace
-- and project.
SELECT det_user.create_experiment(%s, %s, %s, %s, %s) AS id

-- name: model_create
-- An empty model, the user's, in Uncategorized: name and description.
SELECT det_user.model_create(%s, %s, NULL, NULL)

-- name: model_set_metadata
-- Set a model's metadata (a JSON object), nothing else of it.
SELECT det_user.model_update(%s, NULL, NULL, NULL, NULL, %s, NULL)

-- name: model_register_version
-- Register a COMPLETED checkpoint (uuid) as the named model's next version; pins it.
SELECT version FROM det_user.model_register_version(%s, %s, NULL, NULL, NULL, NULL)

-- name: unmanaged_start
-- Create or resume an unmanaged experiment and trial in one transaction: expanded config,
-- its text, workspace, project, external experiment and trial ids, hparams (NULL: none).
-- Answers the new run's det.harness.transport.TaskInfo as JSON.
SELECT det_user.unmanaged_start(%s, %s, %s, %s, %s, %s, %s) AS info

-- name: unmanaged_report_metrics
-- One metrics row of an unmanaged run (det_internal.append_metrics's checks): allocation, group,
-- batches trained, values.
SELECT det_user.unmanaged_report_metrics(%s, %s, %s, %s)

-- name: unmanaged_report_checkpoint
-- Record an unmanaged run's stored checkpoint, the trial's restart point: allocation, uuid,
-- batches trained, resources (file sizes in bytes), metadata. A replaced run's is refused.
SELECT det_user.unmanaged_report_checkpoint(%s, %s, %s, %s, %s)

-- name: unmanaged_progress
-- The unmanaged experiment's progress, 0 to 1.
SELECT det_user.unmanaged_progress(%s, %s)

-- name: unmanaged_best_validation
-- The best searcher metric among an experiment's trials, as far as the user may see them.
SELECT CASE WHEN e.smaller_is_better
            THEN min(t.best_validation) ELSE max(t.best_validation) END AS best
  FROM experiments e JOIN trials t ON t.experiment_id = e.id
 WHERE e.id = %s GROUP BY e.id

-- name: unmanaged_trial_metadata
-- A trial's metadata (an unmanaged trial's stays empty: its runs cannot set it).
SELECT metadata FROM trials WHERE id = %s

-- name: unmanaged_end
-- End an unmanaged run and its trial: COMPLETED when the reason is NULL, else ERROR with it.
SELECT det_user.unmanaged_end(%s, %s)
