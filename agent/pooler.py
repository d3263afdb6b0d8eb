"""Warm database server processes for the ``process`` runtime's tasks: a session-mode
PgBouncer per agent (``det agent run``; ``--no-task-pooler`` turns it off).

Each task opens one connection, so each used to get a new PostgreSQL server process, whose
first calls build its catalog caches and compile det's PL/pgSQL functions afresh: one toy
trial run's calls cost the server 25-27 ms of CPU on a new process, 7-9 ms on a warm one, and
4-5 ms of that is the connection itself (bench/task_backend.py, 2-core host). The agent can
instead start PgBouncer, the well-kept pooler, in session mode and give its tasks its socket:
a task still has a session of its own for as long as it runs (LISTEN, its own transactions),
and when it ends, PgBouncer resets the server process (``RESET_QUERY``) and hands it, warm, to
the next task.

PgBouncer listens on a Unix socket only, in a directory of mode 0700 that only its own user
(and root) can enter, and trusts who reaches it: asking each task for the password costs
both sides a SCRAM exchange with PgBouncer's 4,096 PBKDF2 rounds (its pooled server login uses
the task role's own verifier, one round), and what the socket gives, the task role, does
nothing without a task's token. It logs in to the server with the password libpq finds for the
agent's task URL (in the URL, or in the password file it names: det's embedded server's URLs
name one). Run as root, it switches to the owner of the database's socket directory
(PgBouncer refuses to run as root, and only that user may reach the embedded server's
socket), else to ``nobody``.
The pooler carries the agent's guard token (:mod:`det.agent.guard`), so it dies with its
agent; a watcher thread starts it again, on the same socket, when it dies otherwise (the
tasks' sessions through it end; their transports reconnect). Where PgBouncer is not installed
or does not start, the agent says so once and its tasks connect directly.
"""

import hashlib
import logging
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from det.db.reconnect import open_connection
from det.errors import DetError
from det.sql import named

log = logging.getLogger(__name__)
Q = named("agent")

PORT = 6432
"""The pooler's port: it names its socket file, ``.s.PGSQL.6432``."""

_READY_SECONDS = 10.0

RESET_QUERY = " ".join(line for line in Q.server_reset_query.splitlines()
                       if not line.startswith("--")).strip()
"""What PgBouncer runs on a server process when a task's session ends (``server_reset_query``
of ``sql/agent.sql`` on one line, its comment left out: a value of PgBouncer's ini):
``DISCARD ALL`` but for ``DISCARD PLANS``. What one task set, prepared, listened to, locked or
created is gone for the next; the plans the server cached for det's functions stay (they do
not depend on the session, and PostgreSQL invalidates them itself when what they read
changes). ``DISCARD ALL`` made every task's server process plan each statement of each det
function again."""


def pooler_dir(task_url: str, agent_id: str) -> Path:
    """The pooler's directory (its socket, configuration and log): in the temporary
    directory, where a socket path fits in 107 bytes, named after ``task_url`` and the agent,
    so that an agent started again reuses it and two agents of a host never share one (the
    second's start would take over the first's socket)."""
    digest = hashlib.sha256(f"{os.getuid()} {agent_id} {task_url}".encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"det-pooler-{digest}"


def pooled_url(task_url: str, socket_dir: Path) -> str:
    """``task_url`` with its host and port replaced by the pooler's socket (same user,
    password, database and other parameters but TLS's: the pooler makes the TLS link)."""
    params = {k: v for k, v in conninfo_to_dict(task_url).items()
              if k not in ("sslmode", "sslrootcert")}
    return make_conninfo(**{**params, "host": str(socket_dir), "port": str(PORT)})


def config(task_url: str, socket_dir: Path, pool_size: int,
           password: str | None = None) -> tuple[str, str]:
    """The pooler's ``pgbouncer.ini`` and ``auth_file`` for tasks connecting with
    ``task_url``; ``pool_size``: the sessions expected at once (one a slot, and a few);
    ``password``: the one to log in to the server with (default: the URL's).

    A session never waits for a server process: the pool may grow to as many server processes
    as the pooler takes clients (``max_client_conn``, at least 100), as direct connections
    would; in session mode a client beyond a smaller pool waits until another task's session
    ends (PgBouncer gives up after ``query_wait_timeout``, 120 s). Idle server processes are
    closed after a minute.

    Raises:
        DetError: ``task_url`` names no user or database, or several hosts.
    """
    params = conninfo_to_dict(task_url)
    user, dbname = params.get("user"), params.get("dbname")
    if not user or not dbname:
        raise DetError(f"task pooler: the tasks' database URL must name a user and a "
                       f"database, got {make_conninfo(task_url, password=None)!r}")
    if "," in params.get("host", ""):
        # PgBouncer keeps one server address and has no target_session_attrs: behind it, tasks
        # would not follow a failover to another host, as libpq does for them.
        raise DetError("task pooler: the tasks' database URL names several hosts (a "
                       "replicated cluster), which PgBouncer cannot fail over between")
    server = make_conninfo(**{k: params[k] for k in ("host", "port") if params.get(k)},
                           dbname=dbname)
    max_clients = max(100, 4 * pool_size)
    # A server on another host (det cluster up --listen): the same TLS link, verified as the
    # agent verifies it; the CA certificate is copied next to the config (_start), where the
    # pooler's own user can read it.
    tls = (f"server_tls_sslmode = {params['sslmode']}\n"
           f"server_tls_ca_file = {socket_dir / 'ca.crt'}\n"
           if params.get("sslmode") in ("verify-ca", "verify-full") else
           f"server_tls_sslmode = {params['sslmode']}\n" if params.get("sslmode") else "")
    ini = (f"[databases]\n{dbname} = {server}\n\n"
           "[pgbouncer]\n"
           "listen_addr =\n"
           f"listen_port = {PORT}\n"
           f"unix_socket_dir = {socket_dir}\n"
           "unix_socket_mode = 0777\n"
           "auth_type = trust\n"
           f"auth_file = {socket_dir / 'users.txt'}\n"
           "pool_mode = session\n"
           f"server_reset_query = {RESET_QUERY}\n"
           f"max_client_conn = {max_clients}\n"
           f"default_pool_size = {max_clients}\n"
           "server_idle_timeout = 60\n"
           "ignore_startup_parameters = extra_float_digits\n"
           f"logfile = {socket_dir / 'pgbouncer.log'}\n"
           "log_connections = 0\n"
           "log_disconnections = 0\n" + tls)
    password = password if password is not None else params.get("password") or ""
    users = f"{_quote_auth(user)} {_quote_auth(password)}\n"
    return ini, users


def login_password(url: str) -> str:
    """The password libpq logs in with for ``url``: the URL's, or the one its password file
    (``passfile``, ``PGPASSFILE``, ``~/.pgpass``) or ``PGPASSWORD`` gives; "" for none. It
    connects once to find out, as libpq reads these files only while connecting.

    Raises:
        psycopg.Error: the database could not be reached.
    """
    with open_connection(url, autocommit=False) as conn:
        return conn.info.password or ""


def _quote_auth(value: str) -> str:
    """A PgBouncer ``auth_file`` field: double-quoted, a double quote doubled."""
    return '"' + value.replace('"', '""') + '"'


class TaskPooler:
    """The agent's PgBouncer for tasks reaching the database as ``task_url`` says, in
    ``socket_dir`` (created, mode 0700). Thread-safe."""

    def __init__(self, task_url: str, socket_dir: Path, pool_size: int,
                 env: Mapping[str, str]) -> None:
        self.task_url = task_url
        self.socket_dir = socket_dir
        self.pool_size = pool_size
        self._env = dict(env)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._password: str | None = None  # the server login's, once libpq found it
        self._failed = False
        self._closed = False
        # made once: making it again for each task cost the agent ~0.1 ms of CPU a task
        self._pooled_url = pooled_url(task_url, socket_dir)

    def url(self) -> str:
        """The URL a task should connect with: the pooler's (started now if it is not
        running), or ``task_url`` where the pooler cannot run (said once in the log) or
        before it could first reach the database (the task connects directly, and waits for
        the database as it would anyway)."""
        with self._lock:
            if self._failed:
                return self.task_url
            if self._password is None:
                try:
                    self._password = login_password(self.task_url)
                except psycopg.Error as e:
                    log.info("task pooler: not started, the database is unreachable (%s)", e)
                    return self.task_url
            if self._proc is None or self._proc.poll() is not None:
                try:
                    self._start()
                except (OSError, DetError, subprocess.SubprocessError) as e:
                    self._failed = True
                    log.warning("task pooler: %s; tasks connect directly", e)
                    return self.task_url
            return self._pooled_url

    def close(self) -> None:
        """Stop the pooler (its tasks' sessions end with it)."""
        with self._lock:
            self._closed = True
            if self._proc is not None and self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None

    def _start(self) -> None:
        binary = shutil.which("pgbouncer") or next(
            (p for p in ("/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer")
             if os.access(p, os.X_OK)), None)
        if binary is None:
            raise DetError("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
        self.socket_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        ini, users = config(self.task_url, self.socket_dir, self.pool_size, self._password)
        argv = [binary]
        owner = self._run_as()
        files = [("pgbouncer.ini", ini), ("users.txt", users)]
        root_cert = conninfo_to_dict(self.task_url).get("sslrootcert")
        if root_cert:
            files.append(("ca.crt", Path(root_cert).read_text()))
        for name, text in files:
            path = self.socket_dir / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            if owner is not None:
                os.chown(path, owner.pw_uid, owner.pw_gid)
        if owner is not None:
            os.chown(self.socket_dir, owner.pw_uid, owner.pw_gid)
            argv += ["-u", owner.pw_name]
        (self.socket_dir / f".s.PGSQL.{PORT}").unlink(missing_ok=True)  # a dead one's
        self._proc = subprocess.Popen([*argv, str(self.socket_dir / "pgbouncer.ini")],
                                      env=self._env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True)
        self._wait_ready()
        log.info("task pooler: pgbouncer %s on %s", self._proc.pid, self.socket_dir)
        threading.Thread(target=self._watch, args=(self._proc,), name="det-task-pooler",
                         daemon=True).start()

    def _watch(self, proc: subprocess.Popen) -> None:
        """Start the pooler again once ``proc`` exits, unless it was closed or replaced;
        a failed start is tried again every second."""
        proc.wait()
        while True:
            with self._lock:
                if self._closed or self._proc is not proc:
                    return
                log.warning("task pooler: pgbouncer %s exited with %s; starting it again",
                            proc.pid, proc.returncode)
                try:
                    self._start()
                    return
                except (OSError, DetError, subprocess.SubprocessError) as e:
                    log.warning("task pooler: %s", e)
            time.sleep(1.0)

    def _run_as(self) -> pwd.struct_passwd | None:
        """The user to switch to when run as root: the database socket directory's owner,
        else ``nobody``; None when not root."""
        if os.geteuid() != 0:
            return None
        host = conninfo_to_dict(self.task_url).get("host") or ""
        first = host.split(",")[0]
        if first.startswith("/"):
            uid = os.stat(first).st_uid
            if uid != 0:
                return pwd.getpwuid(uid)
        return pwd.getpwnam("nobody")

    def _wait_ready(self) -> None:
        path = str(self.socket_dir / f".s.PGSQL.{PORT}")
        deadline = time.monotonic() + _READY_SECONDS
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise DetError(f"pgbouncer exited with {self._proc.returncode} (see "
                               f"{self.socket_dir / 'pgbouncer.log'})")
            with socket.socket(socket.AF_UNIX) as s:
                try:
                    s.connect(path)
                    return
                except OSError:
                    time.sleep(0.02)
        raise DetError(f"pgbouncer did not listen on {path} within {_READY_SECONDS:.0f} s")
