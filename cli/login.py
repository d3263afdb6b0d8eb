"""``det user login NAME`` / ``logout`` / ``whoami``: who the CLI connects as.

A det user is a PostgreSQL role, so logging in is connecting: ``login`` asks for the password,
checks it by connecting as NAME, then keeps it the way libpq's tools do, in det's password
file (pgpass format, mode 0600, :mod:`det.db.passfile`), and records NAME in ``<det
home>/user``; every later command connects as NAME (:func:`det.db.connect.database_url`).
``logout`` forgets both: the CLI is then the default user again (the OS user's det account
with the embedded database, ``DET_DB_URL``'s user otherwise). ``whoami`` asks the database.
"""

import getpass
import os

import psycopg
import typer
from psycopg.conninfo import conninfo_to_dict

from det.cli.session import db
from det.db import det_home, embedded, passfile
from det.db.connect import LOGIN_FILE, login_name, owner_url
from det.db.reconnect import open_connection
from det.errors import AuthError, DatabaseError

_NOT_SERVER = ("user", "password", "passfile")


def _server() -> tuple[dict, tuple[str, str]]:
    """Where the CLI connects (conninfo parameters, no user or password) and the host and port
    its password-file entries are stored under (``*``: the embedded server's entries)."""
    url = os.environ.get("DET_DB_URL")
    params = {k: v for k, v in conninfo_to_dict(url or owner_url()).items()
              if k not in _NOT_SERVER}
    if url is None:
        return params, ("*", "*")
    return params, (str(params.get("host") or "localhost"), str(params.get("port") or "*"))


def login(
    name: str = typer.Argument(..., help="The det user to connect as."),
    password: str = typer.Option(None, "--password",
                                 help="The password (for scripts; asked, hidden, if left out)."),
) -> None:
    """Log in as NAME: later commands connect as NAME (its password kept in det's password
    file, mode 0600)."""
    params, (host, port) = _server()
    if password is None:
        password = typer.prompt(f"Password for {name}", hide_input=True)
    try:
        open_connection("", **params, user=name, password=password).close()
    except psycopg.OperationalError as e:
        if "password" in str(e) or "does not exist" in str(e):
            raise AuthError(f"login {name}: the user or the password is wrong") from e
        raise DatabaseError(f"cannot connect to the database: {str(e).strip()}") from e
    passfile.store(passfile.path(det_home()), name, password, host, port)
    (det_home() / LOGIN_FILE).write_text(f"{name}\n")
    typer.echo(f"logged in as {name}")


def logout() -> None:
    """Forget the logged-in user's password; the CLI is the default user again."""
    name = login_name()
    default = "the default user" if os.environ.get("DET_DB_URL") else getpass.getuser()
    if name is None:
        typer.echo(f"not logged in (det connects as {default})")
        return
    _params, (host, port) = _server()
    if (host, port) != ("*", "*") or name not in (default, embedded.OWNER):
        passfile.forget(passfile.path(det_home()), name, host, port)  # never the cluster's own
    (det_home() / LOGIN_FILE).unlink(missing_ok=True)
    typer.echo(f"logged out {name}; det connects as {default}")


def whoami() -> None:
    """The det user the CLI connects as (the database's answer)."""
    with db() as conn:
        typer.echo(conn.execute("SELECT session_user AS name").fetchone()["name"])


def keep_password(name: str, password: str) -> None:
    """After ``name``'s password changed: update det's password-file entry for ``name`` at
    this server, if it has one (the CLI's own user: logged in, or the embedded default), so
    later commands still connect."""
    _params, (host, port) = _server()
    file = passfile.path(det_home())
    if passfile.lookup(file, name, host, port) is not None:
        passfile.store(file, name, password, host, port)


def register(user_app: typer.Typer) -> None:
    """Add ``login``, ``logout`` and ``whoami`` to ``det user``."""
    user_app.command("login")(login)
    user_app.command("logout")(logout)
    user_app.command("whoami")(whoami)
