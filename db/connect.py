"""Where det's database is, and connections to it.

``DET_DB_URL`` names an existing PostgreSQL; without it det uses (and starts if needed) the
embedded server under :func:`det_home`, each actor as its own role: the schema's
owner (:func:`owner_url`), an agent or det serve (:func:`role_url`), the CLI as its det user
(:func:`database_url`).
"""

import getpass
import os
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from det.db import embedded, passfile
from det.db.reconnect import open_connection
from det.errors import DatabaseError


def det_home() -> Path:
    """det's per-user directory: ``DET_HOME``, else ``~/.local/share/det``. Holds the embedded
    database, pid files, process logs and (by default) checkpoints."""
    return Path(os.environ.get("DET_HOME") or Path.home() / ".local" / "share" / "det")


NO_CLUSTER = ("no det cluster is running: start one with `det cluster up`, or point "
              "DET_DB_URL at a PostgreSQL that runs det")

LOGIN_FILE = "user"
"""``<det home>/user``: the det user ``det user login`` made the CLI's (absent: the default)."""


def login_name() -> str | None:
    """The det user ``det user login`` made the CLI's, or None (the default user)."""
    try:
        return (det_home() / LOGIN_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def owner_url(start: bool = False) -> str:
    """The URL of the schema's owner: ``DET_DB_URL`` if set, else the embedded server's
    superuser. For what migrates and bypasses row security: ``det cluster up``, the
    reconciler, ``det db migrate``. ``start``: see :func:`database_url`.

    Raises:
        DatabaseError: no ``DET_DB_URL``, the embedded server is down and ``start`` is false.
    """
    url = os.environ.get("DET_DB_URL")
    if url:
        return url
    home = det_home()
    url = embedded.running_url(home)
    if url is not None:
        return url
    if not start:
        raise DatabaseError(NO_CLUSTER)
    return embedded.ensure_running(home)


def role_url(role: str) -> str:
    """The URL a det process of ``role`` (``det_agent``, ``det_web``) connects with:
    ``DET_DB_URL`` if set (whoever deploys det chose its role), else the embedded server's
    for ``role``, whose password is in det's password file.

    Raises:
        DatabaseError: no ``DET_DB_URL`` and the embedded server is down.
    """
    url = os.environ.get("DET_DB_URL")
    if url:
        return url
    if embedded.running_url(det_home()) is None:
        raise DatabaseError(NO_CLUSTER)
    return embedded.role_url(det_home(), role)


def database_url(start: bool = False) -> str:
    """The URL the CLI connects with, as the CLI's det user: the one ``det user login`` chose
    (its password in det's password file), else ``DET_DB_URL``'s user, else (the embedded
    server) the OS user's det account that ``det cluster up`` made. Only ``det cluster up``
    (and benchmarks) pass ``start``: any other command run before it says so instead of
    silently starting a database no reconciler or agent serves.

    Raises:
        DatabaseError: no ``DET_DB_URL``, the embedded server is down and ``start`` is false.
    """
    name = login_name()
    url = os.environ.get("DET_DB_URL")
    if url:
        if name is None:
            return url
        params = {k: v for k, v in conninfo_to_dict(url).items() if k != "password"}
        return make_conninfo(**{**params, "user": name,
                                "passfile": str(passfile.path(det_home()))})
    owner_url(start)  # the server is running (or started)
    return embedded.role_url(det_home(), name or getpass.getuser())


def connect(url: str | None = None, autocommit: bool = False,
            deadline: float | None = None) -> psycopg.Connection:
    """Open a connection whose rows are dicts, each call waiting up to ``deadline`` seconds
    for the server (``det.db.reconnect.open_connection``; None, for one-shot commands: for
    ever, as an upload or a migration may be long and a person can interrupt).

    Raises:
        DatabaseError: the server cannot be reached.
    """
    url = url or database_url()
    try:
        return open_connection(url, dict_row, autocommit=autocommit, deadline=deadline)
    except psycopg.OperationalError as e:
        raise DatabaseError(f"cannot connect to the database: {str(e).strip()}") from e
