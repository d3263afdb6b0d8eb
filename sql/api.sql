-- det serve's statements (det.api): each request's calls of det_user.* functions, run as the
-- logged-in user's role inside the request's one transaction (det.api.session), except the
-- login's own, which det serve's role makes before there is a user. What the API reads
-- lives in sql/queries.sql, shared with the CLI.

-- name: login_begin
-- Asked before any password is checked: the seconds the user name or the client's address
-- stays locked after failed logins (0: go ahead).
SELECT det_web.login_begin(%s, %s) AS w

-- name: login_failed
-- A wrong user or password: audited and counted toward the throttle.
SELECT det_web.login_failed(%s, %s)

-- name: web_login
-- Store the new token (hashed) for the user with its lifetime in seconds; answers its expiry.
SELECT det_web.login(%s, %s, %s, %s) AS e

-- name: web_logout
-- End the login of this token: it is refused from now on.
SELECT det_web.logout(%s)

-- name: web_auth
-- The token's user made the transaction's caller (SQLSTATE 28000 for an unknown or expired
-- token); NULL where the password changed since the token was minted.
SELECT det_web.auth(%s) AS u

-- name: set_local_role
-- Become the user's role for the rest of the transaction, so row-level security applies to
-- the request as to the user's own psql (the role composed in as an identifier).
SET LOCAL ROLE {}

-- name: web_watch
-- Renew this server's lease on web events: the triggers NOTIFY only while a lease is held.
SELECT det_web.watch(%s, %s)

-- name: task_open
-- The task as a proxy target (its kind, state, address, Jupyter token, end reason), checked
-- as the user (404 unseen, 403 not openable); touches its last activity.
SELECT * FROM det_user.task_open(%s)

-- name: task_kill
-- End the task (Editor of its workspace); an ended task stays as it is.
SELECT det_user.task_kill(%s)

-- name: experiment_create_check
-- May the caller create in this workspace and project (403, or 404 for one they cannot
-- see)? Asked before a byte of the context is unpacked.
SELECT det_user.experiment_create_check(%s, %s)

-- name: create_experiment
-- Store the expanded config, the original YAML and the packed context in the project.
SELECT det_user.create_experiment(%s, %s, %s, %s, %s) AS id

-- name: experiment_action
-- pause | activate | cancel | kill: the experiment's state after it (409 where the state does
-- not allow the action).
SELECT det_user.experiment_action(%s, %s)::text AS s

-- name: experiment_archive
-- Archive or unarchive an experiment (only an ended one can be archived).
SELECT det_user.experiment_archive(%s, %s)

-- name: job_update
-- One change of a job (priority, weight, resource-pool, ahead-of, behind-of), checked against
-- its pool's scheduler.
SELECT det_user.job_update(%s, %s, %s)

-- name: job_move_ahead_of
-- Move to Top: the job goes ahead of the job at the head of its pool's queue.
SELECT det_user.job_update(%s, 'ahead-of', %s)

-- name: agent_set_enabled
-- Enable or drain an agent; answers its state.
SELECT det_user.agent_set_enabled(%s, %s)::text AS s

-- name: slot_set_enabled
-- Enable or drain one slot of an agent.
SELECT det_user.slot_set_enabled(%s, %s, %s)

-- name: model_create
-- An empty model in a workspace where the caller is an Editor.
SELECT id FROM det_user.model_create(%s, %s, %s, %s)

-- name: model_register_version
-- A COMPLETED checkpoint becomes the model's next version (and is pinned).
SELECT model_id, version FROM det_user.model_register_version(%s, %s, %s, %s, %s, %s)
