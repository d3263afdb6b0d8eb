-- Tables: users, workspaces, projects and access control
--
-- A det user is a PostgreSQL role of the same name (LOGIN, member of det_user): PostgreSQL
-- holds the password (SCRAM-SHA-256) and checks it, and row-level security decides which rows
-- each one sees. Roles belong to the server, not to this database: the migration that made
-- this section created det's own when absent (det_user: every user; det_agent and det_task:
-- may only EXECUTE their functions; det_web: det serve, which SETs ROLE to a request's user).
-- The schema's owner (the reconciler, `det cluster up`) bypasses row-level security and acts
-- with every permission.

CREATE FUNCTION det_user.name_problem(p_name text, p_max_bytes integer) RETURNS text
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
GRANT EXECUTE ON FUNCTION det_user.name_problem(text, integer) TO det_user;

CREATE TABLE users (
    id           serial PRIMARY KEY,
    username     text NOT NULL UNIQUE CHECK (det_user.name_problem(username, 63) IS NULL),
    active       boolean NOT NULL DEFAULT true,
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text NOT NULL
);
COMMENT ON TABLE users IS
    'det users: each is the PostgreSQL role named username (LOGIN while active, member of '
    'det_user). det stores no password: PostgreSQL keeps a SCRAM-SHA-256 verifier of it.';
GRANT SELECT ON users TO det_user;

CREATE TABLE user_groups (
    id         serial PRIMARY KEY,
    name       text NOT NULL UNIQUE CHECK (det_user.name_problem(name, 255) IS NULL),
    created_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE user_groups IS
    'Groups of users: a role assigned to a group holds for each member.';
GRANT SELECT ON user_groups TO det_user;

CREATE TABLE user_group_members (
    group_id integer NOT NULL REFERENCES user_groups (id) ON DELETE CASCADE,
    user_id  integer NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    PRIMARY KEY (group_id, user_id)
);
CREATE INDEX user_group_members_user ON user_group_members (user_id);
GRANT SELECT ON user_group_members TO det_user;

CREATE TABLE workspaces (
    id                   serial PRIMARY KEY,
    name                 text NOT NULL UNIQUE CHECK (det_user.name_problem(name, 255) IS NULL),
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
GRANT SELECT ON workspaces TO det_user;
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
GRANT SELECT ON workspace_pools TO det_user;

CREATE TABLE projects (
    id           serial PRIMARY KEY,
    workspace_id integer NOT NULL REFERENCES workspaces (id),
    name         text NOT NULL CHECK (det_user.name_problem(name, 255) IS NULL),
    description  text NOT NULL DEFAULT '' CHECK (length(description) <= 4096),
    archived     boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text NOT NULL,
    UNIQUE (workspace_id, name)
);
COMMENT ON TABLE projects IS
    'Projects of a workspace; project 1, "Uncategorized" of workspace 1, holds experiments '
    'submitted without one.';
GRANT SELECT ON projects TO det_user;
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
GRANT SELECT ON roles TO det_user;
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
GRANT SELECT ON role_assignments TO det_user;

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
GRANT SELECT ON audit_log TO det_user;
