"""det's Core API: the task's view of the platform as small contexts over a ``Transport``.

``with core.init() as ctx:`` gives ``ctx.train`` (metrics), ``ctx.checkpoint``,
``ctx.preempt``, ``ctx.searcher``, ``ctx.distributed`` and ``ctx.info`` (Determined 0.38's
``det.core``).
On a cluster the transport is ``DbTransport.from_env()``; off-cluster pass a ``LocalTransport``.
Among several workers (``det.launch.torch_distributed``) the chief alone talks to the
platform for searcher ops, preemption and checkpoints, and broadcasts what the others need
(``DistributedContext``, :mod:`det.harness.distributed`).
"""

import json
import os
import pathlib
import sys
import tempfile
import uuid as uuidlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from det.errors import DetError
from det.harness import logs
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
from det.reasons import EarlyExitReason

__all__ = [
    "CheckpointContext",
    "ClusterInfo",
    "Context",
    "DbTransport",
    "DistributedContext",
    "EarlyExitReason",
    "LocalTransport",
    "PreemptContext",
    "SearcherContext",
    "SearcherOperation",
    "TrainContext",
    "Transport",
    "init",
]

ClusterInfo = TaskInfo
"""``ctx.info``: allocation / trial / experiment ids, hparams, trial seed, latest checkpoint,
steps completed, slots and the expanded config."""




class TrainContext:
    """Metrics and trial-level reports.

    On a cluster, metrics reports return at once: ``DbTransport`` buffers them and writes
    them in order from a background thread (blocking a report only when its buffer is full),
    and a checkpoint, op completion, preemption acknowledgement or early exit is recorded only
    after every metric reported before it.
    """

    def __init__(self, transport: Transport,
                 tensorboard: TensorboardFiles | None = None,
                 searcher: Mapping[str, Any] | None = None) -> None:
        self._transport = transport
        self._tensorboard = tensorboard
        self._searcher_config = searcher or {}

    def _report(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        self._transport.report_metrics(group, steps_completed, metrics)
        if self._tensorboard is not None:
            self._tensorboard.report(group, steps_completed, metrics)

    def report_training_metrics(self, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Report metrics of group ``training`` at ``steps_completed`` batches."""
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

    def report_progress(self, op: "SearcherOperation", units: float) -> None:
        """Report ``units`` (in ``searcher.max_length``'s unit) done towards ``op``."""
        op.report_progress(units)

    def report_early_exit(self, reason: str) -> None:
        """End the trial on purpose; ``reason`` is one of ``EarlyExitReason``'s values.

        Raises ``DetError`` for another reason.
        """
        if reason not in set(EarlyExitReason):
            expected = ", ".join(EarlyExitReason)
            raise DetError(f"early exit reason {reason!r}: expected one of {expected}")
        self._transport.report_early_exit(reason)

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
    """Store and restore checkpoints: directories named by a uuid in the configured storage."""

    def __init__(self, transport: Transport, storage: FsspecStorage,
                 tensorboard: TensorboardFiles | None = None,
                 distributed: DistributedContext | None = None) -> None:
        self._transport = transport
        self.storage = storage
        self._tensorboard = tensorboard
        self._dist = distributed or DistributedContext()

    @contextmanager
    def store_path(
        self, metadata: Mapping[str, Any], shard: bool = False
    ) -> Iterator[tuple[pathlib.Path, str]]:
        """Yield ``(path, uuid)``: write the checkpoint's files under ``path`` (a local
        ``pathlib.Path``). On a clean exit ``metadata.json`` is added, the files are in storage
        and the checkpoint is reported with its ``{relative path: bytes}`` resources.

        Under several workers, the chief alone calls it, or, with ``shard=True``, every worker
        together: each writes its own files under its own ``path``, and they all land in one
        checkpoint (the chief's uuid), reported by the chief once every worker's files are
        stored. Two workers writing the same file name raise ``DetError`` on every worker.

        ``metadata`` must hold ``steps_completed`` (batches; GC joins checkpoints
        to validations on it, as Determined 0.38's does); raises ``DetError``
        otherwise, and on a worker other than the chief without ``shard``.
        """
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
    def restore_path(self, uuid: str) -> Iterator[pathlib.Path]:
        """Yield a local ``pathlib.Path`` holding checkpoint ``uuid``; read-only use.

        Raises ``det.harness.errors.StorageError`` if it does not exist.
        """
        with self.storage.restore_dir(uuid) as path:
            yield path

    def download(self, uuid: str, ckpt_dir: str | pathlib.Path) -> None:
        """Copy checkpoint ``uuid`` into the local directory ``ckpt_dir``."""
        self.storage.download(uuid, pathlib.Path(ckpt_dir))

    def get_metadata(self, uuid: str) -> dict[str, Any]:
        """The checkpoint's ``metadata.json``."""
        with self.restore_path(uuid) as path:
            return dict(json.loads((path / "metadata.json").read_text()))


class PreemptContext:
    """Whether the platform wants this task to stop (pause, preemption, kill).

    Under several workers the chief decides and broadcasts its answer, so every worker
    agrees; ``should_preempt`` is then a collective every worker must call together."""

    def __init__(self, transport: Transport,
                 distributed: DistributedContext | None = None) -> None:
        self._transport = transport
        self._dist = distributed or DistributedContext()
        self._acknowledged = False

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

    def report_completed(self, searcher_metric: float) -> None:
        """Close the op with the searcher metric's value (sent by the chief only; every
        worker calls it before asking for the next op)."""
        if self._is_chief:
            self._transport.complete_op(self.id, float(searcher_metric))
        self._completed = True

    @property
    def completed(self) -> bool:
        """Whether ``report_completed`` was called."""
        return self._completed


class SearcherContext:
    """The searcher's requests to this trial. Under several workers the chief asks the
    platform and broadcasts each answer, so ``operations()`` is a collective."""

    def __init__(self, transport: Transport, config: Mapping[str, Any],
                 distributed: DistributedContext | None = None) -> None:
        self._transport = transport
        self._dist = distributed or DistributedContext()
        self._out_of_work = False
        max_length = (config.get("searcher") or {}).get("max_length")
        self._unit = parse_length(max_length, "searcher.max_length")[0] if max_length else "batches"

    def get_configured_units(self) -> str:
        """``batches``, ``records`` or ``epochs``: the unit of op lengths."""
        return self._unit

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

    def operations(self) -> Iterator[SearcherOperation]:
        """Yield the trial's open ops until the searcher wants nothing more (the transport
        answers ``None``). Each op must be completed before the next is fetched; raises
        ``DetError`` if the caller moved on without ``report_completed``."""
        while (op := self._next_op()) is not None:
            operation = SearcherOperation(self._transport, op, self._unit, self._dist.rank == 0)
            yield operation
            if not operation.completed:
                raise DetError(
                    f"searcher operation {op.id} was not completed: call "
                    "op.report_completed(metric) before asking for the next one"
                )


@dataclass
class Context:
    """What ``core.init`` yields."""

    info: ClusterInfo
    train: TrainContext
    checkpoint: CheckpointContext
    preempt: PreemptContext
    searcher: SearcherContext
    distributed: DistributedContext
    transport: Transport
    tensorboard: TensorboardFiles | None = None
    """The trial's TensorBoard event files (on a cluster; ``None`` off it)."""

    def units(self) -> UnitConverter:
        """Converts lengths between batches and config units for this trial."""
        return UnitConverter.from_config(self.info.config, self.info.hparams)


@contextmanager
def init(
    *,
    transport: Transport | None = None,
    checkpoint_storage: Mapping[str, Any] | None = None,
    distributed: DistributedContext | None = None,
) -> Iterator[Context]:
    """Open the task's contexts; close the transport (and a process group it joined) on exit.

    ``transport``: default ``DbTransport.from_env()`` (raises
    ``det.harness.errors.TaskEnvironmentError`` outside a det task). ``checkpoint_storage``
    overrides the config's section of that name (absent in both: a temporary directory).
    With a ``DbTransport`` every metric the chief reports is also a TensorBoard event in the
    trial's storage (``det.harness.tensorboard``), synced at checkpoints and on exit.
    ``distributed``: default ``DistributedContext.from_torch_distributed()`` in a worker that
    the launcher started among several (``WORLD_SIZE`` > 1), else the one-process context;
    only the chief (rank 0) reports searcher progress and completions and acknowledges
    preemption.
    """
    transport = transport if transport is not None else DbTransport.from_env()
    if isinstance(transport, DbTransport):
        logs.log_to_stderr()  # into the task's log (det.harness.logs)
    dist = distributed
    tensorboard = None
    try:
        if dist is None:
            dist = (DistributedContext.from_torch_distributed()
                    if int(os.environ.get("WORLD_SIZE", "1")) > 1 else DistributedContext())
        info = transport.task_info()
        if info.slots > dist.size:
            print(
                f"det.harness: warning: {info.slots} slots allocated but {dist.size} "
                "worker(s) run; start the script with python -m det.launch.torch_distributed "
                "to use them all",
                file=sys.stderr,
            )
        storage = storage_from_config(
            checkpoint_storage if checkpoint_storage is not None
            else info.config.get("checkpoint_storage")
        )
        if isinstance(transport, DbTransport) and dist.rank == 0:  # the chief reports
            tensorboard = TensorboardFiles(storage, info.experiment_id, info.trial_id)
        yield Context(
            info=info,
            train=TrainContext(transport, tensorboard, info.config.get("searcher")),
            checkpoint=CheckpointContext(transport, storage, tensorboard, dist),
            preempt=PreemptContext(transport, dist),
            searcher=SearcherContext(transport, info.config, dist),
            distributed=dist,
            transport=transport,
            tensorboard=tensorboard,
        )
    finally:
        try:
            if tensorboard is not None:
                _sync(tensorboard, close=True)
        finally:
            try:
                transport.close()
            finally:
                if dist is not None and distributed is None:
                    dist.close()


def _sync(tensorboard: TensorboardFiles, close: bool = False) -> None:
    """Copy the event files to storage; a storage failure is a warning, never the end of a
    trial (the files are a copy of metrics the database holds)."""
    try:
        tensorboard.close() if close else tensorboard.sync()
    except Exception as e:  # fsspec / botocore / OSError: one line, and training goes on
        print(f"det.harness: warning: TensorBoard files not stored: {type(e).__name__}: {e}",
              file=sys.stderr)
