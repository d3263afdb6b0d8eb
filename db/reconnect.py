"""A connection that comes back: reopened after a loss, calls retried (docs/architecture.md,
"Riding out the database").

For processes that keep one connection for a long time and must carry on through a database
restart or failover: the harness inside a task, the CLI's followers (``det experiment wait``,
``det trial logs -f``). Which errors count as a loss, and the backoff, are
:mod:`det.db.retry`'s.
"""

import select
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import RowFactory, tuple_row

from det.db import retry
from det.errors import DatabaseError

T = TypeVar("T")

CONNECT_TIMEOUT_SECONDS = 10
"""libpq ``connect_timeout`` unless the URL sets one: an unreachable host (a failover in
progress) fails the attempt, which is then retried, instead of hanging it."""


def open_connection(url: str, row_factory: RowFactory[Any] = tuple_row, *,
                    autocommit: bool = True, **params: Any) -> psycopg.Connection[Any]:
    """A connection to ``url`` (autocommit unless ``autocommit`` is false), with ``params``
    (libpq keywords: ``user``, ``password``, ...) over the URL's, and
    ``CONNECT_TIMEOUT_SECONDS`` unless either sets ``connect_timeout``, and
    ``target_session_attrs=read-write`` when the URL names several hosts (a replicated cluster:
    libpq tries each and keeps the primary) unless it says otherwise. One attempt: callers
    that must ride out a loss retry it (:class:`Reconnecting`, ``det.db.retry.call``); a check
    that must fail fast (a password) calls it alone.

    This and :func:`open_async_connection` are the only places det opens a connection
    (tests/test_one_retry_layer.py), so every det process shares this timeout and the retry
    layer's idea of a loss.

    Raises psycopg's ``OperationalError`` when the server cannot be reached or refuses the
    login (``det.db.retry.is_connection_lost`` is true for the former only).
    """
    return psycopg.connect(_conninfo(url, params), autocommit=autocommit,
                           row_factory=row_factory)


async def open_async_connection(url: str) -> psycopg.AsyncConnection[Any]:
    """:func:`open_connection` for asyncio (det serve's listener): autocommit, tuple rows."""
    return await psycopg.AsyncConnection.connect(_conninfo(url, {}), autocommit=True)


def _conninfo(url: str, params: dict[str, Any]) -> str:
    merged = {**conninfo_to_dict(url), **params}
    merged.setdefault("connect_timeout", CONNECT_TIMEOUT_SECONDS)
    if "," in str(merged.get("host", "")):
        # Several servers (a Patroni cluster): only the primary takes det's writes.
        merged.setdefault("target_session_attrs", "read-write")
    return make_conninfo(**merged)


class Reconnecting:
    """One autocommit connection to ``url``, opened on first use and reopened after a loss.

    ``run(what, fn)`` calls ``fn(connection)``; when the connection is lost (before or during
    ``fn``) the connection is dropped and ``fn`` runs again on a new one, with backoff, until
    it succeeds (or ``give_up_after`` seconds). ``fn`` must therefore be safe to run twice:
    a statement whose commit was acknowledged to nobody may have taken effect. Thread-safe:
    calls are serialized by a lock, which is held while ``fn`` runs but not during the backoff
    pauses. ``row_factory`` shapes the rows (tuples by default).
    """

    def __init__(self, url: str, row_factory: RowFactory[Any] = tuple_row,
                 on_connect: Callable[[psycopg.Connection[Any]], None] | None = None) -> None:
        self._url = url
        self._row_factory = row_factory
        self._on_connect = on_connect
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False

    def run(self, what: str, fn: Callable[[psycopg.Connection[Any]], T],
            give_up_after: float | None = None) -> T:
        """``fn(connection)``, retried after connection losses; ``what`` names the work in the
        warnings logged while the database is away. Any other error is raised at once.

        Raises ``DatabaseError`` after :meth:`close`, and the last connection error when
        ``give_up_after`` seconds have passed.
        """
        return retry.call(what, lambda: self._attempt(fn), give_up_after)

    def _attempt(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        with self._lock:
            if self._closed:
                raise DatabaseError("the database connection was closed")
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = open_connection(self._url, self._row_factory)
                    if self._on_connect is not None:
                        self._on_connect(self._conn)
                return fn(self._conn)
            except Exception as e:
                if retry.is_connection_lost(e) and self._conn is not None:
                    self._conn.close()
                    self._conn = None
                raise

    def wait_for_notifies(self, timeout: float, wake_fd: int) -> None:
        """Wait up to ``timeout`` seconds for input on the connection that no call is reading
        (a NOTIFY, or the server going away) or for ``wake_fd`` to become readable; then read
        that input, so that the connection's notify handlers (``add_notify_handler``) see its
        notifications. NOTIFYs that arrive during a call reach the handlers through that call.
        Without a connection (none opened yet, or lost) it only waits. A lost connection is
        dropped, to be reopened by the next :meth:`run`; nothing is raised."""
        conn, fd = self._conn, None
        if conn is not None:
            try:
                fd = conn.fileno()
            except psycopg.Error:  # lost: the next run() reopens it
                conn = None
        try:
            ready, _, _ = select.select([wake_fd] if fd is None else [wake_fd, fd], [], [],
                                        timeout)
        except (OSError, ValueError):  # the connection's socket closed meanwhile
            return
        if conn is None or fd not in ready:
            return
        with self._lock:  # no call is using the connection now
            if self._conn is not conn or conn.closed:
                return
            try:
                conn.pgconn.consume_input()
                while (n := conn.pgconn.notifies()) is not None:
                    conn.pgconn.notify_handler(n)
            except psycopg.Error:
                conn.close()
                self._conn = None

    def close(self) -> None:
        """Close the connection; later calls raise ``DatabaseError``."""
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> "Reconnecting":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
