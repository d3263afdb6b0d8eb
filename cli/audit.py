"""``det audit list``: who did what to which object, and when (ClusterAdmin; the rows are
the audit_log table's, which row-level security shows only to ClusterAdmins). det serve's
logins are there too: action ``login`` on the user name tried, with the outcome
(success, failure, throttled) and the client's address; and ``change_password`` rows say how
many logins a change ended, or that det saw a password changed outside det."""

import typer

from det.cli.output import print_json, print_table
from det.cli.session import db
from det.errors import PermissionDeniedError
from det.queries import users as q

app = typer.Typer(no_args_is_help=True)

@app.command("list")
def list_(
    actor: str = typer.Option(None, "--user", help="Only this user's actions."),
    object_type: str = typer.Option(None, "--object-type",
                                    help="experiment, job, model, workspace, project, user, "
                                         "group, role, agent, ..."),
    object_id: str = typer.Option(None, "--object-id", help="Only this object (with "
                                                            "--object-type)."),
    limit: int = typer.Option(100, "--limit", min=1, help="At most this many, newest first."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The audit log, newest first (ClusterAdmin)."""
    with db() as conn:
        if not q.is_cluster_admin(conn):
            raise PermissionDeniedError("permission denied: needs ClusterAdmin on the cluster "
                                        "to read the audit log")
        rows = q.audit_log(conn, actor, object_type, object_id, limit)
    if json_:
        print_json(rows)
        return
    print_table(rows, ["id", "at", "actor", "action", "object_type", "object_id", "detail"])
