"""Riding out the database (docs/architecture.md, "Riding out the database").

PostgreSQL restarts, fails over and drops connections. Every det process treats a lost
connection as weather: it waits with exponential backoff (tenacity), reconnects and carries on
from the tables. This module is the one place that says which errors are "the connection is
gone, try again" and how long to wait between tries; the callers decide what a retry redoes.
"""

import logging
from collections.abc import Callable
from typing import TypeVar

import psycopg
import tenacity

from det.errors import DatabaseError

log = logging.getLogger("det.db")

T = TypeVar("T")

# SQLSTATEs that mean the server went away or is not accepting us yet: class 08 (connection
# exception), 57P01 admin_shutdown (pg_ctl stop/restart), 57P02 crash_shutdown, 57P03
# cannot_connect_now (starting up, in recovery), 57P05 idle_session_timeout, 53300
# too_many_connections. Also 25006 read_only_sql_transaction (not an OperationalError): the
# server we reached is a replica (a primary demoted in a failover, or a URL that names no
# target_session_attrs), so a new connection finds the primary.
_TRANSIENT_STATES = {"57P01", "57P02", "57P03", "57P05", "53300"}

BACKOFF_INITIAL = 0.1
"""Seconds before the first retry; doubles (with jitter) up to ``BACKOFF_MAX``."""

BACKOFF_MAX = 5.0
"""Longest pause between two tries, in seconds."""


def is_connection_lost(e: BaseException) -> bool:
    """Whether ``e`` means the connection (or the server) is gone and a retry may succeed.

    True for psycopg's client-side connection failures (no SQLSTATE: refused, reset, closed
    connection), the server's shutdown / start-up / connection-class SQLSTATEs and a write
    refused by a read-only replica (25006, after a failover), also when
    wrapped in det's ``DatabaseError`` (``det.db.connect``). False for everything else,
    authentication failures included: those do not heal by waiting.
    """
    if isinstance(e, DatabaseError) and e.__cause__ is not None:
        return is_connection_lost(e.__cause__)
    if isinstance(e, psycopg.InterfaceError | psycopg.errors.ReadOnlySqlTransaction):
        return True
    if not isinstance(e, psycopg.OperationalError) or is_login_refused(e):
        return False
    state = getattr(e, "sqlstate", None)
    return state is None or state.startswith("08") or state in _TRANSIENT_STATES


# libpq reports a refused login with no SQLSTATE, only the server's message: a role that may
# not log in (a revoked agent, det_user.agent_revoke) or a wrong password.
_REFUSED_LOGIN = ("is not permitted to log in", "password authentication failed",
                  # PgBouncer's, as det's TLS gateway (det.db.gateway): a role that may not
                  # log in has no row in pg_shadow, which it asks; a wrong password
                  "no such user", "SASL authentication failed")


def is_login_refused(e: BaseException) -> bool:
    """Whether ``e`` is the server refusing the login (SQLSTATE class 28, or libpq's message
    of a refused role or password), also when wrapped in det's ``DatabaseError``."""
    if isinstance(e, DatabaseError) and e.__cause__ is not None:
        return is_login_refused(e.__cause__)
    if not isinstance(e, psycopg.OperationalError):
        return False
    state = getattr(e, "sqlstate", None)
    return (state or "").startswith("28") or (
        state is None and any(m in str(e) for m in _REFUSED_LOGIN))


def retrying(what: str, give_up_after: float | None = None) -> tenacity.Retrying:
    """A tenacity ``Retrying`` for connection losses only: exponential backoff with jitter
    from ``BACKOFF_INITIAL`` to ``BACKOFF_MAX`` seconds, forever or for ``give_up_after``
    seconds (then the last error is raised). Each wait is logged once as a warning naming
    ``what`` was interrupted. Any other error is raised at once.
    """
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_connection_lost),
        wait=tenacity.wait_exponential_jitter(multiplier=BACKOFF_INITIAL, max=BACKOFF_MAX),
        stop=(tenacity.stop_never if give_up_after is None
              else tenacity.stop_after_delay(give_up_after)),
        before_sleep=_log_wait(what),
        reraise=True,
    )


def call(what: str, fn: Callable[[], T], give_up_after: float | None = None) -> T:
    """``fn()``, retried after connection losses (see :func:`retrying`). ``fn`` must be safe to
    run again: open its own connection, or be idempotent."""
    for attempt in retrying(what, give_up_after):
        with attempt:
            return fn()
    raise AssertionError("unreachable: tenacity either returns or raises")


def _log_wait(what: str) -> Callable[[tenacity.RetryCallState], None]:
    def before_sleep(state: tenacity.RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome else None
        first = str(err).strip().splitlines()[0] if err and str(err).strip() else type(err)
        log.warning("%s: database unavailable (%s); retrying in %.1f s (attempt %d)", what,
                    first, state.upcoming_sleep, state.attempt_number)
    return before_sleep
