"""How a task talks to the platform: a small ``Transport`` protocol and its two implementations.

* ``DbTransport`` calls the task's SQL functions in ``schema.sql`` (``det_task.info``,
  ``det_task.report_metrics_batch``, ...) over one autocommit psycopg connection, authenticated by
  the allocation token (docs/architecture.md), reopened after a loss ("Riding out the
  database"). Metrics are buffered and written by a background thread
  (``det.harness.report_writer``); another watches the same connection, which LISTENs on the
  allocation's channel, and polls ``det_task.should_preempt`` so that ``should_preempt()`` only
  reads a flag.
* ``LocalTransport`` needs no database: for ``det experiment create --local`` and off-cluster
  use. Metrics are printed and kept in memory; one searcher op (or a given list of ops).
"""

import atexit
import contextlib
import copy
import json
import os
import sys
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, TypeVar

import psycopg
import tenacity
from psycopg.types.json import Jsonb

from det.db import channels, retry
from det.db.channels import OP_DECIDED
from det.db.reconnect import Reconnecting
from det.db.sqlstate import translate
from det.errors import DetError
from det.harness.errors import TaskEnvironmentError
from det.harness.report_writer import (
    BUFFER_BYTES,
    MetricsRow,
    ReportWriter,
    encode_metrics,
    json_safe,
)
from det.sql import named

__all__ = ["DbTransport", "LocalTransport", "SearcherOp", "TaskInfo", "Transport", "json_safe"]

Q = named("harness")

PREEMPT_POLL_SECONDS = 5.0
"""How often the preemption watcher asks ``det_task.should_preempt`` even without a NOTIFY; so
also the longest a task whose allocation was ended (its token revoked) runs on while the
database is up: the reconciler's fence before re-placing a lost agent's run reads it."""

FENCED_EXIT_STATUS = 1
"""Exit status of a task process that found its allocation ended (see ``DbTransport``)."""


T = TypeVar("T")

_FENCE_LOCK = threading.Lock()

OP_POLL_SECONDS = 0.1
"""First pause between ``det_task.current_op`` calls while the searcher decides (doubles). The
reconciler's pass that decides NOTIFYs the allocation's channel (payload
``channels.OP_DECIDED``), which ends the pause at once; the pause only bounds the wait when a
NOTIFY is lost. (Polling alone, from 5 ms, cost ~20 calls a hop in a busy search.)"""

OP_POLL_MAX_SECONDS = 1.0
"""Longest pause between ``det_task.current_op`` calls while the searcher decides."""



@dataclass(frozen=True)
class TaskInfo:
    """Identity and starting point of a trial task (the ``det_task.info`` answer).

    ``config`` is the expanded experiment config, ``hparams`` the trial's concrete
    hyperparameters, ``latest_checkpoint`` the uuid to resume from (or ``None``),
    ``steps_completed`` the batches trained at that checkpoint, ``slots`` the slots held.
    """

    allocation_id: int
    trial_id: int
    experiment_id: int
    config: dict[str, Any]
    hparams: dict[str, Any]
    trial_seed: int
    latest_checkpoint: str | None
    steps_completed: int
    slots: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TaskInfo":
        """Build from the ``det_task.info`` JSON object."""
        return cls(
            allocation_id=int(data["allocation_id"]),
            trial_id=int(data["trial_id"]),
            experiment_id=int(data["experiment_id"]),
            config=dict(data.get("config") or {}),
            hparams=dict(data.get("hparams") or {}),
            trial_seed=int(data.get("trial_seed") or 0),
            latest_checkpoint=data.get("latest_checkpoint"),
            steps_completed=int(data.get("steps_completed") or 0),
            slots=int(data.get("slots") or 1),
        )


@dataclass(frozen=True)
class SearcherOp:
    """One searcher operation: train until ``length`` (absolute, in ``searcher.max_length``'s
    unit), then validate and report the searcher metric."""

    id: int
    length: int


class Transport(Protocol):
    """What the Core API contexts need from the platform. Every call but ``should_preempt``
    may do I/O; the trainer only calls them at workload boundaries."""

    def task_info(self) -> TaskInfo: ...

    def report_metrics(
        self, group: str, steps_completed: int, metrics: Mapping[str, Any]
    ) -> None: ...

    def report_checkpoint(
        self,
        uuid: str,
        steps_completed: int,
        resources: Mapping[str, int],
        metadata: Mapping[str, Any],
    ) -> None: ...

    def checkpoint_guard(self, uuid: str,
                         discard: Callable[[], None]) -> AbstractContextManager[None]: ...

    def report_storage_error(self, message: str) -> None: ...

    def current_op(self) -> SearcherOp | None: ...

    out_of_work: bool
    """Set once ``current_op`` answered ``None`` because the searcher wants nothing more from
    the trial (not because a preemption ended the wait)."""

    def report_progress(self, op_id: int, units: float) -> None: ...

    def complete_op(self, op_id: int, metric: float) -> None: ...

    def should_preempt(self) -> bool: ...

    def acknowledge_preemption(self) -> None: ...

    def stop_reason(self) -> str: ...

    def report_early_exit(self, reason: str) -> None: ...

    def experiment_best_validation(self) -> float | None: ...

    def set_trial_metadata(self, metadata: Mapping[str, Any]) -> dict[str, Any]: ...

    def trial_metadata(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class DbTransport:
    """``Transport`` over the SQL functions of ``schema.sql``, riding out database restarts.

    ``db_url`` is a libpq connection string, ``token`` the allocation token every function
    checks (a bad or expired token raises psycopg's ``InvalidAuthorizationSpecification``).

    Calls share one connection that is reopened after a loss; each call is retried with
    backoff (``det.db.retry``) until the database answers, so no call fails because the
    database restarted or failed over. Every function called is safe to run again after an
    attempt whose outcome is unknown (the commit may have happened, its answer was lost):
    ``det_task.info``, ``det_task.current_op``, ``det_task.report_progress``,
    ``det_task.complete_op``, ``det_task.ack_preemption``, ``det_task.report_early_exit``,
    ``det_task.checkpoint_begin``, ``det_task.report_storage_error`` set values or read (a
    second run changes nothing); ``det_task.report_checkpoint`` inserts by uuid, so a unique
    violation on a retry means the lost attempt recorded it (success);
    ``det_task.report_metrics_batch`` skips a batch its writer already recorded
    (``metric_batches``).

    Metrics and op progress are buffered (``ReportWriter``, at most ``buffer_bytes``; a full
    buffer blocks ``report_metrics``) and written in order by a background thread, so
    training goes on while the database is away. The buffer is flushed (waiting until
    written) before every checkpoint report, op completion, preemption acknowledgement,
    early exit, best-validation read, and at ``close()`` and interpreter exit: nothing
    reported before a checkpoint can be lost, and a crash loses only what was reported since
    the writer's last batch. A second thread watches the connection for the NOTIFYs of its
    allocation's channel (preemption, the next op decided): one connection, so one server
    process, per task.

    Fencing: a token the database refuses (SQLSTATE 28000 from ``det_internal.auth``) means
    the cluster ended the allocation (its agent was declared lost, the run was killed) and may
    have placed a replacement, so whichever call sees it first (the watcher within
    ``PREEMPT_POLL_SECONDS``, a report, a checkpoint) prints one line and ends the process at
    once with ``FENCED_EXIT_STATUS`` (``os._exit``: no flush, no handler of the user's can
    keep it running). Each worker of a distributed task has its own transport, so each
    stops; the launcher ends the rest when one exits.
    """

    def __init__(self, db_url: str, allocation_id: int, token: str, *,
                 buffer_bytes: int = BUFFER_BYTES) -> None:
        self._token = token
        self.out_of_work = False
        self.allocation_id = allocation_id
        self._what = f"allocation {allocation_id}"
        self._preempt = threading.Event()
        self._signalled = False  # request_preemption() was called (SIGTERM)
        self._op_decided = threading.Event()  # an OP_DECIDED NOTIFY came
        self._ask = threading.Event()  # another NOTIFY came: ask det_task.should_preempt
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()  # close() ends the watcher's wait at once
        self._listened = False  # whether a connection of the session has LISTENed yet
        # Checkpoints being written, not yet recorded: what to remove if the run is fenced.
        self._discards: dict[str, Callable[[], None]] = {}
        self._session = Reconnecting(db_url, on_connect=self._listen)
        # Names this transport's metrics batches (metric_batches.writer).
        self._writer_id = uuidlib.uuid4()
        self._writer = ReportWriter(self._write_reports, max_bytes=buffer_bytes,
                                    name=f"det-reports-{allocation_id}")
        atexit.register(self._writer.flush)
        self._watcher = threading.Thread(
            target=self._watch_preemption, name=f"det-preempt-{allocation_id}", daemon=True
        )
        self._watcher.start()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "DbTransport":
        """Build from ``DET_DB_URL``, ``DET_ALLOCATION_ID``, ``DET_ALLOCATION_TOKEN``.

        Raises ``TaskEnvironmentError`` naming the missing variables.
        """
        env = os.environ if env is None else env
        names = ("DET_DB_URL", "DET_ALLOCATION_ID", "DET_ALLOCATION_TOKEN")
        missing = [n for n in names if not env.get(n)]
        if missing:
            raise TaskEnvironmentError(
                f"missing environment variable(s) {', '.join(missing)}: det.harness runs "
                "inside a det task, or off-cluster with a LocalTransport"
            )
        return cls(env["DET_DB_URL"], int(env["DET_ALLOCATION_ID"]), env["DET_ALLOCATION_TOKEN"])

    def _run(self, what: str, fn: Callable[[psycopg.Connection[Any]], T],
             give_up_after: float | None = None) -> T:
        """``fn`` on the session (``Reconnecting.run``); a refused token ends the process, a
        refused value (invalid_parameter_value) raises ``DetError``."""
        try:
            return self._session.run(f"{self._what}: {what}", fn, give_up_after)
        except psycopg.errors.InvalidAuthorizationSpecification as e:
            self._end_fenced(e)
        except psycopg.errors.InvalidParameterValue as e:
            # a value the task's functions refuse (schema.sql's bounds): one line naming it
            raise translate(e) from None

    def _end_fenced(self, e: psycopg.Error) -> NoReturn:
        """One line on stderr, then exit at once (see the class docstring)."""
        with _FENCE_LOCK:  # another thread that sees it too waits here until the exit
            for discard in list(self._discards.values()):  # no file without its row
                with contextlib.suppress(Exception):
                    discard()
            first = (str(e).strip().splitlines() or ["token refused"])[0]
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os.write(2, (f"det.harness: allocation {self.allocation_id} was ended by the "
                         f"cluster ({first}); stopping this process\n").encode())
            os._exit(FENCED_EXIT_STATUS)

    def _call(self, what: str, sql: str, *args: Any) -> Any:
        """``sql`` with the token and ``args``, retried after connection losses; the first
        column of the first row (or ``None``)."""
        def attempt(conn: psycopg.Connection[Any]) -> Any:
            row = conn.execute(sql, (self._token, *args)).fetchone()
            return row[0] if row else None

        return self._run(what, attempt)

    def task_info(self) -> TaskInfo:
        """``det_task.info(token)``."""
        return TaskInfo.from_json(self._call("task info", Q.task_info))

    def report_metrics(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Buffer one metrics row for ``det_task.report_metrics_batch``; blocks while the buffer is
        full. Raises ``DetError`` for a report the database could not store (see
        ``encode_metrics``), and a write error of the background thread."""
        self._writer.put_metrics(encode_metrics(group, steps_completed, metrics))

    def report_checkpoint(
        self,
        uuid: str,
        steps_completed: int,
        resources: Mapping[str, int],
        metadata: Mapping[str, Any],
    ) -> None:
        """Flush the metrics, then ``det_task.report_checkpoint(token, uuid, steps_completed,
        resources, metadata)``."""
        self._writer.flush()
        args = (self._token, uuid, steps_completed, Jsonb(dict(resources)),
                Jsonb(json_safe(metadata)))
        unknown = False  # whether an earlier attempt was sent and its outcome lost

        def attempt(conn: psycopg.Connection[Any]) -> None:
            nonlocal unknown
            try:
                conn.execute(Q.report_checkpoint, args)
            except psycopg.errors.UniqueViolation as e:
                # The earlier attempt committed and lost its answer: the row is ours.
                if not (unknown and e.diag.constraint_name == "checkpoints_pkey"):
                    raise
            except Exception as e:
                unknown = unknown or retry.is_connection_lost(e)
                raise
            # Recorded: its files stay. Under the session's lock, so a fence seen by another
            # call comes before (the record is refused) or after this (the files are kept).
            self._discards.pop(uuid, None)

        self._run(f"report checkpoint {uuid}", attempt)

    @contextmanager
    def checkpoint_guard(self, uuid: str, discard: Callable[[], None]) -> Iterator[None]:
        """Around writing checkpoint ``uuid`` and :meth:`report_checkpoint`:
        ``det_task.checkpoint_begin(token)`` first, so a run whose allocation was ended writes no
        file (the refusal ends the process, see the class docstring); until the checkpoint is
        recorded, a refusal seen by any call runs ``discard`` (remove its files) before the
        process ends, so no checkpoint directory is left without its row."""
        self._discards[uuid] = discard
        try:
            self._call(f"begin checkpoint {uuid}", Q.checkpoint_begin)
            yield
        finally:
            self._discards.pop(uuid, None)

    def report_storage_error(self, message: str) -> None:
        """``det_task.report_storage_error(token, message)``: ``message`` (one line naming the
        storage path and the OS error) becomes the run's exit reason, and its experiment is
        paused instead of the trial restarting (``det.reconciler.trials.settle``)."""
        self._call("report storage error", Q.report_storage_error, message)

    def current_op(self) -> SearcherOp | None:
        """``det_task.current_op(token)``: ``{"id", "length"}``, or NULL (-> ``None``).

        While the answer is ``{"wait": true}`` (the searcher has not yet read this trial's
        last report, so its next op is undecided) it asks again when the deciding pass's
        NOTIFY arrives, or after ``OP_POLL_SECONDS`` doubling up to ``OP_POLL_MAX_SECONDS``;
        a preemption request ends the wait with ``None``, so a stopping task never hangs here.
        """
        delay = OP_POLL_SECONDS
        while True:
            self._op_decided.clear()  # a NOTIFY from here on answers the call below
            op = self._call("current op", Q.current_op)
            if op is None or "id" in op or self.should_preempt():
                break
            self._op_decided.wait(delay)
            delay = min(2 * delay, OP_POLL_MAX_SECONDS)
        if op is not None and "id" not in op:  # preempted while waiting
            return None
        if op is None:
            self.out_of_work = True
            return None
        return SearcherOp(int(op["id"]), int(op["length"]))

    def report_progress(self, op_id: int, units: float) -> None:
        """Buffer ``det_task.report_progress(token, op_id, units)`` (written with the metrics)."""
        self._writer.put_progress(op_id, units)

    def complete_op(self, op_id: int, metric: float) -> None:
        """Flush, then ``det_task.complete_op(token, op_id, metric)``."""
        self._writer.flush()
        self._call(f"complete op {op_id}", Q.complete_op, op_id, float(metric))

    def should_preempt(self) -> bool:
        """Reads the flag the watcher thread sets; no I/O. Once true it stays true."""
        return self._preempt.is_set()

    def request_preemption(self) -> None:
        """Set the flag from this process (the task entrypoint does on SIGTERM)."""
        self._signalled = True
        self._preempt.set()

    def stop_reason(self) -> str:
        """Why the run is asked to stop, for its log: ``det_task.stop_reason(token)``, or the
        agent's SIGTERM where the database does not (yet) say so."""
        why = self._call("stop reason", Q.stop_reason)
        return why or ("the agent stopped the task (SIGTERM)" if self._signalled
                       else "the platform asked the run to stop")

    def acknowledge_preemption(self) -> None:
        """Flush, then ``det_task.ack_preemption(token)``: the coming exit 0 means "preempted,
        resume me"."""
        self._writer.flush()
        self._call("acknowledge preemption", Q.ack_preemption)

    def report_early_exit(self, reason: str) -> None:
        """Flush, then ``det_task.report_early_exit(token, reason)``; ``reason`` in
        ``det.reasons.EarlyExitReason``."""
        self._writer.flush()
        self._call("report early exit", Q.report_early_exit, reason)

    def experiment_best_validation(self) -> float | None:
        """Flush (this trial's validations count), then
        ``det_task.experiment_best_validation(token)`` (NULL -> ``None``)."""
        self._writer.flush()
        value = self._call("best validation", Q.experiment_best_validation)
        return None if value is None else float(value)

    def set_trial_metadata(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        """``det_task.set_trial_metadata(token, metadata)``: merged into the trial's metadata, which
        it returns. Raises ``DetError`` for a key already set to another value."""
        merged = self._call("set trial metadata", Q.set_trial_metadata,
                            Jsonb(json_safe(dict(metadata))))
        return dict(merged)

    def trial_metadata(self) -> dict[str, Any]:
        """``det_task.trial_metadata(token)``."""
        return dict(self._call("trial metadata", Q.trial_metadata))

    def close(self) -> None:
        """Flush the buffered reports (waiting for the database if it is away), stop both
        threads and close the connection. Raises the writer's error if it stopped."""
        atexit.unregister(self._writer.flush)
        try:
            self._writer.close()
        finally:
            self._stop.set()
            os.write(self._wake_w, b"x")
            # Bounded: a watcher stuck on a dead network connection is a daemon, left behind.
            self._watcher.join(timeout=PREEMPT_POLL_SECONDS)
            self._session.close()
            if not self._watcher.is_alive():  # else a daemon still waits on the pipe
                os.close(self._wake_r)
                os.close(self._wake_w)

    def _write_reports(self, seq: int, rows: list[MetricsRow], progress: dict[int, float]) -> None:
        """The writer thread's ``WriteBatch``: the batch's metrics rows in one
        ``det_task.report_metrics_batch`` call, then the latest progress of each op.

        The JSON texts go as a binary array (``%b``): psycopg's text-array format escapes every
        quote of every element in Python, which cost ~20 us a row, more than the database's
        work on it (bench/metric_rows.py)."""
        if rows:
            self._call(
                f"report metrics (batch {seq}, {len(rows)} rows)",
                Q.report_metrics_batch,
                self._writer_id, seq, [r.group for r in rows],
                [r.steps_completed for r in rows], [r.values for r in rows],
            )
        for op_id, units in progress.items():
            self._call(f"report progress of op {op_id}", Q.report_progress, op_id, units)

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        """Each new connection of the session LISTENs on the allocation's channel."""
        conn.add_notify_handler(self._on_notify)
        channels.listen_task(conn, self._token)
        if self._listened:  # a NOTIFY may have been missed while there was no connection
            self._ask.set()
        self._listened = True

    def _on_notify(self, notify: psycopg.Notify) -> None:
        (self._op_decided if notify.payload == OP_DECIDED else self._ask).set()

    def _watch_preemption(self) -> None:
        """Ask ``det_task.should_preempt``; then, until a NOTIFY other than ``OP_DECIDED`` or
        ``PREEMPT_POLL_SECONDS`` have passed, read the session's connection whenever no call
        is using it (:meth:`Reconnecting.wait_for_notifies`), so that the NOTIFYs of the
        allocation's channel reach :meth:`_on_notify`; ask again. NOTIFY is only a hint
        (docs/architecture.md). A lost connection is reopened with backoff
        (``det.db.retry``), and LISTENs again; a refused token ends the process (fencing,
        see the class docstring); another error is printed and the watch goes on after one
        poll period."""
        retrying = retry.retrying(f"{self._what}: preemption watcher").copy(
            stop=tenacity.stop_when_event_set(self._stop), sleep=self._stop.wait)
        while not self._stop.is_set():
            self._ask.clear()
            try:
                preempted = retrying(lambda: self._run(
                    "should preempt",
                    lambda conn: conn.execute(Q.should_preempt, (self._token,)).fetchone()[0],
                    give_up_after=0))
            except Exception as e:
                if self._stop.is_set():
                    return
                print(f"det.harness: preemption watcher: {e}", file=sys.stderr)
                self._stop.wait(PREEMPT_POLL_SECONDS)
                continue
            if preempted:
                self._preempt.set()
                return
            deadline = time.monotonic() + PREEMPT_POLL_SECONDS
            while not self._stop.is_set() and not self._ask.is_set() \
                    and (left := deadline - time.monotonic()) > 0:
                self._session.wait_for_notifies(left, self._wake_r)


@dataclass
class LocalTransport:
    """``Transport`` without a database.

    ``ops`` are the searcher op lengths to hand out in order (absolute, in the unit of
    ``config["searcher"]["max_length"]``); by default one op of ``max_length``. Metrics are
    kept in ``metrics`` as ``(group, steps_completed, metrics)`` and printed when ``echo``;
    checkpoints in ``checkpoints`` as ``(uuid, steps_completed, resources, metadata)``;
    completed ops in ``completed_ops`` as ``(op_id, metric)``. ``request_preemption()`` makes
    ``should_preempt()`` true (for tests and Ctrl-C handling).
    """

    config: dict[str, Any]
    hparams: dict[str, Any]
    trial_seed: int = 0
    latest_checkpoint: str | None = None
    steps_completed: int = 0
    ops: list[int] | None = None
    echo: bool = True
    metrics: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    checkpoints: list[tuple[str, int, dict[str, int], dict[str, Any]]] = field(
        default_factory=list
    )
    completed_ops: list[tuple[int, float]] = field(default_factory=list)
    progress: list[tuple[int, float]] = field(default_factory=list)
    early_exit: str | None = None
    storage_error: str | None = None
    trial_metadata_: dict[str, Any] = field(default_factory=dict)
    out_of_work: bool = False
    preemption_acknowledged: bool = False
    _preempt: bool = False

    def __post_init__(self) -> None:
        if self.ops is None:
            max_length = (self.config.get("searcher") or {}).get("max_length") or {}
            self.ops = [int(v) for v in max_length.values()][:1]

    def _print(self, text: str) -> None:
        if self.echo:
            print(f"[det local] {text}", flush=True)

    def task_info(self) -> TaskInfo:
        """Allocation, trial and experiment ids are 0; ``slots`` is 1."""
        return TaskInfo(
            allocation_id=0, trial_id=0, experiment_id=0, config=self.config,
            hparams=self.hparams, trial_seed=self.trial_seed,
            latest_checkpoint=self.latest_checkpoint, steps_completed=self.steps_completed,
            slots=1,
        )

    def report_metrics(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Keep and print one metrics report."""
        values = json_safe(metrics)
        self.metrics.append((group, steps_completed, values))
        self._print(f"{group} metrics at batch {steps_completed}: {json.dumps(values)}")

    def report_checkpoint(
        self,
        uuid: str,
        steps_completed: int,
        resources: Mapping[str, int],
        metadata: Mapping[str, Any],
    ) -> None:
        """Keep the checkpoint and make it the latest one."""
        self.checkpoints.append((uuid, steps_completed, dict(resources), dict(metadata)))
        self.latest_checkpoint, self.steps_completed = uuid, steps_completed
        size = sum(resources.values())
        self._print(f"checkpoint {uuid} at batch {steps_completed} ({size} bytes)")

    @contextmanager
    def checkpoint_guard(self, uuid: str, discard: Callable[[], None]) -> Iterator[None]:
        """No platform to refuse a checkpoint: nothing to check."""
        yield

    def report_storage_error(self, message: str) -> None:
        """Keep the message (a local run has no run row to store it on)."""
        self.storage_error = message

    def current_op(self) -> SearcherOp | None:
        """The first op not yet completed, ids counting from 1."""
        assert self.ops is not None
        done = len(self.completed_ops)
        if done < len(self.ops):
            return SearcherOp(done + 1, self.ops[done])
        self.out_of_work = True
        return None

    def report_progress(self, op_id: int, units: float) -> None:
        """Keep the progress report."""
        self.progress.append((op_id, units))

    def complete_op(self, op_id: int, metric: float) -> None:
        """Record the op's searcher metric."""
        self.completed_ops.append((op_id, metric))
        self._print(f"searcher op {op_id} completed, metric {metric}")

    def request_preemption(self) -> None:
        """Make ``should_preempt()`` true from now on."""
        self._preempt = True

    def should_preempt(self) -> bool:
        """True after ``request_preemption()``."""
        return self._preempt

    def stop_reason(self) -> str:
        """Off a cluster only ``request_preemption()`` stops a run."""
        return "request_preemption() was called"

    def acknowledge_preemption(self) -> None:
        """Record the acknowledgement."""
        self.preemption_acknowledged = True

    def report_early_exit(self, reason: str) -> None:
        """Record and print the reason."""
        self.early_exit = reason
        self._print(f"early exit: {reason}")

    def set_trial_metadata(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        """Merge ``metadata`` into ``self.trial_metadata_`` as det_task.set_trial_metadata does
        (new keys added, objects merged; a key set to another value raises ``DetError``)."""
        self.trial_metadata_ = _merge_metadata(self.trial_metadata_, json_safe(dict(metadata)))
        self._print(f"set_metadata({dict(metadata)})")
        return copy.deepcopy(self.trial_metadata_)

    def trial_metadata(self) -> dict[str, Any]:
        """What ``set_trial_metadata`` merged so far."""
        return copy.deepcopy(self.trial_metadata_)

    def experiment_best_validation(self) -> float | None:
        """The best searcher metric among this run's completed ops (``None`` if none)."""
        values = [m for _, m in self.completed_ops]
        if not values:
            return None
        smaller = self.config["searcher"]["smaller_is_better"]
        return min(values) if smaller else max(values)

    def close(self) -> None:
        """Nothing to release."""


def _merge_metadata(current: dict[str, Any], addition: dict[str, Any],
                    path: str = "") -> dict[str, Any]:
    """``addition`` merged into a copy of ``current``: SQL ``det_internal.merge_metadata``'s
    rule."""
    merged = dict(current)
    for key, value in addition.items():
        dotted = f"{path}.{key}" if path else key
        if key not in merged or merged[key] == value:
            merged[key] = value
        elif isinstance(value, dict) and isinstance(merged[key], dict):
            merged[key] = _merge_metadata(merged[key], value, dotted)
        else:
            raise DetError(f'metadata key "{dotted}" is already set (to '
                           f'{json.dumps(merged[key])}); a key cannot be changed')
    return merged
