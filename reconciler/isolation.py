"""No single object may fail a whole reconciler pass (issue 10, item 3).

The work on each run, experiment, pool and wake-up runs in a savepoint of its own; when it
raises, only that savepoint rolls back, why is recorded on the object, and the pass goes on.
A lost connection is the exception: it ends the pass, and the loop reconnects.
"""

import logging
from collections.abc import Callable

import psycopg

from det.db.retry import is_connection_lost
from det.errors import DetError

log = logging.getLogger("det.reconciler")


def isolated(conn: psycopg.Connection, what: str, work: Callable[[], object],
             on_error: Callable[[str], object] | None = None) -> bool:
    """Run ``work`` in a savepoint; returns whether it succeeded.

    If it raises (a database error other than a lost connection, or a det, key, value or type
    error from a decision), the savepoint rolls back, the error is logged naming ``what``,
    and ``on_error(message)`` records it on the object, in a savepoint of its own. A lost
    connection is re-raised: the pass cannot go on without one.
    """
    try:
        with conn.transaction():
            work()
        return True
    except (psycopg.Error, DetError, KeyError, ValueError, TypeError) as e:
        if is_connection_lost(e):
            raise
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        log.error("%s failed: %s", what, message)
        if on_error is not None:
            with conn.transaction():
                on_error(message)
        return False
