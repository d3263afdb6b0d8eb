"""No single object may fail a whole reconciler pass.

The work on each run, experiment, pool and wake-up runs in a savepoint of its own; when it
raises, only that savepoint rolls back, why is recorded on the object, and the pass goes on.
A lost connection is the exception: it ends the pass, and the loop reconnects.

Savepoints cost round trips (SAVEPOINT, RELEASE), and a busy pass has hundreds of objects
(1,000 tiny tasks are 1,000 runs to settle and 2,000 searcher steps). So objects
of one kind go together (:func:`isolated_each`): all in one savepoint and one pipeline, and
only when that batch fails is each run again in a savepoint of its own.
"""

import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

import psycopg

from det.db.retry import is_connection_lost
from det.errors import DetError
from det.reconciler.batch import Writes

log = logging.getLogger("det.reconciler")

T = TypeVar("T")

# What a failing object's work may raise: a database error, or an error of a pure decision.
FAILURES = (psycopg.Error, DetError, KeyError, ValueError, TypeError)


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
    except FAILURES as e:
        if is_connection_lost(e):
            raise
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        log.error("%s failed: %s", what, message)
        if on_error is not None:
            with conn.transaction():
                on_error(message)
        return False


def isolated_each(conn: psycopg.Connection, items: Iterable[T], what: Callable[[T], str],
                  work: Callable[[T], object],
                  on_error: Callable[[T, str], object] | None = None,
                  writes: Writes | None = None) -> None:
    """``work(item)`` for each item, each isolated as by :func:`isolated`, in a few round
    trips when none fails, however many items.

    All items' statements go in one savepoint and one pipeline (``work`` must not read their
    results, and must change nothing but the database: it may run twice). ``writes``: rows
    that ``work`` queued there instead are sent in the same savepoint after every item, one
    statement per kind (:class:`~det.reconciler.batch.Writes`). If any raises, that
    savepoint rolls back, ``writes`` is cleared, and each item runs again in a savepoint of
    its own (its statements pipelined, its queued rows sent after them), so the failing one
    is found, recorded (``on_error(item, message)``, ``what(item)`` in the log) and the
    others still take effect.
    """
    items = list(items)
    if not items:
        return

    def work_all(batch: list[T]) -> None:
        # The queued rows are sent after the pipeline: a statement of a few MB sent inside one
        # can hang both ends (psycopg/psycopg#685).
        try:
            with conn.pipeline():
                for item in batch:
                    work(item)
            if writes is not None:
                writes.flush(conn)
        finally:
            if writes is not None:
                writes.clear()  # what a failing batch had queued is not to be sent later

    try:
        with conn.transaction():
            work_all(items)  # an error surfaces at the end of the pipeline, in the savepoint
        return
    except FAILURES as e:
        if is_connection_lost(e):
            raise
        log.info("a batch of %d (%s, ...) failed; isolating each", len(items),
                 what(items[0]))
    for item in items:
        isolated(conn, what(item), lambda item=item: work_all([item]),
                 None if on_error is None else lambda msg, item=item: on_error(item, msg))
