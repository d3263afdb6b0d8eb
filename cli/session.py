"""What every command shares: the database connection (as the CLI's det user, on a schema
that is current: only the schema's owner migrates it) and the user's name."""

import getpass
import os

import psycopg

from det.db import connect
from det.db.migrate import ensure_current


def user() -> str:
    """The acting user: ``DET_USER``, else the login name."""
    return os.environ.get("DET_USER") or getpass.getuser()


def db() -> psycopg.Connection:
    """A connection (dict rows, autocommit off) as the CLI's det user
    (:func:`det.db.connect.database_url`) to a database whose schema is current.

    Raises:
        det.errors.DatabaseError: the database cannot be reached, or its schema is behind and
            this user may not upgrade it ("run det cluster up").
    """
    conn = connect()
    try:
        ensure_current(conn)
    except BaseException:
        conn.close()
        raise
    return conn
