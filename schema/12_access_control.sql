-- Access control: who is calling, what they may do, and the audit log. User
-- actions are SECURITY DEFINER functions (they run as the schema's owner, so row-level
-- security does not hide rows from them): each checks its caller's permission with
-- det_internal.require in the transaction of its change.

CREATE FUNCTION det_user.caller() RETURNS text LANGUAGE sql STABLE AS $$
-- The user acting in this session: its login role (session_user, which a SECURITY DEFINER
-- function does not change, unlike current_user), or, for det serve (connected as det_web),
-- the user whose token det_web.auth accepted in this transaction.
SELECT coalesce(CASE WHEN pg_has_role(session_user, 'det_web', 'MEMBER')
                     THEN nullif(current_setting('det.web_user', true), '') END,
                session_user::text)
$$;
GRANT EXECUTE ON FUNCTION det_user.caller() TO det_user;

CREATE FUNCTION det_user.is_owner_session() RETURNS boolean LANGUAGE plpgsql STABLE AS $$
-- Whether the session is the cluster's own (the role owning det's tables, a member of it, or
-- a superuser: the reconciler, `det cluster up`) acting as no det user. It holds every
-- permission.
BEGIN
    RETURN NOT EXISTS (SELECT 1 FROM users WHERE username = det_user.caller())
       AND pg_has_role(session_user, (SELECT relowner FROM pg_class
                                       WHERE oid = 'experiments'::regclass), 'MEMBER');
END $$;
GRANT EXECUTE ON FUNCTION det_user.is_owner_session() TO det_user;

CREATE FUNCTION det_user.user_grants(p_user text)
RETURNS TABLE (workspace_id integer, permissions text[]) LANGUAGE sql STABLE AS $$
-- What active user p_user holds: one row per role assigned to them or to one of their
-- groups, with its workspace (NULL: every workspace) and its permissions (see roles). The
-- one home of that rule: det_user.permitted and det_user.visible_workspaces read it.
SELECT a.workspace_id, r.permissions
  FROM users u
  JOIN role_assignments a
    ON a.user_id = u.id
    OR a.group_id IN (SELECT m.group_id FROM user_group_members m WHERE m.user_id = u.id)
  JOIN roles r ON r.name = a.role
 WHERE u.username = p_user AND u.active
$$;
GRANT EXECUTE ON FUNCTION det_user.user_grants(text) TO det_user;

CREATE FUNCTION det_user.permitted(p_user text, p_permission text, p_workspace integer)
RETURNS boolean LANGUAGE sql STABLE AS $$
-- Whether active user p_user holds p_permission in workspace p_workspace (NULL: globally)
-- through a role held globally or there (det_user.user_grants).
SELECT EXISTS (
    SELECT 1 FROM det_user.user_grants(p_user) g
     WHERE p_permission = ANY (g.permissions)
       AND (g.workspace_id IS NULL OR g.workspace_id = p_workspace))
$$;
GRANT EXECUTE ON FUNCTION det_user.permitted(text, text, integer) TO det_user;

CREATE FUNCTION det_user.visible_workspaces() RETURNS integer[] LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The workspaces the calling user may view (det_user.permitted's rule, as one query): what the
-- row-level security policies key on, called once per query as an InitPlan:
-- `= ANY ((SELECT det_user.visible_workspaces())::integer[])`.
WITH viewable AS (SELECT g.workspace_id FROM det_user.user_grants(det_user.caller()) g
                   WHERE 'view' = ANY (g.permissions))
SELECT CASE WHEN EXISTS (SELECT 1 FROM viewable WHERE workspace_id IS NULL)
            THEN (SELECT coalesce(array_agg(id), '{}') FROM workspaces)
            ELSE (SELECT coalesce(array_agg(DISTINCT workspace_id), '{}') FROM viewable) END
$$;
GRANT EXECUTE ON FUNCTION det_user.visible_workspaces() TO det_user;

CREATE FUNCTION det_user.visible_projects() RETURNS integer[] LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The projects of det_user.visible_workspaces: experiments' policy keys on them, so that a user of
-- few projects reads their experiments through the project index.
SELECT coalesce(array_agg(id), '{}') FROM projects
 WHERE workspace_id = ANY (det_user.visible_workspaces())
$$;
GRANT EXECUTE ON FUNCTION det_user.visible_projects() TO det_user;

CREATE FUNCTION det_user.role_needed(p_permission text) RETURNS text LANGUAGE sql STABLE AS $$
-- The least role that grants p_permission, to name in a refusal.
SELECT name FROM roles WHERE p_permission = ANY (permissions)
 ORDER BY cardinality(permissions), name LIMIT 1
$$;
GRANT EXECUTE ON FUNCTION det_user.role_needed(text) TO det_user;

CREATE FUNCTION det_internal.require(p_permission text, p_workspace integer, p_action text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
-- Check that the caller may do p_action (words for the refusal: 'pause experiment 12') with
-- p_permission in workspace p_workspace (NULL: a cluster-wide permission); returns the
-- caller's name. Refusal is insufficient_privilege, one line naming the role and scope:
-- "permission denied: needs Editor on workspace 'vision' to pause experiment 12". A caller
-- who may not even view the workspace is told what they asked about is not found
-- (no_data_found), as row-level security would show it: no rows.
DECLARE
    v_user text := det_user.caller();
BEGIN
    IF det_user.is_owner_session() THEN
        RETURN v_user;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM users WHERE username = v_user AND active) THEN
        RAISE EXCEPTION 'permission denied: % is not an active det user', to_jsonb(v_user)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF det_user.permitted(v_user, p_permission, p_workspace) THEN
        RETURN v_user;
    END IF;
    IF p_workspace IS NOT NULL AND NOT det_user.permitted(v_user, 'view', p_workspace) THEN
        RAISE EXCEPTION 'cannot %: not found', p_action USING ERRCODE = 'no_data_found';
    END IF;
    RAISE EXCEPTION 'permission denied: needs % % to %', det_user.role_needed(p_permission),
        CASE WHEN p_workspace IS NULL THEN 'on the cluster'
             ELSE format('on workspace ''%s''', (SELECT name FROM workspaces
                                                  WHERE id = p_workspace)) END,
        p_action USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE FUNCTION det_internal.audit(p_action text, p_object_type text, p_object_id text,
                          p_detail jsonb DEFAULT '{}') RETURNS void
LANGUAGE plpgsql AS $$
-- One audit_log entry by the caller, in the transaction of the change it records.
BEGIN
    INSERT INTO audit_log (actor, action, object_type, object_id, detail)
    VALUES (det_user.caller(), p_action, p_object_type, p_object_id, coalesce(p_detail, '{}'));
END $$;

CREATE FUNCTION det_user.experiment_workspace(p_id integer) RETURNS integer LANGUAGE plpgsql
STABLE AS $$
-- The workspace experiment p_id is in. Raises no_data_found.
DECLARE
    v_ws integer;
BEGIN
    SELECT j.workspace_id INTO v_ws FROM experiments e JOIN jobs j ON j.id = e.job_id
     WHERE e.id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'experiment % not found', p_id USING ERRCODE = 'no_data_found';
    END IF;
    RETURN v_ws;
END $$;
GRANT EXECUTE ON FUNCTION det_user.experiment_workspace(integer) TO det_user;

CREATE FUNCTION det_internal.check_experiment_project() RETURNS trigger LANGUAGE plpgsql AS $$
-- An experiment's project is in its job's workspace: row-level security reads the one on
-- experiments and the other on jobs and runs, so they must agree.
BEGIN
    IF NOT EXISTS (SELECT 1 FROM projects p JOIN jobs j ON j.workspace_id = p.workspace_id
                    WHERE p.id = NEW.project_id AND j.id = NEW.job_id) THEN
        RAISE EXCEPTION 'experiment %: project % is not in its job''s workspace', NEW.id,
            NEW.project_id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE CONSTRAINT TRIGGER experiments_project_in_workspace
    AFTER INSERT OR UPDATE OF project_id, job_id ON experiments
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
        EXECUTE FUNCTION det_internal.check_experiment_project();

CREATE FUNCTION det_user.workspace_find(p_name text) RETURNS workspaces
    LANGUAGE plpgsql STABLE AS $$
-- The workspace named p_name (names are exact: any character is part of it). Raises
-- no_data_found, also when the caller may not view it.
DECLARE
    w workspaces;
BEGIN
    SELECT * INTO w FROM workspaces WHERE name = p_name;
    IF NOT FOUND OR NOT (det_user.is_owner_session() OR det_user.permitted(det_user.caller(),
        'view', w.id))
    THEN
        RAISE EXCEPTION 'workspace % not found', to_jsonb(p_name) USING ERRCODE = 'no_data_found';
    END IF;
    RETURN w;
END $$;
GRANT EXECUTE ON FUNCTION det_user.workspace_find(text) TO det_user;

CREATE FUNCTION det_user.project_find(p_workspace text, p_project text) RETURNS projects
LANGUAGE plpgsql STABLE AS $$
-- Project p_project of workspace p_workspace. Raises no_data_found.
DECLARE
    w workspaces := det_user.workspace_find(p_workspace);
    p projects;
BEGIN
    SELECT * INTO p FROM projects WHERE workspace_id = w.id AND name = p_project;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'project % not found in workspace %', to_jsonb(p_project),
            to_jsonb(w.name) USING ERRCODE = 'no_data_found';
    END IF;
    RETURN p;
END $$;
GRANT EXECUTE ON FUNCTION det_user.project_find(text, text) TO det_user;

CREATE FUNCTION det_user.user_find(p_username text) RETURNS users LANGUAGE plpgsql STABLE AS $$
-- The user named p_username. Raises no_data_found.
DECLARE
    u users;
BEGIN
    SELECT * INTO u FROM users WHERE username = p_username;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % not found', to_jsonb(p_username) USING ERRCODE = 'no_data_found';
    END IF;
    RETURN u;
END $$;
GRANT EXECUTE ON FUNCTION det_user.user_find(text) TO det_user;

CREATE FUNCTION det_internal.check_verifier(p_password_verifier text) RETURNS void LANGUAGE plpgsql
IMMUTABLE AS $$
-- A password reaches det only as a SCRAM-SHA-256 verifier made by the client (libpq's
-- PQencryptPasswordConn), never as the password itself.
BEGIN
    IF p_password_verifier IS NOT NULL AND p_password_verifier NOT LIKE 'SCRAM-SHA-256$%' THEN
        RAISE EXCEPTION 'password: expected a SCRAM-SHA-256 verifier computed by the client'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

CREATE FUNCTION det_internal.password_stamp(p_user text) RETURNS bytea LANGUAGE plpgsql STABLE AS $$
-- A digest (SHA-256) of the verifier PostgreSQL keeps for role p_user's password
-- (pg_authid.rolpassword): it changes whenever the password does, however it was changed
-- (a role may always ALTER ROLE its own PASSWORD, and no trigger sees that). NULL when the
-- role has no password, or when the caller may not read pg_authid (a superuser's table;
-- det's SECURITY DEFINER functions call this as det's owner, which the embedded cluster's is:
-- an owner that is not a superuser leaves det blind to a change made outside det). Only
-- det's owner may call it.
BEGIN
    IF NOT has_table_privilege('pg_catalog.pg_authid', 'SELECT') THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT sha256(convert_to(a.rolpassword, 'UTF8'))
              FROM pg_catalog.pg_authid a WHERE a.rolname = p_user);
END $$;

CREATE FUNCTION det_internal.password_policy(p_password_length integer, p_weak_ok boolean,
                                    p_action text) RETURNS void LANGUAGE plpgsql STABLE AS $$
-- The minimum password policy: a new password has at least 8 characters, unless a
-- ClusterAdmin sets p_weak_ok (`--weak-ok`) for p_action ('set the password of user "bob"').
-- det sees a password only as its client-made SCRAM verifier (det_internal.check_verifier), so the
-- client states its length in characters (det's CLI counts it); the cluster's own session,
-- which may ALTER ROLE any password anyway, may leave it unstated (NULL). Raises
-- invalid_parameter_value (too short, or unstated), insufficient_privilege (p_weak_ok by a
-- caller who is no ClusterAdmin).
BEGIN
    IF p_weak_ok THEN
        PERFORM det_internal.require('admin_cluster', NULL, format('%s with --weak-ok', p_action));
        RETURN;
    END IF;
    IF p_password_length IS NULL AND NOT det_user.is_owner_session() THEN
        RAISE EXCEPTION 'password length: expected the new password''s length in characters '
                        '(det requires at least 8)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_password_length < 8 THEN
        RAISE EXCEPTION 'password: expected at least 8 characters, got %; a ClusterAdmin may '
                        'allow a shorter one with --weak-ok', p_password_length
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;
