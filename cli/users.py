"""``det user`` and ``det user-group``: users (PostgreSQL roles) and groups of them.

A password never reaches det's tables or SQL text: the client turns it into a SCRAM-SHA-256
verifier (libpq's PQencryptPasswordConn) that PostgreSQL keeps and checks at login. So the
CLI states the new password's length for det's minimum password policy (at least 8 characters
unless a ClusterAdmin passes ``--weak-ok``: det_internal.password_policy).
"""

import psycopg
import typer

from det.cli import login
from det.cli.output import print_json, print_table
from det.cli.session import db
from det.db import roles
from det.errors import AuthError, DetError, NotFoundError
from det.queries import users as q
from det.sql import named

Q = named("cli")

app = typer.Typer(no_args_is_help=True)
group_app = typer.Typer(no_args_is_help=True)

def password_verifier(conn: psycopg.Connection, username: str, password: str) -> str:
    """The SCRAM-SHA-256 verifier of ``password`` (what PostgreSQL stores), made here.

    Raises:
        DetError: an empty password.
    """
    if not password:
        raise DetError("password: must not be empty")
    return roles.verifier(conn, username, password)


def _new_password(password: str | None, prompt: str) -> str:
    return password if password is not None else typer.prompt(
        prompt, hide_input=True, confirmation_prompt=True)


WEAK_OK_HELP = ("Allow a password shorter than 8 characters (ClusterAdmin only; det refuses "
                "one otherwise).")


@app.command("create")
def create(
    username: str = typer.Argument(..., help="Name of the new user (also its PostgreSQL role)."),
    admin: bool = typer.Option(False, "--admin", help="Make the user a ClusterAdmin."),
    password: str = typer.Option(None, "--password",
                                 help="Its password, at least 8 characters (default: none; it "
                                      "cannot log in until `det user change-password` sets "
                                      "one)."),
    weak_ok: bool = typer.Option(False, "--weak-ok", help=WEAK_OK_HELP),
) -> None:
    """Create a user (ClusterAdmin only). A new user is an Editor in Uncategorized."""
    with db() as conn:
        verifier = password_verifier(conn, username, password) if password is not None else None
        uid = conn.execute(Q.user_create,
                           (username, verifier, admin,
                            None if password is None else len(password), weak_ok)
                           ).fetchone()["id"]
    typer.echo(f"Created user {uid}: {username}" + ("" if password is not None else
                                                    " (no password yet)"))


@app.command("list")
def list_(
    all_: bool = typer.Option(False, "--all", "-a", help="Include deactivated users."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Users: name, active, ClusterAdmin, groups."""
    with db() as conn:
        rows = q.users(conn, all_)
    if json_:
        print_json(rows)
        return
    print_table(rows, ["id", "username", "active", "admin", "groups", "created_at"])


@app.command("describe")
def describe(
    username: str = typer.Argument(..., help="The user."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A user: whether active, their groups, and every role they hold and where."""
    with db() as conn:
        user = next(iter(q.users(conn, True, username)), None)
        if user is None:
            raise NotFoundError(f"user {username!r} not found")
        user["roles"] = q.user_roles(conn, username)
    if json_:
        print_json(user)
        return
    groups = ", ".join(user["groups"]) or "none"
    typer.echo(f"User {user['id']}: {user['username']}  "
               f"{'active' if user['active'] else 'deactivated'}  groups: {groups}")
    print_table(user["roles"], ["role", "workspace", "via"])


def _set_active(username: str, active: bool) -> None:
    with db() as conn:
        conn.execute(Q.user_set_active, (username, active))
    typer.echo(f"{'Activated' if active else 'Deactivated'} user {username}")


@app.command("deactivate")
def deactivate(username: str = typer.Argument(..., help="The user.")) -> None:
    """Deactivate a user (ClusterAdmin): they can no longer log in or act."""
    _set_active(username, False)


@app.command("activate")
def activate(username: str = typer.Argument(..., help="The user.")) -> None:
    """Activate a deactivated user again (ClusterAdmin)."""
    _set_active(username, True)


@app.command("change-password")
def change_password(
    target_user: str = typer.Argument(None, help="Whose password (default: your own; "
                                                 "another's takes ClusterAdmin)."),
    password: str = typer.Option(None, "--password",
                                 help="The new password, at least 8 characters (default: "
                                      "ask)."),
    current_password: str = typer.Option(None, "--current-password",
                                         help="Your current password, when you change your "
                                              "own and are no ClusterAdmin (default: ask)."),
    weak_ok: bool = typer.Option(False, "--weak-ok", help=WEAK_OK_HELP),
) -> None:
    """Set a user's password (asked twice, not echoed). A user who is no ClusterAdmin gives
    their current password first. Every det serve login of the user ends (its tokens are
    refused), and the change is audited (det_user.user_set_password)."""
    with db() as conn:
        me = conn.execute(Q.caller).fetchone()["u"]
        name = target_user or me
        if name == me and not q.is_cluster_admin(conn):
            if current_password is None:
                current_password = typer.prompt(f"Current password for {name}",
                                                hide_input=True)
            try:  # PostgreSQL checks it: det never sees a stored password
                roles.check_password(conn.info.dsn, name, current_password)
            except AuthError:
                raise AuthError(f"change the password of {name}: the current password is "
                                "wrong") from None
        new = _new_password(password, f"New password for {name}")
        verifier = password_verifier(conn, name, new)
        conn.execute(Q.user_set_password, (name, verifier, len(new), weak_ok))
    login.keep_password(name, new)
    typer.echo(f"Changed the password of {name}")


@group_app.command("create")
def group_create(
    group_name: str = typer.Argument(..., help="Name of the new group."),
    add_user: list[str] = typer.Option([], "--add-user", help="A member to add (repeatable)."),
) -> None:
    """Create a user group (ClusterAdmin), with members if --add-user."""
    with db() as conn, conn.transaction():
        gid = conn.execute(Q.group_create, (group_name,)).fetchone()["id"]
        for u in add_user:
            conn.execute(Q.group_add_member, (group_name, u))
    typer.echo(f"Created group {gid}: {group_name}")


@group_app.command("delete")
def group_delete(group_name: str = typer.Argument(..., help="The group.")) -> None:
    """Delete a group (ClusterAdmin); its members lose the roles it held."""
    with db() as conn:
        conn.execute(Q.group_delete, (group_name,))
    typer.echo(f"Deleted group {group_name}")


def _members(group_name: str, usernames: str, member: bool) -> None:
    names = [u.strip() for u in usernames.split(",") if u.strip()]
    if not names:
        raise DetError("usernames: expected a comma-separated list of users")
    with db() as conn, conn.transaction():
        for u in names:
            conn.execute(Q.group_set_member, (group_name, u, member))
    typer.echo(f"{'Added' if member else 'Removed'} {', '.join(names)} "
               f"{'to' if member else 'from'} group {group_name}")


@group_app.command("add-user")
def add_user_(
    group_name: str = typer.Argument(..., help="The group."),
    usernames: str = typer.Argument(..., help="Comma-separated users."),
) -> None:
    """Add users to a group (ClusterAdmin); all or none."""
    _members(group_name, usernames, True)


@group_app.command("remove-user")
def remove_user(
    group_name: str = typer.Argument(..., help="The group."),
    usernames: str = typer.Argument(..., help="Comma-separated users."),
) -> None:
    """Remove users from a group (ClusterAdmin); all or none."""
    _members(group_name, usernames, False)


@group_app.command("list")
def group_list(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Groups and their members."""
    with db() as conn:
        rows = q.groups(conn)
    if json_:
        print_json(rows)
        return
    print_table(rows, ["id", "name", "members", "created_at"])


@group_app.command("describe")
def group_describe(
    group_name: str = typer.Argument(..., help="The group."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A group and its members."""
    with db() as conn:
        row = next(iter(q.groups(conn, group_name)), None)
    if row is None:
        raise NotFoundError(f"group {group_name!r} not found")
    if json_:
        print_json(row)
        return
    typer.echo(f"Group {row['id']}: {row['name']}  members: {', '.join(row['members']) or 'none'}")
