"""Live updates: server-sent-event streams fed by ONE LISTEN connection per server process.

:class:`Hub` holds that connection (LISTENing on the web channel: det.db.channels) and fans each
notification out to the streams subscribed to its topics (``experiment:7``, ``trial:12``,
``queue``, ...). NOTIFY is a hint only (docs/architecture.md): the hub also wakes every stream once
a ``TICK`` (a change no trigger announces, or an event the metrics throttle held back, shows
within a tick), and after reconnecting, since anything may have changed meanwhile. The
triggers fire only while some server holds a lease (``det_web.watch``): the hub renews its
own every tick while it has streams, so a cluster no page watches spends nothing on events.
A woken stream reads what changed in one short transaction (never one held open while it
waits) and sends only what is new: metrics and log rows after the last id it sent, and
snapshots that differ from the last one.
"""

import asyncio
import contextlib
import json
import logging
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable

import psycopg
import tenacity
from fastapi.encoders import jsonable_encoder
from starlette.concurrency import run_in_threadpool

from det.db import channels
from det.db.reconnect import open_async_connection
from det.db.retry import BACKOFF_INITIAL, BACKOFF_MAX, is_connection_lost
from det.errors import DatabaseError
from det.sql import named

log = logging.getLogger("det.api.events")
Q = named("api")

TICK = 1.0
"""Seconds between two looks of every stream when no notification comes."""

KEEPALIVE = 15.0
"""Seconds between two SSE comments on a stream with nothing new (keeps proxies open)."""

LEASE = 3 * TICK
"""Seconds the database sends events for after the hub's last renewal (a few ticks, so that
one slow tick does not drop it)."""


class Hub:
    """The process's one listening connection and its subscribers (asyncio, one loop)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._subs: dict[str, set[asyncio.Event]] = defaultdict(set)
        self.connected = asyncio.Event()
        self.name = f"det serve {uuid.uuid4()}"

    def subscribe(self, topics: Iterable[str]) -> asyncio.Event:
        """An event set whenever one of ``topics`` changes (or at each tick)."""
        ev = asyncio.Event()
        for t in topics:
            self._subs[t].add(ev)
        return ev

    def unsubscribe(self, ev: asyncio.Event) -> None:
        for t in list(self._subs):
            self._subs[t].discard(ev)
            if not self._subs[t]:
                del self._subs[t]

    def wake(self, topics: Iterable[str] | None) -> None:
        """Wake the subscribers of ``topics`` (None or ``*``: all)."""
        topics = None if topics is None else list(topics)
        if topics is None or channels.ALL_TOPICS in topics:
            for evs in self._subs.values():
                for ev in evs:
                    ev.set()
            return
        for t in topics:
            for ev in self._subs.get(t, ()):
                ev.set()

    async def run(self) -> None:
        """Listen until cancelled; a lost connection is weather: reconnect with backoff."""
        wait = tenacity.wait_exponential_jitter(initial=BACKOFF_INITIAL, max=BACKOFF_MAX)
        failures = 0
        while True:
            try:
                async with await open_async_connection(self.url) as conn:
                    await channels.listen_web(conn)
                    failures = 0
                    self.connected.set()
                    self.wake(None)
                    while True:
                        if self._subs:
                            await conn.execute(Q.web_watch, (self.name, LEASE))
                        async for n in conn.notifies(timeout=TICK):
                            self.wake(n.payload.split())
                        self.wake(None)
            except (psycopg.Error, OSError) as e:
                # A lost server above all, but any failure: the listener must come back.
                # Meanwhile each stream still reads at its keepalive, every KEEPALIVE s.
                self.connected.clear()
                if not is_connection_lost(e):
                    log.error("event listener failed: %s", e)
                failures += 1
                state = tenacity.RetryCallState(None, None, (), {})
                state.attempt_number = failures
                delay = wait(state)
                log.warning("event listener: database unavailable (%s); retrying in %.1f s",
                            str(e).strip().splitlines()[0] if str(e).strip() else type(e),
                            delay)
                await asyncio.sleep(delay)


def sse(event: str, data: object) -> str:
    """One server-sent event: ``event`` name and JSON ``data``."""
    return f"event: {event}\ndata: {json.dumps(jsonable_encoder(data))}\n\n"


class Stream:
    """What one SSE client has been sent: per snapshot kind its last JSON, per row kind the
    last id."""

    def __init__(self) -> None:
        self.snapshots: dict[str, str] = {}
        self.cursors: dict[str, int] = {}

    def changed(self, kind: str, data: object) -> str | None:
        """The event for snapshot ``data`` if it differs from the last one sent, else None."""
        text = json.dumps(jsonable_encoder(data))
        if self.snapshots.get(kind) == text:
            return None
        self.snapshots[kind] = text
        return f"event: {kind}\ndata: {text}\n\n"


async def stream(hub: Hub, topics: list[str],
                 read: Callable[[Stream], list[str]]) -> AsyncIterator[str]:
    """The SSE body: ``read(stream)`` (run in a worker thread; it opens its own short
    transaction and returns the events to send) at the start and at every wake-up."""
    ev = hub.subscribe(topics)
    state = Stream()
    try:
        yield "retry: 2000\n\n"
        while True:
            ev.clear()
            try:
                out = await run_in_threadpool(read, state)
            except (psycopg.Error, DatabaseError) as e:
                if not is_connection_lost(e):
                    raise
                # The database is away: the stream stays open and reads again when the hub
                # (re)connects and wakes it, or at its next keepalive.
                out = []
            for chunk in out:
                yield chunk
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ev.wait(), KEEPALIVE)
                continue
            yield ": keepalive\n\n"
    finally:
        hub.unsubscribe(ev)
