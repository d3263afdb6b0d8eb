-- The harness's statements: what a task process sends, authenticated by its allocation token
-- (the first parameter of every det_task.* function here; schema.sql checks it with
-- det_internal.auth).
-- A trial's transport (det.harness.transport.DbTransport), an interactive task's
-- (det.harness.interactive.common.TaskTransport) and the checkpoint GC task
-- (det.harness.checkpoint_gc). Every function called is safe to run again after an attempt
-- whose outcome was lost with the connection (DbTransport's docstring says why for each).

-- name: task_info
-- The trial task's identity and starting point: ids, expanded config, hparams, seed, the
-- checkpoint to resume from and the slots held (det.harness.transport.TaskInfo).
SELECT det_task.info(%s)

-- name: report_metrics_batch
-- One writer batch of metrics rows: writer id, batch sequence number, then the groups, batch
-- counts and JSON texts as three parallel arrays in binary format. A batch the writer already
-- recorded (metric_batches) is skipped, so a retry after a lost answer stores nothing twice.
SELECT det_task.report_metrics_batch(%s, %s, %s, %b, %b, %b::jsonb[])

-- name: report_progress
-- The latest progress of one searcher op, in the unit of searcher.max_length.
SELECT det_task.report_progress(%s, %s, %s)

-- name: checkpoint_begin
-- Before a checkpoint's first file is written: refused (SQLSTATE 28000) once the allocation
-- was ended, so a fenced run writes no file.
SELECT det_task.checkpoint_begin(%s)

-- name: report_checkpoint
-- Record a stored checkpoint: uuid, batches trained, resources (file sizes in bytes) and
-- metadata. Inserts by uuid: a unique violation on checkpoints_pkey after a lost answer
-- means the earlier attempt recorded it.
SELECT det_task.report_checkpoint(%s, %s::uuid, %s, %s, %s)

-- name: report_storage_error
-- The checkpoint storage failed: the message becomes the run's exit reason and the
-- experiment is paused instead of the trial restarting.
SELECT det_task.report_storage_error(%s, %s)

-- name: current_op
-- The trial's next searcher op, {"id", "length"}; {"wait": true} while the searcher decides;
-- NULL when it wants nothing more.
SELECT det_task.current_op(%s)

-- name: complete_op
-- An op done: its id and the searcher metric.
SELECT det_task.complete_op(%s, %s, %s)

-- name: should_preempt
-- Whether the cluster asks the run to stop (the preemption watcher polls it).
SELECT det_task.should_preempt(%s)

-- name: stop_reason
-- Why the run is asked to stop, for its log (NULL where the database does not say).
SELECT det_task.stop_reason(%s)

-- name: ack_preemption
-- The run saw the stop request: its coming exit 0 means "preempted, resume me".
SELECT det_task.ack_preemption(%s)

-- name: report_early_exit
-- The run ends early, with a reason of det.reasons.EarlyExitReason.
SELECT det_task.report_early_exit(%s, %s)

-- name: experiment_best_validation
-- The best searcher metric among the experiment's trials (NULL before any validation).
SELECT det_task.experiment_best_validation(%s)

-- name: set_trial_metadata
-- Merge a JSON object into the trial's metadata; answers the merged metadata.
SELECT det_task.set_trial_metadata(%s, %s)

-- name: trial_metadata
-- The trial's metadata.
SELECT det_task.trial_metadata(%s)

-- name: task_secrets
-- An interactive task's {job_id, jupyter_token, ssh_public_key}.
SELECT det_task.secrets(%s)

-- name: task_ready
-- The interactive task's server answers at this address.
SELECT det_task.ready(%s, %s)

-- name: task_activity
-- The interactive task's server was used at this time (idle_timeout counts from it).
SELECT det_task.activity(%s, %s)

-- name: task_tensorboard_sources
-- A TensorBoard task's sources: the experiments' and trials' ids and checkpoint storages.
SELECT experiment_id, trial_id, storage FROM det_task.tensorboard_sources(%s)

-- name: gc_checkpoints
-- The checkpoint GC task's next batch of DELETING checkpoints (at most the given count),
-- each with its storage config and size in bytes.
SELECT uuid::text, storage, size_bytes FROM det_task.gc_task_checkpoints(%s, %s)

-- name: gc_failed
-- A storage error of the checkpoint GC task, written on the experiment.
SELECT det_task.gc_task_failed(%s, %s)

-- name: gc_deleted
-- Mark a batch of checkpoints DELETED once their files are gone (records the bytes freed);
-- answers how many were this task's to mark.
SELECT det_task.gc_task_deleted(%s, %s::uuid[])

-- name: gc_tensorboards
-- The experiments being deleted whose TensorBoard files the GC task removes, with their
-- storage configs.
SELECT experiment_id, storage FROM det_task.gc_task_tensorboards(%s)

-- name: gc_tensorboards_deleted
-- The TensorBoard files are gone: the experiment's rows may go.
SELECT det_task.gc_task_tensorboards_deleted(%s)

-- name: gc_unrecorded
-- Of the checkpoint uuids found in a storage, those no row names (candidates for the sweep
-- of what crashed runs left).
SELECT u::text FROM det_task.gc_task_unrecorded(%s, %s::uuid[]) u
