-- Issue 14: users, groups, workspaces, projects, roles (RBAC) and an audit log; every user
-- action checks its caller's permission; row-level security on user data; det's own
-- PostgreSQL roles (det_user, det_agent, det_task, det_web) and what each may do.

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
END $$;

-- =============================================================================================
-- Tables: users, workspaces, projects and access control (issue 14)
--
-- A det user is a PostgreSQL role of the same name (LOGIN, member of det_user): PostgreSQL
-- holds the password (SCRAM-SHA-256) and checks it, and row-level security decides which rows
-- each one sees. Roles belong to the server, not to this database: the migration that made
-- this section created det's own when absent (det_user: every user; det_agent and det_task:
-- may only EXECUTE their functions; det_web: det serve, which SETs ROLE to a request's user).
-- The schema's owner (the reconciler, `det cluster up`) bypasses row-level security and acts
-- with every permission.

CREATE FUNCTION det_name_problem(p_name text, p_max_bytes integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
-- Why p_name cannot name a user, group, workspace or project, or NULL: not blank, at most
-- p_max_bytes bytes (63 for users: a PostgreSQL role name), no control characters. Any other
-- character is kept verbatim (quotes, semicolons: names are data, never SQL).
SELECT CASE
    WHEN p_name IS NULL OR btrim(p_name) = '' THEN 'must not be blank'
    WHEN octet_length(p_name) > p_max_bytes
        THEN format('expected at most %s bytes, got %s', p_max_bytes, octet_length(p_name))
    WHEN p_name ~ '[[:cntrl:]]' THEN 'must not contain control characters'
END $$;

CREATE TABLE users (
    id           serial PRIMARY KEY,
    username     text NOT NULL UNIQUE CHECK (det_name_problem(username, 63) IS NULL),
    active       boolean NOT NULL DEFAULT true,
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text NOT NULL
);
COMMENT ON TABLE users IS
    'det users: each is the PostgreSQL role named username (LOGIN while active, member of '
    'det_user). det stores no password: PostgreSQL keeps a SCRAM-SHA-256 verifier of it.';

CREATE TABLE user_groups (
    id         serial PRIMARY KEY,
    name       text NOT NULL UNIQUE CHECK (det_name_problem(name, 255) IS NULL),
    created_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE user_groups IS 'Groups of users: a role assigned to a group holds for each member.';

CREATE TABLE user_group_members (
    group_id integer NOT NULL REFERENCES user_groups (id) ON DELETE CASCADE,
    user_id  integer NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    PRIMARY KEY (group_id, user_id)
);
CREATE INDEX user_group_members_user ON user_group_members (user_id);

CREATE TABLE workspaces (
    id                   serial PRIMARY KEY,
    name                 text NOT NULL UNIQUE CHECK (det_name_problem(name, 255) IS NULL),
    archived             boolean NOT NULL DEFAULT false,
    created_at           timestamptz NOT NULL DEFAULT now(),
    created_by           text NOT NULL,
    default_compute_pool text REFERENCES resource_pools (name) ON DELETE SET NULL,
    default_aux_pool     text REFERENCES resource_pools (name) ON DELETE SET NULL,
    checkpoint_storage   jsonb CHECK (jsonb_typeof(checkpoint_storage) = 'object')
);
COMMENT ON TABLE workspaces IS
    'Workspaces hold projects, projects hold experiments (spec: Workspaces and Projects). '
    'Row-level security keys every user-data table on its workspace. Workspace 1, '
    '"Uncategorized", holds what names no other; every new user is an Editor there.';
COMMENT ON COLUMN workspaces.default_compute_pool IS
    'The pool its experiments use when their config names none (then the cluster''s default).';
COMMENT ON COLUMN workspaces.checkpoint_storage IS
    'The checkpoint_storage its experiments use when their config has none (then det''s '
    'default).';
-- (a fixed creation time: the release of this schema, the same in every database)
INSERT INTO workspaces (name, created_by, created_at)  -- id 1
VALUES ('Uncategorized', 'det', '2026-11-25 00:00:00+00');

CREATE TABLE workspace_pools (
    workspace_id  integer NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    resource_pool text NOT NULL REFERENCES resource_pools (name) ON DELETE CASCADE,
    PRIMARY KEY (resource_pool, workspace_id)
);
COMMENT ON TABLE workspace_pools IS
    'Pools bound to workspaces: a bound pool serves only the jobs of the workspaces bound to '
    'it; a pool bound to none serves every workspace (Determined: resource pool bindings).';

CREATE TABLE projects (
    id           serial PRIMARY KEY,
    workspace_id integer NOT NULL REFERENCES workspaces (id),
    name         text NOT NULL CHECK (det_name_problem(name, 255) IS NULL),
    description  text NOT NULL DEFAULT '' CHECK (length(description) <= 4096),
    archived     boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text NOT NULL,
    UNIQUE (workspace_id, name)
);
COMMENT ON TABLE projects IS
    'Projects of a workspace; project 1, "Uncategorized" of workspace 1, holds experiments '
    'submitted without one.';
INSERT INTO projects (workspace_id, name, created_by, created_at)  -- id 1
VALUES (1, 'Uncategorized', 'det', '2026-11-25 00:00:00+00');

CREATE TABLE roles (
    name        text PRIMARY KEY,
    permissions text[] NOT NULL,
    global_only boolean NOT NULL DEFAULT false,
    description text NOT NULL
);
COMMENT ON TABLE roles IS
    'Determined''s roles and what they permit: view (read a workspace''s experiments, models '
    'and logs), edit (create, pause, kill, reprioritise, move, delete them; projects and '
    'models), admin_workspace (the workspace itself and who may use it), create_workspace, '
    'admin_cluster (users, groups, pools, agents, cluster config, every workspace).';
INSERT INTO roles (name, permissions, global_only, description) VALUES
    ('Viewer', '{view}', false, 'reads a workspace''s experiments, models and logs'),
    ('Editor', '{view,edit}', false,
     'also creates, pauses, kills, reprioritises, moves and deletes experiments and models'),
    ('WorkspaceAdmin', '{view,edit,admin_workspace}', false,
     'also manages the workspace: archive, delete, projects, members'),
    ('WorkspaceCreator', '{create_workspace}', true,
     'creates workspaces (and becomes WorkspaceAdmin of each)'),
    ('ClusterAdmin', '{view,edit,admin_workspace,create_workspace,admin_cluster}', true,
     'manages users, groups, pools, agents, cluster config and every workspace');

CREATE TABLE role_assignments (
    id           serial PRIMARY KEY,
    role         text NOT NULL REFERENCES roles (name),
    user_id      integer REFERENCES users (id) ON DELETE CASCADE,
    group_id     integer REFERENCES user_groups (id) ON DELETE CASCADE,
    workspace_id integer REFERENCES workspaces (id) ON DELETE CASCADE,
    CHECK ((user_id IS NULL) <> (group_id IS NULL))
);
COMMENT ON TABLE role_assignments IS
    'Who holds which role, globally (workspace_id NULL: in every workspace) or in one '
    'workspace; to a user or to a group.';
CREATE UNIQUE INDEX role_assignments_once ON role_assignments
    (role, coalesce(user_id, 0), coalesce(group_id, 0), coalesce(workspace_id, 0));
CREATE INDEX role_assignments_user ON role_assignments (user_id);

CREATE TABLE audit_log (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text NOT NULL,
    action      text NOT NULL,
    object_type text NOT NULL,
    object_id   text NOT NULL,
    detail      jsonb NOT NULL DEFAULT '{}'
);
COMMENT ON TABLE audit_log IS
    'Who did what to which object, written by the user-action functions in the transaction of '
    'the change (so an action that fails leaves no entry). ClusterAdmins read it.';
CREATE INDEX audit_log_object ON audit_log (object_type, object_id);

ALTER TABLE jobs ADD COLUMN workspace_id integer NOT NULL DEFAULT 1 REFERENCES workspaces (id);
COMMENT ON COLUMN jobs.workspace_id IS
    'The workspace of the job''s experiment (its project''s): what row-level security keys '
    'jobs, runs and their logs on.';
CREATE INDEX jobs_workspace ON jobs (workspace_id);
ALTER TABLE experiments ADD COLUMN project_id integer NOT NULL DEFAULT 1 REFERENCES projects (id);
CREATE INDEX experiments_project ON experiments (project_id);
ALTER TABLE models ADD COLUMN workspace_id integer NOT NULL DEFAULT 1 REFERENCES workspaces (id);

-- =============================================================================================
-- Access control (issue 14): who is calling, what they may do, and the audit log. User
-- actions are SECURITY DEFINER functions (they run as the schema's owner, so row-level
-- security does not hide rows from them): each checks its caller's permission with
-- det_require in the transaction of its change.

CREATE FUNCTION det_caller() RETURNS text LANGUAGE sql STABLE AS $$
-- The user acting in this session: its login role (session_user, which a SECURITY DEFINER
-- function does not change, unlike current_user), or, for det serve (connected as det_web),
-- the user whose token det_web_auth accepted in this transaction.
SELECT coalesce(CASE WHEN pg_has_role(session_user, 'det_web', 'MEMBER')
                     THEN nullif(current_setting('det.web_user', true), '') END,
                session_user::text)
$$;

CREATE FUNCTION det_is_owner_session() RETURNS boolean LANGUAGE sql STABLE AS $$
-- Whether the session is the cluster's own (the role owning det's tables, a member of it, or
-- a superuser: the reconciler, `det cluster up`) acting as no det user. It holds every
-- permission.
SELECT NOT EXISTS (SELECT 1 FROM users WHERE username = det_caller())
   AND pg_has_role(session_user, (SELECT relowner FROM pg_class
                                   WHERE oid = 'experiments'::regclass), 'MEMBER')
$$;

CREATE FUNCTION det_user_grants(p_user text)
RETURNS TABLE (workspace_id integer, permissions text[]) LANGUAGE sql STABLE AS $$
-- What active user p_user holds: one row per role assigned to them or to one of their
-- groups, with its workspace (NULL: every workspace) and its permissions (see roles). The
-- one home of that rule: det_permitted and det_visible_workspaces read it.
SELECT a.workspace_id, r.permissions
  FROM users u
  JOIN role_assignments a
    ON a.user_id = u.id
    OR a.group_id IN (SELECT m.group_id FROM user_group_members m WHERE m.user_id = u.id)
  JOIN roles r ON r.name = a.role
 WHERE u.username = p_user AND u.active
$$;

CREATE FUNCTION det_permitted(p_user text, p_permission text, p_workspace integer)
RETURNS boolean LANGUAGE sql STABLE AS $$
-- Whether active user p_user holds p_permission in workspace p_workspace (NULL: globally)
-- through a role held globally or there (det_user_grants).
SELECT EXISTS (
    SELECT 1 FROM det_user_grants(p_user) g
     WHERE p_permission = ANY (g.permissions)
       AND (g.workspace_id IS NULL OR g.workspace_id = p_workspace))
$$;

CREATE FUNCTION det_visible_workspaces() RETURNS integer[] LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The workspaces the calling user may view (det_permitted's rule, as one query): what the
-- row-level security policies key on, called once per query as an InitPlan:
-- `= ANY ((SELECT det_visible_workspaces())::integer[])`.
WITH viewable AS (SELECT g.workspace_id FROM det_user_grants(det_caller()) g
                   WHERE 'view' = ANY (g.permissions))
SELECT CASE WHEN EXISTS (SELECT 1 FROM viewable WHERE workspace_id IS NULL)
            THEN (SELECT coalesce(array_agg(id), '{}') FROM workspaces)
            ELSE (SELECT coalesce(array_agg(DISTINCT workspace_id), '{}') FROM viewable) END
$$;

CREATE FUNCTION det_visible_projects() RETURNS integer[] LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The projects of det_visible_workspaces: experiments' policy keys on them, so that a user of
-- few projects reads their experiments through the project index.
SELECT coalesce(array_agg(id), '{}') FROM projects
 WHERE workspace_id = ANY (det_visible_workspaces())
$$;

CREATE FUNCTION det_role_needed(p_permission text) RETURNS text LANGUAGE sql STABLE AS $$
-- The least role that grants p_permission, to name in a refusal.
SELECT name FROM roles WHERE p_permission = ANY (permissions)
 ORDER BY cardinality(permissions), name LIMIT 1
$$;

CREATE FUNCTION det_require(p_permission text, p_workspace integer, p_action text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
-- Check that the caller may do p_action (words for the refusal: 'pause experiment 12') with
-- p_permission in workspace p_workspace (NULL: a cluster-wide permission); returns the
-- caller's name. Refusal is insufficient_privilege, one line naming the role and scope:
-- "permission denied: needs Editor on workspace 'vision' to pause experiment 12". A caller
-- who may not even view the workspace is told what they asked about is not found
-- (no_data_found), as row-level security would show it: no rows.
DECLARE
    v_user text := det_caller();
BEGIN
    IF det_is_owner_session() THEN
        RETURN v_user;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM users WHERE username = v_user AND active) THEN
        RAISE EXCEPTION 'permission denied: % is not an active det user', to_jsonb(v_user)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF det_permitted(v_user, p_permission, p_workspace) THEN
        RETURN v_user;
    END IF;
    IF p_workspace IS NOT NULL AND NOT det_permitted(v_user, 'view', p_workspace) THEN
        RAISE EXCEPTION 'cannot %: not found', p_action USING ERRCODE = 'no_data_found';
    END IF;
    RAISE EXCEPTION 'permission denied: needs % % to %', det_role_needed(p_permission),
        CASE WHEN p_workspace IS NULL THEN 'on the cluster'
             ELSE format('on workspace ''%s''', (SELECT name FROM workspaces
                                                  WHERE id = p_workspace)) END,
        p_action USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE FUNCTION det_audit(p_action text, p_object_type text, p_object_id text,
                          p_detail jsonb DEFAULT '{}') RETURNS void LANGUAGE sql AS $$
-- One audit_log entry by the caller, in the transaction of the change it records.
INSERT INTO audit_log (actor, action, object_type, object_id, detail)
VALUES (det_caller(), p_action, p_object_type, p_object_id, coalesce(p_detail, '{}'))
$$;

CREATE FUNCTION det_experiment_workspace(p_id integer) RETURNS integer LANGUAGE plpgsql
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

CREATE FUNCTION det_check_experiment_project() RETURNS trigger LANGUAGE plpgsql AS $$
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
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION det_check_experiment_project();

CREATE FUNCTION det_workspace_find(p_name text) RETURNS workspaces LANGUAGE plpgsql STABLE AS $$
-- The workspace named p_name (names are exact: any character is part of it). Raises
-- no_data_found, also when the caller may not view it.
DECLARE
    w workspaces;
BEGIN
    SELECT * INTO w FROM workspaces WHERE name = p_name;
    IF NOT FOUND OR NOT (det_is_owner_session() OR det_permitted(det_caller(), 'view', w.id))
    THEN
        RAISE EXCEPTION 'workspace % not found', to_jsonb(p_name) USING ERRCODE = 'no_data_found';
    END IF;
    RETURN w;
END $$;

CREATE FUNCTION det_project_find(p_workspace text, p_project text) RETURNS projects
LANGUAGE plpgsql STABLE AS $$
-- Project p_project of workspace p_workspace. Raises no_data_found.
DECLARE
    w workspaces := det_workspace_find(p_workspace);
    p projects;
BEGIN
    SELECT * INTO p FROM projects WHERE workspace_id = w.id AND name = p_project;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'project % not found in workspace %', to_jsonb(p_project),
            to_jsonb(w.name) USING ERRCODE = 'no_data_found';
    END IF;
    RETURN p;
END $$;

CREATE FUNCTION det_user_find(p_username text) RETURNS users LANGUAGE plpgsql STABLE AS $$
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

CREATE FUNCTION det_check_verifier(p_password_verifier text) RETURNS void LANGUAGE plpgsql
IMMUTABLE AS $$
-- A password reaches det only as a SCRAM-SHA-256 verifier made by the client (libpq's
-- PQencryptPasswordConn), never as the password itself.
BEGIN
    IF p_password_verifier IS NOT NULL AND p_password_verifier NOT LIKE 'SCRAM-SHA-256$%' THEN
        RAISE EXCEPTION 'password: expected a SCRAM-SHA-256 verifier computed by the client'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- =============================================================================================
-- User actions: users, groups, workspaces, projects and roles (issue 14). Each is one
-- transaction, checks its caller's permission and writes an audit_log entry.

CREATE FUNCTION det_user_create(p_username text, p_password_verifier text, p_admin boolean)
RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user create` (ClusterAdmin): a det user is a new LOGIN role of the same name, member
-- of det_user (and of det_web, so det serve can act as it), Editor in Uncategorized, and
-- ClusterAdmin too if p_admin. p_password_verifier: see det_check_verifier; NULL leaves the
-- user unable to log in until a password is set. Returns the user's id.
DECLARE
    v_problem text := det_name_problem(p_username, 63);
    v_id integer;
BEGIN
    PERFORM det_require('admin_cluster', NULL, format('create user %s', to_jsonb(p_username)));
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'username %: %', to_jsonb(p_username), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_check_verifier(p_password_verifier);
    IF EXISTS (SELECT 1 FROM users WHERE username = p_username) THEN
        RAISE EXCEPTION 'username %: a user of that name exists', to_jsonb(p_username)
            USING ERRCODE = 'unique_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = p_username)
       OR p_username ~* '^pg_' OR lower(p_username) IN ('public', 'none', 'current_user',
                                                       'current_role', 'session_user') THEN
        RAISE EXCEPTION 'username %: the name of a PostgreSQL role of the server (not a det user)',
            to_jsonb(p_username) USING ERRCODE = 'unique_violation';
    END IF;
    EXECUTE format('CREATE ROLE %I LOGIN IN ROLE det_user PASSWORD %L', p_username,
                   p_password_verifier);
    EXECUTE format('GRANT %I TO det_web', p_username);
    INSERT INTO users (username, created_by) VALUES (p_username, det_caller())
    RETURNING id INTO v_id;
    INSERT INTO role_assignments (role, user_id, workspace_id) VALUES ('Editor', v_id, 1);
    IF p_admin THEN
        INSERT INTO role_assignments (role, user_id) VALUES ('ClusterAdmin', v_id);
    END IF;
    PERFORM det_audit('create', 'user', p_username, jsonb_build_object('admin', p_admin));
    RETURN v_id;
END $$;

CREATE FUNCTION det_user_set_password(p_username text, p_password_verifier text)
RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user change-password`: a user's own, or anyone's by a ClusterAdmin.
DECLARE
    u users := det_user_find(p_username);
BEGIN
    IF u.username <> det_caller() THEN
        PERFORM det_require('admin_cluster', NULL,
                            format('change the password of user %s', to_jsonb(p_username)));
    END IF;
    IF p_password_verifier IS NULL THEN
        RAISE EXCEPTION 'password: expected a SCRAM-SHA-256 verifier, got nothing'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_check_verifier(p_password_verifier);
    EXECUTE format('ALTER ROLE %I PASSWORD %L', u.username, p_password_verifier);
    PERFORM det_audit('change_password', 'user', u.username);
END $$;

CREATE FUNCTION det_user_set_active(p_username text, p_active boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user deactivate | activate` (ClusterAdmin): a deactivated user cannot log in (its role
-- loses LOGIN), holds no permission, and its det serve logins end.
DECLARE
    u users := det_user_find(p_username);
BEGIN
    PERFORM det_require('admin_cluster', NULL,
                        format('%s user %s', CASE WHEN p_active THEN 'activate'
                                                  ELSE 'deactivate' END, to_jsonb(p_username)));
    IF NOT p_active AND u.username = det_caller() THEN
        RAISE EXCEPTION 'user %: you cannot deactivate yourself', to_jsonb(u.username)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE users SET active = p_active WHERE id = u.id;
    EXECUTE format('ALTER ROLE %I %s', u.username, CASE WHEN p_active THEN 'LOGIN' ELSE 'NOLOGIN' END);
    IF NOT p_active THEN
        DELETE FROM web_sessions WHERE username = u.username;
    END IF;
    PERFORM det_audit(CASE WHEN p_active THEN 'activate' ELSE 'deactivate' END, 'user',
                      u.username);
END $$;

CREATE FUNCTION det_group_create(p_name text) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user-group create` (ClusterAdmin). Returns the group's id.
DECLARE
    v_problem text := det_name_problem(p_name, 255);
    v_id integer;
BEGIN
    PERFORM det_require('admin_cluster', NULL, format('create group %s', to_jsonb(p_name)));
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'group name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO user_groups (name) VALUES (p_name) RETURNING id INTO v_id;
    PERFORM det_audit('create', 'group', p_name);
    RETURN v_id;
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'group name %: a group of that name exists', to_jsonb(p_name)
        USING ERRCODE = 'unique_violation';
END $$;

CREATE FUNCTION det_group_delete(p_name text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user-group delete` (ClusterAdmin): its members lose the roles it held.
BEGIN
    PERFORM det_require('admin_cluster', NULL, format('delete group %s', to_jsonb(p_name)));
    DELETE FROM user_groups WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'group % not found', to_jsonb(p_name) USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_audit('delete', 'group', p_name);
END $$;

CREATE FUNCTION det_group_set_member(p_group text, p_username text, p_member boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user-group add-user | remove-user` (ClusterAdmin). Adding a member twice or removing a
-- non-member changes nothing.
DECLARE
    v_group integer;
    u users := det_user_find(p_username);
BEGIN
    PERFORM det_require('admin_cluster', NULL,
                        format('%s group %s', CASE WHEN p_member THEN 'add users to'
                                                   ELSE 'remove users from' END,
                               to_jsonb(p_group)));
    SELECT id INTO v_group FROM user_groups WHERE name = p_group;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'group % not found', to_jsonb(p_group) USING ERRCODE = 'no_data_found';
    END IF;
    IF p_member THEN
        INSERT INTO user_group_members VALUES (v_group, u.id) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM user_group_members WHERE group_id = v_group AND user_id = u.id;
    END IF;
    PERFORM det_audit(CASE WHEN p_member THEN 'add_member' ELSE 'remove_member' END, 'group',
                      p_group, jsonb_build_object('user', u.username));
END $$;

CREATE FUNCTION det_workspace_create(
    p_name text, p_default_compute_pool text, p_default_aux_pool text,
    p_checkpoint_storage jsonb
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det workspace create` (WorkspaceCreator or ClusterAdmin): the creator becomes its
-- WorkspaceAdmin. p_checkpoint_storage was validated by det.configs. Returns its id.
DECLARE
    v_user text := det_require('create_workspace', NULL,
                               format('create workspace %s', to_jsonb(p_name)));
    v_problem text := det_name_problem(p_name, 255);
    v_id integer;
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'workspace name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM workspaces WHERE name = p_name) THEN
        RAISE EXCEPTION 'workspace name %: a workspace of that name exists', to_jsonb(p_name)
            USING ERRCODE = 'unique_violation';
    END IF;
    INSERT INTO workspaces (name, created_by, default_compute_pool, default_aux_pool,
                            checkpoint_storage)
    VALUES (p_name, v_user, p_default_compute_pool, p_default_aux_pool, p_checkpoint_storage)
    RETURNING id INTO v_id;
    INSERT INTO role_assignments (role, user_id, workspace_id)
    SELECT 'WorkspaceAdmin', id, v_id FROM users WHERE username = v_user;
    PERFORM det_audit('create', 'workspace', v_id::text, jsonb_build_object('name', p_name));
    RETURN v_id;
EXCEPTION WHEN foreign_key_violation THEN
    RAISE EXCEPTION 'workspace %: no resource pool named % or %', to_jsonb(p_name),
        to_jsonb(p_default_compute_pool), to_jsonb(p_default_aux_pool)
        USING ERRCODE = 'foreign_key_violation';
END $$;

CREATE FUNCTION det_workspace_set_archived(p_name text, p_archived boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det workspace archive | unarchive` (WorkspaceAdmin): an archived workspace takes no new
-- experiments or projects and is hidden from `det workspace list` unless --all.
DECLARE
    w workspaces := det_workspace_find(p_name);
BEGIN
    PERFORM det_require('admin_workspace', w.id,
                        format('%s workspace %s', CASE WHEN p_archived THEN 'archive'
                                                       ELSE 'unarchive' END, to_jsonb(w.name)));
    IF w.id = 1 THEN
        RAISE EXCEPTION 'workspace "Uncategorized" cannot be archived'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE workspaces SET archived = p_archived WHERE id = w.id;
    PERFORM det_audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END, 'workspace',
                      w.id::text, jsonb_build_object('name', w.name));
END $$;

CREATE FUNCTION det_workspace_delete(p_name text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det workspace delete` (WorkspaceAdmin): refused while any experiment or model is in it
-- (move or delete them first); its projects, role assignments and pool bindings go with it.
DECLARE
    w workspaces := det_workspace_find(p_name);
    v_n bigint;
BEGIN
    PERFORM det_require('admin_workspace', w.id, format('delete workspace %s', to_jsonb(w.name)));
    IF w.id = 1 THEN
        RAISE EXCEPTION 'workspace "Uncategorized" cannot be deleted'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT count(*) INTO v_n FROM jobs WHERE workspace_id = w.id;
    IF v_n > 0 THEN
        RAISE EXCEPTION 'workspace %: it still holds % experiment(s); move or delete them first',
            to_jsonb(w.name), v_n USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
    SELECT count(*) INTO v_n FROM models WHERE workspace_id = w.id;
    IF v_n > 0 THEN
        RAISE EXCEPTION 'workspace %: it still holds % model(s); move or delete them first',
            to_jsonb(w.name), v_n USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
    DELETE FROM projects WHERE workspace_id = w.id;
    DELETE FROM workspaces WHERE id = w.id;
    PERFORM det_audit('delete', 'workspace', w.id::text, jsonb_build_object('name', w.name));
END $$;

CREATE FUNCTION det_workspace_bind_pool(p_workspace text, p_pool text, p_bound boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det resource-pool bindings add | remove` (ClusterAdmin): bind a pool to a workspace, or
-- unbind it. Jobs already queued in the pool stay; new ones are checked at submission.
DECLARE
    w workspaces := det_workspace_find(p_workspace);
BEGIN
    PERFORM det_require('admin_cluster', NULL,
                        format('bind resource pool %s', to_jsonb(p_pool)));
    IF NOT EXISTS (SELECT 1 FROM resource_pools WHERE name = p_pool) THEN
        RAISE EXCEPTION 'no resource pool named %', to_jsonb(p_pool)
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF p_bound THEN
        INSERT INTO workspace_pools VALUES (w.id, p_pool) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM workspace_pools WHERE workspace_id = w.id AND resource_pool = p_pool;
    END IF;
    PERFORM det_audit(CASE WHEN p_bound THEN 'bind_pool' ELSE 'unbind_pool' END, 'workspace',
                      w.id::text, jsonb_build_object('name', w.name, 'pool', p_pool));
END $$;

CREATE FUNCTION det_check_pools(p_workspace integer, p_pools text[], p_what text)
RETURNS void LANGUAGE plpgsql STABLE AS $$
-- Each pool exists and serves workspace p_workspace (bound to it, or to no workspace).
DECLARE
    v_pool text;
BEGIN
    SELECT p INTO v_pool FROM unnest(p_pools) p
     WHERE NOT EXISTS (SELECT 1 FROM resource_pools WHERE name = p) LIMIT 1;
    IF v_pool IS NOT NULL THEN
        RAISE EXCEPTION '%: no resource pool named "%"', p_what, v_pool
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    SELECT p INTO v_pool FROM unnest(p_pools) p
     WHERE EXISTS (SELECT 1 FROM workspace_pools b WHERE b.resource_pool = p)
       AND NOT EXISTS (SELECT 1 FROM workspace_pools b
                        WHERE b.resource_pool = p AND b.workspace_id = p_workspace) LIMIT 1;
    IF v_pool IS NOT NULL THEN
        RAISE EXCEPTION '%: resource pool "%" is bound to other workspaces than %', p_what,
            v_pool, to_jsonb((SELECT name FROM workspaces WHERE id = p_workspace))
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;

CREATE FUNCTION det_project_create(p_workspace text, p_name text, p_description text)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det project create` (Editor of the workspace). Returns the project's id.
DECLARE
    w workspaces := det_workspace_find(p_workspace);
    v_user text := det_require('edit', w.id, format('create a project in workspace %s',
                                                     to_jsonb(w.name)));
    v_problem text := det_name_problem(p_name, 255);
    v_id integer;
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'project name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF w.archived THEN
        RAISE EXCEPTION 'workspace % is archived: unarchive it first', to_jsonb(w.name)
            USING ERRCODE = 'check_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM projects WHERE workspace_id = w.id AND name = p_name) THEN
        RAISE EXCEPTION 'project name %: workspace % has a project of that name',
            to_jsonb(p_name), to_jsonb(w.name) USING ERRCODE = 'unique_violation';
    END IF;
    INSERT INTO projects (workspace_id, name, description, created_by)
    VALUES (w.id, p_name, coalesce(p_description, ''), v_user) RETURNING id INTO v_id;
    PERFORM det_audit('create', 'project', v_id::text,
                      jsonb_build_object('name', p_name, 'workspace', w.name));
    RETURN v_id;
END $$;

CREATE FUNCTION det_project_set_archived(p_workspace text, p_name text, p_archived boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det project archive | unarchive` (Editor): an archived project takes no new experiments.
DECLARE
    p projects := det_project_find(p_workspace, p_name);
BEGIN
    PERFORM det_require('edit', p.workspace_id,
                        format('%s project %s', CASE WHEN p_archived THEN 'archive'
                                                     ELSE 'unarchive' END, to_jsonb(p.name)));
    IF p.id = 1 THEN
        RAISE EXCEPTION 'project "Uncategorized" cannot be archived'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE projects SET archived = p_archived WHERE id = p.id;
    PERFORM det_audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END, 'project',
                      p.id::text, jsonb_build_object('name', p.name));
END $$;

CREATE FUNCTION det_project_delete(p_workspace text, p_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det project delete` (Editor): refused while it holds experiments.
DECLARE
    p projects := det_project_find(p_workspace, p_name);
    v_n bigint;
BEGIN
    PERFORM det_require('edit', p.workspace_id, format('delete project %s', to_jsonb(p.name)));
    IF p.id = 1 THEN
        RAISE EXCEPTION 'project "Uncategorized" cannot be deleted'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT count(*) INTO v_n FROM experiments WHERE project_id = p.id;
    IF v_n > 0 THEN
        RAISE EXCEPTION 'project %: it still holds % experiment(s); move or delete them first',
            to_jsonb(p.name), v_n USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
    DELETE FROM projects WHERE id = p.id;
    PERFORM det_audit('delete', 'project', p.id::text, jsonb_build_object('name', p.name));
END $$;

CREATE FUNCTION det_experiment_move(p_id integer, p_workspace text, p_project text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment move` (Editor where it is and where it goes): its job (and so its runs,
-- metrics, checkpoints and logs, which row-level security reaches through it) moves too.
-- The destination's pool bindings are not checked: what already runs keeps its pool.
DECLARE
    v_from integer := det_experiment_workspace(p_id);
    p projects := det_project_find(p_workspace, p_project);
BEGIN
    PERFORM det_require('edit', v_from, format('move experiment %s', p_id));
    PERFORM det_require('edit', p.workspace_id,
                        format('move experiment %s into project %s', p_id, to_jsonb(p.name)));
    IF p.archived THEN
        RAISE EXCEPTION 'project % is archived: unarchive it first', to_jsonb(p.name)
            USING ERRCODE = 'check_violation';
    END IF;
    UPDATE jobs SET workspace_id = p.workspace_id
     WHERE id = (SELECT job_id FROM experiments WHERE id = p_id);
    UPDATE experiments SET project_id = p.id WHERE id = p_id;
    PERFORM det_audit('move', 'experiment', p_id::text,
                      jsonb_build_object('project', p.id, 'workspace', p.workspace_id));
END $$;

CREATE FUNCTION det_role_assign(
    p_role text, p_username text, p_group text, p_workspace text, p_assigned boolean
) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det rbac assign-role | unassign-role`: role p_role to user p_username or group p_group,
-- in workspace p_workspace (WorkspaceAdmin there) or globally (NULL; ClusterAdmin).
-- WorkspaceCreator and ClusterAdmin are global only. Assigning twice, or unassigning what is
-- not assigned, changes nothing.
DECLARE
    r roles;
    w workspaces;
    v_user integer;
    v_group integer;
BEGIN
    SELECT * INTO r FROM roles WHERE name = p_role;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'role %: expected one of %', to_jsonb(p_role),
            (SELECT string_agg(name, ', ' ORDER BY cardinality(permissions)) FROM roles)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (p_username IS NULL) = (p_group IS NULL) THEN
        RAISE EXCEPTION 'role %: name exactly one of a user and a group', p_role
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_workspace IS NOT NULL THEN
        IF r.global_only THEN
            RAISE EXCEPTION 'role % is cluster-wide: assign it without a workspace', p_role
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        w := det_workspace_find(p_workspace);
        PERFORM det_require('admin_workspace', w.id,
                            format('assign roles in workspace %s', to_jsonb(w.name)));
    ELSE
        PERFORM det_require('admin_cluster', NULL, 'assign cluster-wide roles');
    END IF;
    IF p_username IS NOT NULL THEN
        v_user := (det_user_find(p_username)).id;
    ELSE
        SELECT id INTO v_group FROM user_groups WHERE name = p_group;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'group % not found', to_jsonb(p_group) USING ERRCODE = 'no_data_found';
        END IF;
    END IF;
    IF p_assigned THEN
        INSERT INTO role_assignments (role, user_id, group_id, workspace_id)
        VALUES (p_role, v_user, v_group, w.id) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM role_assignments
         WHERE role = p_role AND user_id IS NOT DISTINCT FROM v_user
           AND group_id IS NOT DISTINCT FROM v_group AND workspace_id IS NOT DISTINCT FROM w.id;
    END IF;
    PERFORM det_audit(CASE WHEN p_assigned THEN 'assign_role' ELSE 'unassign_role' END, 'role',
                      p_role, jsonb_build_object('user', p_username, 'group', p_group,
                                                 'workspace', w.name));
END $$;

CREATE FUNCTION det_model_move(p_model text, p_workspace text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model move` (Editor where it is and where it goes).
DECLARE
    m models := det_model_find(p_model);
    w workspaces := det_workspace_find(p_workspace);
BEGIN
    PERFORM det_require('edit', m.workspace_id, format('move model %s', to_jsonb(m.name)));
    PERFORM det_require('edit', w.id, format('move model %s into workspace %s',
                                             to_jsonb(m.name), to_jsonb(w.name)));
    UPDATE models SET workspace_id = w.id, last_updated_time = now() WHERE id = m.id;
    PERFORM det_audit('move', 'model', m.id::text, jsonb_build_object('workspace', w.name));
END $$;

-- User actions that now check permissions, record their caller as owner and audit.

DROP FUNCTION det_create_experiment(jsonb, text, bytea, text);
DROP FUNCTION det_model_create(text, text, text[], text);
DROP FUNCTION det_model_register_version(text, text, text, text, text[], jsonb, text);
DROP FUNCTION det_template_set(text, jsonb, text, text);

CREATE FUNCTION det_create_experiment(
    p_config jsonb, p_original_config text, p_context bytea, p_workspace text DEFAULT NULL,
    p_project text DEFAULT NULL
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Submit an experiment (Editor of its workspace), owned by the caller. p_config is the
-- expanded config (validated by det.configs, every default filled: nothing here supplies one
-- again); p_context the packed model definition (tar.gz), stored once per distinct content.
-- It goes to project p_project of workspace p_workspace, else the config's workspace and
-- project (both or neither), else Uncategorized. Its pools must serve that workspace
-- (workspace_pools). The job's priority defaults to its pool scheduler's default_priority
-- (the pool's rule, not the config's).
DECLARE
    v_workspace text := coalesce(p_workspace, p_config ->> 'workspace');
    v_project text := coalesce(p_project, p_config ->> 'project');
    p projects;
    v_user text;
    v_pools text[] := CASE jsonb_typeof(p_config #> '{resources,resource_pool}')
        WHEN 'array' THEN ARRAY(SELECT jsonb_array_elements_text(
                                    p_config #> '{resources,resource_pool}'))
        ELSE ARRAY[p_config #>> '{resources,resource_pool}'] END;
    v_pool text := v_pools[1];
    v_ctx bigint;
    v_job bigint;
    v_id integer;
BEGIN
    IF p_config #> '{resources,resource_pool}' IS NULL OR p_config #> '{resources,weight}' IS NULL
       OR p_config ->> 'name' IS NULL THEN
        RAISE EXCEPTION 'det_create_experiment: expected an expanded config (det.configs) with '
            'name, resources.resource_pool and resources.weight'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (v_workspace IS NULL) <> (v_project IS NULL) THEN
        RAISE EXCEPTION 'workspace and project: give both or neither (neither: Uncategorized)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_workspace IS NULL THEN
        SELECT * INTO p FROM projects WHERE id = 1;
    ELSE
        p := det_project_find(v_workspace, v_project);
    END IF;
    v_user := det_require('edit', p.workspace_id,
                          format('create an experiment in project %s', to_jsonb(p.name)));
    IF p.archived OR (SELECT archived FROM workspaces WHERE id = p.workspace_id) THEN
        RAISE EXCEPTION 'project %: it (or its workspace) is archived', to_jsonb(p.name)
            USING ERRCODE = 'check_violation';
    END IF;
    PERFORM det_check_pools(p.workspace_id, v_pools, 'resources.resource_pool');
    IF p_context IS NOT NULL THEN
        INSERT INTO context_blobs (sha256, size_bytes, data)
        VALUES (sha256(p_context), length(p_context), p_context)
        ON CONFLICT (sha256) DO NOTHING;
        SELECT id INTO v_ctx FROM context_blobs WHERE sha256 = sha256(p_context);
    END IF;
    INSERT INTO jobs (type, resource_pool, fallback_pools, priority, weight, max_slots,
                      queue_position, owner, workspace_id)
    VALUES ('EXPERIMENT', v_pool, v_pools[2:],
            coalesce((p_config #>> '{resources,priority}')::integer,
                     (det_pool_scheduler(v_pool) ->> 'default_priority')::integer),
            (p_config #>> '{resources,weight}')::double precision,
            (p_config #>> '{resources,max_slots}')::integer,
            extract(epoch FROM clock_timestamp()) * 1000000, v_user, p.workspace_id)
    RETURNING id INTO v_job;
    INSERT INTO experiments (job_id, name, description, config, original_config, context_id,
                             owner, project_id)
    VALUES (v_job, p_config ->> 'name', coalesce(p_config ->> 'description', ''), p_config,
            p_original_config, v_ctx, v_user, p.id)
    RETURNING id INTO v_id;
    PERFORM det_audit('create', 'experiment', v_id::text, jsonb_build_object('project', p.id));
    PERFORM pg_notify('det_reconciler', 'experiment');
    RETURN v_id;
END $$;

CREATE FUNCTION det_model_create(
    p_name text, p_description text, p_labels text[], p_workspace text
) RETURNS models LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model create`: a new, empty model of the caller's in workspace p_workspace (NULL:
-- Uncategorized), where the caller is an Editor.
DECLARE
    v_ws integer := CASE WHEN p_workspace IS NULL THEN 1
                         ELSE (det_workspace_find(p_workspace)).id END;
    v_user text := det_require('edit', v_ws, format('create model %s', to_jsonb(p_name)));
    m models;
BEGIN
    PERFORM det_model_check(p_name, p_description, p_labels, NULL, NULL);
    INSERT INTO models (name, description, labels, owner, workspace_id)
    VALUES (p_name, coalesce(p_description, ''), coalesce(p_labels, '{}'), v_user, v_ws)
    RETURNING * INTO m;
    PERFORM det_audit('create', 'model', m.id::text, jsonb_build_object('name', m.name));
    RETURN m;
END $$;

CREATE FUNCTION det_model_register_version(
    p_model text, p_checkpoint text, p_name text, p_notes text, p_labels text[],
    p_metadata jsonb
) RETURNS model_versions LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model register-version`: the model's next version (its highest number plus one; the
-- model's row lock serialises concurrent registrations) is the checkpoint p_checkpoint, which
-- must be COMPLETED (Determined: "checkpoints for model versions must be in a COMPLETED
-- state"). The version pins the checkpoint. An archived model takes no new versions. The
-- caller is an Editor of the model's workspace and may view the checkpoint's.
DECLARE
    m models := det_model_find(p_model);
    v_uuid uuid;
    v_state text;
    v_problem text := det_label_problem(p_labels);
    r model_versions;
    v_user text := det_require('edit', m.workspace_id,
                               format('register a version of model %s', to_jsonb(m.name)));
BEGIN
    SELECT * INTO m FROM models WHERE id = m.id FOR UPDATE;
    IF m.archived THEN
        RAISE EXCEPTION 'model % is archived: unarchive it to register new versions',
            to_jsonb(m.name) USING ERRCODE = 'check_violation';
    END IF;
    BEGIN
        v_uuid := p_checkpoint::uuid;
    EXCEPTION WHEN invalid_text_representation THEN
        RAISE EXCEPTION 'checkpoint: expected a checkpoint UUID, got %', to_jsonb(p_checkpoint)
            USING ERRCODE = 'invalid_parameter_value';
    END;
    -- FOR SHARE: the checkpoint cannot change state or go away until this version commits.
    SELECT state INTO v_state FROM checkpoints WHERE uuid = v_uuid FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'checkpoint % not found', v_uuid USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_require('view', (SELECT j.workspace_id FROM checkpoints c
                                   JOIN trials t ON t.id = c.trial_id
                                   JOIN experiments e ON e.id = t.experiment_id
                                   JOIN jobs j ON j.id = e.job_id WHERE c.uuid = v_uuid),
                        format('register checkpoint %s', v_uuid));
    IF v_state <> 'COMPLETED' THEN
        RAISE EXCEPTION 'checkpoint % is %: only a COMPLETED checkpoint can be registered',
            v_uuid, v_state USING ERRCODE = 'check_violation';
    END IF;
    IF length(p_name) > 255 THEN
        RAISE EXCEPTION 'version name: expected at most 255 characters, got %', length(p_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'labels: %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
        RAISE EXCEPTION 'metadata: expected a JSON object, got %', jsonb_typeof(p_metadata)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO model_versions (model_id, version, checkpoint_uuid, name, notes, labels,
                                metadata, owner)
    SELECT m.id, coalesce(max(v.version), 0) + 1, v_uuid, coalesce(p_name, ''),
           coalesce(p_notes, ''), coalesce(p_labels, '{}'), coalesce(p_metadata, '{}'), v_user
      FROM model_versions v WHERE v.model_id = m.id
    RETURNING * INTO r;
    UPDATE models SET last_updated_time = now() WHERE id = m.id;
    PERFORM det_audit('register_version', 'model', m.id::text,
                      jsonb_build_object('version', r.version, 'checkpoint', v_uuid));
    RETURN r;
END $$;

CREATE FUNCTION det_template_set(p_name text, p_config jsonb, p_original text)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det template set`: create or replace a template (p_config: its YAML as a JSON object,
-- checked by det.configs.templates). Templates are the cluster's: any user may create one;
-- replacing one takes its owner or a ClusterAdmin. Returns true when it was created.
DECLARE
    v_problem text := det_template_name_problem(p_name);
    v_user text := det_caller();
    v_owner text := (SELECT owner FROM templates WHERE name = p_name);
    v_created boolean;
BEGIN
    IF v_owner IS DISTINCT FROM v_user THEN
        PERFORM det_require(CASE WHEN v_owner IS NULL THEN 'view' ELSE 'admin_cluster' END,
                            CASE WHEN v_owner IS NULL THEN 1 END,
                            format('replace template %s of %s', to_jsonb(p_name),
                                   to_jsonb(v_owner)));
    END IF;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'template name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(p_config) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'template %: expected a mapping at the top level', to_jsonb(p_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO templates AS t (name, config, original, owner)
    VALUES (p_name, p_config, p_original, v_user)
    ON CONFLICT (name) DO UPDATE
        SET config = excluded.config, original = excluded.original, updated_at = now()
    RETURNING (xmax = 0) INTO v_created;
    PERFORM det_audit(CASE WHEN v_created THEN 'create' ELSE 'update' END, 'template', p_name);
    RETURN v_created;
END $$;

CREATE OR REPLACE FUNCTION det_experiment_action(p_id integer, p_action text) RETURNS experiment_state
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- pause | activate | cancel | kill (spec: run-training-code, Pause and Activate). Returns the
-- new state. The reconciler turns the state into desired states of the trials' allocations.
-- An action the state does not allow is a check_violation (an illegal transition); an
-- unknown action a bad argument.
DECLARE
    v_state experiment_state;
    v_new experiment_state;
BEGIN
    IF p_action IS NULL OR p_action NOT IN ('pause', 'activate', 'cancel', 'kill') THEN
        RAISE EXCEPTION 'action: expected pause, activate, cancel or kill, not %', p_action
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_require('edit', det_experiment_workspace(p_id),
                        format('%s experiment %s', p_action, p_id));
    SELECT state INTO v_state FROM experiments WHERE id = p_id FOR UPDATE;
    v_new := CASE
        WHEN p_action = 'pause' AND v_state IN ('ACTIVE', 'PAUSED') THEN 'PAUSED'
        WHEN p_action = 'activate' AND v_state IN ('ACTIVE', 'PAUSED') THEN 'ACTIVE'
        WHEN p_action = 'cancel' AND v_state IN ('ACTIVE', 'PAUSED') THEN 'STOPPING_CANCELED'
        WHEN p_action = 'cancel' AND v_state::text LIKE 'STOPPING_%' THEN v_state
        WHEN p_action = 'kill' AND (v_state IN ('ACTIVE', 'PAUSED')
                                    OR v_state::text LIKE 'STOPPING_%') THEN 'STOPPING_KILLED'
    END::experiment_state;
    IF v_new IS NULL THEN
        RAISE EXCEPTION 'experiment %: cannot % an experiment in state %', p_id, p_action, v_state
            USING ERRCODE = 'check_violation';
    END IF;
    UPDATE experiments SET state = v_new WHERE id = p_id;
    PERFORM det_audit(p_action, 'experiment', p_id::text);
    PERFORM pg_notify('det_reconciler', 'experiment');
    RETURN v_new;
END $$;

CREATE OR REPLACE FUNCTION det_job_update(p_job bigint, p_field text, p_value text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- One change to a queued job (spec: run-training-code, Modify the Job Queue): priority only
-- under the priority scheduler, weight only under fair share, ahead-of / behind-of only under
-- priority, resource-pool only for experiments. Several calls in one transaction are
-- `det job update-batch`: all apply or none. Editor of the job's workspace; a new pool must
-- serve it.
DECLARE
    j jobs;
    other jobs;
    v_type text;
    v_neighbour numeric;
    v_int integer;
    v_weight double precision;
    v_exp integer;
    v_state experiment_state;
BEGIN
    SELECT * INTO j FROM jobs WHERE id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % not found', p_job USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_require('edit', j.workspace_id, format('change the %s of job %s', p_field, p_job));
    SELECT e.id, e.state INTO v_exp, v_state FROM experiments e WHERE e.job_id = p_job;
    IF v_state IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RAISE EXCEPTION 'job % (experiment %) is %: it is no longer queued', p_job, v_exp,
            v_state USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_type := det_pool_scheduler(j.resource_pool) ->> 'type';
    CASE p_field
    WHEN 'priority' THEN
        IF v_type <> 'priority' THEN
            RAISE EXCEPTION 'job %: priority applies only under the priority scheduler; pool "%" uses %',
                p_job, j.resource_pool, v_type USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_int := p_value::integer;
        IF v_int NOT BETWEEN 1 AND 99 THEN
            RAISE EXCEPTION 'job %: priority must be between 1 and 99, not %', p_job, p_value
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- A new priority puts the job back at its submission time within that priority.
        UPDATE jobs SET priority = v_int,
               queue_position = extract(epoch FROM submitted_at) * 1000000
         WHERE id = p_job;
    WHEN 'weight' THEN
        IF v_type <> 'fair_share' THEN
            RAISE EXCEPTION 'job %: weight applies only under the fair_share scheduler; pool "%" uses %',
                p_job, j.resource_pool, v_type USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_weight := p_value::double precision;
        -- NOT (... AND ...) also refuses NaN, which PostgreSQL sorts above every number (so
        -- NaN > 0 holds), and Infinity; the same rule is the jobs.weight CHECK.
        IF NOT (v_weight > 0 AND v_weight <= 1000000) THEN
            RAISE EXCEPTION 'job %: weight must be a finite number > 0 and at most 1e6, not %',
                p_job, p_value USING ERRCODE = 'invalid_parameter_value';
        END IF;
        UPDATE jobs SET weight = v_weight WHERE id = p_job;
    WHEN 'resource-pool' THEN
        IF j.type <> 'EXPERIMENT' THEN
            RAISE EXCEPTION 'job %: only experiments can change resource pool; cancel and resubmit a %',
                p_job, lower(j.type) USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM det_check_pools(j.workspace_id, ARRAY[p_value], format('job %s', p_job));
        UPDATE jobs SET resource_pool = p_value, fallback_pools = '{}' WHERE id = p_job;
        UPDATE allocations SET resource_pool = p_value
         WHERE job_id = p_job AND state = 'PENDING';
        UPDATE experiments SET config = jsonb_set(config, '{resources,resource_pool}', to_jsonb(p_value))
         WHERE job_id = p_job;
    WHEN 'ahead-of', 'behind-of' THEN
        IF v_type <> 'priority' THEN
            RAISE EXCEPTION 'job %: % applies only under the priority scheduler; pool "%" uses %',
                p_job, p_field, j.resource_pool, v_type USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT * INTO other FROM jobs WHERE id = p_value::bigint;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'job %: no job % to move %', p_job, p_value, replace(p_field, '-of', '')
                USING ERRCODE = 'no_data_found';
        END IF;
        IF other.resource_pool <> j.resource_pool THEN
            RAISE EXCEPTION 'job %: job % is in pool "%", not "%"', p_job, other.id,
                other.resource_pool, j.resource_pool USING ERRCODE = 'invalid_parameter_value';
        END IF;
        -- Take the other job's priority and a position just before (after) it: the midpoint
        -- with its neighbour, so no other job moves.
        IF p_field = 'ahead-of' THEN
            SELECT max(queue_position) INTO v_neighbour FROM jobs
             WHERE resource_pool = other.resource_pool AND priority = other.priority
               AND queue_position < other.queue_position AND id <> p_job;
            v_neighbour := coalesce(v_neighbour, other.queue_position - 2);
        ELSE
            SELECT min(queue_position) INTO v_neighbour FROM jobs
             WHERE resource_pool = other.resource_pool AND priority = other.priority
               AND queue_position > other.queue_position AND id <> p_job;
            v_neighbour := coalesce(v_neighbour, other.queue_position + 2);
        END IF;
        UPDATE jobs SET priority = other.priority,
               queue_position = (other.queue_position + v_neighbour) / 2
         WHERE id = p_job;
    ELSE
        RAISE EXCEPTION 'unknown job field "%"; expected priority, weight, resource-pool, ahead-of or behind-of',
            p_field USING ERRCODE = 'invalid_parameter_value';
    END CASE;
    PERFORM det_audit('update', 'job', p_job::text,
                      jsonb_build_object('field', p_field, 'value', p_value));
    PERFORM pg_notify('det_reconciler', 'job');
EXCEPTION
    WHEN invalid_text_representation OR numeric_value_out_of_range THEN
        RAISE EXCEPTION 'job %: % expects a number, not "%"', p_job, p_field, p_value
            USING ERRCODE = 'invalid_parameter_value';
END $$;

CREATE OR REPLACE FUNCTION det_apply_cluster_config(p_config jsonb, p_original text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Store a validated cluster config and make resource_pools match it (ClusterAdmin). A pool
-- the config drops is deleted only if nothing uses it; otherwise the whole apply is refused.
DECLARE
    v_gone text;
BEGIN
    PERFORM det_require('admin_cluster', NULL, 'apply a cluster config');
    INSERT INTO resource_pools (name, description, scheduler, max_aux_containers_per_agent)
    SELECT p ->> 'name', coalesce(p ->> 'description', ''), nullif(p -> 'scheduler', 'null'),
           coalesce((p ->> 'max_aux_containers_per_agent')::integer, 100)
    FROM jsonb_array_elements(p_config -> 'resource_pools') p
    ON CONFLICT (name) DO UPDATE
        SET description = excluded.description, scheduler = excluded.scheduler,
            max_aux_containers_per_agent = excluded.max_aux_containers_per_agent;
    SELECT name INTO v_gone FROM resource_pools r
     WHERE name NOT IN (SELECT p ->> 'name' FROM jsonb_array_elements(p_config -> 'resource_pools') p)
       AND (EXISTS (SELECT 1 FROM agents g WHERE g.resource_pool = r.name AND g.state <> 'LOST')
            OR EXISTS (SELECT 1 FROM jobs j JOIN experiments e ON e.job_id = j.id
                        WHERE j.resource_pool = r.name
                          AND e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR')))
     LIMIT 1;
    IF v_gone IS NOT NULL THEN
        RAISE EXCEPTION 'resource_pools: pool "%" still has agents or active jobs; keep it in the config or drain it first', v_gone
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM resource_pools r
     WHERE name NOT IN (SELECT p ->> 'name' FROM jsonb_array_elements(p_config -> 'resource_pools') p)
       AND NOT EXISTS (SELECT 1 FROM agents g WHERE g.resource_pool = r.name)
       AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.resource_pool = r.name)
       AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.resource_pool = r.name);
    INSERT INTO cluster_config (config, original) VALUES (p_config, p_original)
    ON CONFLICT (singleton) DO UPDATE
        SET config = excluded.config, original = excluded.original, applied_at = now();
    PERFORM det_audit('apply', 'cluster_config', 'cluster', p_config);
    PERFORM pg_notify('det_reconciler', 'cluster');
END $$;

CREATE OR REPLACE FUNCTION det_agent_set_enabled(p_id text, p_enabled boolean) RETURNS agent_state
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Disable (drain) or enable an agent (ClusterAdmin): a disabled agent's running work
-- finishes, nothing new is placed on it (spec: agents; issue 5). Returns its new state.
DECLARE
    v_state agent_state;
BEGIN
    PERFORM det_require('admin_cluster', NULL,
                        format('%s agent %s', CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END,
                               p_id));
    UPDATE agents
       SET state = CASE WHEN p_enabled THEN 'ACTIVE' ELSE 'DISABLED' END::agent_state
     WHERE id = p_id AND state <> 'LOST'
    RETURNING state INTO v_state;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent % not found (or lost)', p_id USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_audit(CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END, 'agent', p_id);
    PERFORM pg_notify('det_reconciler', 'agent');
    RETURN v_state;
END $$;

CREATE OR REPLACE FUNCTION det_slot_set_enabled(p_agent text, p_slot integer, p_enabled boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Disable (drain) or enable one slot of an agent (ClusterAdmin); work holding it runs on.
BEGIN
    PERFORM det_require('admin_cluster', NULL,
                        format('%s slot %s of agent %s',
                               CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END, p_slot,
                               p_agent));
    UPDATE slots SET enabled = p_enabled WHERE agent_id = p_agent AND slot_id = p_slot;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent % has no slot %', p_agent, p_slot USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_audit(CASE WHEN p_enabled THEN 'enable' ELSE 'disable' END, 'slot',
                      p_agent || '/' || p_slot);
    PERFORM pg_notify('det_reconciler', 'agent');
END $$;

CREATE OR REPLACE FUNCTION det_model_update(
    p_model text, p_name text, p_description text, p_notes text, p_labels text[],
    p_metadata jsonb, p_remove_metadata text[]
) RETURNS models LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model update`: each argument NULL leaves its field as it is. p_labels replaces the
-- labels; p_metadata is merged into the metadata (its top-level keys replace the model's),
-- then the keys in p_remove_metadata are removed. An archived model cannot change.
DECLARE
    m models := det_model_find(p_model);
BEGIN
    PERFORM det_require('edit', m.workspace_id, format('change model %s', to_jsonb(m.name)));
    SELECT * INTO m FROM models WHERE id = m.id FOR UPDATE;
    IF m.archived THEN
        RAISE EXCEPTION 'model % is archived: unarchive it to change it', to_jsonb(m.name)
            USING ERRCODE = 'check_violation';
    END IF;
    PERFORM det_model_check(p_name, p_description, p_labels, p_metadata, m.id);
    UPDATE models
       SET name = coalesce(p_name, name), description = coalesce(p_description, description),
           notes = coalesce(p_notes, notes), labels = coalesce(p_labels, labels),
           metadata = (metadata || coalesce(p_metadata, '{}')) - coalesce(p_remove_metadata, '{}'),
           last_updated_time = now()
     WHERE id = m.id
    RETURNING * INTO m;
    PERFORM det_audit('update', 'model', m.id::text);
    RETURN m;
END $$;

CREATE OR REPLACE FUNCTION det_model_set_archived(p_model text, p_archived boolean) RETURNS models
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model archive | unarchive`: an archived model is hidden from `det model list` (unless
-- --all), takes no new versions and no changes; its versions still pin their checkpoints.
DECLARE
    m models := det_model_find(p_model);
BEGIN
    PERFORM det_require('edit', m.workspace_id,
                        format('%s model %s', CASE WHEN p_archived THEN 'archive'
                                                   ELSE 'unarchive' END, to_jsonb(m.name)));
    UPDATE models SET archived = p_archived, last_updated_time = now()
     WHERE id = m.id RETURNING * INTO m;
    PERFORM det_audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END, 'model',
                      m.id::text);
    RETURN m;
END $$;

CREATE OR REPLACE FUNCTION det_model_delete(p_model text) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model delete`: the model and all its versions; their checkpoints are no longer pinned.
-- Returns how many versions went with it.
DECLARE
    m models := det_model_find(p_model);
    v_versions integer;
BEGIN
    PERFORM det_require('edit', m.workspace_id, format('delete model %s', to_jsonb(m.name)));
    SELECT count(*) INTO v_versions FROM model_versions WHERE model_id = m.id;
    DELETE FROM models WHERE id = m.id;
    PERFORM det_audit('delete', 'model', m.id::text, jsonb_build_object('name', m.name));
    RETURN v_versions;
END $$;

CREATE OR REPLACE FUNCTION det_model_version_update(
    p_model text, p_version integer, p_name text, p_notes text, p_labels text[],
    p_metadata jsonb, p_remove_metadata text[]
) RETURNS model_versions LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model update NAME --version N`: as det_model_update, for one version (its name,
-- notes, labels and metadata). A version of an archived model cannot change.
DECLARE
    r model_versions := det_model_version_find(p_model, p_version);
    m models;
    v_problem text := det_label_problem(p_labels);
BEGIN
    SELECT * INTO m FROM models WHERE id = r.model_id FOR UPDATE;
    PERFORM det_require('edit', m.workspace_id, format('change model %s', to_jsonb(m.name)));
    IF m.archived THEN
        RAISE EXCEPTION 'model % is archived: unarchive it to change its versions',
            to_jsonb(m.name) USING ERRCODE = 'check_violation';
    END IF;
    IF length(p_name) > 255 THEN
        RAISE EXCEPTION 'version name: expected at most 255 characters, got %', length(p_name)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'labels: %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
        RAISE EXCEPTION 'metadata: expected a JSON object, got %', jsonb_typeof(p_metadata)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE model_versions
       SET name = coalesce(p_name, name), notes = coalesce(p_notes, notes),
           labels = coalesce(p_labels, labels),
           metadata = (metadata || coalesce(p_metadata, '{}')) - coalesce(p_remove_metadata, '{}'),
           last_updated_time = now()
     WHERE id = r.id
    RETURNING * INTO r;
    UPDATE models SET last_updated_time = now() WHERE id = r.model_id;
    PERFORM det_audit('update_version', 'model', m.id::text,
                      jsonb_build_object('version', r.version));
    RETURN r;
END $$;

CREATE OR REPLACE FUNCTION det_model_version_delete(p_model text, p_version integer) RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model delete-version`: remove one version; returns its checkpoint, no longer pinned by
-- it. The numbers of the other versions stay as they are.
DECLARE
    r model_versions := det_model_version_find(p_model, p_version);
BEGIN
    PERFORM det_require('edit', (SELECT workspace_id FROM models WHERE id = r.model_id),
                        format('delete a version of model %s', to_jsonb(p_model)));
    DELETE FROM model_versions WHERE id = r.id;
    UPDATE models SET last_updated_time = now() WHERE id = r.model_id;
    PERFORM det_audit('delete_version', 'model', r.model_id::text,
                      jsonb_build_object('version', r.version));
    RETURN r.checkpoint_uuid;
END $$;

CREATE OR REPLACE FUNCTION det_template_remove(p_name text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det template remove` (its owner or a ClusterAdmin): experiments created from it keep their
-- merged configs.
DECLARE
    v_owner text := (SELECT owner FROM templates WHERE name = p_name);
BEGIN
    IF v_owner IS NULL THEN
        RAISE EXCEPTION 'template % not found', to_jsonb(p_name) USING ERRCODE = 'no_data_found';
    END IF;
    IF v_owner <> det_caller() THEN
        PERFORM det_require('admin_cluster', NULL, format('remove template %s of %s',
                                                          to_jsonb(p_name), to_jsonb(v_owner)));
    END IF;
    DELETE FROM templates WHERE name = p_name;
    PERFORM det_audit('delete', 'template', p_name);
END $$;

CREATE OR REPLACE FUNCTION det_set_gc_policy(
    p_experiment integer, p_save_experiment_best integer, p_save_trial_best integer,
    p_save_trial_latest integer
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment set gc-policy`: store the new save_* values in the experiment's config and,
-- if it has ended, apply them now (a running experiment applies them when it ends). Returns
-- the checkpoints marked DELETING.
DECLARE
    e experiments;
BEGIN
    PERFORM det_require('edit', det_experiment_workspace(p_experiment),
                        format('set the GC policy of experiment %s', p_experiment));
    SELECT * INTO e FROM experiments WHERE id = p_experiment FOR UPDATE;
    IF least(p_save_experiment_best, p_save_trial_best, p_save_trial_latest) < 0 THEN
        RAISE EXCEPTION 'gc policy: save_experiment_best, save_trial_best and save_trial_latest must be 0 or more'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(e.config -> 'checkpoint_storage') IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'experiment %: it has no checkpoint_storage to set a GC policy on',
            p_experiment USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE experiments
       SET config = jsonb_set(config, '{checkpoint_storage}', config -> 'checkpoint_storage'
                              || jsonb_build_object('save_experiment_best', p_save_experiment_best,
                                                    'save_trial_best', p_save_trial_best,
                                                    'save_trial_latest', p_save_trial_latest))
     WHERE id = p_experiment;
    PERFORM det_audit('set_gc_policy', 'experiment', p_experiment::text,
                      jsonb_build_object('save_experiment_best', p_save_experiment_best,
                                         'save_trial_best', p_save_trial_best,
                                         'save_trial_latest', p_save_trial_latest));
    IF e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RETURN 0;
    END IF;
    PERFORM pg_notify('det_reconciler', 'checkpoint_gc');
    RETURN det_checkpoint_gc(p_experiment);
END $$;

CREATE OR REPLACE FUNCTION det_delete_checkpoints(p_uuids uuid[]) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det checkpoint delete`: the checkpoints become DELETING (one already DELETING is asked
-- again, so a GC that gave up tries again; a DELETED one is left as it is). All or none:
-- refused for an unknown or pinned checkpoint, or one of an experiment that has not ended.
-- Returns the checkpoints asked to be deleted. Editor of each checkpoint's workspace.
DECLARE
    v_missing uuid;
    v_bad record;
    v_n integer;
BEGIN
    SELECT u INTO v_missing FROM unnest(p_uuids) u
     WHERE NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.uuid = u) LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'checkpoint % not found', v_missing USING ERRCODE = 'no_data_found';
    END IF;
    FOR v_bad IN SELECT c.uuid, j.workspace_id FROM checkpoints c
                   JOIN trials t ON t.id = c.trial_id JOIN experiments e ON e.id = t.experiment_id
                   JOIN jobs j ON j.id = e.job_id WHERE c.uuid = ANY(p_uuids) LOOP
        PERFORM det_require('edit', v_bad.workspace_id, format('delete checkpoint %s', v_bad.uuid));
    END LOOP;
    SELECT c.uuid INTO v_missing FROM checkpoints c JOIN checkpoint_pins p
        ON p.checkpoint_uuid = c.uuid
     WHERE c.uuid = ANY(p_uuids) LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'checkpoint % is pinned (registered in the model registry, or an experiment warm-starts from it): it cannot be deleted',
            v_missing USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT c.uuid, e.id, e.state INTO v_bad
      FROM checkpoints c JOIN trials t ON t.id = c.trial_id
      JOIN experiments e ON e.id = t.experiment_id
     WHERE c.uuid = ANY(p_uuids) AND e.state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'checkpoint %: experiment % is %; its checkpoints can be deleted once it has ended',
            v_bad.uuid, v_bad.id, v_bad.state USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE checkpoints SET state = 'DELETING', delete_requested_at = now()
     WHERE uuid = ANY(p_uuids) AND state IN ('COMPLETED', 'DELETING');
    GET DIAGNOSTICS v_n = ROW_COUNT;
    PERFORM det_audit('delete', 'checkpoint', u::text) FROM unnest(p_uuids) u;
    PERFORM pg_notify('det_reconciler', 'checkpoint_gc');
    RETURN v_n - det_unpin_deleting();  -- pinned since the check above
END $$;

CREATE OR REPLACE FUNCTION det_experiment_archive(p_id integer, p_archived boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment archive | unarchive`: an archived experiment is hidden from default lists
-- (spec: experiment-lifecycle). Only an ended experiment can be archived (else a
-- check_violation: an illegal transition).
DECLARE
    v_state experiment_state;
BEGIN
    PERFORM det_require('edit', det_experiment_workspace(p_id),
                        format('%s experiment %s', CASE WHEN p_archived THEN 'archive'
                                                        ELSE 'unarchive' END, p_id));
    SELECT state INTO v_state FROM experiments WHERE id = p_id FOR UPDATE;
    IF p_archived AND v_state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RAISE EXCEPTION 'experiment % is %: only an ended experiment can be archived', p_id,
            v_state USING ERRCODE = 'check_violation';
    END IF;
    UPDATE experiments SET archived = p_archived WHERE id = p_id;
    PERFORM det_audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END, 'experiment',
                      p_id::text);
END $$;

CREATE OR REPLACE FUNCTION det_experiment_delete(p_id integer) RETURNS boolean LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment delete`: for an ended experiment none of whose checkpoints is pinned. Its
-- checkpoints become DELETING (their files are removed by a GC task), and its rows go in one
-- transaction once that is done (det_purge_experiment: here if nothing is left to remove,
-- else by the reconciler). Asking again retries a GC that gave up. Returns true when the
-- rows are already gone.
DECLARE
    v_state experiment_state;
    v_pinned uuid;
BEGIN
    PERFORM det_require('edit', det_experiment_workspace(p_id),
                        format('delete experiment %s', p_id));
    SELECT state INTO v_state FROM experiments WHERE id = p_id FOR UPDATE;
    IF v_state NOT IN ('COMPLETED', 'CANCELED', 'ERROR') THEN
        RAISE EXCEPTION 'experiment % is %: only an ended experiment can be deleted (kill it first)',
            p_id, v_state USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT c.uuid INTO v_pinned
      FROM checkpoints c JOIN trials t ON t.id = c.trial_id
      JOIN checkpoint_pins p ON p.checkpoint_uuid = c.uuid
     WHERE t.experiment_id = p_id AND c.state <> 'DELETED' LIMIT 1;
    IF v_pinned IS NOT NULL THEN
        RAISE EXCEPTION 'experiment %: checkpoint % is pinned (registered in the model registry, or an experiment warm-starts from it); the experiment cannot be deleted',
            p_id, v_pinned USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE experiments SET delete_requested_at = now(), checkpoint_gc_error = NULL WHERE id = p_id;
    UPDATE checkpoints c SET state = 'DELETING', delete_requested_at = now()
      FROM trials t
     WHERE t.id = c.trial_id AND t.experiment_id = p_id AND c.state IN ('COMPLETED', 'DELETING');
    PERFORM det_unpin_deleting();  -- pinned since the check above: kept, and so is the experiment
    PERFORM det_audit('delete', 'experiment', p_id::text);
    PERFORM pg_notify('det_reconciler', 'checkpoint_gc');
    RETURN det_purge_experiment(p_id);
END $$;

CREATE OR REPLACE FUNCTION det_web_login(p_token text, p_user text, p_ttl_seconds double precision)
RETURNS timestamptz LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- Record a login token (minted by det serve once PostgreSQL accepted p_user's password) for
-- active user p_user, good for p_ttl_seconds; returns its expiry. Expired tokens are removed
-- here, so the table stays as small as the live logins.
DECLARE
    v_expires timestamptz;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM users WHERE username = p_user AND active) THEN
        RAISE EXCEPTION 'invalid username or password'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF NOT (p_ttl_seconds > 0 AND p_ttl_seconds <= 366 * 86400) THEN
        RAISE EXCEPTION 'token lifetime: expected seconds > 0 and at most a year, not %',
            p_ttl_seconds USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_token IS NULL OR length(p_token) < 32 THEN
        RAISE EXCEPTION 'token: expected at least 32 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM web_sessions WHERE expires_at <= now();
    v_expires := now() + make_interval(secs => p_ttl_seconds);
    INSERT INTO web_sessions (token_hash, username, expires_at)
    VALUES (sha256(convert_to(p_token, 'UTF8')), p_user, v_expires);
    RETURN v_expires;
END $$;

CREATE OR REPLACE FUNCTION det_web_auth(p_token text) RETURNS text LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- The active user a live login token belongs to, or an error (SQLSTATE 28000). It becomes the
-- transaction's caller (det_caller reads det.web_user); det serve then SETs LOCAL ROLE to it,
-- so row-level security applies to the request as to that user's own psql.
DECLARE
    v_user text;
BEGIN
    SELECT s.username INTO v_user FROM web_sessions s JOIN users u ON u.username = s.username
     WHERE s.token_hash = sha256(convert_to(p_token, 'UTF8')) AND s.expires_at > now()
       AND u.active;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'invalid or expired token: log in again'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    PERFORM set_config('det.web_user', v_user, true);
    RETURN v_user;
END $$;

CREATE OR REPLACE FUNCTION det_web_logout(p_token text) RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- End a login: its token is good no more.
    DELETE FROM web_sessions WHERE token_hash = sha256(convert_to(p_token, 'UTF8'));
$$;

-- Agent and task functions run as the schema's owner: their roles have no table rights.
ALTER FUNCTION det_agent_register(text, text, text, text, jsonb) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_agent_heartbeat(text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_agent_claim(text, bigint) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_agent_report(text, bigint, allocation_state, integer, text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_gang_agents(bigint) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_gang_started(bigint) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_agent_set_rendezvous(text, bigint, text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_agent_claim_node(text, bigint) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_agent_report_node(text, bigint, allocation_state, integer, text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_append_logs(bigint, text[], text[]) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_task_info(text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_report_metrics_batch(text, uuid, bigint, text[], bigint[], jsonb[]) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_report_metrics(text, text, bigint, jsonb) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_report_checkpoint(text, uuid, bigint, jsonb, jsonb) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_current_op(text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_report_progress(text, bigint, double precision) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_complete_op(text, bigint, double precision) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_should_preempt(text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_ack_preemption(text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_report_early_exit(text, text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_experiment_best_validation(text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_gc_task_checkpoints(text, integer) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_gc_task_tensorboards(text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_gc_task_deleted(text, uuid[]) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION det_gc_task_failed(text, text) SECURITY DEFINER SET search_path = public, pg_temp;

-- Reports run with the caller's rights, under row-level security.
ALTER VIEW checkpoint_pins SET (security_invoker = true);
CREATE OR REPLACE VIEW reporting.experiments WITH (security_invoker = true) AS
SELECT e.id, e.name, e.state, e.owner, e.progress, e.start_time, e.end_time, e.archived,
       e.config #>> '{searcher,name}' AS searcher,
       e.config #>> '{searcher,metric}' AS metric,
       (SELECT count(*) FROM trials t WHERE t.experiment_id = e.id) AS trials,
       (SELECT CASE WHEN (e.config #>> '{searcher,smaller_is_better}')::boolean
                    THEN min(t.best_validation) ELSE max(t.best_validation) END
          FROM trials t WHERE t.experiment_id = e.id) AS best_validation,
       j.resource_pool, j.priority, j.weight, e.project_id, p.name AS project,
       p.workspace_id, w.name AS workspace
FROM experiments e JOIN jobs j ON j.id = e.job_id
JOIN projects p ON p.id = e.project_id JOIN workspaces w ON w.id = p.workspace_id;
ALTER VIEW reporting.trials SET (security_invoker = true);
ALTER VIEW reporting.job_queue SET (security_invoker = true);
ALTER VIEW reporting.slot_usage SET (security_invoker = true);
ALTER VIEW reporting.checkpoints SET (security_invoker = true);
ALTER VIEW reporting.models SET (security_invoker = true);
ALTER VIEW reporting.model_versions SET (security_invoker = true);

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC;
-- and from the functions later migrations add (the global default of the role that runs
-- them: a per-schema one cannot take a privilege away): each grants its own
ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
REVOKE ALL ON SCHEMA reporting FROM PUBLIC;
GRANT USAGE ON SCHEMA reporting TO det_user;

GRANT EXECUTE ON FUNCTION
    det_agent_register(text, text, text, text, jsonb), det_agent_heartbeat(text),
    det_agent_claim(text, bigint), det_agent_report(text, bigint, allocation_state, integer, text),
    det_gang_agents(bigint), det_gang_started(bigint),
    det_agent_set_rendezvous(text, bigint, text), det_agent_claim_node(text, bigint),
    det_agent_report_node(text, bigint, allocation_state, integer, text),
    det_append_logs(bigint, text[], text[])
TO det_agent;

GRANT EXECUTE ON FUNCTION
    det_task_info(text), det_report_metrics_batch(text, uuid, bigint, text[], bigint[], jsonb[]),
    det_report_metrics(text, text, bigint, jsonb),
    det_report_checkpoint(text, uuid, bigint, jsonb, jsonb), det_current_op(text),
    det_report_progress(text, bigint, double precision),
    det_complete_op(text, bigint, double precision), det_should_preempt(text),
    det_ack_preemption(text), det_report_early_exit(text, text),
    det_experiment_best_validation(text), det_gc_task_checkpoints(text, integer),
    det_gc_task_tensorboards(text), det_gc_task_deleted(text, uuid[]),
    det_gc_task_failed(text, text)
TO det_task;

GRANT EXECUTE ON FUNCTION
    det_web_login(text, text, double precision), det_web_auth(text), det_web_logout(text)
TO det_web;
-- a request logs out after det serve took its user's role: ending a login takes its token
GRANT EXECUTE ON FUNCTION det_web_logout(text) TO det_user;

GRANT EXECUTE ON FUNCTION
    -- user actions (SECURITY DEFINER, each checks its caller's permission)
    det_create_experiment(jsonb, text, bytea, text, text),
    det_experiment_action(integer, text), det_job_update(bigint, text, text),
    det_apply_cluster_config(jsonb, text), det_agent_set_enabled(text, boolean),
    det_slot_set_enabled(text, integer, boolean),
    det_model_create(text, text, text[], text),
    det_model_update(text, text, text, text, text[], jsonb, text[]),
    det_model_set_archived(text, boolean), det_model_delete(text),
    det_model_register_version(text, text, text, text, text[], jsonb),
    det_model_version_update(text, integer, text, text, text[], jsonb, text[]),
    det_model_version_delete(text, integer), det_model_move(text, text),
    det_template_set(text, jsonb, text), det_template_remove(text),
    det_set_gc_policy(integer, integer, integer, integer), det_delete_checkpoints(uuid[]),
    det_experiment_archive(integer, boolean), det_experiment_delete(integer),
    det_experiment_move(integer, text, text),
    det_user_create(text, text, boolean), det_user_set_password(text, text),
    det_user_set_active(text, boolean), det_group_create(text), det_group_delete(text),
    det_group_set_member(text, text, boolean),
    det_workspace_create(text, text, text, jsonb), det_workspace_set_archived(text, boolean),
    det_workspace_delete(text), det_workspace_bind_pool(text, text, boolean),
    det_project_create(text, text, text), det_project_set_archived(text, text, boolean),
    det_project_delete(text, text),
    det_role_assign(text, text, text, text, boolean),
    -- readers: they run as the caller, under row-level security
    det_model_find(text), det_model_version_find(text, integer),
    det_checkpoints_to_delete(integer, integer, integer, integer),
    det_pool_scheduler(text), det_stopped_state(text), det_caller(),
    det_is_owner_session(), det_user_grants(text), det_permitted(text, text, integer),
    det_visible_workspaces(),
    det_visible_projects(),
    det_role_needed(text), det_workspace_find(text), det_project_find(text, text),
    det_user_find(text), det_experiment_workspace(integer),
    det_model_name_problem(text), det_label_problem(text[]), det_template_name_problem(text),
    det_name_problem(text, integer)
TO det_user;

-- What a user may read. Tables not named here (tokens, sessions, the searcher's event queue,
-- the reconciler's bookkeeping) are the owner's alone.
GRANT SELECT ON
    users, user_groups, user_group_members, roles, role_assignments, workspaces,
    workspace_pools, projects, audit_log, resource_pools, agents, slots, cluster_config,
    reconciler_leader, jobs, experiments, context_blobs, trials,
    searcher_ops, allocation_slots, metrics, checkpoints, task_logs, models, model_versions,
    templates, checkpoint_pins, reporting.experiments, reporting.trials, reporting.job_queue,
    reporting.slot_usage, reporting.checkpoints, reporting.models, reporting.model_versions
TO det_user;
-- allocations without token_hash
GRANT SELECT (id, job_id, trial_id, run, resource_pool, slots_needed, spec, desired_state,
              state, agent_id, exit_code, exit_reason, stop_requested_at, preempt_acked,
              settled, created_at, assigned_at, started_at, ended_at, preemptible,
              pending_reason, out_of_work, running_at, rendezvous)
    ON allocations TO det_user;

-- Row-level security: a user sees a workspace's rows when a role of theirs (or of a group of
-- theirs) lets them view it. The workspace is read from the row's job (jobs, allocations and
-- what hangs off them) or project (experiments and what hangs off them); a constraint
-- trigger keeps the two in agreement. `(SELECT det_visible_workspaces())` (and
-- det_visible_projects) is computed once per query.
ALTER TABLE workspaces ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON workspaces FOR SELECT
    USING (id = ANY ((SELECT det_visible_workspaces())::integer[]));
ALTER TABLE workspace_pools ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON workspace_pools FOR SELECT
    USING (workspace_id = ANY ((SELECT det_visible_workspaces())::integer[]));
ALTER TABLE projects ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON projects FOR SELECT
    USING (workspace_id = ANY ((SELECT det_visible_workspaces())::integer[]));
ALTER TABLE role_assignments ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON role_assignments FOR SELECT
    USING (workspace_id IS NULL OR workspace_id = ANY ((SELECT det_visible_workspaces())::integer[]));
ALTER TABLE jobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON jobs FOR SELECT
    USING (workspace_id = ANY ((SELECT det_visible_workspaces())::integer[]));
ALTER TABLE experiments ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON experiments FOR SELECT
    USING (project_id = ANY ((SELECT det_visible_projects())::integer[]));
ALTER TABLE context_blobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON context_blobs FOR SELECT
    USING (id IN (SELECT context_id FROM experiments));
ALTER TABLE trials ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON trials FOR SELECT
    USING (experiment_id IN (SELECT id FROM experiments));
ALTER TABLE searcher_ops ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON searcher_ops FOR SELECT
    USING (trial_id IN (SELECT id FROM trials));
ALTER TABLE allocations ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON allocations FOR SELECT
    USING (job_id IN (SELECT id FROM jobs));
ALTER TABLE metrics ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON metrics FOR SELECT
    USING (trial_id IN (SELECT id FROM trials));
ALTER TABLE checkpoints ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON checkpoints FOR SELECT
    USING (trial_id IN (SELECT id FROM trials));
ALTER TABLE task_logs ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON task_logs FOR SELECT
    USING (allocation_id IN (SELECT id FROM allocations));
ALTER TABLE models ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON models FOR SELECT
    USING (workspace_id = ANY ((SELECT det_visible_workspaces())::integer[]));
ALTER TABLE model_versions ENABLE ROW LEVEL SECURITY;
CREATE POLICY visible ON model_versions FOR SELECT
    USING (model_id IN (SELECT id FROM models));
ALTER TABLE audit_log ENABLE ROW LEVEL SECURITY;
CREATE POLICY cluster_admins ON audit_log FOR SELECT
    USING ((SELECT det_permitted(det_caller(), 'admin_cluster', NULL)));

-- migrate()'s bookkeeping: the CLI checks the schema is current before it acts.
GRANT SELECT ON det_migrations TO det_user;
