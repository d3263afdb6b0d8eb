-- What the CLI sends of its own (det.cli): calls of the det_user.* functions of schema.sql, each
-- user action one transaction, and the few reads that only one command makes. Reads that det
-- serve shares live in queries.sql.

-- name: task_kill
SELECT det_user.task_kill(%s)

-- name: job_set_priority
SELECT det_user.job_update(%s, 'priority', %s)

-- name: agent_token_create
SELECT role_name, expires_at FROM det_user.agent_token_create(%s, %s, %s::interval)

-- name: agent_enroll
SELECT det_enroll.agent_enroll(%s, %s)

-- name: agent_revoke
SELECT det_user.agent_revoke(%s) AS n

-- name: agent_set_enabled
SELECT det_user.agent_set_enabled(%s, %s)::text AS s

-- name: agent_drain
SELECT det_user.agent_drain(%s) AS n

-- name: slot_set_enabled
SELECT det_user.slot_set_enabled(%s, %s, %s)

-- name: task_ssh_key
SELECT det_user.task_ssh_key(%s) AS k

-- name: job_update
SELECT det_user.job_update(%s, %s, %s)

-- name: gc_preview
SELECT uuid::text AS uuid, trial_id, steps_completed, size_bytes, metric
  FROM det_user.checkpoints_to_delete(%(id)s, %(seb)s, %(stb)s, %(stl)s)

-- name: create_experiment
SELECT det_user.create_experiment(%s, %s, %s, %s, %s) AS id

-- name: experiment_pause
SELECT det_user.experiment_action(%s, 'pause')

-- name: experiment_archive
SELECT det_user.experiment_archive(%s, true)

-- name: experiment_action
SELECT det_user.experiment_action(%s, %s) AS s

-- name: experiment_unarchive
SELECT det_user.experiment_archive(%s, false)

-- name: experiment_move
SELECT det_user.experiment_move(%s, %s, %s)

-- name: experiment_delete
SELECT det_user.experiment_delete(%s) AS gone

-- name: set_gc_policy
SELECT det_user.set_gc_policy(%(id)s, %(seb)s, %(stb)s, %(stl)s) AS n

-- name: model_create
SELECT id, name, description, labels, owner, creation_time
    FROM det_user.model_create(%s, %s, %s, %s)

-- name: model_version_find
SELECT det_user.model_version_find(%s, %s)

-- name: model_register_version
SELECT version, checkpoint_uuid::text AS checkpoint_uuid
  FROM det_user.model_register_version(%s, %s, %s, %s, %s, %s)

-- name: model_update
SELECT det_user.model_update(%s, %s, %s, %s, %s, %s, %s)

-- name: model_version_update
SELECT det_user.model_version_update(%s, %s, %s, %s, %s, %s, %s)

-- name: model_set_archived
SELECT name FROM det_user.model_set_archived(%s, %s)

-- name: model_move
SELECT det_user.model_move(%s, %s)

-- name: model_delete
SELECT det_user.model_delete(%s) AS n

-- name: model_version_delete
SELECT det_user.model_version_delete(%s, %s)::text AS u

-- name: apply_cluster_config
SELECT det_user.apply_cluster_config(%s, %s)

-- name: workspace_bind_pool
SELECT det_user.workspace_bind_pool(%s, %s, %s)

-- name: role_assign
SELECT det_user.role_assign(%s, %s, %s, %s, %s)

-- name: caller
SELECT det_user.caller() AS u

-- name: template_set
SELECT det_user.template_set(%s, %s, %s, %s) AS c

-- name: template_remove
SELECT det_user.template_remove(%s, %s)

-- name: user_create
SELECT det_user.user_create(%s, %s, %s, %s, %s) AS id

-- name: user_set_active
SELECT det_user.user_set_active(%s, %s)

-- name: user_set_password
SELECT det_user.user_set_password(%s, %s, %s, %s)

-- name: group_create
SELECT det_user.group_create(%s) AS id

-- name: group_add_member
SELECT det_user.group_set_member(%s, %s, true)

-- name: group_delete
SELECT det_user.group_delete(%s)

-- name: group_set_member
SELECT det_user.group_set_member(%s, %s, %s)

-- name: workspace_create
SELECT det_user.workspace_create(%s, %s, %s, %s) AS id

-- name: workspace_set_archived
SELECT det_user.workspace_set_archived(%s, %s)

-- name: workspace_delete
SELECT det_user.workspace_delete(%s)

-- name: project_create
SELECT det_user.project_create(%s, %s, %s) AS id

-- name: project_set_archived
SELECT det_user.project_set_archived(%s, %s, %s)

-- name: project_delete
SELECT det_user.project_delete(%s, %s)

-- name: delete_checkpoints
SELECT det_user.delete_checkpoints(%s::uuid[]) AS n
