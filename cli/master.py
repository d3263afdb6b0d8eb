"""What ``det -m/--master URL`` and ``DET_MASTER`` mean for det.

Determined's master is an HTTP server that its CLI talks to. det's control plane is
PostgreSQL and its CLI talks to that, so for the CLI a master URL is det's database URL
(as ``DET_DB_URL``). Kept apart from :mod:`det.cli.upstream` so that every command's option
parsing imports nothing heavy (psycopg is 0.3 s)."""

import os

from det.errors import DetError

DB_SCHEMES = ("postgresql://", "postgres://")


def is_database_url(url: str) -> bool:
    """Whether ``url`` names a PostgreSQL database: a ``postgresql://`` (``postgres://``) URL
    or libpq's ``key=value`` form, as ``DET_DB_URL`` accepts (not det serve's
    ``http(s)://HOST:PORT`` or a bare ``HOST:PORT``)."""
    return url.startswith(DB_SCHEMES) or ("://" not in url and "=" in url)


def master_database_url(url: str) -> str:
    """The database URL a ``-m/--master`` or ``DET_MASTER`` value names.

    Determined's master is an HTTP server; det's control plane is its PostgreSQL, so a
    master URL for det is that database's (:func:`is_database_url`, as ``DET_DB_URL``).
    An ``http(s)://`` URL or a bare ``host:port`` names a det serve, which
    the CLI cannot use as its transport.

    Raises:
        DetError: ``url`` is not a PostgreSQL URL (the message says what to pass instead).
    """
    if is_database_url(url):
        return url
    raise DetError(
        f"--master/DET_MASTER {url!r} is not a database URL: det's CLI talks to det's "
        "PostgreSQL, not to det serve over HTTP; pass postgresql://USER@HOST:PORT/DB "
        "(-m, DET_MASTER or DET_DB_URL)")


def apply_master(url: str | None) -> None:
    """Point this process at ``-m/--master``'s database (explicit: it wins over
    ``DET_DB_URL``), else at ``DET_MASTER``'s where that is a PostgreSQL URL and
    ``DET_DB_URL`` is unset. A ``DET_MASTER`` of det serve's URL (``http://...``) is left to
    what uses it (notebook and TensorBoard proxy URLs, :func:`det.cli.notebooks.serve_url`).

    Raises:
        DetError: ``url`` is not a PostgreSQL URL (:func:`master_database_url`).
    """
    if url is not None:
        os.environ["DET_DB_URL"] = master_database_url(url)
        return
    env = os.environ.get("DET_MASTER", "")
    if is_database_url(env) and not os.environ.get("DET_DB_URL"):
        os.environ["DET_DB_URL"] = env
