"""``det agent token create``, ``det agent enroll``, ``det agent revoke``: agents on other hosts,
each with its own PostgreSQL login (schema.sql: det_user.agent_token_create,
det_enroll.agent_enroll, det_internal.agent_check_self, det_user.agent_revoke).

An agent's identity is a login role of its own (``det_agent_<id>``, a member of det_agent)
rather than a client certificate: PostgreSQL then ends its access by itself (NOLOGIN and
``pg_terminate_backend`` on revoke), every agent function checks ``session_user`` against the
agent id it names, and PgBouncer's ``auth_query`` serves it like any role; a certificate would
need det's CA on every host and a revocation list the server reloads.

Enrollment stores the agent's password in det's password file (``<DET_HOME>/pgpass``, 0600,
found by libpq through the URL's ``passfile=``) and its URL, id and pool in
``<DET_HOME>/agent.json`` (0600), which ``det agent run`` connects with. Without that file an
agent logs in as the shared det_agent role (the single-host mode of ``det cluster up``).
"""

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import typer

from det.db.connect import det_home
from det.errors import DetError
from det.sql import named

Q = named("cli")

token_app = typer.Typer(no_args_is_help=True)

CREDENTIAL_FILE = "agent.json"
"""``<DET_HOME>/agent.json``: the enrolled agent's id, pool and URL (its password is in det's
password file)."""

TOKEN_ROLE = "det_enroll_"


@dataclass(frozen=True)
class Credential:
    """What ``det agent enroll`` stored: the agent's id, its pool (None: its own choice) and the
    URL it connects with (its login; libpq reads the password from ``passfile=``)."""

    agent_id: str
    pool: str | None
    url: str


def credential_path() -> Path:
    """Where this host's agent credential lives (:data:`CREDENTIAL_FILE` under det home)."""
    return det_home() / CREDENTIAL_FILE


def credential() -> Credential | None:
    """The credential ``det agent enroll`` stored here, or None (the shared det_agent login).

    Raises:
        DetError: the file is there but unreadable or malformed (naming it).
    """
    path = credential_path()
    try:
        data = json.loads(path.read_text())
        return Credential(data["agent_id"], data.get("resource_pool"), data["url"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DetError(f"{path}: not an agent credential of `det agent enroll` ({e})") from None


def enrolled_identity(agent_id: str | None, pool: str | None) -> Credential | None:
    """The identity ``det agent run`` takes from this host's credential, checked against its
    ``--id`` and ``--resource-pool`` (None: not given); None without a credential.

    Raises:
        DetError: ``--id`` or ``--resource-pool`` differs from the enrolled one.
    """
    cred = credential()
    if cred is None:
        return None
    if agent_id is not None and agent_id != cred.agent_id:
        raise DetError(f"--id: this host's agent is enrolled as {cred.agent_id!r} "
                       f"({credential_path()}), got {agent_id!r}")
    if pool is not None and cred.pool is not None and pool != cred.pool:
        raise DetError(f"--resource-pool: this host's agent is enrolled in pool {cred.pool!r}, "
                       f"got {pool!r}")
    return Credential(cred.agent_id, pool or cred.pool, cred.url)


def _split_token(token: str) -> tuple[str, str]:
    role, sep, secret = token.strip().partition(".")
    if not sep or not role.startswith(TOKEN_ROLE) or not secret:
        raise DetError("--token: expected the token `det agent token create` printed "
                       f"({TOKEN_ROLE}<hex>.<secret>)")
    return role, secret


@token_app.command("create")
def token_create(
    pool: str = typer.Option(None, "--pool", help="The resource pool the agent joins "
                                                  "(default: its own --resource-pool)."),
    expires: str = typer.Option("1h", "--expires",
                                help="How long the token may be used: a PostgreSQL interval "
                                     "such as 30m, 1h, 2 days (at most 7 days)."),
) -> None:
    """Print a one-time enrollment token for one new agent (ClusterAdmin). Give it to
    `det agent enroll` on the new host; it is good once, until it expires."""
    import psycopg

    from det.cli.session import db
    from det.db import passfile, roles

    secret = passfile.new_password()
    with db() as conn:
        # SCRAM verifiers do not depend on the role's name: the role is named by the server
        ver = roles.verifier(conn, TOKEN_ROLE, secret, iterations=roles.MACHINE_SCRAM_ITERATIONS)
        try:
            row = conn.execute(Q.agent_token_create, (ver, pool, expires)).fetchone()
        except (psycopg.errors.InvalidDatetimeFormat, psycopg.errors.DatetimeFieldOverflow,
                psycopg.errors.IntervalFieldOverflow):
            raise DetError(f"--expires: expected a duration such as 30m, 1h or 2 days, "
                           f"got {expires!r}") from None
    typer.echo(f"{row['role_name']}.{secret}")
    typer.echo(f"(one use, until {row['expires_at']:%Y-%m-%d %H:%M:%S %Z}; on the new host: "
               "det agent enroll --master URL --token TOKEN)", err=True)


def enroll(
    master: str = typer.Option(..., "--master",
                               help="The database URL of the cluster as this host reaches it "
                                    "(libpq URL or key=value string; no user or password)."),
    token: str = typer.Option(..., "--token", envvar="DET_ENROLL_TOKEN",
                              help="The token of `det agent token create`."),
    agent_id: str = typer.Option(None, "--id", help="This agent's id: 1 to 53 letters, "
                                 "digits, '.', '_' or '-' (default: the hostname)."),
) -> None:
    """Make this host's agent a login of its own with a one-time token, and store it (0600)
    under det home for `det agent run`."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from det.db import passfile, roles
    from det.db.reconnect import open_connection

    role, secret = _split_token(token)
    # the id's rule is det_enroll.agent_enroll's (the agent's daemon module costs ~1 s to import)
    agent_id = agent_id if agent_id is not None else socket.gethostname()
    path = credential_path()
    if (cred := credential()) is not None:
        raise DetError(f"this host's agent is enrolled already, as {cred.agent_id!r} ({path}): "
                       "remove that file to enroll it again")
    try:
        params = {k: v for k, v in conninfo_to_dict(master).items()
                  if k not in ("user", "password", "passfile")}
    except psycopg.ProgrammingError as e:
        raise DetError(f"--master: not a database URL ({e})") from None
    try:
        # One attempt: a refused token must not wait out a retry.
        conn = open_connection(make_conninfo(**params), user=role, password=secret)
    except psycopg.OperationalError as e:
        text = str(e)
        if "not permitted to log in" in text:
            raise DetError("--token: already used (each token enrolls one agent)") from None
        if "authentication failed" in text:
            raise DetError("--token: refused by the server (not a token of this cluster)") \
                from None
        raise DetError(f"--master: cannot connect: {text.strip()}") from None
    login = f"det_agent_{agent_id}"
    password = passfile.new_password()
    with conn:
        ver = roles.verifier(conn, login, password, iterations=roles.MACHINE_SCRAM_ITERATIONS)
        # the password is on file before the server knows it: a crash in between leaves an
        # entry no server accepts, never a login whose password is lost
        pgpass = passfile.path(det_home())
        passfile.store(pgpass, login, password)
        pool = conn.execute(Q.agent_enroll, (agent_id, ver)).fetchone()[0]
    url = make_conninfo(**params, user=login, passfile=str(pgpass.resolve()))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"agent_id": agent_id, "resource_pool": pool, "url": url}, f)
        f.write("\n")
    typer.echo(f"Agent {agent_id}: enrolled as {login}"
               f"{f' in pool {pool}' if pool else ''}; credential in {path} (password in "
               f"{pgpass}); start it with `det agent run`")


def revoke(agent_id: str = typer.Argument(..., metavar="AGENT_ID")) -> None:
    """End an enrolled agent's access now (ClusterAdmin): its login can no longer log in, its
    sessions end, and its runs are placed elsewhere (the agent counts as lost)."""
    from det.cli.session import db

    with db() as conn:
        n = conn.execute(Q.agent_revoke, (agent_id,)).fetchone()["n"]
    typer.echo(f"Agent {agent_id}: revoked; {n} session(s) ended; its runs are placed again "
               "elsewhere")
