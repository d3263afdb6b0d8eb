"""Reading workspaces and projects (as the caller: row-level security shows only the
workspaces they may view), and where a new experiment goes."""

import psycopg

from det.configs.load import parse_yaml
from det.errors import ConfigError, NotFoundError
from det.sql import named

Q = named("queries")


def get_workspace(conn: psycopg.Connection, name: str) -> dict:
    """The workspace named ``name`` (with its counts and bound pools), as the rows of
    queries.sql's ``workspaces``.

    Raises:
        NotFoundError: no such workspace the caller may view.
    """
    row = conn.execute(Q.workspaces, {"all": True, "name": name}).fetchone()
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
        row = conn.execute(Q.project_place, (project_id,)).fetchone()
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
    row = conn.execute(Q.workspace_defaults, (workspace,)).fetchone()
    out: dict = {}
    if row is None:
        return out
    if row["default_compute_pool"] is not None:
        out["resources"] = {"resource_pool": row["default_compute_pool"]}
    if row["checkpoint_storage"] is not None:
        out["checkpoint_storage"] = row["checkpoint_storage"]
    return out


def workspace_by_id(conn: psycopg.Connection, workspace_id: int) -> dict:
    """The workspace ``workspace_id`` as :func:`get_workspace` gives it, with its projects
    (queries.sql's ``workspace_projects``, archived ones included) under ``project_list``.

    Raises:
        NotFoundError: no such workspace the caller may view.
    """
    row = conn.execute(Q.workspace_name, (workspace_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"workspace {workspace_id} not found")
    ws = get_workspace(conn, row["name"])
    ws["project_list"] = conn.execute(Q.workspace_projects,
                                      {"workspace": ws["name"], "all": True,
                                       "name": None}).fetchall()
    return ws


def project_by_id(conn: psycopg.Connection, project_id: int) -> dict:
    """The project ``project_id`` (queries.sql: project).

    Raises:
        NotFoundError: no such project in a workspace the caller may view.
    """
    row = conn.execute(Q.project, {"id": project_id}).fetchone()
    if row is None:
        raise NotFoundError(f"project {project_id} not found")
    return row


def project_experiments(conn: psycopg.Connection, project_id: int) -> list[dict]:
    """The experiments of project ``project_id`` (``id``, ``name``, ``state``, ``owner``,
    ``start_time``), by id."""
    return conn.execute(Q.project_experiments, (project_id,)).fetchall()
