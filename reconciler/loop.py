"""The reconciler process: lead, then pass after pass.

``det reconcile`` loops: a pass, then sleep until NOTIFY ``det_reconciler`` or ``interval``
seconds; a pass that changed something is followed at once by another, so a chain of
decisions (run ended -> searcher -> new trial -> placement) settles without waiting.
``det reconcile --once`` runs passes until nothing changes and exits (for cron).
"""

import logging
import os
import socket
import time

import psycopg

from det.db import connect
from det.errors import DetError
from det.reconciler import leader
from det.reconciler.passes import Settings, run_pass

log = logging.getLogger("det.reconciler")

# Bound on back-to-back passes, so a pass that keeps finding work cannot starve the timer.
MAX_CHAINED_PASSES = 20


class NotLeaderError(DetError):
    """Another reconciler holds leadership (``--once`` does not wait for it)."""


def run(url: str, settings: Settings, once: bool = False) -> None:
    """Run the reconciler against the database at ``url``.

    Raises:
        NotLeaderError: ``once`` and another reconciler leads.
    """
    holder = f"{socket.gethostname()}:{os.getpid()}"
    with connect(url, autocommit=True) as conn:
        if once:
            if not leader.try_lead(conn):
                raise NotLeaderError("another reconciler is running; nothing to do")
        else:
            leader.wait_to_lead(conn)
        log.info("leading as %s", holder)
        conn.execute("LISTEN det_reconciler")
        while True:
            try:
                for _ in range(MAX_CHAINED_PASSES):
                    if run_pass(conn, settings, holder).changes == 0:
                        break
            except psycopg.OperationalError:
                raise  # the connection, and with it leadership, is gone: fail-stop
            except psycopg.Error:
                # The pass rolled back; log it and retry on the next tick (requeue).
                log.exception("reconciler pass failed; retrying in %.1f s", settings.interval)
                time.sleep(settings.interval)
            if once:
                return
            for _ in conn.notifies(timeout=settings.interval, stop_after=1):
                pass
