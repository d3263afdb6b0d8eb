"""What every command shares: the database connection (as the CLI's det user, on a schema
that is current: only ``det cluster up`` and the reconciler migrate it) and the user's name."""

import getpass
import os

import psycopg

from det.db import connect
from det.db.migrate import require_current


def user() -> str:
    """The acting user: ``DET_USER``, else the login name."""
    return os.environ.get("DET_USER") or getpass.getuser()


def db() -> psycopg.Connection:
    """A connection (dict rows, autocommit off) as the CLI's det user
    (:func:`det.db.connect.database_url`) to a database whose schema is current.

    Raises:
        det.errors.DatabaseError: the database cannot be reached, or its schema is behind
            this det's ("run det cluster up").
    """
    conn = connect()
    try:
        require_current(conn)
    except BaseException:
        conn.close()
        raise
    return conn
