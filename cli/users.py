"""``det user`` and ``det user-group``: users (PostgreSQL roles) and groups of them.

A password never reaches det's tables or SQL text: the client turns it into a SCRAM-SHA-256
verifier (libpq's PQencryptPasswordConn) that PostgreSQL keeps and checks at login. So the
CLI states the new password's length for det's minimum password policy (at least 8 characters
unless a ClusterAdmin passes ``--weak-ok``: det_password_policy).
"""

import psycopg
import typer

from det.cli import login
from det.cli.output import print_json, print_table
from det.cli.session import db
from det.db import roles
from det.errors import AuthError, DetError, NotFoundError

app = typer.Typer(no_args_is_help=True)
group_app = typer.Typer(no_args_is_help=True)

USERS = """
SELECT u.id, u.username, u.active, u.created_at, u.created_by,
       EXISTS (SELECT 1 FROM role_assignments a WHERE a.user_id = u.id AND a.role = 'ClusterAdmin'
                  AND a.workspace_id IS NULL) AS admin,
       coalesce((SELECT array_agg(g.name ORDER BY g.name) FROM user_group_members m
                  JOIN user_groups g ON g.id = m.group_id WHERE m.user_id = u.id), '{}') AS groups
  FROM users u
 WHERE (%(all)s OR u.active) AND (%(name)s::text IS NULL OR u.username = %(name)s)
 ORDER BY u.id
"""

USER_ROLES = """
SELECT a.role, coalesce(w.name, '(all workspaces)') AS workspace,
       CASE WHEN a.user_id IS NULL THEN 'group ' || g.name ELSE 'directly' END AS via
  FROM users u
  JOIN role_assignments a
    ON a.user_id = u.id
    OR a.group_id IN (SELECT m.group_id FROM user_group_members m WHERE m.user_id = u.id)
  LEFT JOIN user_groups g ON g.id = a.group_id
  LEFT JOIN workspaces w ON w.id = a.workspace_id
 WHERE u.username = %(name)s
 ORDER BY a.workspace_id NULLS FIRST, a.role
"""

GROUPS = """
SELECT g.id, g.name, g.created_at,
       coalesce((SELECT array_agg(u.username ORDER BY u.username) FROM user_group_members m
                  JOIN users u ON u.id = m.user_id WHERE m.group_id = g.id), '{}') AS members
  FROM user_groups g WHERE %(name)s::text IS NULL OR g.name = %(name)s ORDER BY g.id
"""


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
        uid = conn.execute("SELECT det_user_create(%s, %s, %s, %s, %s) AS id",
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
        rows = conn.execute(USERS, {"all": all_, "name": None}).fetchall()
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
        user = conn.execute(USERS, {"all": True, "name": username}).fetchone()
        if user is None:
            raise NotFoundError(f"user {username!r} not found")
        user["roles"] = conn.execute(USER_ROLES, {"name": username}).fetchall()
    if json_:
        print_json(user)
        return
    groups = ", ".join(user["groups"]) or "none"
    typer.echo(f"User {user['id']}: {user['username']}  "
               f"{'active' if user['active'] else 'deactivated'}  groups: {groups}")
    print_table(user["roles"], ["role", "workspace", "via"])


def _set_active(username: str, active: bool) -> None:
    with db() as conn:
        conn.execute("SELECT det_user_set_active(%s, %s)", (username, active))
    typer.echo(f"{'Activated' if active else 'Deactivated'} user {username}")


@app.command("deactivate")
def deactivate(username: str = typer.Argument(..., help="The user.")) -> None:
    """Deactivate a user (ClusterAdmin): they can no longer log in or act."""
    _set_active(username, False)


@app.command("activate")
def activate(username: str = typer.Argument(..., help="The user.")) -> None:
    """Activate a deactivated user again (ClusterAdmin)."""
    _set_active(username, True)


IS_ADMIN = ("SELECT det_is_owner_session() OR det_permitted(det_caller(), 'admin_cluster', "
            "NULL) AS ok")


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
    refused), and the change is audited (det_user_set_password)."""
    with db() as conn:
        me = conn.execute("SELECT det_caller() AS u").fetchone()["u"]
        name = target_user or me
        if name == me and not conn.execute(IS_ADMIN).fetchone()["ok"]:
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
        conn.execute("SELECT det_user_set_password(%s, %s, %s, %s)",
                     (name, verifier, len(new), weak_ok))
    login.keep_password(name, new)
    typer.echo(f"Changed the password of {name}")


@group_app.command("create")
def group_create(
    group_name: str = typer.Argument(..., help="Name of the new group."),
    add_user: list[str] = typer.Option([], "--add-user", help="A member to add (repeatable)."),
) -> None:
    """Create a user group (ClusterAdmin), with members if --add-user."""
    with db() as conn, conn.transaction():
        gid = conn.execute("SELECT det_group_create(%s) AS id", (group_name,)).fetchone()["id"]
        for u in add_user:
            conn.execute("SELECT det_group_set_member(%s, %s, true)", (group_name, u))
    typer.echo(f"Created group {gid}: {group_name}")


@group_app.command("delete")
def group_delete(group_name: str = typer.Argument(..., help="The group.")) -> None:
    """Delete a group (ClusterAdmin); its members lose the roles it held."""
    with db() as conn:
        conn.execute("SELECT det_group_delete(%s)", (group_name,))
    typer.echo(f"Deleted group {group_name}")


def _members(group_name: str, usernames: str, member: bool) -> None:
    names = [u.strip() for u in usernames.split(",") if u.strip()]
    if not names:
        raise DetError("usernames: expected a comma-separated list of users")
    with db() as conn, conn.transaction():
        for u in names:
            conn.execute("SELECT det_group_set_member(%s, %s, %s)", (group_name, u, member))
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
        rows = conn.execute(GROUPS, {"name": None}).fetchall()
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
        row = conn.execute(GROUPS, {"name": group_name}).fetchone()
    if row is None:
        raise NotFoundError(f"group {group_name!r} not found")
    if json_:
        print_json(row)
        return
    typer.echo(f"Group {row['id']}: {row['name']}  members: {', '.join(row['members']) or 'none'}")
