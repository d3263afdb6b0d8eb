"""Leadership: exactly one reconciler writes.

The leader holds a session advisory lock on the very connection that runs every pass. If that
connection dies (the process is killed, or the server restarts), Postgres drops the lock with
it, and the dead connection can write nothing more: fencing comes free. A standby polls for the
lock.

A leader that is frozen but still connected (SIGSTOP, a long pause, a hung host) would keep
the lock forever. So the leader's session carries a lease enforced by the server itself:
``idle_session_timeout`` and ``idle_in_transaction_session_timeout`` of ``lease`` seconds end a
session that stops talking, and with it the lock. A live leader talks at least every
``lease / 3`` seconds (the loop's longest wait), so only a frozen one is cut off; a standby
then leads within ``lease`` plus one poll. The frozen process, once it wakes, finds its
connection gone and comes back as a standby.
"""

import logging
import time

import psycopg

from det.sql import named

log = logging.getLogger("det.reconciler")
Q = named("reconciler")

LOCK_KEY = 0x6465745F726563  # "det_rec"

DEFAULT_LEASE = 10.0
"""Seconds a leader may stay silent before the server ends its session (and its lock)."""

STANDBY_POLL = 0.5
"""Seconds between a standby's tries for the lock: a killed leader's lock goes with its
session at once, so this is the leaderless gap (plus one pass) that a kill leaves."""


def current(conn: psycopg.Connection) -> dict | None:
    """The last leader recorded (``holder``, ``since``, ``last_pass``) and whether it leads
    now (``alive``: a session holds the lock); None when no reconciler ever ran here.
    ``conn`` must return dict rows. The one read of leadership status (one statement,
    ``current_leader``): det serve, the CLI and the queue's reasons all call it."""
    return conn.execute(Q.current_leader, {"key": LOCK_KEY}).fetchone()


def hold_lease(conn: psycopg.Connection, lease: float) -> None:
    """Make the server end ``conn``'s session after ``lease`` seconds without a statement,
    idle or idle in a transaction (PostgreSQL >= 14)."""
    ms = str(int(lease * 1000))
    conn.execute(Q.hold_lease, (ms, ms))


def try_lead(conn: psycopg.Connection) -> bool:
    """Take leadership on ``conn`` if no one holds it; returns whether this connection leads."""
    row = conn.execute(Q.try_lead, (LOCK_KEY,)).fetchone()
    return bool(row["ok"])


def wait_to_lead(conn: psycopg.Connection, poll: float = STANDBY_POLL) -> None:
    """Block as a hot standby until ``conn`` holds the leader lock (polls every ``poll`` s)."""
    if try_lead(conn):
        return
    log.info("another reconciler leads; waiting as standby")
    while not try_lead(conn):
        time.sleep(poll)
    log.info("took over as leader")
