-- Roles and privileges
--
-- Nobody but the schema's owner may do anything not granted: a user (det_user) reads through
-- row-level security and changes state only through the user-action functions (SECURITY
-- DEFINER, each checks its caller's permission; its readers run as the caller, under
-- row-level security); an agent (det_agent) and a task (det_task) may only EXECUTE their own
-- functions, and det serve (det_web) its login functions (then it acts as the request's user,
-- SET LOCAL ROLE). Each object's grants follow its definition; tables granted to nobody
-- (tokens, sessions, the searcher's event queue, the reconciler's bookkeeping) are the
-- owner's alone.

DO $$
BEGIN
    -- Roles belong to the server: several det databases on one server share them.
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'det_user') THEN
        CREATE ROLE det_user NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'det_agent') THEN
        CREATE ROLE det_agent LOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'det_task') THEN
        CREATE ROLE det_task LOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'det_web') THEN
        CREATE ROLE det_web LOGIN NOINHERIT;
    END IF;
    -- the one-time logins of enrollment tokens (det_user.agent_token_create) are its members
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'det_enroll') THEN
        CREATE ROLE det_enroll NOLOGIN;
    END IF;
END $$;

-- No function is executable by PUBLIC: each function's grant names the roles that may call
-- it. This is the global default of the role that runs this file or the migrations (a
-- per-schema one cannot take a privilege away), so it covers every function added later.
ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
