"""The task's buffered reports: metrics rows and searcher-op progress, written in order by one
background thread.

A training loop reports far more often than a database round trip allows, and must go on
training while the database is away (docs/architecture.md, "Riding out the database").
``ReportWriter`` keeps the reports in a bounded FIFO buffer; its thread takes whatever has
accumulated (up to ``batch_rows`` items) and hands it to a ``write`` function as one numbered
batch, so the rate of batches adapts to the database's speed and a report waits at most one
batch's round trip while the database is there.

The buffer is bounded in bytes. When it is full, ``put_metrics`` blocks until the writer
catches up (backpressure) rather than drop reports: a dropped metrics row is silent, permanent
data loss, while a blocked reporter is visible and ends when the database is back. A task
blocked this way has reported ``max_bytes`` of metrics the database has not taken yet;
it would block at its next checkpoint anyway, since a checkpoint must not be recorded before
the metrics reported ahead of it (see ``flush``).
"""

import functools
import json
import math
import threading
import unicodedata
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from det.errors import DetError

try:
    import orjson
except ImportError:  # a task image made before det needed it: the standard encoder, slower
    orjson = None

BUFFER_BYTES = 8 * 2**20
"""Default bound of the buffer: JSON bytes of the metrics not yet written, plus
``ITEM_OVERHEAD_BYTES`` per report."""

BATCH_ROWS = 5000
"""Most reports in one batch (one statement for its metrics rows)."""

ITEM_OVERHEAD_BYTES = 100
"""What a buffered report costs besides its JSON text (the Python objects), in bytes."""


class MetricsRow(NamedTuple):
    """One metrics report: ``values`` is the JSON text of the metrics (jsonb-safe). A named
    tuple: a frozen dataclass took a tenth of a report's time to build."""

    group: str
    steps_completed: int
    values: str

    @property
    def size(self) -> int:
        """Bytes this report holds in the buffer (approximate)."""
        return len(self.values) + len(self.group) + ITEM_OVERHEAD_BYTES


@dataclass(frozen=True, slots=True)
class Progress:
    """Units done towards searcher op ``op_id`` (absolute, in ``searcher.max_length``'s unit).
    Only the latest value per op in a batch is written."""

    op_id: int
    units: float

    @property
    def size(self) -> int:
        return ITEM_OVERHEAD_BYTES


def json_safe(value: Any) -> Any:
    """Metrics -> JSON that PostgreSQL's jsonb accepts.

    Tensors and numpy scalars become Python numbers (one-element) or lists; NaN and +-inf,
    which JSON cannot carry, become the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.
    """
    # Exact built-in scalars first: a report is mostly floats, and the ABC checks below cost
    # more than the JSON encoding of one (bench/metric_rows.py).
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else _non_finite(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "tolist"):  # torch tensors, numpy arrays and scalars
        return json_safe(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return _non_finite(value)
    return value


def _non_finite(value: float) -> str:
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
"""The metrics encoder: made once (``json.dumps`` with options builds one per call)."""


WriteBatch = Callable[[int, list[MetricsRow], dict[int, float]], None]
"""``write(seq, rows, progress)``: store one batch (``seq`` counts batches from 1; ``rows`` in
report order; ``progress`` op id -> latest units) or raise. It must be safe to call again with
the same batch (the writer never does, but ``write`` retries internally after connection
losses, when a batch's first attempt may have been committed)."""


MAX_STEPS = 2**53 - 1
"""Largest ``steps_completed`` det_task.report_metrics_batch stores (what a JSON reader such as the
WebUI holds exactly)."""


def encode_metrics(group: str, steps_completed: int, metrics: Mapping[str, Any]) -> MetricsRow:
    """Check and encode one metrics report for the buffer.

    Values go through ``json_safe`` (tensors, numpy values, non-finite floats). Refused here,
    with a ``DetError`` naming the report, rather than by the database later in a batch with
    other reports: a ``steps_completed`` that is not an integer from 0 to ``MAX_STEPS``, a
    ``group`` that is empty, longer than 255 characters or holds a control character (the
    database's rules for these, det_task.report_metrics_batch, which alone also bounds the values'
    size and depth), values that are not JSON, strings holding NUL (jsonb cannot store it) or
    lone surrogates (not UTF-8).
    """
    if not isinstance(group, str) or not _group_ok(group):
        raise DetError(f"metrics group must be a non-empty name of at most 255 characters "
                       f"without control characters, got {group!r}")
    if isinstance(steps_completed, bool) or not isinstance(steps_completed, int) \
            or not 0 <= steps_completed <= MAX_STEPS:
        raise DetError(f"{_where(group, steps_completed)}: steps_completed must be an "
                       "integer from 0 to 2^53 - 1 (batches)")
    text = _fast_json(metrics)
    if text is None:
        try:
            text = _ENCODER.encode(json_safe(metrics))
        except (TypeError, ValueError) as e:
            raise DetError(f"{_where(group, steps_completed)}: values must be JSON: {e}") from e
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise DetError(f"{_where(group, steps_completed)}: a string is not valid UTF-8 "
                           "(lone surrogate)") from e
    # Both encoders write NUL as the escape \u0000: a cheap first test, which a string
    # holding a backslash followed by "u0000" also passes, hence the walk.
    if "\\u0000" in text and _has_nul(metrics):
        raise DetError(f"{_where(group, steps_completed)}: a string holds NUL (\\x00), which "
                       "jsonb cannot store")
    return MetricsRow(group, steps_completed, text)


@functools.lru_cache(maxsize=64)  # a task reports a few groups, many times each
def _group_ok(group: str) -> bool:
    return 0 < len(group) <= 255 and not any(unicodedata.category(c) == "Cc" for c in group)


def _where(group: str, steps_completed: int) -> str:
    return f"{group!r} metrics at batch {steps_completed}"


def _fast_json(metrics: Mapping[str, Any]) -> str | None:
    """``metrics`` as JSON text by orjson (~1 us for a few floats, where ``json_safe`` and the
    standard encoder take ~10: bench/metric_rows.py), or None where only the slow path gives
    det's encoding: orjson writes NaN and +-inf as ``null`` (so any ``null`` is handed back),
    refuses non-string keys, integers past 64 bits and lone surrogates. Tensors and numpy values
    go through ``tolist`` (``_tolist``), as in ``json_safe``: orjson's own numpy encoding writes
    a float32 by its shortest float32 digits (0.1 where ``tolist`` gives 0.10000000149011612),
    so a value would be stored one way or the other depending on its report's other values.
    None without orjson (a docker task runs the agent's det on its image's packages)."""
    if orjson is None:
        return None
    try:
        data = orjson.dumps(metrics, default=_tolist)
    except orjson.JSONEncodeError:
        return None
    return None if b"null" in data else data.decode()


def _tolist(value: Any) -> Any:
    if hasattr(value, "tolist"):  # torch tensors, numpy arrays and scalars
        return value.tolist()
    raise TypeError


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False


class ReportWriter:
    """A bounded buffer of reports and the thread that writes them (see the module's doc).

    ``write`` stores one batch (``WriteBatch``); it is called from the writer thread only,
    one batch at a time, in order. When it raises, the writer stops: the error is raised again
    by every later ``put_*``, ``flush`` and ``close``, and reports still buffered are dropped
    (the database refused them or their allocation; a connection loss never gets here, since
    ``write`` retries those itself). ``max_bytes`` bounds the buffer, ``batch_rows`` a batch.
    """

    def __init__(self, write: WriteBatch, *, max_bytes: int = BUFFER_BYTES,
                 batch_rows: int = BATCH_ROWS, name: str = "det-report-writer") -> None:
        if max_bytes <= 0 or batch_rows <= 0:
            raise ValueError("max_bytes and batch_rows must be positive")
        self._write = write
        self._max_bytes = max_bytes
        self._batch_rows = batch_rows
        self._cv = threading.Condition(threading.Lock())  # not reentrant: cheaper
        self._items: deque[MetricsRow | Progress] = deque()
        self._bytes = 0          # of buffered and in-flight reports
        self._enqueued = 0       # reports ever put
        self._written = 0        # reports written (always a prefix of those put)
        self._batches = 0
        self._error: BaseException | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put_metrics(self, row: MetricsRow) -> None:
        """Buffer one metrics row; blocks while the buffer is full. Raises the writer's
        error if it stopped."""
        self._put(row)

    def put_progress(self, op_id: int, units: float) -> None:
        """Buffer a progress report for op ``op_id``."""
        self._put(Progress(op_id, float(units)))

    def _put(self, item: MetricsRow | Progress) -> None:
        size = item.size
        with self._cv:
            # A report larger than the whole buffer still goes through, alone.
            while self._error is None and self._bytes and self._bytes + size > self._max_bytes:
                self._cv.wait()
            self._raise_error()
            if self._closing:
                raise DetError("reports after the transport was closed")
            self._items.append(item)
            self._bytes += size
            self._enqueued += 1
            if len(self._items) == 1:  # only an empty buffer keeps the writer waiting
                self._cv.notify_all()

    def flush(self) -> None:
        """Wait until every report put before this call is written. Raises the writer's
        error if it stopped."""
        with self._cv:
            target = self._enqueued
            while self._error is None and self._written < target:
                self._cv.wait()
            self._raise_error()

    def close(self) -> None:
        """Flush, then stop the thread. Raises the writer's error if it stopped."""
        try:
            self.flush()
        finally:
            with self._cv:
                self._closing = True
                self._cv.notify_all()
            self._thread.join()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._items and not self._closing:
                    self._cv.wait()
                if not self._items:
                    return
                n = min(len(self._items), self._batch_rows)
                batch = [self._items.popleft() for _ in range(n)]
                self._batches += 1
                seq = self._batches
            rows = [item for item in batch if isinstance(item, MetricsRow)]
            progress = {item.op_id: item.units for item in batch if isinstance(item, Progress)}
            try:
                self._write(seq, rows, progress)
            except BaseException as e:
                with self._cv:
                    self._error = e
                    self._items.clear()
                    self._bytes = 0
                    self._cv.notify_all()
                return
            with self._cv:
                self._written += n
                self._bytes -= sum(item.size for item in batch)
                self._cv.notify_all()
