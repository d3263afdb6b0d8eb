"""Shipping task output to the ``task_logs`` table in batches.

Lines are buffered and written by one background thread with one ``det_append_logs`` call per
allocation per flush, never a statement per line (logs are a hot, append-only table).
"""

import threading
from collections import defaultdict

import psycopg

FLUSH_SECONDS = 0.5
MAX_LINE_CHARS = 16_384


class LogShipper:
    """Buffers ``(allocation, stream, line)`` and flushes every ``FLUSH_SECONDS`` on its own
    connection to ``url``."""

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True)
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # keeps batches in order across threads
        self._buf: dict[int, list[tuple[str, str]]] = defaultdict(list)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        self._thread.start()

    def add(self, allocation_id: int, stream: str, line: str) -> None:
        with self._lock:
            self._buf[allocation_id].append((stream, line[:MAX_LINE_CHARS]))

    def flush(self) -> None:
        """Write everything buffered so far (called before an exit is reported, so a task's
        logs are complete when its end becomes visible)."""
        with self._flush_lock:
            with self._lock:
                batches, self._buf = self._buf, defaultdict(list)
            for alloc, lines in batches.items():
                self._conn.execute("SELECT det_append_logs(%s, %s, %s)",
                                   (alloc, [s for s, _ in lines], [ln for _, ln in lines]))

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_SECONDS):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.flush()
        self._conn.close()
