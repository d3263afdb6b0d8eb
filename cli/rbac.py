"""``det rbac``: Determined's roles (Viewer, Editor, WorkspaceAdmin, WorkspaceCreator,
ClusterAdmin), who holds them, and what the caller may do."""

import typer

from det.cli.output import print_json, print_table
from det.cli.session import db
from det.queries import users as q
from det.sql import named

Q = named("cli")

app = typer.Typer(no_args_is_help=True)

@app.command("list-roles")
def list_roles(
    exclude_global_roles: bool = typer.Option(False, "--exclude-global-roles",
                                              help="Leave out the cluster-wide-only roles."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The roles, what each permits, and where each can be assigned."""
    with db() as conn:
        rows = q.roles(conn, exclude_global_roles)
    if json_:
        print_json(rows)
        return
    print_table(rows, ["name", "permissions", "scope", "description"])


def _assign(role: str, user: str | None, group: str | None, workspace: str | None,
            assigned: bool) -> None:
    with db() as conn:
        conn.execute(Q.role_assign, (role, user, group, workspace, assigned))
    who = f"user {user}" if user is not None else f"group {group}"
    where = f"workspace {workspace}" if workspace is not None else "the cluster"
    typer.echo(f"{'Assigned' if assigned else 'Unassigned'} role {role} "
               f"{'to' if assigned else 'from'} {who} on {where}")


_USER = typer.Option(None, "--username-to-assign", "-u", help="The user.")
_GROUP = typer.Option(None, "--group-name-to-assign", "-g", help="The group.")
_WORKSPACE = typer.Option(None, "--workspace-name", "-w",
                          help="The workspace (default: cluster-wide, ClusterAdmin only).")


@app.command("assign-role")
def assign_role(
    role_name: str = typer.Argument(..., help="Viewer, Editor, WorkspaceAdmin, "
                                              "WorkspaceCreator or ClusterAdmin."),
    username_to_assign: str = _USER, group_name_to_assign: str = _GROUP,
    workspace_name: str = _WORKSPACE,
) -> None:
    """Assign a role to a user or a group, in a workspace (its WorkspaceAdmin may) or
    cluster-wide (ClusterAdmin)."""
    _assign(role_name, username_to_assign, group_name_to_assign, workspace_name, True)


@app.command("unassign-role")
def unassign_role(
    role_name: str = typer.Argument(..., help="The role."),
    username_to_assign: str = _USER, group_name_to_assign: str = _GROUP,
    workspace_name: str = _WORKSPACE,
) -> None:
    """Take a role back from a user or a group (the same rights as assigning it)."""
    _assign(role_name, username_to_assign, group_name_to_assign, workspace_name, False)


@app.command("my-permissions")
def my_permissions(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """What you may do, and where."""
    with db() as conn:
        me = conn.execute(Q.caller).fetchone()["u"]
        rows = q.caller_permissions(conn)
    if json_:
        print_json({"user": me, "permissions": rows})
        return
    typer.echo(f"User {me}")
    print_table(rows, ["workspace", "permission"])


@app.command("list-users-roles")
def list_users_roles(
    username: str = typer.Argument(..., help="The user."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The roles a user holds, directly or through groups, and where."""
    with db() as conn:
        rows = q.user_roles(conn, username)
    if json_:
        print_json(rows)
        return
    print_table(rows, ["role", "workspace", "via"])
