-- What det.db sends: the NOTIFY channels' calls (det.db.channels), the migration ledger
-- (det.db.migrate), the actors' roles and passwords (det.db.roles) and the embedded server's
-- setup (det.db.embedded). A channel's name never appears here: the listen functions and
-- det_internal.channel build it inside the database from the channel's kind and key (schema.sql,
-- "NOTIFY channels").

-- name: listen
-- The session LISTENs on a channel by kind and key: the schema's owner only.
SELECT det_internal.listen(%s, %s)

-- name: notify
-- NOTIFY a channel by kind and key with a payload, delivered at the transaction's commit: the
-- schema's owner only.
SELECT pg_notify(det_internal.channel(%s, %s), %s)

-- name: channel_name
-- The name of a channel (kind, key) in this cluster, to compare with a notification's channel:
-- the schema's owner only; never handed to a user or task.
SELECT det_internal.channel(%s, %s)

-- name: agent_listen
-- An agent's session LISTENs on its own channel (det_agent).
SELECT det_agent.listen(%s)

-- name: task_listen
-- A task's session LISTENs on its allocation's channel, by its token (det_task).
SELECT det_task.listen(%s)

-- name: web_listen
-- det serve's listener LISTENs on the web channel (det_web).
SELECT det_web.listen()

-- name: confirm_primary
-- A connection to a replicated cluster proves its server is still the primary its synchronous
-- replica follows (det.db.reconnect): a transactional message writes WAL, so its commit waits
-- for that replica; on a deposed primary (one woken from a freeze after a failover, before
-- Patroni demotes it) it never returns. Writes nothing any table holds; any role may.
SELECT pg_logical_emit_message(true, 'det.confirm_primary', '')

-- name: lock_migrations
-- Serializes migrating sessions (det cluster up, an agent, a test) until the transaction ends,
-- so each version is applied once.
SELECT pg_advisory_xact_lock(%s)

-- name: create_ledger
-- The ledger of applied migrations, created by the first migration run.
CREATE TABLE IF NOT EXISTS det_migrations (version integer PRIMARY KEY,
    name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())

-- name: applied_versions
-- The migrations this database has applied.
SELECT version FROM det_migrations

-- name: is_applied
-- Whether one version was applied, re-read under the lock: another process may have applied it
-- between the first read and the lock.
SELECT 1 FROM det_migrations WHERE version = %s

-- name: record_migration
-- Records a version as applied, in the transaction that applied it.
INSERT INTO det_migrations (version, name) VALUES (%s, %s)

-- name: schema_version
-- The newest migration the schema has (det.schema_version: migration 0015 and later).
SELECT det.schema_version()

-- name: may_migrate
-- Whether this session may create in the schema: its owner (det cluster up, the reconciler, an
-- admin's URL) may migrate it, anyone else is told to run det cluster up.
SELECT has_schema_privilege('public', 'CREATE')

-- name: set_scram_iterations
-- The SCRAM iterations of the verifiers libpq computes on this session (PostgreSQL 16 and
-- later); the caller composes the count as a literal: SET takes no parameter.
SET scram_iterations = {}

-- name: reset_scram_iterations
-- Back to the server's scram_iterations once a verifier is computed.
RESET scram_iterations

-- name: set_role_password
-- A role's password, as a SCRAM-SHA-256 verifier computed by the client, never in clear: the
-- caller composes the role as an identifier and binds the verifier on the client (ALTER ROLE
-- takes no server-side parameter).
ALTER ROLE {} PASSWORD %s

-- name: role_exists
-- Whether a login role of this name exists (a det user is a role).
SELECT 1 FROM pg_roles WHERE rolname = %s

-- name: user_set_password
-- A det user's new password: name, verifier, password length.
SELECT det_user.user_set_password(%s, %s, %s)

-- name: user_create
-- A new det user who is a ClusterAdmin: name, verifier, password length.
SELECT det_user.user_create(%s, %s, true, %s)

-- name: session_user
-- The user this connection logged in as.
SELECT session_user

-- name: reload_conf
-- The embedded server reads pg_hba.conf again (it now asks every connection for a password).
SELECT pg_reload_conf()

-- name: database_exists
-- Whether the embedded server has the det database yet.
SELECT 1 FROM pg_database WHERE datname = %s

-- name: create_database
-- The embedded server's det database; the caller composes its name as an identifier.
CREATE DATABASE {}
