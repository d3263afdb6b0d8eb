"""``det workspace`` and ``det project``: where experiments and models live, and who may use
them (spec: Workspaces and Projects). Names are exact: any character is part of a name."""

import json

import typer
from psycopg.types.json import Jsonb
from pydantic import TypeAdapter

from det.cli.output import print_json, print_table
from det.cli.session import db
from det.configs.experiment import CheckpointStorage
from det.configs.load import parse_value, parse_yaml
from det.errors import ConfigError, NotFoundError
from det.queries.workspaces import get_workspace, project_experiments
from det.sql import named

Q = named("cli")
READ = named("queries")

app = typer.Typer(no_args_is_help=True)
project_app = typer.Typer(no_args_is_help=True)


def _storage(config: str | None, config_file: str | None) -> dict | None:
    """A workspace's checkpoint_storage from --checkpoint-storage-config (JSON) or a YAML file,
    checked as an experiment's would be.

    Raises:
        ConfigError: invalid JSON/YAML or storage config, naming the option.
    """
    if config is not None and config_file is not None:
        raise ConfigError("--checkpoint-storage-config",
                          "give it or --checkpoint-storage-config-file, not both")
    if config is not None:
        try:
            data = json.loads(config)
        except json.JSONDecodeError as e:
            raise ConfigError("--checkpoint-storage-config", f"invalid JSON ({e})") from e
        source = "--checkpoint-storage-config"
    elif config_file is not None:
        with open(config_file, encoding="utf-8") as f:
            data = parse_yaml(f.read(), config_file)
        source = config_file
    else:
        return None
    storage = parse_value(TypeAdapter(CheckpointStorage), data, f"{source}: checkpoint_storage")
    return storage.model_dump(mode="json", exclude_none=True)


@app.command("create")
def create(
    name: str = typer.Argument(..., help="Unique name of the workspace."),
    default_compute_pool: str = typer.Option(None, "--default-compute-pool",
                                             help="Pool its experiments use by default."),
    default_aux_pool: str = typer.Option(None, "--default-aux-pool",
                                         help="Pool its zero-slot tasks use by default."),
    checkpoint_storage_config: str = typer.Option(
        None, "--checkpoint-storage-config",
        help="Checkpoint storage its experiments use by default (JSON)."),
    checkpoint_storage_config_file: str = typer.Option(
        None, "--checkpoint-storage-config-file", help="The same, from a YAML file."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Create a workspace (WorkspaceCreator or ClusterAdmin); you become its WorkspaceAdmin."""
    storage = _storage(checkpoint_storage_config, checkpoint_storage_config_file)
    with db() as conn:
        wid = conn.execute(Q.workspace_create,
                           (name, default_compute_pool, default_aux_pool,
                            Jsonb(storage) if storage is not None else None)).fetchone()["id"]
        row = get_workspace(conn, name) if json_ else None
    if json_:
        print_json(row)
        return
    typer.echo(f"Created workspace {wid}: {name}")


@app.command("list")
def list_(
    all_: bool = typer.Option(False, "--all", "-a", help="Include archived workspaces."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The workspaces you may view: projects, experiments, default pool, bound pools."""
    with db() as conn:
        rows = conn.execute(READ.workspaces, {"all": all_, "name": None}).fetchall()
    if json_:
        print_json(rows)
        return
    print_table(rows, ["id", "name", "archived", "projects", "experiments",
                       "default_compute_pool", "bound_pools", "created_by"])


@app.command("describe")
def describe(
    workspace_name: str = typer.Argument(..., help="The workspace."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A workspace: its settings, projects and members."""
    with db() as conn:
        ws = get_workspace(conn, workspace_name)
        ws["project_list"] = conn.execute(READ.workspace_projects,
                                          {"workspace": workspace_name, "all": True,
                                           "name": None}).fetchall()
        ws["members"] = conn.execute(READ.workspace_members,
                                     {"workspace": workspace_name}).fetchall()
    if json_:
        print_json(ws)
        return
    typer.echo(f"Workspace {ws['id']}: {ws['name']}{'  [archived]' if ws['archived'] else ''}"
               f"  created by {ws['created_by']}")
    typer.echo(f"default compute pool: {ws['default_compute_pool'] or '(the cluster default)'}"
               f"  default aux pool: {ws['default_aux_pool'] or '(the cluster default)'}"
               f"  bound pools: {', '.join(ws['bound_pools']) or 'none'}")
    if ws["checkpoint_storage"]:
        typer.echo(f"checkpoint storage: {json.dumps(ws['checkpoint_storage'])}")
    typer.echo("")
    print_table(ws["project_list"], ["id", "name", "experiments", "archived", "description"])
    typer.echo("")
    print_table(ws["members"], ["member", "kind", "role", "workspace"])


@app.command("list-projects")
def list_projects(
    workspace_name: str = typer.Argument(..., help="The workspace."),
    all_: bool = typer.Option(False, "--all", "-a", help="Include archived projects."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A workspace's projects."""
    project_list(workspace_name, all_, json_)


@app.command("list-members")
def list_members(
    workspace_name: str = typer.Argument(..., help="The workspace."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Who holds which role in a workspace (cluster-wide roles included)."""
    with db() as conn:
        get_workspace(conn, workspace_name)
        rows = conn.execute(READ.workspace_members, {"workspace": workspace_name}).fetchall()
    if json_:
        print_json(rows)
        return
    print_table(rows, ["member", "kind", "role", "workspace"])


def _archive(name: str, archived: bool) -> None:
    with db() as conn:
        conn.execute(Q.workspace_set_archived, (name, archived))
    typer.echo(f"{'Archived' if archived else 'Unarchived'} workspace {name}")


@app.command("archive")
def archive(workspace_name: str = typer.Argument(..., help="The workspace.")) -> None:
    """Archive a workspace (WorkspaceAdmin): it takes no new experiments or projects."""
    _archive(workspace_name, True)


@app.command("unarchive")
def unarchive(workspace_name: str = typer.Argument(..., help="The workspace.")) -> None:
    """Unarchive a workspace (WorkspaceAdmin)."""
    _archive(workspace_name, False)


@app.command("delete")
def delete(
    workspace_name: str = typer.Argument(..., help="The workspace."),
    yes: bool = typer.Option(False, "--yes", help="Do not ask."),
) -> None:
    """Delete a workspace (WorkspaceAdmin), with its projects and role assignments. Refused
    while it holds experiments or models: move or delete them first."""
    if not yes:
        typer.confirm(f"Delete workspace {workspace_name!r}?", abort=True)
    with db() as conn:
        conn.execute(Q.workspace_delete, (workspace_name,))
    typer.echo(f"Deleted workspace {workspace_name}")


@project_app.command("create")
def project_create(
    workspace_name: str = typer.Argument(..., help="The workspace."),
    name: str = typer.Argument(..., help="Name of the project (unique in its workspace)."),
    description: str = typer.Option("", "--description", help="One-line description."),
) -> None:
    """Create a project (Editor of the workspace)."""
    with db() as conn:
        pid = conn.execute(Q.project_create, (workspace_name, name, description)).fetchone()["id"]
    typer.echo(f"Created project {pid}: {name} in workspace {workspace_name}")


@project_app.command("list")
def project_list(
    workspace_name: str = typer.Argument(..., help="The workspace."),
    all_: bool = typer.Option(False, "--all", "-a", help="Include archived projects."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A workspace's projects and how many experiments each holds."""
    with db() as conn:
        get_workspace(conn, workspace_name)
        rows = conn.execute(READ.workspace_projects, {"workspace": workspace_name, "all": all_,
                                                      "name": None}).fetchall()
    if json_:
        print_json(rows)
        return
    print_table(rows, ["id", "name", "experiments", "archived", "created_by", "description"])


@project_app.command("describe")
def project_describe(
    workspace_name: str = typer.Argument(..., help="The workspace."),
    project_name: str = typer.Argument(..., help="The project."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A project and its experiments."""
    with db() as conn:
        row = conn.execute(READ.workspace_projects, {"workspace": workspace_name, "all": True,
                                                     "name": project_name}).fetchone()
        if row is None:
            raise NotFoundError(f"project {project_name!r} not found in workspace "
                                f"{workspace_name!r}")
        row["experiment_list"] = project_experiments(conn, row["id"])
    if json_:
        print_json(row)
        return
    typer.echo(f"Project {row['id']}: {row['name']} (workspace {workspace_name})"
               f"{'  [archived]' if row['archived'] else ''}  {row['description']}")
    print_table(row["experiment_list"], ["id", "name", "state", "owner", "start_time"])


def _project_archive(workspace_name: str, name: str, archived: bool) -> None:
    with db() as conn:
        conn.execute(Q.project_set_archived, (workspace_name, name, archived))
    typer.echo(f"{'Archived' if archived else 'Unarchived'} project {name}")


@project_app.command("archive")
def project_archive(
    workspace_name: str = typer.Argument(..., help="The workspace."),
    name: str = typer.Argument(..., help="The project."),
) -> None:
    """Archive a project (Editor): it takes no new experiments."""
    _project_archive(workspace_name, name, True)


@project_app.command("unarchive")
def project_unarchive(
    workspace_name: str = typer.Argument(..., help="The workspace."),
    name: str = typer.Argument(..., help="The project."),
) -> None:
    """Unarchive a project (Editor)."""
    _project_archive(workspace_name, name, False)


@project_app.command("delete")
def project_delete(
    workspace_name: str = typer.Argument(..., help="The workspace."),
    name: str = typer.Argument(..., help="The project."),
    yes: bool = typer.Option(False, "--yes", help="Do not ask."),
) -> None:
    """Delete a project (Editor). Refused while it holds experiments."""
    if not yes:
        typer.confirm(f"Delete project {name!r} of workspace {workspace_name!r}?", abort=True)
    with db() as conn:
        conn.execute(Q.project_delete, (workspace_name, name))
    typer.echo(f"Deleted project {name}")
