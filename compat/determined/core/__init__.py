"""``determined.core``: 0.38's Core API over det's (``det.harness.core``).

``init()`` returns a ``Context`` (use it as a context manager, or call ``close()``). Inside a
det task it reports through the database like det's own harness; off-cluster (no task
environment) it returns working stand-ins as Determined does: metrics are logged, checkpoints
go to a local directory (``checkpoint_storage``, else ``~/.local/share/determined``), the
searcher hands out one operation of length 1 and ``info`` is ``None``.
"""

import enum
import logging
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from det.errors import DetError
from det.harness import core as det_core
from det.harness.core import DistributedContext
from det.harness.transport import LocalTransport, Transport
from det.reasons import EarlyExitReason as _DetReason
from determined._info import ClusterInfo, on_cluster, task_transport

__all__ = [
    "CheckpointContext",
    "Context",
    "DistributedContext",
    "DownloadMode",
    "DummyDistributedContext",
    "EarlyExitReason",
    "PreemptContext",
    "PreemptMode",
    "ProfilerContext",
    "SearcherContext",
    "SearcherMode",
    "SearcherOperation",
    "TensorboardMode",
    "TrainContext",
    "Unit",
    "init",
]

logger = logging.getLogger("determined.core")


class PreemptMode(enum.Enum):
    """Who asks the platform whether to stop. det's tasks read one flag kept current by a
    background listener, so every mode answers the same."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    WorkersAskMaster = "WORKERS_ASK_MASTER"


class TensorboardMode(enum.Enum):
    """Whether metrics are written as TensorBoard events automatically or by the user."""

    AUTO = "AUTO"
    MANUAL = "MANUAL"


class DownloadMode(enum.Enum):
    """How workers on one host share a checkpoint download (one process per task on det)."""

    LocalWorkersShareDownload = "LOCAL_WORKERS_SHARE_DOWNLOAD"
    NoSharedDownload = "NO_SHARED_DOWNLOAD"


class SearcherMode(enum.Enum):
    """Which workers ask for searcher operations."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHEIF_ONLY"  # sic: 0.38's value


class EarlyExitReason(enum.Enum):
    """Why a trial ends on purpose (``TrainContext.report_early_exit``)."""

    INVALID_HP = "EXITED_REASON_INVALID_HP"
    USER_REQUESTED_STOP = "EXITED_REASON_USER_REQUESTED_STOP"


class Unit(enum.Enum):
    """The unit of ``searcher.max_length``."""

    EPOCHS = "UNIT_EPOCHS"
    RECORDS = "UNIT_RECORDS"
    BATCHES = "UNIT_BATCHES"


_DET_REASON = {EarlyExitReason.INVALID_HP: _DetReason.INVALID_HP,
               EarlyExitReason.USER_REQUESTED_STOP: _DetReason.USER_REQUESTED_STOP}


class DummyDistributedContext(DistributedContext):
    """The one-process ``DistributedContext``: rank 0 of 1."""


class TrainContext(det_core.TrainContext):
    """``core_context.train``: metrics, progress, early exit, status (0.38 signatures)."""

    def __init__(self, base: det_core.TrainContext, searcher: "SearcherContext") -> None:
        super().__init__(base._transport, base._tensorboard, base._searcher_config)
        self._searcher = searcher

    def report_training_metrics(self, steps_completed: int, metrics: Mapping[str, Any],
                                batch_metrics: list[dict[str, Any]] | None = None) -> None:
        """Report metrics of group ``training`` at ``steps_completed`` batches.

        ``batch_metrics`` (per-batch values, shown by Determined's WebUI only) is not stored
        by det; a warning says so once.
        """
        if batch_metrics is not None and not getattr(self, "_warned_batch_metrics", False):
            logger.warning("report_training_metrics: batch_metrics are not stored by det")
            self._warned_batch_metrics = True
        super().report_training_metrics(steps_completed, metrics)

    def report_progress(self, progress: float) -> None:  # type: ignore[override]
        """Report the fraction ``progress`` (0 to 1) of the trial's work done.

        det keeps progress per searcher operation: it is recorded on the current operation
        when ``searcher.max_length`` bounds it, and only logged otherwise. Raises
        ``DetError`` for a value outside [0, 1].
        """
        if not 0 <= float(progress) <= 1:
            raise DetError(f"report_progress: progress must be between 0 and 1, got {progress}")
        op = self._searcher.current_bounded_op()
        if op is not None:
            op.report_progress(float(progress) * op.length)
        logger.info(f"report_progress with progress={progress}")

    def report_early_exit(self, reason: EarlyExitReason | str) -> None:  # type: ignore[override]
        """End the trial on purpose (``EarlyExitReason.INVALID_HP`` or
        ``USER_REQUESTED_STOP``)."""
        if isinstance(reason, EarlyExitReason):
            reason = _DET_REASON[reason]
        super().report_early_exit(reason)

    def set_status(self, status: str) -> None:
        """Write ``status`` to the trial's logs (det has no status field to show it in)."""
        logger.info(f"status: {status}")

    def get_tensorboard_path(self) -> pathlib.Path:
        """The local directory of this trial's TensorBoard event files: on a cluster, copied
        to the trial's storage at each checkpoint and at the end; off it, a temporary one."""
        if self._tensorboard is not None:
            return self._tensorboard.path
        if getattr(self, "_local_tensorboard", None) is None:
            self._local_tensorboard = pathlib.Path(tempfile.mkdtemp(prefix="det-tensorboard-"))
        return self._local_tensorboard


class CheckpointContext(det_core.CheckpointContext):
    """``core_context.checkpoint`` with 0.38's signatures: ``store_path``, ``upload``,
    ``download``, ``restore_path``, ``get_metadata``, ``delete``."""

    def __init__(self, base: det_core.CheckpointContext, distributed: DistributedContext,
                 on_cluster: bool) -> None:
        super().__init__(base._transport, base.storage, base._tensorboard)
        self._distributed = distributed
        self._on_cluster = on_cluster

    def _check_shard(self, shard: bool, what: str) -> None:
        size = self._distributed.get_size()
        if shard and size > 1:
            raise DetError(f"checkpoint.{what}(shard=True) across {size} workers is not "
                           "supported by det yet: store from the chief (rank 0) alone")
        if not shard and self._distributed.get_rank() != 0:
            raise DetError(f"checkpoint.{what}: only the chief (rank 0) may store a checkpoint "
                           "when shard=False")

    def _metadata(self, metadata: Mapping[str, Any] | None) -> dict[str, Any]:
        metadata = dict(metadata or {})
        if "steps_completed" not in metadata:
            if self._on_cluster:
                raise DetError("checkpoint metadata must include 'steps_completed' (batches)")
            metadata["steps_completed"] = 0  # off-cluster, as Determined's dummy context
        return metadata

    @contextmanager
    def store_path(  # type: ignore[override]
        self, metadata: Mapping[str, Any] | None = None, *, shard: bool = False
    ) -> Iterator[tuple[pathlib.Path, str]]:
        """Yield ``(path, storage_id)``: write the checkpoint under ``path``; it is stored and
        reported when the block exits cleanly. ``metadata`` must hold ``steps_completed`` on
        a cluster."""
        self._check_shard(shard, "store_path")
        with super().store_path(self._metadata(metadata)) as (path, uuid):
            yield path, uuid
        logger.info(f"saved checkpoint {uuid}")

    def upload(self, ckpt_dir: str | os.PathLike[str] | None,
               metadata: Mapping[str, Any] | None = None, *, shard: bool = False,
               selector: Callable[[str], bool] | None = None) -> str:
        """Store the files of the local directory ``ckpt_dir`` (those ``selector`` accepts,
        by relative path) as a new checkpoint; returns its storage id."""
        with self.store_path(metadata, shard=shard) as (path, uuid):
            if ckpt_dir is not None:
                src = pathlib.Path(ckpt_dir)
                for file in sorted(p for p in src.rglob("*") if p.is_file()):
                    rel = file.relative_to(src).as_posix()
                    if rel == "metadata.json" or (selector is not None and not selector(rel)):
                        continue
                    (path / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(file, path / rel)
        return uuid

    def download(self, storage_id: str, ckpt_dir: str | os.PathLike[str],  # type: ignore[override]
                 download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload, *,
                 selector: Callable[[str], bool] | None = None) -> None:
        """Copy checkpoint ``storage_id`` into ``ckpt_dir`` (the files ``selector`` accepts)."""
        super().download(storage_id, ckpt_dir)
        if selector is not None:
            root = pathlib.Path(ckpt_dir)
            for file in [p for p in root.rglob("*") if p.is_file()]:
                if not selector(file.relative_to(root).as_posix()):
                    file.unlink()

    @contextmanager
    def restore_path(  # type: ignore[override]
        self, storage_id: str,
        download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload, *,
        selector: Callable[[str], bool] | None = None,
    ) -> Iterator[pathlib.Path]:
        """Yield a local path holding checkpoint ``storage_id`` (read it, don't modify it)."""
        with super().restore_path(storage_id) as path:
            yield path

    def delete(self, storage_id: str) -> None:
        """Remove checkpoint ``storage_id``. Off-cluster its directory is removed; on a det
        cluster checkpoints are deleted by ``det checkpoint delete`` and the experiment's GC
        policy (the database tracks them), so this raises ``DetError``."""
        if self._on_cluster:
            raise DetError(f"checkpoint.delete({storage_id}): a det task cannot delete "
                           "checkpoints; use `det checkpoint delete` or the GC policy")
        self.storage.delete(storage_id)


class PreemptContext(det_core.PreemptContext):
    """``core_context.preempt``: ``should_preempt()``, ``acknowledge_preemption_signal()``."""

    def __init__(self, transport: Transport, mode: PreemptMode,
                 distributed: DistributedContext | None = None) -> None:
        super().__init__(transport, distributed)
        self.mode = mode

    def start(self) -> "PreemptContext":
        """Nothing to start: det's transport watches for preemption from ``init()`` on."""
        return self

    def close(self) -> None:
        """Nothing to stop here: the transport's watcher ends with the ``Context``."""


class SearcherOperation(det_core.SearcherOperation):
    """One searcher operation: train to ``length`` (absolute, in ``searcher.max_length``'s
    unit), ``report_progress(length_done)``, then ``report_completed(metric)``."""

    def report_completed(self, searcher_metric: Any) -> None:
        """Close the operation with the searcher metric's value (a number)."""
        super().report_completed(float(searcher_metric))


class SearcherContext(det_core.SearcherContext):
    """``core_context.searcher`` (deprecated in 0.38, still used by many scripts)."""

    def __init__(self, transport: Transport, config: Mapping[str, Any], on_cluster: bool,
                 distributed: DistributedContext | None = None) -> None:
        super().__init__(transport, config, distributed)
        # Off-cluster the one operation has length 1, as Determined's dummy searcher's.
        self._max_length = (config.get("searcher") or {}).get("max_length") if on_cluster \
            else {"batches": 1}
        self._current: SearcherOperation | None = None

    def operations(  # type: ignore[override]
        self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief, auto_ack: bool = True
    ) -> Iterator[SearcherOperation]:
        """Yield the trial's searcher operations; each must be ``report_completed`` before the
        next. Raises ``DetError`` when the config sets no ``searcher.max_length`` (0.38's
        ``SearcherContextMissing``: the code then decides its own length)."""
        if not self._max_length:
            raise DetError("core_context.searcher: the experiment config sets no "
                           "searcher.max_length, so there are no searcher operations; train "
                           "for a length the code decides")
        while (op := self._next_op()) is not None:  # the chief asks and tells the others
            operation = SearcherOperation(self._transport, op, self._unit, self._dist.rank == 0)
            self._current = operation
            yield operation
            if not operation.completed:
                raise DetError("you must call op.report_completed() on each operation")
        self._current = None

    def current_bounded_op(self) -> SearcherOperation | None:
        """The operation being worked on, if ``searcher.max_length`` bounds it."""
        return self._current if self._max_length else None

    def acknowledge_out_of_ops(self) -> None:
        """Nothing to acknowledge: the trial ends when its code exits."""

    def get_configured_units(self) -> Unit | None:  # type: ignore[override]
        """The unit of ``searcher.max_length`` (``None`` without one)."""
        if not self._max_length:
            return None
        return Unit[self._unit.upper()]


class ProfilerContext:
    """``core_context.profiler``: det collects no system metrics; ``on``/``off`` log that."""

    def on(self, sampling_interval: int = 1, samples_per_report: int = 10) -> None:
        """Log that system-metrics profiling is not collected by det."""
        logger.info("profiler.on: det does not collect system metrics")

    def off(self) -> None:
        """Nothing to stop."""


class Context:
    """What ``init()`` returns: ``train``, ``checkpoint``, ``preempt``, ``searcher``,
    ``distributed``, ``profiler`` and ``info`` (``ClusterInfo``, ``None`` off-cluster)."""

    def __init__(self, inner: det_core.Context, info: ClusterInfo | None,
                 distributed: DistributedContext, preempt_mode: PreemptMode,
                 close: Callable[[], None]) -> None:
        self._inner = inner
        self._close = close
        self.info = info
        self.distributed = distributed
        self.searcher = SearcherContext(inner.transport, inner.info.config, info is not None,
                                        distributed)
        self.train = TrainContext(inner.train, self.searcher)
        self.checkpoint = CheckpointContext(inner.checkpoint, distributed, info is not None)
        self.preempt = PreemptContext(inner.transport, preempt_mode, distributed)
        self.profiler = ProfilerContext()

    @property
    def det_context(self) -> det_core.Context:
        """det's own Core API context underneath (``det.harness.core.Context``)."""
        return self._inner

    def start(self) -> "Context":
        """Nothing to start (kept for 0.38 code that calls it)."""
        return self

    def close(self, exc: BaseException | None = None) -> None:
        """Flush what was reported and release the connection."""
        self._close()

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def default_storage_path() -> pathlib.Path:
    """Where off-cluster checkpoints go by default, as in Determined."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return pathlib.Path(base, "determined")


def _storage(checkpoint_storage: str | Mapping[str, Any] | None, on_cluster: bool
             ) -> Mapping[str, Any] | None:
    """The ``checkpoint_storage`` section for det: a path string is a shared_fs directory;
    ``None`` is the config's section on a cluster, Determined's default directory off it."""
    if isinstance(checkpoint_storage, str):
        return {"type": "shared_fs", "host_path": os.path.abspath(checkpoint_storage)}
    if checkpoint_storage is None and not on_cluster:
        path = default_storage_path()
        logger.info(f"no storage_manager provided; storing checkpoints in {path}")
        return {"type": "shared_fs", "host_path": str(path)}
    return checkpoint_storage


def init(
    *,
    distributed: DistributedContext | None = None,
    checkpoint_storage: str | dict[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
) -> Context:
    """Open the Core API contexts (0.38 ``det.core.init``).

    In a det task (``DET_ALLOCATION_TOKEN`` set) they report to det's database; otherwise
    they are off-cluster stand-ins. ``distributed``: the task's ``DistributedContext``
    (default: one process). ``checkpoint_storage``: a directory path or a storage section
    overriding the config's. ``tensorboard_mode`` has no effect: det writes no TensorBoard
    files yet.
    """
    return init_for(distributed=distributed, checkpoint_storage=checkpoint_storage,
                    preempt_mode=preempt_mode)


def init_for(
    *,
    distributed: DistributedContext | None = None,
    checkpoint_storage: str | dict[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    hparams: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
) -> Context:
    """``init`` with, off-cluster, the trial's ``hparams`` and experiment ``config`` (what
    ``determined.pytorch.init`` passes); on a cluster they come from the trial."""
    transport: Transport
    info: ClusterInfo | None = None
    if on_cluster():
        transport, info = task_transport()
    else:
        config = dict(config or {})
        seed = int((config.get("reproducibility") or {}).get("experiment_seed") or 0)
        transport = OffClusterTransport(config, dict(hparams or {}), trial_seed=seed, ops=[1],
                                        echo=False)
    if distributed is None and info is None:
        distributed = DummyDistributedContext()
    # det's init makes the task's DistributedContext when none is given (from torch's
    # environment under the launcher), and its contexts ask through the chief.
    cm = det_core.init(transport=transport,
                       checkpoint_storage=_storage(checkpoint_storage, info is not None),
                       distributed=distributed)
    inner = cm.__enter__()
    return Context(inner, info, inner.distributed, preempt_mode,
                   lambda: cm.__exit__(None, None, None))


class OffClusterTransport(LocalTransport):
    """det's ``LocalTransport`` that logs each metrics report as Determined's dummy context
    does (``determined.core`` logger, level INFO)."""

    def report_metrics(self, group: str, steps_completed: int,
                       metrics: Mapping[str, Any]) -> None:
        """Log, then keep the report."""
        logger.info(f"report_{group}_metrics(steps_completed={steps_completed}, "
                    f"metrics={dict(metrics)})")
        super().report_metrics(group, steps_completed, metrics)
