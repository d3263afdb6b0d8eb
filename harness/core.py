"""The Core API: the task's view of the platform as small contexts over a ``Transport``.

One implementation with Determined 0.38.1's public names and signatures (``determined.core``
re-exports this module). ``with core.init() as ctx:`` gives ``ctx.train`` (metrics),
``ctx.checkpoint``, ``ctx.preempt``, ``ctx.searcher``, ``ctx.distributed``, ``ctx.profiler``
and ``ctx.info`` (0.38's ``ClusterInfo``), plus det's own ``ctx.task_info``, ``ctx.transport``,
``ctx.tensorboard`` and ``ctx.units()``.
In a det task the transport is the task's ``DbTransport``; pass ``transport=`` to run over
another (``LocalTransport`` for ``det local`` and tests). Off-cluster with no transport the
contexts are 0.38's stand-ins: metrics are logged, checkpoints go to a local directory
(``checkpoint_storage``, else ``~/.local/share/determined``), the searcher hands out one
operation of length 1 and ``info`` is ``None``.
Among several workers (``det.launch.torch_distributed``) the chief alone talks to the
platform for searcher ops, preemption and checkpoints, and broadcasts what the others need
(``DistributedContext``, :mod:`det.harness.distributed`).
"""

import enum
import json
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import uuid as uuidlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from det.errors import DetError
from det.harness import cluster_info, logs
from det.harness.cluster_info import ClusterInfo
from det.harness.distributed import DistributedContext
from det.harness.errors import CheckpointStorageError, MissingSearcherMetricError
from det.harness.lengths import UnitConverter, parse_length
from det.harness.storage import FsspecStorage, directory_sizes, storage_from_config
from det.harness.tensorboard import TensorboardFiles
from det.harness.transport import (
    DbTransport,
    LocalTransport,
    SearcherOp,
    TaskInfo,
    Transport,
    json_safe,
)
from det.reasons import EarlyExitReason as _DetReason

__all__ = [
    "CheckpointContext",
    "ClusterInfo",
    "Context",
    "DbTransport",
    "DistributedContext",
    "DownloadMode",
    "DummyDistributedContext",
    "EarlyExitReason",
    "LocalTransport",
    "PreemptContext",
    "PreemptMode",
    "ProfilerContext",
    "SearcherContext",
    "SearcherMode",
    "SearcherOperation",
    "TensorboardMode",
    "TrainContext",
    "Transport",
    "Unit",
    "init",
]

logger = logging.getLogger("determined.core")  # 0.38's logger name, which user code configures


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
    """Why a trial ends on purpose (``TrainContext.report_early_exit``); recorded as
    ``det.reasons.EarlyExitReason``'s value."""

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


class TrainContext:
    """``ctx.train``: metrics, progress, early exit, status and trial metadata.

    On a cluster, metrics reports return at once: ``DbTransport`` buffers them and writes
    them in order from a background thread (blocking a report only when its buffer is full),
    and a checkpoint, op completion, preemption acknowledgement or early exit is recorded only
    after every metric reported before it.
    """

    def __init__(self, transport: Transport,
                 tensorboard: TensorboardFiles | None = None,
                 searcher_config: Mapping[str, Any] | None = None,
                 searcher: "SearcherContext | None" = None) -> None:
        self._transport = transport
        self._tensorboard = tensorboard
        self._searcher_config = searcher_config or {}
        self._searcher = searcher
        self._warned_batch_metrics = False
        self._local_tensorboard: pathlib.Path | None = None

    def _report(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        self._transport.report_metrics(group, steps_completed, metrics)
        if self._tensorboard is not None:
            self._tensorboard.report(group, steps_completed, metrics)

    def report_training_metrics(self, steps_completed: int, metrics: Mapping[str, Any],
                                batch_metrics: list[dict[str, Any]] | None = None) -> None:
        """Report metrics of group ``training`` at ``steps_completed`` batches.

        ``batch_metrics`` (per-batch values, shown by Determined's WebUI only) is not stored
        by det; a warning says so once.
        """
        if batch_metrics is not None and not self._warned_batch_metrics:
            logger.warning("report_training_metrics: batch_metrics are not stored by det")
            self._warned_batch_metrics = True
        self._report("training", steps_completed, metrics)

    def report_validation_metrics(self, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Report metrics of group ``validation`` at ``steps_completed`` batches; the platform
        tracks the trial's best ``searcher.metric`` from these.

        Under a searcher with a ``time_metric`` (adaptive ASHA in the reference's 0.38 form)
        these are the searcher's results: ``metrics`` must hold ``searcher.metric`` and a
        number under ``searcher.time_metric`` (§6.1), else ``MissingSearcherMetricError``
        (the reference fails the experiment instead; here the trial's code learns it).
        """
        time_metric = self._searcher_config.get("time_metric")
        if time_metric is not None:
            keys = [str(k) for k in metrics]
            if self._searcher_config["metric"] not in metrics:
                raise MissingSearcherMetricError(self._searcher_config["metric"], keys)
            time = json_safe(metrics.get(time_metric))  # a tensor or numpy scalar counts
            if isinstance(time, bool) or not isinstance(time, int | float):
                raise MissingSearcherMetricError(time_metric, keys, key="time_metric")
        self._report("validation", steps_completed, metrics)

    def report_metrics(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Report metrics of any non-empty group name."""
        if not group:
            raise DetError("metrics group must be a non-empty name")
        self._report(group, steps_completed, metrics)

    def report_progress(self, progress: float) -> None:
        """Report the fraction ``progress`` (0 to 1) of the trial's work done.

        det keeps progress per searcher operation: it is recorded on the current operation
        when ``searcher.max_length`` bounds it, and only logged otherwise. Raises
        ``DetError`` for a value outside [0, 1].
        """
        if not 0 <= float(progress) <= 1:
            raise DetError(f"report_progress: progress must be between 0 and 1, got {progress}")
        op = self._searcher.current_bounded_op() if self._searcher is not None else None
        if op is not None:
            op.report_progress(float(progress) * op.length)
        logger.info(f"report_progress with progress={progress}")

    def report_early_exit(self, reason: EarlyExitReason | str) -> None:
        """End the trial on purpose: an ``EarlyExitReason``, or one of
        ``det.reasons.EarlyExitReason``'s values.

        Raises ``DetError`` for another reason.
        """
        if isinstance(reason, EarlyExitReason):
            reason = _DET_REASON[reason]
        if reason not in set(_DetReason):
            expected = ", ".join(_DetReason)
            raise DetError(f"early exit reason {reason!r}: expected one of {expected}")
        self._transport.report_early_exit(reason)

    def set_status(self, status: str) -> None:
        """Write ``status`` to the trial's logs (det has no status field to show it in)."""
        logger.info(f"status: {status}")

    def get_tensorboard_path(self) -> pathlib.Path:
        """The local directory of this trial's TensorBoard event files: on a cluster, copied
        to the trial's storage at each checkpoint and at the end; off it, a temporary one."""
        if self._tensorboard is not None:
            return self._tensorboard.path
        if self._local_tensorboard is None:
            self._local_tensorboard = pathlib.Path(tempfile.mkdtemp(prefix="det-tensorboard-"))
        return self._local_tensorboard

    def get_experiment_best_validation(self) -> float | None:
        """The experiment's best ``searcher.metric`` so far, or ``None``."""
        return self._transport.experiment_best_validation()

    def set_metadata(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        """Merge ``metadata`` into the trial's metadata (``trials.metadata``) and return all
        of it: new keys are added and nested mappings merged key by key; setting a key to the
        value it holds changes nothing. Raises ``DetError`` for a key already set to another
        value (as the reference's run metadata, which never overwrites a key) and for
        ``metadata`` that is not a mapping."""
        if not isinstance(metadata, Mapping):
            raise DetError(f"metadata: expected a mapping, got {type(metadata).__name__}")
        return self._transport.set_trial_metadata(metadata)

    def get_metadata(self) -> dict[str, Any]:
        """The trial's metadata: what ``set_metadata`` merged so far, over all its runs."""
        return self._transport.trial_metadata()


class CheckpointContext:
    """``ctx.checkpoint``: store and restore checkpoints, directories named by a uuid in the
    configured storage. ``stand_in``: 0.38's off-cluster context (``steps_completed``
    defaults to 0 and ``delete`` removes the directory)."""

    def __init__(self, transport: Transport, storage: FsspecStorage,
                 tensorboard: TensorboardFiles | None = None,
                 distributed: DistributedContext | None = None, *,
                 stand_in: bool = False) -> None:
        self._transport = transport
        self.storage = storage
        self._tensorboard = tensorboard
        self._dist = distributed or DistributedContext()
        self._stand_in = stand_in

    @contextmanager
    def store_path(
        self, metadata: Mapping[str, Any] | None = None, *, shard: bool = False
    ) -> Iterator[tuple[pathlib.Path, str]]:
        """Yield ``(path, uuid)``: write the checkpoint's files under ``path`` (a local
        ``pathlib.Path``). On a clean exit ``metadata.json`` is added, the files are in storage
        and the checkpoint is reported with its ``{relative path: bytes}`` resources.

        Under several workers, the chief alone calls it, or, with ``shard=True``, every worker
        together: each writes its own files under its own ``path``, and they all land in one
        checkpoint (the chief's uuid), reported by the chief once every worker's files are
        stored. Two workers writing the same file name raise ``DetError`` on every worker.

        ``metadata`` must hold ``steps_completed`` (batches; GC joins checkpoints
        to validations on it, as Determined 0.38's does; the off-cluster stand-in uses 0);
        raises ``DetError`` otherwise, and on a worker other than the chief without ``shard``.
        """
        metadata = dict(metadata or {})
        if self._stand_in:
            metadata.setdefault("steps_completed", 0)  # as 0.38's dummy checkpoint context
        if "steps_completed" not in metadata:
            raise DetError("checkpoint metadata must include 'steps_completed' (batches)")
        steps = int(metadata["steps_completed"])
        if shard and self._dist.size > 1:
            with self._store_shard(metadata, steps) as stored:
                yield stored
            return
        if self._dist.rank != 0:
            raise DetError(f"worker {self._dist.rank}: only the chief stores a checkpoint; "
                           "call store_path(metadata, shard=True) on every worker to store "
                           "one in shards")
        uuid = str(uuidlib.uuid4())
        with self._writing(uuid, chief=True):
            with self.storage.store_dir(uuid) as path:
                yield path, uuid
                (path / "metadata.json").write_text(json.dumps(dict(metadata), default=str))
                resources = directory_sizes(path)
            self._transport.report_checkpoint(uuid, steps, resources, dict(metadata))
        logs.checkpointed(uuid, steps, resources)
        if self._tensorboard is not None:
            _sync(self._tensorboard)

    def upload(self, ckpt_dir: str | os.PathLike[str] | None,
               metadata: Mapping[str, Any] | None = None, *, shard: bool = False,
               selector: Callable[[str], bool] | None = None) -> str:
        """Store the files of the local directory ``ckpt_dir`` (those ``selector`` accepts,
        by relative path) as a new checkpoint (``store_path``'s rules); returns its uuid."""
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

    @contextmanager
    def _writing(self, uuid: str, chief: bool) -> Iterator[None]:
        """Around writing and recording checkpoint ``uuid``. The chief first has the platform
        check that its run is live, so a fenced run writes no file, and the files are removed
        if the record is refused (``Transport.checkpoint_guard``). A storage failure
        (``CheckpointStorageError``: a full disk, ...) is printed as one line and reported as
        the run's exit reason (``Transport.report_storage_error``), then raised."""
        try:
            if chief:
                with self._transport.checkpoint_guard(uuid,
                                                      lambda: self.storage.discard(uuid)):
                    yield
            else:
                yield
        except CheckpointStorageError as e:
            print(f"det.harness: {e}", file=sys.stderr, flush=True)
            self._transport.report_storage_error(str(e))
            raise

    @contextmanager
    def _store_shard(self, metadata: Mapping[str, Any],
                     steps: int) -> Iterator[tuple[pathlib.Path, str]]:
        dist = self._dist
        uuid = dist.broadcast(str(uuidlib.uuid4()) if dist.rank == 0 else None)
        with self._writing(uuid, chief=dist.rank == 0):
            with tempfile.TemporaryDirectory(prefix=f"det-ckpt-{uuid}-{dist.rank}-") as tmp:
                path = pathlib.Path(tmp)
                yield path, uuid
                if dist.rank == 0:
                    (path / "metadata.json").write_text(json.dumps(dict(metadata), default=str))
                mine = directory_sizes(path)
                shares = dist.allgather(mine)
                owners: dict[str, int] = {}
                clashes = sorted({f for rank, share in enumerate(shares) for f in share
                                  if owners.setdefault(f, rank) != rank})
                if clashes:
                    raise DetError(f"checkpoint {uuid}: several workers wrote "
                                   f"{', '.join(clashes)}; give each worker's files names of "
                                   "their own (by rank)")
                self.storage.add_files(uuid, path)
            dist.allgather(None)  # a barrier: every share is in storage before the report
            if dist.rank == 0:
                self.storage.publish(uuid)
                resources = {f: n for share in shares for f, n in share.items()}
                self._transport.report_checkpoint(uuid, steps, resources, dict(metadata))
                logs.checkpointed(uuid, steps, resources)

    @contextmanager
    def restore_path(
        self, storage_id: str,
        download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload, *,
        selector: Callable[[str], bool] | None = None,
    ) -> Iterator[pathlib.Path]:
        """Yield a local ``pathlib.Path`` holding checkpoint ``storage_id``; read-only use
        (``download_mode`` and ``selector`` change nothing: the whole checkpoint is there).

        Raises ``det.harness.errors.StorageError`` if it does not exist.
        """
        with self.storage.restore_dir(storage_id) as path:
            yield path

    def download(self, storage_id: str, ckpt_dir: str | os.PathLike[str],
                 download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload, *,
                 selector: Callable[[str], bool] | None = None) -> None:
        """Copy checkpoint ``storage_id`` into the local directory ``ckpt_dir`` (the files
        ``selector`` accepts, by relative path)."""
        root = pathlib.Path(ckpt_dir)
        self.storage.download(storage_id, root)
        if selector is not None:
            for file in [p for p in root.rglob("*") if p.is_file()]:
                if not selector(file.relative_to(root).as_posix()):
                    file.unlink()

    def get_metadata(self, storage_id: str) -> dict[str, Any]:
        """The checkpoint's ``metadata.json``."""
        with self.restore_path(storage_id) as path:
            return dict(json.loads((path / "metadata.json").read_text()))

    def delete(self, storage_id: str) -> None:
        """Remove checkpoint ``storage_id``. Off-cluster its directory is removed; a det task's
        checkpoints are deleted by ``det checkpoint delete`` and the experiment's GC policy
        (the database tracks them), so there this raises ``DetError``."""
        if not self._stand_in:
            raise DetError(f"checkpoint.delete({storage_id}): a det task cannot delete "
                           "checkpoints; use `det checkpoint delete` or the GC policy")
        self.storage.delete(storage_id)


class PreemptContext:
    """``ctx.preempt``: whether the platform wants this task to stop (pause, preemption,
    kill).

    Under several workers the chief decides and broadcasts its answer, so every worker
    agrees; ``should_preempt`` is then a collective every worker must call together."""

    def __init__(self, transport: Transport,
                 distributed: DistributedContext | None = None,
                 mode: PreemptMode = PreemptMode.WorkersAskChief) -> None:
        self._transport = transport
        self._dist = distributed or DistributedContext()
        self._acknowledged = False
        self.mode = mode

    def start(self) -> "PreemptContext":
        """Nothing to start: det's transport watches for preemption from ``init()`` on."""
        return self

    def close(self) -> None:
        """Nothing to stop here: the transport's watcher ends with the ``Context``."""

    def should_preempt(self, auto_ack: bool = True) -> bool:
        """True once the platform asked the task to stop. Cheap (reads a flag; one broadcast
        under several workers); the first true answer is acknowledged (by the chief) when
        ``auto_ack``. The task should then checkpoint and exit 0."""
        asked = self._transport.should_preempt() if self._dist.rank == 0 else False
        if self._dist.size > 1:
            asked = bool(self._dist.broadcast(asked))
        if not asked:
            return False
        if auto_ack and not self._acknowledged:
            self.acknowledge_preemption_signal()
        return True

    def acknowledge_preemption_signal(self) -> None:
        """Tell the platform the coming exit is a preemption, not a completion (the chief
        does; on other workers it only remembers the answer)."""
        self._acknowledged = True
        if self._dist.rank == 0:
            self._transport.acknowledge_preemption()


class SearcherOperation:
    """Train until ``length`` (absolute, in the unit of ``searcher.max_length``), validate,
    then ``report_completed(searcher metric)``."""

    def __init__(self, transport: Transport, op: SearcherOp, unit: str,
                 is_chief: bool = True) -> None:
        self._transport = transport
        self.id = op.id
        self.length = op.length
        self.unit = unit
        self._is_chief = is_chief
        self._completed = False

    def report_progress(self, units: float) -> None:
        """Units done so far (absolute, same unit as ``length``); only the chief's report is
        sent (other workers' calls do nothing)."""
        if self._is_chief:
            self._transport.report_progress(self.id, units)

    def report_completed(self, searcher_metric: Any) -> None:
        """Close the op with the searcher metric's value, a number (sent by the chief only;
        every worker calls it before asking for the next op)."""
        if self._is_chief:
            self._transport.complete_op(self.id, float(searcher_metric))
        self._completed = True

    @property
    def completed(self) -> bool:
        """Whether ``report_completed`` was called."""
        return self._completed


class SearcherContext:
    """``ctx.searcher`` (deprecated in 0.38, still used by many scripts): the searcher's
    requests to this trial. Under several workers the chief asks the platform and broadcasts
    each answer, so ``operations()`` is a collective. ``stand_in``: 0.38's off-cluster
    searcher, whose one operation has length 1 (in batches)."""

    def __init__(self, transport: Transport, config: Mapping[str, Any],
                 distributed: DistributedContext | None = None, *,
                 stand_in: bool = False) -> None:
        self._transport = transport
        self._dist = distributed or DistributedContext()
        self._out_of_work = False
        self._current: SearcherOperation | None = None
        self._max_length = ({"batches": 1} if stand_in
                            else (config.get("searcher") or {}).get("max_length"))
        self._unit = (parse_length(self._max_length, "searcher.max_length")[0]
                      if self._max_length else "batches")

    def get_configured_units(self) -> Unit | None:
        """The unit of ``searcher.max_length`` (``None`` without one)."""
        return Unit[self._unit.upper()] if self._max_length else None

    def current_bounded_op(self) -> SearcherOperation | None:
        """The operation being worked on, if ``searcher.max_length`` bounds it."""
        return self._current if self._max_length else None

    def acknowledge_out_of_ops(self) -> None:
        """Nothing to acknowledge: the trial ends when its code exits."""

    @property
    def out_of_work(self) -> bool:
        """Whether the searcher said it wants nothing more from this trial (rather than the
        wait for the next op ending because the task is being preempted)."""
        return self._out_of_work

    def _next_op(self) -> SearcherOp | None:
        answer = None
        if self._dist.rank == 0:
            answer = (self._transport.current_op(), self._transport.out_of_work)
        if self._dist.size > 1:
            answer = self._dist.broadcast(answer)
        op, self._out_of_work = answer
        return op

    def operations(
        self, searcher_mode: SearcherMode = SearcherMode.WorkersAskChief, auto_ack: bool = True
    ) -> Iterator[SearcherOperation]:
        """Yield the trial's open ops until the searcher wants nothing more (the transport
        answers ``None``); every mode asks through the chief. Each op must be completed
        before the next is fetched; raises ``DetError`` if the caller moved on without
        ``report_completed``, and when the config sets no ``searcher.max_length`` (0.38's
        ``SearcherContextMissing``: the code then decides its own length)."""
        if not self._max_length:
            raise DetError("core_context.searcher: the experiment config sets no "
                           "searcher.max_length, so there are no searcher operations; train "
                           "for a length the code decides")
        while (op := self._next_op()) is not None:
            operation = SearcherOperation(self._transport, op, self._unit, self._dist.rank == 0)
            self._current = operation
            yield operation
            if not operation.completed:
                raise DetError(
                    f"searcher operation {op.id} was not completed: call "
                    "op.report_completed(metric) before asking for the next one"
                )
        self._current = None


class ProfilerContext:
    """``ctx.profiler``: det collects no system metrics; ``on``/``off`` log that."""

    def on(self, sampling_interval: int = 1, samples_per_report: int = 10) -> None:
        """Log that system-metrics profiling is not collected by det."""
        logger.info("profiler.on: det does not collect system metrics")

    def off(self) -> None:
        """Nothing to stop."""


class Context:
    """What ``init`` returns; use it as a context manager, or call ``close()``.

    ``info``: 0.38's ``ClusterInfo`` (``None`` for the off-cluster stand-ins); it also answers
    det's names ``hparams``, ``config``, ``trial_id``, ``experiment_id``, ``trial_seed`` and
    ``steps_completed``. ``task_info``: det's ``TaskInfo`` from the transport, always there.
    ``tensorboard``: the trial's TensorBoard event files (on a cluster; ``None`` off it).
    """

    def __init__(self, *, info: ClusterInfo | None, task_info: TaskInfo, train: TrainContext,
                 checkpoint: CheckpointContext, preempt: PreemptContext,
                 searcher: SearcherContext, distributed: DistributedContext,
                 transport: Transport, tensorboard: TensorboardFiles | None,
                 close: Callable[[], None]) -> None:
        self.info = info
        self.task_info = task_info
        self.train = train
        self.checkpoint = checkpoint
        self.preempt = preempt
        self.searcher = searcher
        self.distributed = distributed
        self.profiler = ProfilerContext()
        self.transport = transport
        self.tensorboard = tensorboard
        self._close: Callable[[], None] | None = close

    def units(self) -> UnitConverter:
        """Converts lengths between batches and config units for this trial."""
        return UnitConverter.from_config(self.task_info.config, self.task_info.hparams)

    def start(self) -> "Context":
        """Nothing to start (kept for 0.38 code that calls it)."""
        return self

    def close(self, exc: BaseException | None = None) -> None:
        """Flush what was reported, sync TensorBoard files and release the connection (and a
        process group ``init`` joined); a second call does nothing."""
        close, self._close = self._close, None
        if close is not None:
            close()

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def init(
    *,
    distributed: DistributedContext | None = None,
    checkpoint_storage: str | Mapping[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
    transport: Transport | None = None,
    hparams: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
) -> Context:
    """Open the task's contexts (0.38 ``det.core.init``); ``Context.close`` (or leaving its
    ``with`` block) closes the transport and a process group it joined.

    ``transport``: default the task's ``DbTransport`` in a det task (``DET_DB_URL``,
    ``DET_ALLOCATION_ID`` and ``DET_ALLOCATION_TOKEN`` set), else 0.38's off-cluster
    stand-ins, over a ``LocalTransport`` of ``config`` and ``hparams`` (what
    ``determined.pytorch.init`` passes; ignored otherwise). ``checkpoint_storage``: a
    directory path or a storage section overriding the config's (absent in both: Determined's
    default directory for the stand-ins, else a temporary directory).
    With a ``DbTransport`` every metric the chief reports is also a TensorBoard event in the
    trial's storage (``det.harness.tensorboard``), synced at checkpoints and on exit, whatever
    ``tensorboard_mode``; ``preempt_mode`` is kept on ``ctx.preempt.mode`` (every mode asks
    through the chief).
    ``distributed``: default ``DistributedContext.from_torch_distributed()`` in a worker that
    the launcher started among several (``WORLD_SIZE`` > 1), else the one-process context;
    only the chief (rank 0) reports searcher progress and completions and acknowledges
    preemption.
    """
    info: ClusterInfo | None = None
    stand_in = False
    if transport is None and cluster_info.on_cluster():
        transport, info = cluster_info.task_transport()
    elif transport is None:
        stand_in = True
        cfg = dict(config or {})
        seed = int((cfg.get("reproducibility") or {}).get("experiment_seed") or 0)
        transport = OffClusterTransport(cfg, dict(hparams or {}), trial_seed=seed, ops=[1],
                                        echo=False)
        distributed = distributed or DummyDistributedContext()
    if isinstance(transport, DbTransport):
        logs.log_to_stderr()  # into the task's log (det.harness.logs)
    dist = distributed
    tensorboard = None

    def close() -> None:
        try:
            if tensorboard is not None:
                _sync(tensorboard, close=True)
        finally:
            try:
                transport.close()
            finally:
                if dist is not None and distributed is None:
                    dist.close()

    try:
        if dist is None:
            dist = (DistributedContext.from_torch_distributed()
                    if int(os.environ.get("WORLD_SIZE", "1")) > 1 else DistributedContext())
        task = transport.task_info()
        if task.slots > dist.size:
            print(
                f"det.harness: warning: {task.slots} slots allocated but {dist.size} "
                "worker(s) run; start the script with python -m det.launch.torch_distributed "
                "to use them all",
                file=sys.stderr,
            )
        storage = storage_from_config(_storage_section(checkpoint_storage, stand_in, task))
        if isinstance(transport, DbTransport) and dist.rank == 0:  # the chief reports
            tensorboard = TensorboardFiles(storage, task.experiment_id, task.trial_id)
        if info is None and not stand_in:
            info = ClusterInfo.from_task_info(task, dict(os.environ))
        searcher = SearcherContext(transport, task.config, dist, stand_in=stand_in)
        return Context(
            info=info,
            task_info=task,
            train=TrainContext(transport, tensorboard, task.config.get("searcher"), searcher),
            checkpoint=CheckpointContext(transport, storage, tensorboard, dist,
                                         stand_in=stand_in),
            preempt=PreemptContext(transport, dist, preempt_mode),
            searcher=searcher,
            distributed=dist,
            transport=transport,
            tensorboard=tensorboard,
            close=close,
        )
    except BaseException:
        close()
        raise


def default_storage_path() -> pathlib.Path:
    """Where off-cluster checkpoints go by default, as in Determined."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return pathlib.Path(base, "determined")


def _storage_section(checkpoint_storage: str | Mapping[str, Any] | None, stand_in: bool,
                     task: TaskInfo) -> Mapping[str, Any] | None:
    """The ``checkpoint_storage`` section: a path string is a shared_fs directory; ``None``
    is the config's section, or Determined's default directory for the stand-ins."""
    if isinstance(checkpoint_storage, str):
        return {"type": "shared_fs", "host_path": os.path.abspath(checkpoint_storage)}
    if checkpoint_storage is not None:
        return checkpoint_storage
    if stand_in:
        path = default_storage_path()
        logger.info(f"no storage_manager provided; storing checkpoints in {path}")
        return {"type": "shared_fs", "host_path": str(path)}
    return task.config.get("checkpoint_storage")


class OffClusterTransport(LocalTransport):
    """The stand-ins' ``LocalTransport``: it logs each metrics report as Determined's dummy
    context does (``determined.core`` logger, level INFO)."""

    def report_metrics(self, group: str, steps_completed: int,
                       metrics: Mapping[str, Any]) -> None:
        """Log, then keep the report."""
        logger.info(f"report_{group}_metrics(steps_completed={steps_completed}, "
                    f"metrics={dict(metrics)})")
        super().report_metrics(group, steps_completed, metrics)


def _sync(tensorboard: TensorboardFiles, close: bool = False) -> None:
    """Copy the event files to storage; a storage failure is a warning, never the end of a
    trial (the files are a copy of metrics the database holds)."""
    try:
        tensorboard.close() if close else tensorboard.sync()
    except Exception as e:  # fsspec / botocore / OSError: one line, and training goes on
        print(f"det.harness: warning: TensorBoard files not stored: {type(e).__name__}: {e}",
              file=sys.stderr)
