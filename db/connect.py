"""Where det's database is, and connections to it.

``DET_DB_URL`` names an existing PostgreSQL; without it det uses (and starts if needed) the
embedded server under :func:`det_home`.
"""

import os
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from det.db import embedded
from det.errors import DatabaseError


def det_home() -> Path:
    """det's per-user directory: ``DET_HOME``, else ``~/.local/share/det``. Holds the embedded
    database, pid files, process logs and (by default) checkpoints."""
    return Path(os.environ.get("DET_HOME") or Path.home() / ".local" / "share" / "det")


NO_CLUSTER = ("no det cluster is running: start one with `det cluster up`, or point "
              "DET_DB_URL at a PostgreSQL that runs det")


def database_url(start: bool = False) -> str:
    """The database URL: ``DET_DB_URL`` if set, else the embedded server's. Only ``det cluster
    up`` (and benchmarks) pass ``start``: any other command run before it says so instead of
    silently starting a database no reconciler or agent serves.

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


def connect(url: str | None = None, autocommit: bool = False) -> psycopg.Connection:
    """Open a connection whose rows are dicts.

    Raises:
        DatabaseError: the server cannot be reached.
    """
    url = url or database_url()
    try:
        return psycopg.connect(url, autocommit=autocommit, row_factory=dict_row)
    except psycopg.OperationalError as e:
        raise DatabaseError(f"cannot connect to the database: {str(e).strip()}") from e
