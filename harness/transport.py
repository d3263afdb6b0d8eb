"""How a task talks to the platform: a small ``Transport`` protocol and its two implementations.

* ``DbTransport`` calls the task's SQL functions in ``schema.sql`` (``det_task_info``,
  ``det_report_metrics``, ...) over one autocommit psycopg connection, authenticated by the
  allocation token (DESIGN.md, "Harness"). A background thread LISTENs on ``alloc_<id>`` and
  polls ``det_should_preempt`` so that ``should_preempt()`` only reads a flag.
* ``LocalTransport`` needs no database: for ``det experiment create --local`` and off-cluster
  use. Metrics are printed and kept in memory; one searcher op (or a given list of ops).
"""

import json
import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from det.harness.errors import TaskEnvironmentError

PREEMPT_POLL_SECONDS = 5.0
"""How often the preemption watcher asks ``det_should_preempt`` even without a NOTIFY."""

OP_POLL_SECONDS = 0.05
"""First pause between ``det_current_op`` calls while the searcher decides (doubles)."""

OP_POLL_MAX_SECONDS = 1.0
"""Longest pause between ``det_current_op`` calls while the searcher decides."""

EARLY_EXIT_REASONS = ("invalid_hp", "user_requested_stop", "errored")


@dataclass(frozen=True)
class TaskInfo:
    """Identity and starting point of a trial task (the ``det_task_info`` answer).

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
        """Build from the ``det_task_info`` JSON object."""
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

    def current_op(self) -> SearcherOp | None: ...

    def report_progress(self, op_id: int, units: float) -> None: ...

    def complete_op(self, op_id: int, metric: float) -> None: ...

    def should_preempt(self) -> bool: ...

    def acknowledge_preemption(self) -> None: ...

    def report_early_exit(self, reason: str) -> None: ...

    def experiment_best_validation(self) -> float | None: ...

    def close(self) -> None: ...


def json_safe(value: Any) -> Any:
    """Metrics -> JSON that PostgreSQL's jsonb accepts.

    Tensors and numpy scalars become Python numbers (one-element) or lists; NaN and +-inf,
    which JSON cannot carry, become the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.
    """
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "tolist"):  # torch tensors, numpy arrays and scalars
        return json_safe(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


class DbTransport:
    """``Transport`` over the SQL functions of ``schema.sql``.

    ``db_url`` is a libpq connection string, ``token`` the allocation token every function
    checks (each raises a PostgreSQL error for a bad token; psycopg raises it here).
    Starts the preemption watcher thread on construction; ``close()`` stops it.
    """

    def __init__(self, db_url: str, allocation_id: int, token: str) -> None:
        import psycopg

        self._db_url = db_url
        self._token = token
        self.allocation_id = allocation_id
        self._conn = psycopg.connect(db_url, autocommit=True)
        self._preempt = threading.Event()
        self._stop = threading.Event()
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

    def _call(self, sql: str, *args: Any) -> Any:
        row = self._conn.execute(sql, (self._token, *args)).fetchone()
        return row[0] if row else None

    def task_info(self) -> TaskInfo:
        """``det_task_info(token)``."""
        return TaskInfo.from_json(self._call("SELECT det_task_info(%s)"))

    def report_metrics(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """``det_report_metrics(token, group, steps_completed, metrics)``."""
        from psycopg.types.json import Jsonb

        self._call(
            "SELECT det_report_metrics(%s, %s, %s, %s)",
            group, steps_completed, Jsonb(json_safe(metrics)),
        )

    def report_checkpoint(
        self,
        uuid: str,
        steps_completed: int,
        resources: Mapping[str, int],
        metadata: Mapping[str, Any],
    ) -> None:
        """``det_report_checkpoint(token, uuid, steps_completed, resources, metadata)``."""
        from psycopg.types.json import Jsonb

        self._call(
            "SELECT det_report_checkpoint(%s, %s::uuid, %s, %s, %s)",
            uuid, steps_completed, Jsonb(dict(resources)), Jsonb(json_safe(metadata)),
        )

    def current_op(self) -> SearcherOp | None:
        """``det_current_op(token)``: ``{"id", "length"}``, or NULL (-> ``None``).

        While the answer is ``{"wait": true}`` (the searcher has not yet read this trial's
        last report, so its next op is undecided) it asks again, every
        ``OP_POLL_SECONDS`` doubling up to ``OP_POLL_MAX_SECONDS``; a preemption request
        ends the wait with ``None``, so a stopping task never hangs here.
        """
        delay = OP_POLL_SECONDS
        while (op := self._call("SELECT det_current_op(%s)")) is not None and "id" not in op:
            if self.should_preempt():
                return None
            time.sleep(delay)
            delay = min(2 * delay, OP_POLL_MAX_SECONDS)
        return None if op is None else SearcherOp(int(op["id"]), int(op["length"]))

    def report_progress(self, op_id: int, units: float) -> None:
        """``det_report_progress(token, op_id, units)``."""
        self._call("SELECT det_report_progress(%s, %s, %s)", op_id, float(units))

    def complete_op(self, op_id: int, metric: float) -> None:
        """``det_complete_op(token, op_id, metric)``."""
        self._call("SELECT det_complete_op(%s, %s, %s)", op_id, float(metric))

    def should_preempt(self) -> bool:
        """Reads the flag the watcher thread sets; no I/O. Once true it stays true."""
        return self._preempt.is_set()

    def request_preemption(self) -> None:
        """Set the flag from this process (the task entrypoint does on SIGTERM)."""
        self._preempt.set()

    def acknowledge_preemption(self) -> None:
        """``det_ack_preemption(token)``: the coming exit 0 means "preempted, resume me"."""
        self._call("SELECT det_ack_preemption(%s)")

    def report_early_exit(self, reason: str) -> None:
        """``det_report_early_exit(token, reason)``; ``reason`` in ``EARLY_EXIT_REASONS``."""
        self._call("SELECT det_report_early_exit(%s, %s)", reason)

    def experiment_best_validation(self) -> float | None:
        """``det_experiment_best_validation(token)`` (NULL -> ``None``)."""
        value = self._call("SELECT det_experiment_best_validation(%s)")
        return None if value is None else float(value)

    def close(self) -> None:
        """Stop the watcher thread and close the connection."""
        self._stop.set()
        self._watcher.join(timeout=PREEMPT_POLL_SECONDS + 1)
        self._conn.close()

    def _watch_preemption(self) -> None:
        """LISTEN ``alloc_<id>`` on a connection of its own; on each NOTIFY, and at least every
        ``PREEMPT_POLL_SECONDS``, ask ``det_should_preempt``. NOTIFY is only a hint (DESIGN.md
        principle 4); connection errors are printed and retried after one poll period."""
        import psycopg

        while not self._stop.is_set() and not self._preempt.is_set():
            try:
                with psycopg.connect(self._db_url, autocommit=True) as conn:
                    conn.execute(f"LISTEN alloc_{int(self.allocation_id)}")
                    while not self._stop.is_set():
                        row = conn.execute(
                            "SELECT det_should_preempt(%s)", (self._token,)
                        ).fetchone()
                        if row and row[0]:
                            self._preempt.set()
                            return
                        for _ in conn.notifies(timeout=PREEMPT_POLL_SECONDS, stop_after=1):
                            pass
            except psycopg.Error as e:
                print(f"det.harness: preemption watcher: {e}", file=sys.stderr)
                self._stop.wait(PREEMPT_POLL_SECONDS)


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

    def current_op(self) -> SearcherOp | None:
        """The first op not yet completed, ids counting from 1."""
        assert self.ops is not None
        done = len(self.completed_ops)
        return SearcherOp(done + 1, self.ops[done]) if done < len(self.ops) else None

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

    def acknowledge_preemption(self) -> None:
        """Record the acknowledgement."""
        self.preemption_acknowledged = True

    def report_early_exit(self, reason: str) -> None:
        """Record and print the reason."""
        self.early_exit = reason
        self._print(f"early exit: {reason}")

    def experiment_best_validation(self) -> float | None:
        """The best searcher metric among this run's completed ops (``None`` if none)."""
        values = [m for _, m in self.completed_ops]
        if not values:
            return None
        smaller = (self.config.get("searcher") or {}).get("smaller_is_better", True)
        return min(values) if smaller else max(values)

    def close(self) -> None:
        """Nothing to release."""
