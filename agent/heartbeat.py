"""The agent's heartbeat: a thread of its own on a connection of its own, so nothing the agent
does with its tasks (a slow launch, a context unpack, an image pull) delays it, and a database
restart only pauses it (docs/architecture.md, "Riding out the database").
"""

import logging
import threading
from collections.abc import Callable

import psycopg

from det.db import retry

log = logging.getLogger("det.agent")


class Heartbeat:
    """Calls ``det_agent_heartbeat(agent_id)`` every ``interval`` seconds on its own connection
    to ``url``. When the answer is LOST (the reconciler gave up on the agent meanwhile) it
    calls ``on_lost(conn)`` on that connection, which registers the agent again. Lost
    connections are reopened with backoff (:mod:`det.db.retry`); any other error stops the
    thread and is raised by :meth:`check`."""

    def __init__(self, url: str, agent_id: str, interval: float,
                 on_lost: Callable[[psycopg.Connection], None]) -> None:
        self.url = url
        self.agent_id = agent_id
        self.interval = interval
        self._on_lost = on_lost
        self._conn: psycopg.Connection | None = None
        self._failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def check(self) -> None:
        """Raise the error that stopped the thread, if one did."""
        if self._failure is not None:
            raise self._failure

    def stop(self) -> None:
        """Stop beating (at once, even in a backoff) and close the connection."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._conn is not None:
            self._conn.close()

    def _run(self) -> None:
        # Backoff waits on the stop event, so stop() never waits for a retry.
        retrying = retry.retrying("agent heartbeat").copy(sleep=self._stop.wait)
        try:
            while not self._stop.is_set():
                for attempt in retrying:
                    with attempt:
                        self._beat()
                self._stop.wait(self.interval)
        except BaseException as e:  # handed to the main loop by check()
            self._failure = e

    def _beat(self) -> None:
        if self._stop.is_set():
            return
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.url, autocommit=True)
            (state,) = self._conn.execute("SELECT det_agent_heartbeat(%s)",
                                          (self.agent_id,)).fetchone()
            if state == "LOST":
                log.warning("the reconciler declared this agent lost; registering again")
                self._on_lost(self._conn)
        except psycopg.Error as e:
            if retry.is_connection_lost(e) and self._conn is not None:
                self._conn.close()
            raise
