"""The agent's heartbeat: a thread of its own on a connection of its own, so nothing the agent
does with its tasks (a slow launch, a context unpack, an image pull) delays it, and a database
restart only pauses it (docs/architecture.md, "Riding out the database").

Self-fencing: the leading reconciler declares an agent lost, and places its
runs elsewhere, once its heartbeat is ``agent_timeout`` seconds old (``det reconcile
--agent-timeout``, recorded in ``reconciler_leader.agent_timeout``; each beat reads it back).
An agent that has not beaten for its lease, ``FENCE_FRACTION`` of that timeout, kills its own
tasks first, so a run is not live twice. The lease runs from the moment the last successful
beat was sent, which is no later than the ``last_heartbeat`` the database recorded for it;
a separate thread watches it, so a beat stuck in the network cannot hold the kill back.
Those runs end as planned stops (``det_agent.mark_fenced``): an agent cannot tell a database
outage, which fences every agent, from a partition, and neither is the trials' failure.
"""

import logging
import threading
import time
from collections.abc import Callable

import psycopg

from det.db import retry
from det.db.reconnect import open_connection
from det.sql import named

log = logging.getLogger("det.agent")
Q = named("agent")

DEFAULT_AGENT_TIMEOUT = 30.0
"""Seconds: the agent timeout assumed until a reconciler has recorded its own (the default
of ``det reconcile --agent-timeout``)."""

FENCE_FRACTION = 2 / 3
"""The agent's lease as a fraction of the reconciler's agent timeout: 20 s of 30 s, leaving
10 s (at least 5 s beyond one pass interval of 2 s and the kill) before the reconciler can
declare it lost."""

UNKNOWN_TIMEOUT_BEAT_SECONDS = 1.0
"""How often the agent beats while no reconciler has recorded its agent timeout (a fresh
cluster whose reconciler has not finished its first pass): that timeout may be shorter than
the agent's interval, and the agent learns it only at its next beat."""

FENCE_CHECK_SECONDS = 0.2
"""How often the fence thread compares the time since the last beat with the lease."""


class Heartbeat:
    """Calls ``det_agent.heartbeat(agent_id)`` every ``interval`` seconds (more often where
    the reconciler's agent timeout asks: a third of it at most; every
    ``UNKNOWN_TIMEOUT_BEAT_SECONDS`` until a reconciler has recorded it) on its own connection to
    ``url``. When the answer is LOST (the reconciler gave up on the agent meanwhile) it calls
    ``on_lost(conn)`` on that connection, which registers the agent again. When no beat has
    succeeded for the lease (see the module) it calls ``on_fenced(seconds silent)`` once, from
    its fence thread, until a beat succeeds again. Lost connections are reopened with backoff
    (:mod:`det.db.retry`); any other error stops the thread and is raised by :meth:`check`."""

    def __init__(self, url: str, agent_id: str, interval: float,
                 on_lost: Callable[[psycopg.Connection], None],
                 on_fenced: Callable[[float], None]) -> None:
        self.url = url
        self.agent_id = agent_id
        self.interval = interval
        self.agent_timeout = DEFAULT_AGENT_TIMEOUT
        self.timeout_known = False  # a reconciler's timeout has been read
        self.fenced = False
        self._on_lost = on_lost
        self._on_fenced = on_fenced
        self._last_ok = time.monotonic()
        self._conn: psycopg.Connection | None = None
        self._failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._fence_thread = threading.Thread(target=self._watch, name="fence", daemon=True)

    @property
    def lease(self) -> float:
        """Seconds without a successful beat after which the agent kills its tasks."""
        return self.agent_timeout * FENCE_FRACTION

    def start(self) -> None:
        self._last_ok = time.monotonic()
        self._thread.start()
        self._fence_thread.start()

    def check(self) -> None:
        """Raise the error that stopped the thread, if one did."""
        if self._failure is not None:
            raise self._failure

    def stop(self) -> None:
        """Stop beating (at once, even in a backoff) and close the connection."""
        self._stop.set()
        for thread in (self._thread, self._fence_thread):
            if thread.is_alive():
                thread.join()
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
                self._stop.wait(min(self.interval, self.agent_timeout / 3 if self.timeout_known
                                    else UNKNOWN_TIMEOUT_BEAT_SECONDS))
        except BaseException as e:  # handed to the main loop by check()
            self._failure = e

    def _beat(self) -> None:
        if self._stop.is_set():
            return
        sent = time.monotonic()
        try:
            if self._conn is None or self._conn.closed:
                self._conn = open_connection(self.url)
            state, timeout = self._conn.execute(Q.beat, (self.agent_id,)).fetchone()
            if timeout is not None:
                self.agent_timeout, self.timeout_known = timeout, True
            if state == "LOST":
                log.warning("the reconciler declared this agent lost; registering again")
                self._on_lost(self._conn)
        except psycopg.Error as e:
            if retry.is_connection_lost(e) and self._conn is not None:
                self._conn.close()
            raise
        self._last_ok = sent
        if self.fenced:
            log.warning("heartbeat back; this agent takes work again")
            self.fenced = False

    def _watch(self) -> None:
        """The fence thread: kill the tasks (``on_fenced``) once the lease has run out."""
        while not self._stop.wait(FENCE_CHECK_SECONDS):
            silent = time.monotonic() - self._last_ok
            if silent > self.lease and not self.fenced:
                self.fenced = True
                log.error("no heartbeat for %.1f s, past this agent's lease of %.1f s (the "
                          "reconciler's agent timeout is %.0f s): killing its tasks", silent,
                          self.lease, self.agent_timeout)
                self._on_fenced(silent)
