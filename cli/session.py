"""What every command shares: the database connection (schema brought up to date first) and
the user's name."""

import getpass
import os

import psycopg

from det.db import connect
from det.db.migrate import ensure_current


def user() -> str:
    """The acting user: ``DET_USER``, else the login name."""
    return os.environ.get("DET_USER") or getpass.getuser()


def db() -> psycopg.Connection:
    """A connection (dict rows, autocommit off) to a database whose schema is current.

    Raises:
        det.errors.DatabaseError: the database cannot be reached, or its schema is behind and
            this user may not upgrade it.
    """
    conn = connect()
    ensure_current(conn)
    return conn
