"""Reading workspaces and projects (as the caller: row-level security shows only the
workspaces they may view), and where a new experiment goes."""

import psycopg

from det.configs.load import parse_yaml
from det.errors import ConfigError, NotFoundError

LIST = """
SELECT w.id, w.name, w.archived, w.created_by, w.created_at, w.default_compute_pool,
       w.default_aux_pool, w.checkpoint_storage,
       (SELECT count(*) FROM projects p WHERE p.workspace_id = w.id) AS projects,
       (SELECT count(*) FROM jobs j WHERE j.workspace_id = w.id) AS experiments,
       coalesce((SELECT array_agg(b.resource_pool ORDER BY b.resource_pool)
                   FROM workspace_pools b WHERE b.workspace_id = w.id), '{}') AS bound_pools
  FROM workspaces w
 WHERE (%(all)s OR NOT w.archived) AND (%(name)s::text IS NULL OR w.name = %(name)s)
 ORDER BY w.id
"""

PROJECTS = """
SELECT p.id, p.name, p.description, p.archived, p.created_by, p.created_at,
       (SELECT count(*) FROM experiments e WHERE e.project_id = p.id) AS experiments
  FROM projects p JOIN workspaces w ON w.id = p.workspace_id
 WHERE w.name = %(workspace)s AND (%(all)s OR NOT p.archived)
   AND (%(name)s::text IS NULL OR p.name = %(name)s)
 ORDER BY p.id
"""

MEMBERS = """
SELECT coalesce(u.username, g.name) AS member, CASE WHEN u.id IS NULL THEN 'group' ELSE 'user'
       END AS kind, a.role, coalesce(w.name, '(all workspaces)') AS workspace
  FROM role_assignments a
  LEFT JOIN users u ON u.id = a.user_id
  LEFT JOIN user_groups g ON g.id = a.group_id
  LEFT JOIN workspaces w ON w.id = a.workspace_id
 WHERE a.workspace_id IS NULL OR w.name = %(workspace)s
 ORDER BY a.workspace_id NULLS FIRST, kind DESC, member, a.role
"""


def get_workspace(conn: psycopg.Connection, name: str) -> dict:
    """The workspace named ``name`` (with its counts and bound pools), as :data:`LIST` rows.

    Raises:
        NotFoundError: no such workspace the caller may view.
    """
    row = conn.execute(LIST, {"all": True, "name": name}).fetchone()
    if row is None:
        raise NotFoundError(f"workspace {name!r} not found")
    return row


def placement(conn: psycopg.Connection, config_text: str, source: str, workspace: str | None,
              project: str | None, project_id: int | None) -> tuple[str | None, str | None]:
    """(workspace name, project name) a new experiment goes to: ``project_id``, else the
    ``workspace``/``project`` options, else the config's ``workspace:``/``project:`` keys
    (both or neither; Determined's rule), else (None, None) for Uncategorized.

    Raises:
        ConfigError: only one of the two named, or both ``project_id`` and names.
        NotFoundError: no project with ``project_id`` that the caller may view.
    """
    if project_id is not None:
        if workspace is not None or project is not None:
            raise ConfigError("--project_id", "give it, or --workspace and --project, not both")
        row = conn.execute("SELECT w.name AS workspace, p.name AS project FROM projects p "
                           "JOIN workspaces w ON w.id = p.workspace_id WHERE p.id = %s",
                           (project_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"project {project_id} not found")
        return row["workspace"], row["project"]
    if workspace is None and project is None:
        try:
            data = parse_yaml(config_text, source)
        except ConfigError:
            data = None  # the config's own check reports it, with its line
        if isinstance(data, dict):
            workspace, project = data.get("workspace") or None, data.get("project") or None
            where = "workspace and project"
        else:
            return None, None
    else:
        source, where = None, "--workspace and --project"
    if (workspace is None) != (project is None):
        raise ConfigError(where, "give both or neither (neither: Uncategorized)", source)
    return workspace, project


def workspace_defaults(conn: psycopg.Connection, workspace: str | None) -> dict:
    """A partial config of what workspace ``workspace`` (None: Uncategorized) gives its
    experiments when their config is silent: ``resources.resource_pool`` (its default compute
    pool) and ``checkpoint_storage``. Empty when it sets neither or cannot be seen (the
    submission then fails naming the workspace)."""
    row = conn.execute("SELECT default_compute_pool, checkpoint_storage FROM workspaces "
                       "WHERE name = coalesce(%s, 'Uncategorized')", (workspace,)).fetchone()
    out: dict = {}
    if row is None:
        return out
    if row["default_compute_pool"] is not None:
        out["resources"] = {"resource_pool": row["default_compute_pool"]}
    if row["checkpoint_storage"] is not None:
        out["checkpoint_storage"] = row["checkpoint_storage"]
    return out


PROJECT = """
SELECT p.id, p.name, p.description, p.archived, p.created_by, p.created_at,
       p.workspace_id, w.name AS workspace,
       (SELECT count(*) FROM experiments e WHERE e.project_id = p.id) AS experiments
  FROM projects p JOIN workspaces w ON w.id = p.workspace_id
 WHERE p.id = %(id)s
"""
"""One project by id, with its workspace's name (the WebUI's project page)."""


def workspace_by_id(conn: psycopg.Connection, workspace_id: int) -> dict:
    """The workspace ``workspace_id`` as :func:`get_workspace` gives it, with its projects
    (:data:`PROJECTS`, archived ones included) under ``project_list``.

    Raises:
        NotFoundError: no such workspace the caller may view.
    """
    row = conn.execute("SELECT name FROM workspaces WHERE id = %s", (workspace_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"workspace {workspace_id} not found")
    ws = get_workspace(conn, row["name"])
    ws["project_list"] = conn.execute(PROJECTS, {"workspace": ws["name"], "all": True,
                                                 "name": None}).fetchall()
    return ws


def project_by_id(conn: psycopg.Connection, project_id: int) -> dict:
    """The project ``project_id`` (:data:`PROJECT`).

    Raises:
        NotFoundError: no such project in a workspace the caller may view.
    """
    row = conn.execute(PROJECT, {"id": project_id}).fetchone()
    if row is None:
        raise NotFoundError(f"project {project_id} not found")
    return row
