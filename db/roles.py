"""The embedded server's login roles and their passwords.

Each det actor connects with its own role (the roles and their grants are schema.sql's,
migration 0014): the reconciler and migrations as the owner, agents as ``det_agent`` (agent
functions only), tasks as ``det_task`` (token-checked task functions only), ``det serve`` as
``det_web``, the CLI as a det user. ``det cluster up`` gives the actors' roles random
passwords the first time it runs, and makes the OS user's det account (a ClusterAdmin) the
CLI's default user, so the embedded default asks no password. Passwords go to the server as
SCRAM-SHA-256 verifiers computed here, never in clear, and are kept in det's password file
(:mod:`det.db.passfile`).
"""

import getpass
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql

from det.db import embedded, passfile
from det.db.reconnect import open_connection
from det.errors import AuthError, DatabaseError
from det.sql import named

Q = named("db")

AGENT = "det_agent"
TASK = "det_task"
WEB = "det_web"
ACTORS = (AGENT, TASK, WEB)


MACHINE_SCRAM_ITERATIONS = 1
"""SCRAM iterations (PBKDF2 rounds) of the actors' verifiers. Rounds make each guess at a
weak password dear for whoever holds its verifier; the actors' passwords are random (190 bits,
:func:`det.db.passfile.new_password`), which no number of guesses finds, while the client of
every connection pays the rounds: 4096, the server's default, cost ~1.7 ms of CPU a
connection, paid by every task (bench/toy_search.py)."""


def verifier(conn: psycopg.Connection, role: str, password: str, *,
             iterations: int | None = None) -> str:
    """The SCRAM-SHA-256 verifier of ``password`` for ``role`` (what PostgreSQL stores), with
    ``iterations`` rounds where server and libpq can set them (PostgreSQL 16 and later), else
    the server's ``scram_iterations`` (4096 by default). Only random passwords may have
    fewer rounds (:data:`MACHINE_SCRAM_ITERATIONS`)."""
    custom = (iterations is not None and conn.info.server_version >= 160000
              and psycopg.pq.version() >= 160000)
    if custom:
        conn.execute(sql.SQL(Q.set_scram_iterations).format(sql.Literal(iterations)))
    try:
        return conn.pgconn.encrypt_password(password.encode(), role.encode(),
                                            b"scram-sha-256").decode()
    finally:
        if custom:
            conn.execute(Q.reset_scram_iterations)


def set_password(conn: psycopg.Connection, role: str, scram: str) -> None:
    """Set ``role``'s password to ``scram``, a SCRAM-SHA-256 verifier (:func:`verifier`).
    ALTER ROLE takes no server-side parameter: the verifier is bound as a literal on the
    client, the text :class:`psycopg.sql.Literal` would give.

    Raises:
        psycopg.errors.InsufficientPrivilege: ``conn``'s role may not alter ``role``.
    """
    psycopg.ClientCursor(conn).execute(
        sql.SQL(Q.set_role_password).format(sql.Identifier(role)), (scram,))


def provision(conn: psycopg.Connection, home: Path) -> str:
    """Give each actor role a password if det's password file has none for it, and create
    the OS user's det account (ClusterAdmin, ``det_user.user_create``) if absent, or give it a new
    password if the file lost it. ``conn``: the owner's, on the migrated ``det`` database.
    Returns the account's name. Each password is set and committed before it is written to
    the file, so a crash in between only leaves a password the next run replaces.
    """
    file = passfile.path(home)
    for role in ACTORS:
        if passfile.lookup(file, role) is None:
            password = passfile.new_password()
            with conn.transaction():
                set_password(conn, role, verifier(
                    conn, role, password, iterations=MACHINE_SCRAM_ITERATIONS))
            passfile.store(file, role, password)
    admin = getpass.getuser()
    if admin in (embedded.OWNER, *ACTORS):
        return admin  # an OS user named like det's own roles is that role (its entry is kept)
    if passfile.lookup(file, admin) is None:
        password = passfile.new_password()
        exists = conn.execute(Q.role_exists, (admin,)).fetchone()
        with conn.transaction():
            conn.execute(Q.user_set_password if exists else Q.user_create,
                         (admin, verifier(conn, admin, password), len(password)))
        passfile.store(file, admin, password)
    return admin


def task_url(home: Path) -> str:
    """The URL a task of the embedded server connects with: ``det_task`` with its password in
    the URL itself (a task container sees the socket directory and nothing else of det's
    home). It reaches only det_task's functions, each checking the task's own token."""
    password = passfile.lookup(passfile.path(home), TASK)
    if password is None:
        raise DatabaseError(f"{passfile.path(home)}: no password for {TASK}; "
                            "run `det cluster up`")
    return (f"postgresql://{TASK}:{quote(password, safe='')}@/{embedded.DB_NAME}"
            f"?host={quote(str(embedded.socket_dir(home)), safe='/')}")


def check_password(url: str, username: str, password: str) -> str:
    """The user ``username`` if PostgreSQL accepts ``password`` for them: one connection to the
    database at ``url`` as that user (their role must be allowed to log in: an active user).

    Raises:
        AuthError: any other user or password (one message for both, so neither leaks).
    """
    if not password:
        raise AuthError("invalid username or password")
    try:
        # One attempt: a wrong password must not wait out a retry.
        with open_connection(url, autocommit=False, user=username, password=password) as conn:
            return conn.execute(Q.session_user).fetchone()[0]
    except psycopg.OperationalError as e:
        raise AuthError("invalid username or password") from e
