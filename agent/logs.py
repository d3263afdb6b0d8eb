"""Shipping task output to the ``task_logs`` table in batches.

Lines are buffered and written by one background thread with one ``det_agent.append_logs`` call per
allocation per flush, never a statement per line (logs are a hot, append-only table).

While the database is away (a restart, a failover) lines stay buffered and the thread
reconnects with backoff (:mod:`det.db.retry`). The buffer is bounded per allocation: once an
allocation's buffered lines cost ``max_buffered_bytes``, its further lines are dropped and
counted, and one line saying how many were dropped follows its buffered lines once they are
written (docs/architecture.md, "Riding out the database").

A batch whose commit acknowledgement was lost (a failover) is sent again and must not be
written twice: each shipper draws a uuid at start and numbers each allocation's lines 1, 2, ...
(the dropped-lines note too, once), and ``det_agent.append_logs`` skips the lines at or below the
last number it holds for that shipper and allocation (schema.sql, ``log_batches``).
"""

import logging
import threading
import uuid
from collections import defaultdict

import psycopg

from det.db import retry
from det.db.reconnect import open_connection
from det.launch.wrap_rank import split_rank
from det.sql import named

log = logging.getLogger("det.agent")
Q = named("agent")

FLUSH_SECONDS = 0.5
MAX_LINE_CHARS = 16_384
MAX_BUFFERED_BYTES = 16 * 2**20
"""Default bound of one allocation's buffered output, in bytes as :meth:`LogShipper.cost`
counts them."""

CLOSE_RETRY_SECONDS = 10.0
"""How long :meth:`LogShipper.close` keeps trying to write what is left, in seconds."""


class LogShipper:
    """Buffers ``(allocation, stream, line)`` and flushes every ``FLUSH_SECONDS`` on its own
    connection to ``url`` (opened on first use, and again after it was lost).

    ``max_buffered_bytes``: the bound of one allocation's buffer (see :meth:`cost`)."""

    LINE_OVERHEAD = 100
    """Bytes a buffered line costs beyond its characters (Python's str and tuple objects)."""

    def __init__(self, url: str, max_buffered_bytes: int = MAX_BUFFERED_BYTES) -> None:
        self._url = url
        self._max_bytes = max_buffered_bytes
        self._conn: psycopg.Connection | None = None
        self._writer = uuid.uuid4()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # keeps batches in order across threads
        # (number, stream, line, rank) per allocation, numbered in order
        self._buf: dict[int, list[tuple[int, str, str, int | None]]] = defaultdict(list)
        self._bytes: dict[int, int] = defaultdict(int)
        self._dropped: dict[int, int] = defaultdict(int)
        # The note on dropped lines being sent: (its number, the count it tells), kept until
        # written so that a re-sent batch carries it unchanged.
        self._notes: dict[int, tuple[int, int]] = {}
        # The last number given per allocation; never reset, as the database remembers it.
        self._seq: dict[int, int] = defaultdict(int)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        self._thread.start()

    @classmethod
    def cost(cls, line: str) -> int:
        """Approximate bytes ``line`` holds while buffered: its characters plus
        ``LINE_OVERHEAD``."""
        return len(line) + cls.LINE_OVERHEAD

    def add(self, allocation_id: int, stream: str, line: str) -> None:
        """Buffer one line (cut to ``MAX_LINE_CHARS``; NUL, which a text column cannot hold,
        shown as U+FFFD; a worker's ``[rank=N]`` tag taken off, its rank kept beside it), or
        count it as dropped when the allocation's buffer is full."""
        rank, line = split_rank(line) if stream != "det" else (None, line)
        line = line[:MAX_LINE_CHARS].replace("\x00", "\ufffd")
        with self._lock:
            if self._bytes[allocation_id] + self.cost(line) > self._max_bytes:
                self._dropped[allocation_id] += 1
                return
            self._seq[allocation_id] += 1
            self._buf[allocation_id].append((self._seq[allocation_id], stream, line, rank))
            self._bytes[allocation_id] += self.cost(line)

    def flush(self) -> None:
        """Write everything buffered so far (called before an exit is reported, so a task's
        logs are complete when its end becomes visible). Lines leave the buffer only once
        written.

        Raises:
            psycopg.OperationalError: the database is away (the lines stay buffered).
        """
        with self._flush_lock:
            with self._lock:
                for alloc, n in self._dropped.items():
                    if n and alloc not in self._notes:
                        self._seq[alloc] += 1
                        self._notes[alloc] = (self._seq[alloc], n)
                batches = {a: list(lines) for a, lines in self._buf.items() if lines}
                notes = dict(self._notes)
                for alloc in notes.keys() - batches.keys():
                    batches[alloc] = []
            for alloc, lines in batches.items():
                written = lines
                if alloc in notes:
                    seq, n = notes[alloc]
                    note = (seq, "det", f"{n} lines of output were dropped while the database "
                                        "was unavailable", None)
                    written = sorted([*lines, note], key=lambda ln: ln[0])
                self._write(alloc, written)
                with self._lock:
                    del self._buf[alloc][:len(lines)]
                    self._bytes[alloc] -= sum(self.cost(ln) for _, _, ln, _ in lines)
                    if alloc in notes:
                        self._dropped[alloc] -= notes[alloc][1]
                        del self._notes[alloc]
                    if not self._buf[alloc] and not self._dropped[alloc]:
                        del self._buf[alloc], self._bytes[alloc], self._dropped[alloc]

    def _write(self, alloc: int, lines: list[tuple[int, str, str, int | None]]) -> None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = open_connection(self._url)
            seqs, streams, texts, ranks = (zip(*lines, strict=True) if lines
                                           else ((), (), (), ()))
            self._conn.execute(Q.append_logs, (alloc, list(streams), list(texts), list(ranks),
                                               self._writer, list(seqs)))
        except psycopg.Error as e:
            if retry.is_connection_lost(e) and self._conn is not None:
                self._conn.close()
            raise

    def _run(self) -> None:
        # Retries wait on the stop event, so close() is never delayed by a backoff.
        retrying = retry.retrying("task log shipping").copy(sleep=self._stop.wait)
        while not self._stop.wait(FLUSH_SECONDS):
            for attempt in retrying:
                with attempt:
                    if not self._stop.is_set():
                        self.flush()

    def close(self) -> None:
        """Stop the thread and write what is left, trying for up to ``CLOSE_RETRY_SECONDS``
        while the database is away (then the rest is lost, and logged as such)."""
        self._stop.set()
        self._thread.join()
        try:
            retry.call("task log shipping", self.flush, give_up_after=CLOSE_RETRY_SECONDS)
        except psycopg.Error as e:
            with self._lock:
                left = sum(map(len, self._buf.values())) + sum(self._dropped.values())
            log.error("%d task output lines could not be written: %s", left, e)
        if self._conn is not None:
            self._conn.close()
