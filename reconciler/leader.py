"""Leadership: exactly one reconciler writes.

The leader holds a session advisory lock on the very connection that runs every pass. If that
connection dies (the process is killed, paused past TCP timeouts, or partitioned), Postgres
drops the lock with it, and the dead connection can write nothing more: fencing comes free.
A standby polls for the lock.
"""

import logging
import time

import psycopg

log = logging.getLogger("det.reconciler")

LOCK_KEY = 0x6465745F726563  # "det_rec"


def try_lead(conn: psycopg.Connection) -> bool:
    """Take leadership on ``conn`` if no one holds it; returns whether this connection leads."""
    row = conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (LOCK_KEY,)).fetchone()
    return bool(row["ok"])


def wait_to_lead(conn: psycopg.Connection, poll: float = 1.0) -> None:
    """Block as a hot standby until ``conn`` holds the leader lock (polls every ``poll`` s)."""
    if try_lead(conn):
        return
    log.info("another reconciler leads; waiting as standby")
    while not try_lead(conn):
        time.sleep(poll)
    log.info("took over as leader")

