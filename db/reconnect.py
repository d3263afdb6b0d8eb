"""A connection that comes back: reopened after a loss, calls retried (docs/architecture.md,
"Riding out the database").

For processes that keep one connection for a long time and must carry on through a database
restart or failover: the harness inside a task, the CLI's followers (``det experiment wait``,
``det trial logs -f``). Which errors count as a loss, and the backoff, are
:mod:`det.db.retry`'s.
"""

import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.abc import PQGen
from psycopg.connection import _WAIT_INTERVAL
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import RowFactory, tuple_row

from det.db import retry
from det.errors import DatabaseError
from det.sql import named

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

T = TypeVar("T")

Q = named("db")

CONNECT_TIMEOUT_SECONDS = 10
"""libpq ``connect_timeout`` unless the URL sets one: an unreachable host (a failover in
progress) fails the attempt, which is then retried, instead of hanging it."""

CALL_DEADLINE_SECONDS = 10.0
"""The longest det's daemons (agent, reconciler, task harness, det serve's listener) wait for
the server's answer to one call: a statement with its results, a commit. A frozen server
(SIGSTOP, a hung host) never answers, and its kernel still acknowledges every packet and
keepalive, so neither TCP (keepalives, ``tcp_user_timeout``) nor libpq ever notice. Past the
deadline the connection is closed and the call fails as a lost connection (:class:`NoAnswer`),
so the retry layer reconnects, after a failover to the new primary. 10 s: well above det's
control statements (milliseconds; a reconciler pass is many short statements), below the
agent's 20 s lease. Callers with longer legitimate calls pass ``deadline`` (a context blob:
:func:`patience`); one-shot commands (``det.db.connect``) have none: a person can interrupt."""

BULK_CALL_DEADLINE_SECONDS = 300.0
"""The deadline of a call that moves a context blob (up to det's context limit, at a slow
link's MB/s), instead of ``CALL_DEADLINE_SECONDS`` (:func:`patience`)."""

UNANSWERED_CONNECT_TIMEOUT_SECONDS = 2
"""libpq ``connect_timeout`` for a URL of several hosts while one of them has left a call
unanswered (for ``UNANSWERED_MEMORY_SECONDS``): a frozen server accepts the TCP connection but
never the login, so each reconnect would spend the whole ``CONNECT_TIMEOUT_SECONDS`` on it.
A live server logs in within milliseconds."""

UNANSWERED_MEMORY_SECONDS = 60.0
"""How long a host that left a call unanswered is tried last among a URL's hosts."""

_unanswered: dict[tuple[str, str], float] = {}
"""(host, port) -> ``time.monotonic()`` of its last unanswered call, in this process."""


class NoAnswer(psycopg.OperationalError):
    """The server did not answer a call within the connection's deadline; the connection is
    closed. No SQLSTATE, so ``det.db.retry.is_connection_lost`` counts it as a loss."""


def _no_answer(pgconn: Any, deadline: float) -> NoAnswer:
    host, port = pgconn.host.decode(), pgconn.port.decode()
    _unanswered[(host, port or "5432")] = time.monotonic()
    # Not cancel(): it opens a connection to the same frozen server, and hangs too.
    pgconn.finish()
    return NoAnswer(f"no answer from the database server {host}:{port} in {deadline:g} s; "
                    "connection closed")


class _DeadlineConnection(psycopg.Connection[Any]):
    """A connection whose calls fail with :class:`NoAnswer` after ``deadline`` seconds
    (None: never). psycopg's own timed waits (``notifies(timeout=...)``) keep theirs."""

    deadline: float | None = None

    def wait(self, gen: PQGen[T], interval: float = _WAIT_INTERVAL,
             timeout: float | None = None) -> T:
        if timeout is not None or self.deadline is None:
            return super().wait(gen, interval, timeout)
        try:
            return super().wait(gen, interval, self.deadline)
        except psycopg.errors._WaitTimeout:
            raise _no_answer(self.pgconn, self.deadline) from None


class _AsyncDeadlineConnection(psycopg.AsyncConnection[Any]):
    """:class:`_DeadlineConnection` for asyncio."""

    deadline: float | None = None

    async def wait(self, gen: PQGen[T], interval: float = _WAIT_INTERVAL,
                   timeout: float | None = None) -> T:
        if timeout is not None or self.deadline is None:
            return await super().wait(gen, interval, timeout)
        try:
            return await super().wait(gen, interval, self.deadline)
        except psycopg.errors._WaitTimeout:
            raise _no_answer(self.pgconn, self.deadline) from None


@contextmanager
def patience(conn: psycopg.Connection[Any], deadline: float | None) -> Iterator[None]:
    """Calls on ``conn`` inside the block wait up to ``deadline`` seconds (None: for ever)
    instead of the connection's own deadline: a call known to be long (a context blob)."""
    before = getattr(conn, "deadline", None)
    if not isinstance(conn, _DeadlineConnection):
        yield
        return
    conn.deadline = deadline
    try:
        yield
    finally:
        conn.deadline = before


def open_connection(url: str, row_factory: RowFactory[Any] = tuple_row, *,
                    autocommit: bool = True, deadline: float | None = CALL_DEADLINE_SECONDS,
                    **params: Any) -> psycopg.Connection[Any]:
    """A connection to ``url`` (autocommit unless ``autocommit`` is false), with ``params``
    (libpq keywords: ``user``, ``password``, ...) over the URL's, and
    ``CONNECT_TIMEOUT_SECONDS`` unless either sets ``connect_timeout``, and
    ``target_session_attrs=read-write`` when the URL names several hosts (a replicated cluster:
    libpq tries each and keeps the primary) unless it says otherwise; a host that left a call
    unanswered lately is tried last, with ``UNANSWERED_CONNECT_TIMEOUT_SECONDS``. On a
    replicated cluster the connection is returned only once :func:`confirm_primary` has
    proved its server the primary. Each call
    on it waits ``deadline`` seconds for the server's answer at most (None: for ever;
    ``CALL_DEADLINE_SECONDS``), then raises :class:`NoAnswer`. One attempt: callers
    that must ride out a loss retry it (:class:`Reconnecting`, ``det.db.retry.call``); a check
    that must fail fast (a password) calls it alone.

    This, :func:`open_async_connection` and :func:`open_pool` are the only places det opens a
    connection (tests/test_one_retry_layer.py), so every det process shares this timeout,
    the deadline and the retry layer's idea of a loss.

    Raises psycopg's ``OperationalError`` when the server cannot be reached or refuses the
    login (``det.db.retry.is_connection_lost`` is true for the former only).
    """
    info = _conninfo(url, params)
    conn = _DeadlineConnection.connect(info, autocommit=autocommit, row_factory=row_factory)
    conn.deadline = deadline
    if replicated(info):
        try:
            confirm_primary(conn)
        except BaseException:
            conn.close()
            raise
    return conn


async def open_async_connection(url: str) -> psycopg.AsyncConnection[Any]:
    """:func:`open_connection` for asyncio (det serve's listener): autocommit, tuple rows,
    ``CALL_DEADLINE_SECONDS``, its primary confirmed on a replicated cluster."""
    conn = await _AsyncDeadlineConnection.connect(_conninfo(url, {}), autocommit=True)
    conn.deadline = CALL_DEADLINE_SECONDS
    if replicated(url):
        try:
            await conn.execute(Q.confirm_primary)
        except BaseException:
            await conn.close()
            raise
    return conn


def open_pool(url: str, min_size: int, max_size: int,
              row_factory: RowFactory[Any] = tuple_row) -> "ConnectionPool[Any]":
    """A pool of ``min_size`` to ``max_size`` connections to ``url`` (det serve's requests),
    each opened as :func:`open_connection` opens one (each connect reads the hosts' order
    afresh), its calls bounded by ``CALL_DEADLINE_SECONDS``, and checked before a request
    gets it: one that a restart dropped, or whose server froze, is replaced. On a replicated
    cluster the check is :func:`confirm_primary`, so a request never reads from a deposed
    primary: a connection that waited out a freeze answers nothing stale."""
    from psycopg_pool import ConnectionPool

    confirm = replicated(url)

    def configure(conn: _DeadlineConnection) -> None:
        conn.deadline = CALL_DEADLINE_SECONDS
        if confirm:
            confirm_primary(conn)

    return ConnectionPool(lambda: _conninfo(url, {}), connection_class=_DeadlineConnection,
                          min_size=min_size, max_size=max_size, open=True,
                          kwargs={"row_factory": row_factory}, configure=configure,
                          check=confirm_primary if confirm else ConnectionPool.check_connection)


def replicated(url: str) -> bool:
    """Whether ``url`` names several hosts: a replicated cluster (Patroni), where libpq keeps
    whichever host says it is the primary."""
    return _several_hosts(conninfo_to_dict(url))


def _several_hosts(params: dict[str, Any]) -> bool:
    return "," in str(params.get("host", ""))


def confirm_primary(conn: psycopg.Connection[Any]) -> None:
    """Prove that ``conn``'s server is still the primary its synchronous replica follows: a
    commit that waits for the replica (``sql/db.sql``, ``confirm_primary``), on an idle
    connection (committed here where it is not autocommit).

    A primary frozen past a failover still says read-write when it wakes, until its Patroni
    demotes it (a fraction of a second; Patroni's watchdog would have rebooted the host):
    a connection that waited out the freeze would be answered from its old state, and libpq's
    ``target_session_attrs`` accepts it for a new one. Its commits never return (the replica
    follows the new primary), so the call fails at the connection's deadline, or at the
    demotion, as a lost connection (``det.db.retry.is_connection_lost``), and the caller
    reconnects to the new primary. Costs one replicated commit (milliseconds on a LAN; with
    asynchronous replication, only a local WAL flush, and no proof).

    Raises psycopg's ``OperationalError`` (:class:`NoAnswer` past the deadline)."""
    conn.execute(Q.confirm_primary)
    if not conn.autocommit:
        conn.commit()


def _conninfo(url: str, params: dict[str, Any]) -> str:
    merged = {**conninfo_to_dict(url), **params}
    merged.setdefault("connect_timeout", CONNECT_TIMEOUT_SECONDS)
    if _several_hosts(merged):
        # Several servers (a Patroni cluster): only the primary takes det's writes.
        merged.setdefault("target_session_attrs", "read-write")
        _unanswered_last(merged)
    return make_conninfo(**merged)


def _unanswered_last(params: dict[str, Any]) -> None:
    """Reorder ``params``' hosts (and ports) so the ones that left a call unanswered in the
    last ``UNANSWERED_MEMORY_SECONDS`` come last, and shorten the connect timeout meanwhile:
    a frozen old primary is then tried after the promoted replica, and briefly."""
    now = time.monotonic()
    hosts = str(params["host"]).split(",")
    ports = str(params.get("port", "")).split(",")
    ports = ports * len(hosts) if len(ports) == 1 else ports
    if len(ports) != len(hosts) or "hostaddr" in params:
        return  # a layout libpq would reject, or addresses given apart: left as written
    late = [now - _unanswered.get((h, p or "5432"), -1e9) < UNANSWERED_MEMORY_SECONDS
            for h, p in zip(hosts, ports, strict=True)]
    if not any(late):
        return
    order = sorted(range(len(hosts)), key=lambda i: late[i])
    params["host"] = ",".join(hosts[i] for i in order)
    if "port" in params:
        params["port"] = ",".join(ports[i] for i in order)
    params["connect_timeout"] = min(int(params["connect_timeout"]),
                                    UNANSWERED_CONNECT_TIMEOUT_SECONDS)


class Reconnecting:
    """One autocommit connection to ``url``, opened on first use and reopened after a loss.

    ``run(what, fn)`` calls ``fn(connection)``; when the connection is lost (before or during
    ``fn``) the connection is dropped and ``fn`` runs again on a new one, with backoff, until
    it succeeds (or ``give_up_after`` seconds). ``fn`` must therefore be safe to run twice:
    a statement whose commit was acknowledged to nobody may have taken effect. Thread-safe:
    calls are serialized by a lock, which is held while ``fn`` runs but not during the backoff
    pauses. ``row_factory`` shapes the rows (tuples by default); ``deadline`` bounds each
    call's wait for the server (:func:`open_connection`), past which it counts as a loss.
    """

    def __init__(self, url: str, row_factory: RowFactory[Any] = tuple_row,
                 on_connect: Callable[[psycopg.Connection[Any]], None] | None = None,
                 deadline: float | None = CALL_DEADLINE_SECONDS) -> None:
        self._url = url
        self._deadline = deadline
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
                    self._conn = open_connection(self._url, self._row_factory,
                                                 deadline=self._deadline)
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
