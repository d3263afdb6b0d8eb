"""The reconciler process: lead, then pass after pass, through database restarts.

``det reconcile`` loops: a pass, then sleep until NOTIFY on its channel or ``interval``
seconds; a pass that changed something is followed at once by another, so a chain of
decisions (run ended -> searcher -> new trial -> placement) settles without waiting.
``det reconcile --once`` runs passes until nothing changes and exits (for cron).

A lost connection (the server restarted, failed over, or ended a frozen leader's session) is
weather: leadership died with the connection, so the loop reconnects with backoff, waits to
lead again through the lock, re-LISTENs and carries on from the tables.
"""

import functools
import logging
import os
import socket
import time

import psycopg

from det.db import channels, connect, det_home, retry
from det.db.reconnect import CALL_DEADLINE_SECONDS
from det.errors import DetError
from det.reconciler import leader
from det.reconciler.contract import Step, run_steps
from det.reconciler.passes import Settings, prepare_session, run_pass
from det.reconciler.provision import Provisioner
from det.reconciler.statistics import Statistics

log = logging.getLogger("det.reconciler")

# Bound on back-to-back passes, so a pass that keeps finding work cannot starve the timer.
MAX_CHAINED_PASSES = 20

# How long `--once` (cron) keeps trying to reach the database before it gives up.
ONCE_GIVE_UP_AFTER = 60.0


class NotLeaderError(DetError):
    """Another reconciler holds leadership (``--once`` does not wait for it)."""


def run(url: str, settings: Settings, once: bool = False) -> None:
    """Run the reconciler against the database at ``url``, reconnecting after connection
    losses (forever; with ``once``, for ``ONCE_GIVE_UP_AFTER`` seconds).

    Raises:
        NotLeaderError: ``once`` and another reconciler leads.
        det.errors.DatabaseError: ``once`` and the database stayed unreachable.
    """
    holder = f"{socket.gethostname()}:{os.getpid()}"
    give_up = ONCE_GIVE_UP_AFTER if once else None
    for attempt in retry.retrying("reconciler", give_up_after=give_up):
        # A frozen server must not freeze the leader: its calls are bounded.
        with attempt, connect(url, autocommit=True, deadline=CALL_DEADLINE_SECONDS) as conn:
            _lead_and_serve(conn, settings, holder, once)


def _lead_and_serve(conn: psycopg.Connection, settings: Settings, holder: str,
                    once: bool) -> None:
    leader.hold_lease(conn, settings.lease)
    if once:
        if not leader.try_lead(conn):
            raise NotLeaderError("another reconciler is running; nothing to do")
    else:
        leader.wait_to_lead(conn)
    log.info("leading as %s", holder)
    channels.listen(conn, channels.RECONCILER)
    prepare_session(conn)
    # A live leader must talk well within its lease (see det.reconciler.leader).
    wait = min(settings.interval, settings.lease / 3)
    statistics = Statistics()
    # Elastic pools after the pass: their demand is what placement left waiting.
    steps: list[Step] = [functools.partial(run_pass, settings=settings, holder=holder),
                         Provisioner(det_home()).step]
    while True:
        try:
            for _ in range(MAX_CHAINED_PASSES):
                statistics.refresh(conn)
                if not run_steps(conn, steps).requeue:
                    break
        except psycopg.Error as e:
            if retry.is_connection_lost(e):
                raise  # leadership is gone with the connection: reconnect, lead again
            # The pass rolled back; log it and retry on the next tick (requeue).
            log.exception("reconciler pass failed; retrying in %.1f s", wait)
            time.sleep(wait)
        if once:
            return
        for _ in conn.notifies(timeout=wait, stop_after=1):
            pass
