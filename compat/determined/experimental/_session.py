"""Who ``determined.experimental.client`` acts as, and its connections to det's database.

det has no master process: a client is one more client of the database, like the CLI
(docs/architecture.md, "One idea: the database is the control plane"). So the SDK connects
exactly as ``det`` commands do (:func:`det.cli.session.db`:
:func:`det.db.connect.database_url`, a schema that is current), and row-level security and
the user identity are the same as the CLI's.

``login(master, user, password)`` (0.38's names) changes that for this process only; nothing
is written to disk (``det user login`` is what makes a user the CLI's, and the SDK follows
it without ``login``):

- ``master``: where det is, as a PostgreSQL URL or conninfo string (``postgresql://host/db``,
  what ``DET_DB_URL`` takes). Default: where the CLI connects (``DET_DB_URL``, else the
  embedded server ``det cluster up`` started). An ``http(s)://`` URL (``det serve``, or a
  Determined master) is refused with a ``ValueError``: the SDK reads the database itself.
- ``user`` / ``password``: the det user to connect as (a det user is a PostgreSQL role).
  Without ``password``, det's password file (where ``det user login`` keeps it) supplies it.
  Without ``user``, the CLI's user.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from det.db import det_home, passfile
from det.db.connect import connect, database_url
from det.db.migrate import ensure_current
from det.db.sqlstate import translate
from det.errors import AuthError, DatabaseError

_url: str | None = None
"""The URL :func:`login` chose for this process; None: the CLI's (read at each connection)."""


def login(master: str | None = None, user: str | None = None,
          password: str | None = None) -> None:
    """Make later client calls of this process connect to ``master`` as ``user`` (see the
    module's docstring); checks the pair by connecting.

    Raises:
        ValueError: ``master`` is an HTTP URL rather than a database's.
        det.errors.AuthError: the user or the password is wrong.
        det.errors.DatabaseError: the database cannot be reached.
    """
    global _url
    if master is not None and master.split("://", 1)[0].lower() in ("http", "https"):
        raise ValueError(f"master: expected det's PostgreSQL URL (postgresql://...), not "
                         f"{master!r}: the SDK connects to det's database, as the CLI does")
    params = conninfo_to_dict(master if master is not None else database_url())
    if user is not None:
        params = {k: v for k, v in params.items() if k not in ("user", "password")}
        params["user"] = user
        if password is not None:
            params["password"] = password
        else:
            params["passfile"] = str(passfile.path(det_home()))
    url = make_conninfo(**params)
    try:
        with connect(url):
            pass
    except DatabaseError as e:
        if "password" in str(e) or "does not exist" in str(e):
            raise AuthError(f"login {user}: the user or the password is wrong") from e
        raise
    _url = url


def url() -> str:
    """The database URL the client connects with (:func:`login`'s, else the CLI's)."""
    return _url or database_url()


@contextmanager
def db() -> Iterator[psycopg.Connection]:
    """A connection as the client's user (:func:`login`'s, else the CLI's) to a current
    schema, committed when the block ends without error (each call one transaction), closed
    after. Database errors come out as det's error types (det.db.sqlstate), as the CLI shows
    them.

    Raises:
        det.errors.DetError: what det.db.sqlstate translates (NotFoundError,
            PermissionDeniedError, ...); DatabaseError when det's database cannot be reached.
    """
    conn = connect(url())
    try:
        ensure_current(conn)
        with conn:
            yield conn
    except psycopg.Error as e:
        raise translate(e) from e
    finally:
        conn.close()
