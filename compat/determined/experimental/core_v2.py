"""``determined.experimental.core_v2``: Determined 0.38.1's singleton Core API, for unmanaged
runs: any script, run outside det (``python train.py``), reports to det as its user.

``init(config=Config(name=..., hparams=..., searcher=..., checkpoint_storage=...,
workspace=..., project=..., external_experiment_id=..., external_trial_id=...))`` (or 0.38's
deprecated ``defaults=DefaultConfig(...)`` and ``unmanaged=UnmanagedConfig(...)``) makes an
unmanaged experiment with one trial in det, in one transaction (``det_user.unmanaged_start``:
submitted as ``det experiment create`` submits, the experiment's config validated by
det.configs), and fills the module attributes ``train``, ``checkpoint``, ``preempt``,
``distributed``, ``searcher`` (``None`` without ``searcher.max_length``, as upstream) and
``info``. The same external ids (of the same user) resume that experiment and trial: a new
run of the trial starts from its latest checkpoint (``info.latest_checkpoint``). det never
schedules anything for it: no searcher, no run placed; ``preempt.should_preempt()`` is always
False. ``close()`` (also at exit) ends the trial COMPLETED, or ERROR when the script raised
or called ``sys.exit`` with a non-zero code, as upstream's exit hook does; the experiment
ends with its last live trial.

The script connects and acts as the SDK client does (:mod:`determined.experimental._session`:
the CLI's user, or ``client.login``'s); each report is one transaction of a
``det_unmanaged_*`` function, which only the trial's owner may call (row-level rules in
schema.sql). Checkpoints go to ``checkpoint_storage`` (a directory path, or a storage
section; default upstream's ``~/.local/share/determined/checkpoints``) through det's
checkpoint storage code. Logs are not shipped: the script's output stays on its terminal
(upstream's log shipper intercepts stdout; det keeps task logs for the runs it starts).

Inside a det trial task ``init`` opens that task's Core API instead (managed mode) and
ignores the config, as upstream.
"""

import atexit
import dataclasses
import os
import shlex
import sys
import types
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from det.db.reconnect import Reconnecting
from det.db.sqlstate import translate
from det.errors import DetError
from det.harness.transport import SearcherOp, TaskInfo, json_safe
from det.sql import named
from determined import core
from determined._info import ClusterInfo, get_cluster_info, on_cluster
from determined.core import DistributedContext, PreemptMode, TensorboardMode

__all__ = ["Config", "DefaultConfig", "DistributedContext", "PreemptMode", "TensorboardMode",
           "UnmanagedConfig", "checkpoint", "close", "distributed", "info", "init", "preempt",
           "searcher", "train", "url_reverse_webui_exp_view"]

Q = named("sdk")

train: core.TrainContext | None = None
checkpoint: core.CheckpointContext | None = None
preempt: core.PreemptContext | None = None
distributed: DistributedContext | None = None
searcher: core.SearcherContext | None = None
info: ClusterInfo | None = None


@dataclasses.dataclass
class Config:
    """What an unmanaged experiment is made with (0.38's fields; ignored in managed mode).

    ``hparams``: the trial's hyperparameters (values). ``searcher``: its ``metric`` and
    ``smaller_is_better`` rank the checkpoints (default ``{name: single, metric:
    unmanaged}``). ``checkpoint_storage``: a directory path or a storage section.
    ``external_experiment_id`` / ``external_trial_id``: resume the experiment / trial a
    previous run with the same ids made (a trial id needs the experiment id too)."""

    name: str | None = None
    hparams: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    description: str | None = None
    labels: list[str] | None = None
    workspace: str | None = None
    project: str | None = None
    checkpoint_storage: str | dict[str, Any] | None = None
    searcher: dict[str, Any] | None = None
    external_experiment_id: str | None = None
    external_trial_id: str | None = None


class DefaultConfig(Config):
    """0.38's deprecated name of ``Config`` for ``init(defaults=...)``."""

    def __init__(self, **kwargs: Any) -> None:
        warnings.warn("'DefaultConfig' is deprecated: use `Config`", FutureWarning, stacklevel=2)
        super().__init__(**kwargs)


class UnmanagedConfig(Config):
    """0.38's deprecated ``init(unmanaged=...)``: its workspace, project and external ids
    fill those ``defaults`` leaves unset."""

    def __init__(self, **kwargs: Any) -> None:
        warnings.warn("'UnmanagedConfig' is deprecated: use `Config`", FutureWarning,
                      stacklevel=2)
        super().__init__(**kwargs)


class UnmanagedTransport:
    """det's harness ``Transport`` for an unmanaged run: each report one call of a
    ``det_unmanaged_*`` function on one connection kept for the run (det.db.reconnect:
    reopened after a loss), as the client's user. No searcher operations and no preemption:
    det never asks an unmanaged run to stop."""

    out_of_work = True

    def __init__(self, url: str, task: TaskInfo) -> None:
        self._db = Reconnecting(url, dict_row)
        self._task = task
        self._allocation = task.allocation_id

    def _call(self, what: str, sql: str, *args: Any) -> Any:
        def attempt(conn: psycopg.Connection[Any]) -> Any:
            return conn.execute(sql, args).fetchone()

        try:
            return self._db.run(what, attempt)
        except psycopg.Error as e:
            raise translate(e) from e

    def task_info(self) -> TaskInfo:
        """What ``det_user.unmanaged_start`` answered."""
        return self._task

    def report_metrics(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """One metrics row (det_internal.append_metrics's checks)."""
        self._call("report metrics", Q.unmanaged_report_metrics, self._allocation, group,
                   steps_completed, Jsonb(json_safe(metrics)))

    def report_checkpoint(self, uuid: str, steps_completed: int, resources: Mapping[str, int],
                          metadata: Mapping[str, Any]) -> None:
        """Record a stored checkpoint: the trial's restart point."""
        self._call("report a checkpoint", Q.unmanaged_report_checkpoint, self._allocation, uuid,
                   steps_completed, Jsonb(dict(resources)), Jsonb(json_safe(metadata)))

    @contextmanager
    def checkpoint_guard(self, uuid: str, discard: Callable[[], None]) -> Iterator[None]:
        """Nothing to fence: det_user.unmanaged_report_checkpoint refuses a replaced run's
        report."""
        yield

    def report_storage_error(self, message: str) -> None:
        """No pass watches an unmanaged run: the error reaches the script as the
        CheckpointStorageError the checkpoint context raises."""

    def current_op(self) -> SearcherOp | None:
        """None: an unmanaged trial has no searcher operations (its script decides)."""
        return None

    def report_progress(self, op_id: int, units: float) -> None:
        """Never called: there are no operations (``current_op``)."""
        raise DetError("an unmanaged trial has no searcher operations")

    complete_op = report_progress

    def experiment_progress(self, progress: float) -> None:
        """core_v2's ``train.report_progress``: the experiment's progress (0 to 1)."""
        self._call("report progress", Q.unmanaged_progress, self._allocation, float(progress))

    def should_preempt(self) -> bool:
        """False: det never stops an unmanaged run (upstream's DummyPreemptContext)."""
        return False

    def acknowledge_preemption(self) -> None:
        """Nothing was asked."""

    def stop_reason(self) -> str:
        """Never asked to stop."""
        return "an unmanaged run is never asked to stop"

    def report_early_exit(self, reason: str) -> None:
        """Refused: an unmanaged script ends its trial by ``close()`` or an exception."""
        raise DetError("report_early_exit: an unmanaged trial ends with core_v2.close() or "
                       "the script's exception")

    def experiment_best_validation(self) -> float | None:
        """The best searcher metric among the experiment's trials (RLS: the user's view)."""
        row = self._call("read the best validation", Q.unmanaged_best_validation,
                         self._task.experiment_id)
        return None if row is None else row["best"]

    def set_trial_metadata(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        """Refused: trial metadata is a managed task's (det_task.set_trial_metadata)."""
        raise DetError("set_metadata: not supported for an unmanaged trial")

    def trial_metadata(self) -> dict[str, Any]:
        """The trial's metadata (empty: unmanaged runs cannot set it)."""
        row = self._call("read trial metadata", Q.unmanaged_trial_metadata,
                         self._task.trial_id)
        return dict(row["metadata"]) if row else {}

    def end(self, error: str | None) -> None:
        """End the run and its trial: COMPLETED, or ERROR with ``error`` as its reason."""
        self._call("end the run", Q.unmanaged_end, self._allocation, error)

    def close(self) -> None:
        """Release the connection."""
        self._db.close()


class _UnmanagedTrain(core.TrainContext):
    """``train`` of an unmanaged run: ``report_progress(fraction)`` sets the experiment's
    progress (det has no searcher operation to put it on)."""

    def report_progress(self, progress: float) -> None:  # type: ignore[override]
        """Record ``progress`` (0 to 1) as the experiment's. Raises DetError outside it."""
        if not 0 <= float(progress) <= 1:
            raise DetError(f"report_progress: progress must be between 0 and 1, got {progress}")
        assert isinstance(self._transport, UnmanagedTransport)
        self._transport.experiment_progress(progress)


class _ExitWatch:
    """How the script is ending: an uncaught exception (sys.excepthook) or ``sys.exit(code)``,
    so that ``close`` at exit marks the trial ERROR as upstream's exit hook does."""

    def __init__(self) -> None:
        self.error: str | None = None
        self._excepthook = sys.excepthook
        self._exit = sys.exit
        sys.excepthook = self._on_exception
        sys.exit = self._on_exit  # type: ignore[assignment]

    def _on_exception(self, kind: type[BaseException], value: BaseException,
                      tb: types.TracebackType | None) -> None:
        self.error = f"{kind.__name__}: {value}"
        self._excepthook(kind, value, tb)

    def _on_exit(self, code: Any = None) -> None:
        if code not in (None, 0):
            self.error = f"exit code {code}"
        self._exit(code)

    def restore(self) -> None:
        sys.excepthook, sys.exit = self._excepthook, self._exit  # type: ignore[assignment]


_context: core.Context | None = None
_transport: UnmanagedTransport | None = None
_exit_watch: _ExitWatch | None = None
_atexit_registered = False


def _merge_config(config: Config | None, defaults: Config | None,
                  unmanaged: Config | None) -> Config:
    """``config``, else ``defaults`` with ``unmanaged``'s workspace, project and external ids
    where it leaves them unset (0.38's rule). Raises ValueError when neither is given."""
    if config is not None:
        return config
    if defaults is None:
        raise ValueError("config: either specify `config` (or `defaults`), or run as a "
                         "managed det trial")
    if unmanaged is not None:
        for name in ("workspace", "project", "external_experiment_id", "external_trial_id"):
            if getattr(defaults, name) is None:
                setattr(defaults, name, getattr(unmanaged, name))
    return defaults


def _storage(section: str | dict[str, Any] | None) -> dict[str, Any]:
    """The checkpoint_storage section: a path string is a shared_fs directory; None is
    upstream's default directory."""
    if section is None:
        section = str(core.default_storage_path() / "checkpoints")
    if isinstance(section, str):
        return {"type": "shared_fs", "host_path": os.path.abspath(section)}
    return dict(section)


def _entrypoint() -> str:
    """What ran: the interpreter and the script's command line (the config's entrypoint)."""
    argv = [a for a in sys.argv if a] or ["-c"]
    return shlex.join([os.path.basename(sys.executable) or "python", *argv])


def _start(cfg: Config, storage: dict[str, Any]) -> TaskInfo:
    """Create or resume the experiment and trial and start a run (one transaction of
    det_user.unmanaged_start); its TaskInfo."""
    import yaml

    from det.queries.workspaces import placement, workspace_defaults
    from det.submission import validated_config
    from determined.experimental._session import db

    data = {k: v for k, v in {
        "name": cfg.name or f"unmanaged-{uuid.uuid4().hex[:8]}",
        "description": cfg.description, "labels": cfg.labels, "data": cfg.data,
        "workspace": cfg.workspace, "project": cfg.project,
        "entrypoint": _entrypoint(),
        "searcher": cfg.searcher or {"name": "single", "metric": "unmanaged"},
        "checkpoint_storage": storage,
    }.items() if v is not None}
    text = yaml.safe_dump(data, sort_keys=False)
    source = "core_v2.Config"
    with db() as conn:
        workspace, project = placement(conn, text, source, None, None, None)
        defaults = workspace_defaults(conn, workspace)
    expanded = validated_config(data, source, defaults=defaults).expanded()
    with db() as conn:
        row = conn.execute(
            Q.unmanaged_start,
            (Jsonb(expanded), text, workspace, project, cfg.external_experiment_id,
             cfg.external_trial_id,
             Jsonb(json_safe(cfg.hparams)) if cfg.hparams is not None else None)).fetchone()
    return TaskInfo.from_json(row["info"])


def init(*, config: Config | None = None, defaults: DefaultConfig | None = None,
         unmanaged: UnmanagedConfig | None = None,
         distributed: DistributedContext | None = None,
         checkpoint_storage: str | dict[str, Any] | None = None,
         preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
         tensorboard_mode: TensorboardMode = TensorboardMode.AUTO) -> None:
    """Open the Core API as this module's attributes (see the module's docstring); a context
    already open is closed first (COMPLETED). ``checkpoint_storage`` overrides the config's.
    ``tensorboard_mode`` has no effect (det writes TensorBoard files for managed trials).

    Raises:
        ValueError: neither ``config`` nor ``defaults`` outside a det task.
        det.errors.ConfigError: the config is invalid (naming the field).
        det.errors.PermissionDeniedError: no Editor role where the experiment goes, or the
            external ids name an experiment the user may not write into.
        det.errors.DetError: ``external_trial_id`` without ``external_experiment_id``, or a
            resumed experiment that is paused or stopping.
    """
    global _context, _transport, _exit_watch, _atexit_registered
    global train, checkpoint, preempt, searcher, info
    if _context is not None:
        close()
    if defaults is not None or unmanaged is not None:
        warnings.warn("'defaults' and 'unmanaged' are deprecated: use `config`",
                      FutureWarning, stacklevel=2)
    if on_cluster():  # managed: the task's own trial
        ctx = core.init(distributed=distributed, checkpoint_storage=checkpoint_storage,
                        preempt_mode=preempt_mode)
        run_info = get_cluster_info()
    else:
        from determined.experimental._session import url

        cfg = _merge_config(config, defaults, unmanaged)
        storage = _storage(checkpoint_storage or cfg.checkpoint_storage)
        task = _start(cfg, storage)
        _transport = UnmanagedTransport(url(), task)
        ctx = core.init(transport=_transport, checkpoint_storage=storage,
                        distributed=distributed or core.DummyDistributedContext(),
                        preempt_mode=preempt_mode)
        run_info = dataclasses.replace(ClusterInfo.from_task_info(task, {}),
                                       agent_id="unmanaged")
        ctx.info = run_info
        ctx.train = _UnmanagedTrain(_transport, ctx.tensorboard,
                                    task.config.get("searcher"), ctx.searcher)
        _exit_watch = _ExitWatch()
    _context = ctx
    train, checkpoint, preempt = ctx.train, ctx.checkpoint, ctx.preempt
    globals()["distributed"] = ctx.distributed
    searcher = ctx.searcher if (ctx.task_info.config.get("searcher") or {}).get(
        "max_length") else None
    info = run_info
    if not _atexit_registered:
        atexit.register(close)
        _atexit_registered = True


def close() -> None:
    """End the run: its trial COMPLETED, or ERROR if the script is exiting on an uncaught
    exception or a non-zero ``sys.exit`` (the experiment ends with its last live trial).
    Idempotent; called at exit too."""
    global _context, _transport, _exit_watch, train
    ctx, transport, watch = _context, _transport, _exit_watch
    _context = _transport = _exit_watch = None
    train = None
    if ctx is None:
        return
    try:
        if transport is not None:
            transport.end(watch.error if watch is not None else None)
    finally:
        ctx.close()  # closes the transport too (det.harness.core.init)
        if watch is not None:
            watch.restore()


def url_reverse_webui_exp_view() -> str:
    """The WebUI page of this run's experiment, on det serve (``DET_MASTER``, else the one
    ``det cluster up`` runs). Raises DetError when neither is known, or before ``init``."""
    from det.cli.notebooks import serve_url

    if info is None:
        raise DetError("url_reverse_webui_exp_view: call core_v2.init() first")
    base = serve_url()
    if base is None:
        raise DetError("url_reverse_webui_exp_view: no det serve found: set DET_MASTER to "
                       "its URL")
    return f"{base}/#/experiments/{info.trial.experiment_id}"
