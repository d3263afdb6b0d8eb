-- det's schema as it is today: the whole control plane, and the contract every actor codes
-- against. Read this file to learn det's states and rules.
--
-- Rules live here, next to the data:
--   * states are enums and every transition is checked by a trigger
--     (det_internal.check_transition);
--   * a slot is held by at most one live allocation, a trial has at most one live allocation
--     (partial unique indexes);
--   * writes that carry rules go through the actors' functions (det_user.*, det_agent.*, ...),
--     called alike by the CLI, the reconciler, agents and the harness (the harness
--     authenticates with an allocation token, stored here only as a SHA-256 hash);
--   * the `reporting` schema holds stable views for users' own SQL.
--
-- The contract is this file with the files below, in their order, one concern each: roles and
-- default privileges; the schemas of the actors' functions; types; tables by concern (each
-- with its comments, indexes and grants); NOTIFY channels; the transition trigger; functions
-- by actor (user actions in det_user, agents' in det_agent, tasks' in det_task, det serve's in
-- det_web, the reconciler's helpers in det_internal); reporting views; row-level security.
-- Grants sit beside their definitions: each table's, view's and schema's after it, each
-- function's after it (and its COMMENT), one GRANT EXECUTE per function naming every role
-- that may call it. `psql -f schema.sql` runs it whole (\ir includes relative to this file);
-- det.db.schema reads it as one text.
--
-- How databases get here. det does not execute this file: databases are built and upgraded
-- by the migrations in db/migrations/ (NNNN_name.sql, applied in order, each in its own
-- transaction, recorded in det_migrations; see db/migrate.py). tests/test_migrations.py builds one
-- database from the migrations and one from this contract and asserts their catalogs are
-- identical. To change the schema: add the next migration file, then fold the change in where
-- the object is defined, in the file of its concern (a new column goes last in its CREATE
-- TABLE; a replaced function or view replaces its definition, verbatim), so that each object
-- is still defined once.

\ir schema/01_roles.sql
\ir schema/02_schemas.sql
\ir schema/03_types.sql
\ir schema/04_tables_cluster.sql
\ir schema/05_tables_access.sql
\ir schema/06_tables_experiments.sql
\ir schema/07_tables_allocations.sql
\ir schema/08_tables_registry.sql
\ir schema/09_tables_serve.sql
\ir schema/10_channels.sql
\ir schema/11_transitions.sql
\ir schema/12_access_control.sql
\ir schema/13_user_admin.sql
\ir schema/14_user_actions.sql
\ir schema/15_user_registry.sql
\ir schema/16_agent.sql
\ir schema/17_task.sql
\ir schema/18_reconciler.sql
\ir schema/19_gc.sql
\ir schema/20_serve.sql
\ir schema/21_reporting.sql
\ir schema/22_row_security.sql
