-- User actions: users, groups, workspaces, projects and roles. Each is one
-- transaction, checks its caller's permission and writes an audit_log entry.

CREATE FUNCTION det_user.user_create(p_username text, p_password_verifier text, p_admin boolean,
                                p_password_length integer DEFAULT NULL,
                                p_weak_ok boolean DEFAULT false)
RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user create` (ClusterAdmin): a det user is a new LOGIN role of the same name, member
-- of det_user (and of det_web, so det serve can act as it), Editor in Uncategorized, and
-- ClusterAdmin too if p_admin. p_password_verifier: see det_internal.check_verifier; NULL leaves
-- the user unable to log in until a password is set. p_password_length, p_weak_ok: the password
-- policy (det_internal.password_policy). Returns the user's id.
DECLARE
    v_problem text := det_user.name_problem(p_username, 63);
    v_id integer;
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL, format('create user %s',
        to_jsonb(p_username)));
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'username %: %', to_jsonb(p_username), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_internal.check_verifier(p_password_verifier);
    IF p_password_verifier IS NOT NULL THEN
        PERFORM det_internal.password_policy(p_password_length, p_weak_ok,
                                    format('create user %s', to_jsonb(p_username)));
    END IF;
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
    INSERT INTO users (username, created_by) VALUES (p_username, det_user.caller())
    RETURNING id INTO v_id;
    INSERT INTO role_assignments (role, user_id, workspace_id) VALUES ('Editor', v_id, 1);
    IF p_admin THEN
        INSERT INTO role_assignments (role, user_id) VALUES ('ClusterAdmin', v_id);
    END IF;
    PERFORM det_internal.audit('create', 'user', p_username,
                      jsonb_build_object('admin', p_admin, 'weak_ok', coalesce(p_weak_ok, false)));
    RETURN v_id;
END $$;
GRANT EXECUTE ON FUNCTION det_user.user_create(text, text, boolean, integer, boolean) TO det_user;

CREATE FUNCTION det_user.user_set_password(p_username text, p_password_verifier text,
                                      p_password_length integer DEFAULT NULL,
                                      p_weak_ok boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user change-password`: a user's own, or anyone's by a ClusterAdmin (the CLI asks a
-- user who is no ClusterAdmin for the current password first). p_password_length,
-- p_weak_ok: the password policy (det_internal.password_policy). Every det serve login of the user
-- ends (a token minted under the old password is refused), and the change is audited with how
-- many logins it ended.
DECLARE
    u users := det_user.user_find(p_username);
    v_ended integer;
BEGIN
    IF u.username <> det_user.caller() THEN
        PERFORM det_internal.require('admin_cluster', NULL,
                            format('change the password of user %s', to_jsonb(p_username)));
    END IF;
    IF p_password_verifier IS NULL THEN
        RAISE EXCEPTION 'password: expected a SCRAM-SHA-256 verifier, got nothing'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM det_internal.check_verifier(p_password_verifier);
    PERFORM det_internal.password_policy(p_password_length, p_weak_ok,
                                format('change the password of user %s', to_jsonb(p_username)));
    EXECUTE format('ALTER ROLE %I PASSWORD %L', u.username, p_password_verifier);
    DELETE FROM web_sessions WHERE username = u.username;
    GET DIAGNOSTICS v_ended = ROW_COUNT;
    PERFORM det_internal.audit('change_password', 'user', u.username,
                      jsonb_build_object('logins_ended', v_ended,
                                         'weak_ok', coalesce(p_weak_ok, false)));
END $$;
GRANT EXECUTE ON FUNCTION det_user.user_set_password(text, text, integer, boolean) TO det_user;

CREATE FUNCTION det_user.user_set_active(p_username text, p_active boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user deactivate | activate` (ClusterAdmin): a deactivated user cannot log in (its role
-- loses LOGIN), holds no permission, and its det serve logins end.
DECLARE
    u users := det_user.user_find(p_username);
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL,
                        format('%s user %s', CASE WHEN p_active THEN 'activate'
                                                  ELSE 'deactivate' END, to_jsonb(p_username)));
    IF NOT p_active AND u.username = det_user.caller() THEN
        RAISE EXCEPTION 'user %: you cannot deactivate yourself', to_jsonb(u.username)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE users SET active = p_active WHERE id = u.id;
    EXECUTE format('ALTER ROLE %I %s', u.username,
        CASE WHEN p_active THEN 'LOGIN' ELSE 'NOLOGIN' END);
    IF NOT p_active THEN
        DELETE FROM web_sessions WHERE username = u.username;
    END IF;
    PERFORM det_internal.audit(CASE WHEN p_active THEN 'activate' ELSE 'deactivate' END, 'user',
                      u.username);
END $$;
GRANT EXECUTE ON FUNCTION det_user.user_set_active(text, boolean) TO det_user;

CREATE FUNCTION det_user.group_create(p_name text) RETURNS integer LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user-group create` (ClusterAdmin). Returns the group's id.
DECLARE
    v_problem text := det_user.name_problem(p_name, 255);
    v_id integer;
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL, format('create group %s',
        to_jsonb(p_name)));
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'group name %: %', to_jsonb(p_name), v_problem
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO user_groups (name) VALUES (p_name) RETURNING id INTO v_id;
    PERFORM det_internal.audit('create', 'group', p_name);
    RETURN v_id;
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'group name %: a group of that name exists', to_jsonb(p_name)
        USING ERRCODE = 'unique_violation';
END $$;
GRANT EXECUTE ON FUNCTION det_user.group_create(text) TO det_user;

CREATE FUNCTION det_user.group_delete(p_name text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user-group delete` (ClusterAdmin): its members lose the roles it held.
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL, format('delete group %s',
        to_jsonb(p_name)));
    DELETE FROM user_groups WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'group % not found', to_jsonb(p_name) USING ERRCODE = 'no_data_found';
    END IF;
    PERFORM det_internal.audit('delete', 'group', p_name);
END $$;
GRANT EXECUTE ON FUNCTION det_user.group_delete(text) TO det_user;

CREATE FUNCTION det_user.group_set_member(p_group text, p_username text, p_member boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det user-group add-user | remove-user` (ClusterAdmin). Adding a member twice or removing a
-- non-member changes nothing.
DECLARE
    v_group integer;
    u users := det_user.user_find(p_username);
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL,
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
    PERFORM det_internal.audit(CASE WHEN p_member THEN 'add_member' ELSE 'remove_member' END, 'group',
                      p_group, jsonb_build_object('user', u.username));
END $$;
GRANT EXECUTE ON FUNCTION det_user.group_set_member(text, text, boolean) TO det_user;

CREATE FUNCTION det_user.workspace_create(
    p_name text, p_default_compute_pool text, p_default_aux_pool text,
    p_checkpoint_storage jsonb
) RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det workspace create` (WorkspaceCreator or ClusterAdmin): the creator becomes its
-- WorkspaceAdmin. p_checkpoint_storage was validated by det.configs. Returns its id.
DECLARE
    v_user text := det_internal.require('create_workspace', NULL,
                               format('create workspace %s', to_jsonb(p_name)));
    v_problem text := det_user.name_problem(p_name, 255);
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
    PERFORM det_internal.audit('create', 'workspace', v_id::text,
        jsonb_build_object('name', p_name));
    RETURN v_id;
EXCEPTION WHEN foreign_key_violation THEN
    RAISE EXCEPTION 'workspace %: no resource pool named % or %', to_jsonb(p_name),
        to_jsonb(p_default_compute_pool), to_jsonb(p_default_aux_pool)
        USING ERRCODE = 'foreign_key_violation';
END $$;
GRANT EXECUTE ON FUNCTION det_user.workspace_create(text, text, text, jsonb) TO det_user;

CREATE FUNCTION det_user.workspace_set_archived(p_name text, p_archived boolean) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det workspace archive | unarchive` (WorkspaceAdmin): an archived workspace takes no new
-- experiments or projects and is hidden from `det workspace list` unless --all.
DECLARE
    w workspaces := det_user.workspace_find(p_name);
BEGIN
    PERFORM det_internal.require('admin_workspace', w.id,
                        format('%s workspace %s', CASE WHEN p_archived THEN 'archive'
                                                       ELSE 'unarchive' END, to_jsonb(w.name)));
    IF w.id = 1 THEN
        RAISE EXCEPTION 'workspace "Uncategorized" cannot be archived'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE workspaces SET archived = p_archived WHERE id = w.id;
    PERFORM det_internal.audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END,
        'workspace',
                      w.id::text, jsonb_build_object('name', w.name));
END $$;
GRANT EXECUTE ON FUNCTION det_user.workspace_set_archived(text, boolean) TO det_user;

CREATE FUNCTION det_user.workspace_delete(p_name text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det workspace delete` (WorkspaceAdmin): refused while any experiment or model is in it
-- (move or delete them first); its projects, role assignments and pool bindings go with it.
DECLARE
    w workspaces := det_user.workspace_find(p_name);
    v_n bigint;
BEGIN
    PERFORM det_internal.require('admin_workspace', w.id, format('delete workspace %s',
        to_jsonb(w.name)));
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
    PERFORM det_internal.audit('delete', 'workspace', w.id::text,
        jsonb_build_object('name', w.name));
END $$;
GRANT EXECUTE ON FUNCTION det_user.workspace_delete(text) TO det_user;

CREATE FUNCTION det_user.workspace_bind_pool(p_workspace text, p_pool text, p_bound boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det resource-pool bindings add | remove` (ClusterAdmin): bind a pool to a workspace, or
-- unbind it. Jobs already queued in the pool stay; new ones are checked at submission.
DECLARE
    w workspaces := det_user.workspace_find(p_workspace);
BEGIN
    PERFORM det_internal.require('admin_cluster', NULL,
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
    PERFORM det_internal.audit(CASE WHEN p_bound THEN 'bind_pool' ELSE 'unbind_pool' END,
        'workspace',
                      w.id::text, jsonb_build_object('name', w.name, 'pool', p_pool));
END $$;
GRANT EXECUTE ON FUNCTION det_user.workspace_bind_pool(text, text, boolean) TO det_user;

CREATE FUNCTION det_internal.check_pools(p_workspace integer, p_pools text[], p_what text)
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

CREATE FUNCTION det_user.project_create(p_workspace text, p_name text, p_description text)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det project create` (Editor of the workspace). Returns the project's id.
DECLARE
    w workspaces := det_user.workspace_find(p_workspace);
    v_user text := det_internal.require('edit', w.id, format('create a project in workspace %s',
                                                     to_jsonb(w.name)));
    v_problem text := det_user.name_problem(p_name, 255);
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
    PERFORM det_internal.audit('create', 'project', v_id::text,
                      jsonb_build_object('name', p_name, 'workspace', w.name));
    RETURN v_id;
END $$;
GRANT EXECUTE ON FUNCTION det_user.project_create(text, text, text) TO det_user;

CREATE FUNCTION det_user.project_set_archived(p_workspace text, p_name text, p_archived boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det project archive | unarchive` (Editor): an archived project takes no new experiments.
DECLARE
    p projects := det_user.project_find(p_workspace, p_name);
BEGIN
    PERFORM det_internal.require('edit', p.workspace_id,
                        format('%s project %s', CASE WHEN p_archived THEN 'archive'
                                                     ELSE 'unarchive' END, to_jsonb(p.name)));
    IF p.id = 1 THEN
        RAISE EXCEPTION 'project "Uncategorized" cannot be archived'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE projects SET archived = p_archived WHERE id = p.id;
    PERFORM det_internal.audit(CASE WHEN p_archived THEN 'archive' ELSE 'unarchive' END, 'project',
                      p.id::text, jsonb_build_object('name', p.name));
END $$;
GRANT EXECUTE ON FUNCTION det_user.project_set_archived(text, text, boolean) TO det_user;

CREATE FUNCTION det_user.project_delete(p_workspace text, p_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det project delete` (Editor): refused while it holds experiments.
DECLARE
    p projects := det_user.project_find(p_workspace, p_name);
    v_n bigint;
BEGIN
    PERFORM det_internal.require('edit', p.workspace_id, format('delete project %s',
        to_jsonb(p.name)));
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
    PERFORM det_internal.audit('delete', 'project', p.id::text, jsonb_build_object('name', p.name));
END $$;
GRANT EXECUTE ON FUNCTION det_user.project_delete(text, text) TO det_user;

CREATE FUNCTION det_user.experiment_move(p_id integer, p_workspace text, p_project text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det experiment move` (Editor where it is and where it goes): its job (and so its runs,
-- metrics, checkpoints and logs, which row-level security reaches through it) moves too.
-- The destination's pool bindings are not checked: what already runs keeps its pool.
DECLARE
    v_from integer := det_user.experiment_workspace(p_id);
    p projects := det_user.project_find(p_workspace, p_project);
BEGIN
    PERFORM det_internal.require('edit', v_from, format('move experiment %s', p_id));
    PERFORM det_internal.require('edit', p.workspace_id,
                        format('move experiment %s into project %s', p_id, to_jsonb(p.name)));
    IF p.archived THEN
        RAISE EXCEPTION 'project % is archived: unarchive it first', to_jsonb(p.name)
            USING ERRCODE = 'check_violation';
    END IF;
    UPDATE jobs SET workspace_id = p.workspace_id
     WHERE id = (SELECT job_id FROM experiments WHERE id = p_id);
    UPDATE experiments SET project_id = p.id WHERE id = p_id;
    PERFORM det_internal.audit('move', 'experiment', p_id::text,
                      jsonb_build_object('project', p.id, 'workspace', p.workspace_id));
END $$;
GRANT EXECUTE ON FUNCTION det_user.experiment_move(integer, text, text) TO det_user;

CREATE FUNCTION det_user.role_assign(
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
        w := det_user.workspace_find(p_workspace);
        PERFORM det_internal.require('admin_workspace', w.id,
                            format('assign roles in workspace %s', to_jsonb(w.name)));
    ELSE
        PERFORM det_internal.require('admin_cluster', NULL, 'assign cluster-wide roles');
    END IF;
    IF p_username IS NOT NULL THEN
        v_user := (det_user.user_find(p_username)).id;
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
    PERFORM det_internal.audit(CASE WHEN p_assigned THEN 'assign_role' ELSE 'unassign_role' END, 'role',
                      p_role, jsonb_build_object('user', p_username, 'group', p_group,
                                                 'workspace', w.name));
END $$;
GRANT EXECUTE ON FUNCTION det_user.role_assign(text, text, text, text, boolean) TO det_user;

CREATE FUNCTION det_user.model_move(p_model text, p_workspace text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
-- `det model move` (Editor where it is and where it goes).
DECLARE
    m models := det_user.model_find(p_model);
    w workspaces := det_user.workspace_find(p_workspace);
BEGIN
    PERFORM det_internal.require('edit', m.workspace_id, format('move model %s', to_jsonb(m.name)));
    PERFORM det_internal.require('edit', w.id, format('move model %s into workspace %s',
                                             to_jsonb(m.name), to_jsonb(w.name)));
    UPDATE models SET workspace_id = w.id, last_updated_time = now() WHERE id = m.id;
    PERFORM det_internal.audit('move', 'model', m.id::text,
        jsonb_build_object('workspace', w.name));
END $$;
GRANT EXECUTE ON FUNCTION det_user.model_move(text, text) TO det_user;
