"""``determined.pytorch.experimental``: 0.38.1's batch inference API, ``torch_batch_process``.

``torch_batch_process(MyProcessor, dataset, batch_size=...)`` splits the dataset's batches
among the workers (batch ``i`` to rank ``i % size``, as upstream's distributed batch sampler),
calls ``MyProcessor(context).process_batch(batch, batch_idx)`` on each of this worker's
batches, and every ``checkpoint_interval`` batches calls ``on_checkpoint_start`` and stores a
checkpoint recording the batches every worker completed (``steps_completed``, the least of
them), so a resumed trial skips them; ``on_finish`` at the end. Files written under
``context.upload_path()`` land in checkpoint storage under ``<uuid>/rank_<rank>``, one
``<uuid>`` for the whole run. Unlike upstream it also runs off-cluster (one worker,
checkpoints in Determined's local default directory). Metric reducers
(``context.wrap_reducer``) are not provided: report with ``context.report_metrics``.
"""

import abc
import json
import logging
import math
import pathlib
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn
import torch.utils.data

import determined as det
from determined import core
from determined.pytorch import to_device

__all__ = ["TorchBatchProcessor", "TorchBatchProcessorContext", "get_default_device",
           "torch_batch_process"]

logger = logging.getLogger("determined.pytorch.experimental")

DEFAULT_BATCH_SIZE = 1
"""Upstream's batch size when neither ``batch_size`` nor ``dataloader_kwargs`` gives one."""


def get_default_device(core_context: core.Context) -> torch.device:
    """``cuda:<local rank>`` when CUDA devices are visible, else the CPU."""
    if torch.cuda.device_count() == 0:
        return torch.device("cpu")
    return torch.device("cuda", core_context.distributed.local_rank)


class TorchBatchProcessorContext:
    """What a ``TorchBatchProcessor`` gets: the device, the trial's hyperparameters, metric
    reports, and ``upload_path`` into checkpoint storage."""

    def __init__(self, core_context: core.Context, storage_path: str) -> None:
        self._core_context = core_context
        self.device = get_default_device(core_context)
        self._storage_path = storage_path

    def get_hparams(self) -> dict[str, Any]:
        """The trial's hyperparameters. Raises RuntimeError off-cluster (there are none)."""
        info = det.get_cluster_info()
        if info is None or info.trial is None:
            raise RuntimeError("get_hparams(): TorchBatchProcessor runs outside a det trial, "
                               "which has no hyperparameters")
        return dict(info.trial.hparams)

    def to_device(self, data: Any, warned_types: set[type] | None = None) -> Any:
        """``data`` (tensors in lists, tuples, dicts) on this worker's device."""
        return to_device(data, self.device, warned_types)

    def get_tensorboard_path(self) -> pathlib.Path:
        """Where TensorBoard files for the trial go."""
        return self._core_context.train.get_tensorboard_path()

    def prepare_model_for_inference(self, model: nn.Module) -> nn.Module:
        """``model`` in eval mode on this worker's device."""
        model.eval()
        return model.to(self.device)

    @contextmanager
    def upload_path(self) -> Iterator[pathlib.Path]:
        """A directory whose files are in checkpoint storage under ``<uuid>/rank_<rank>``
        when the block exits (written in place on a local filesystem, uploaded to an object
        store); may be used any number of times, files accumulating."""
        storage = self._core_context.checkpoint.storage
        url = f"{storage.base}/{self._storage_path}"
        if storage.local:
            path = pathlib.Path(url)
            path.mkdir(parents=True, exist_ok=True)
            yield path
            return
        with tempfile.TemporaryDirectory(prefix="det-batch-") as tmp:
            yield pathlib.Path(tmp)
            storage.fs.put(tmp + "/", url, recursive=True)

    def report_metrics(self, group: str, steps_completed: int, metrics: dict[str, Any]) -> None:
        """Report ``metrics`` of ``group`` at ``steps_completed`` (batches) for the trial."""
        self._core_context.train.report_metrics(group=group, steps_completed=steps_completed,
                                                metrics=metrics)

    def get_distributed_rank(self) -> int:
        """This worker's rank."""
        return self._core_context.distributed.get_rank()

    def get_distributed_size(self) -> int:
        """The number of workers."""
        return self._core_context.distributed.get_size()


class TorchBatchProcessor(abc.ABC):
    """Subclass this: build the model in ``__init__(context)``, handle one batch in
    ``process_batch``."""

    @abc.abstractmethod
    def __init__(self, context: TorchBatchProcessorContext) -> None:
        """Set up what processing needs (the model, on ``context.device``)."""

    @abc.abstractmethod
    def process_batch(self, batch: Any, batch_idx: int) -> None:
        """Process one batch; ``batch_idx`` counts this worker's batches from 0."""

    def on_checkpoint_start(self) -> None:  # noqa: B027 - optional hook, upstream's
        """Called before each checkpoint (flush what ``process_batch`` buffered)."""

    def on_finish(self) -> None:  # noqa: B027 - optional hook, upstream's
        """Called once after the last batch."""


def _check_dataloader_kwargs(kwargs: dict[str, Any], batch_size: int | None) -> None:
    """Raises ValueError naming a loader argument that would break the sharding (upstream's
    rules): ``shuffle``, ``sampler``, ``batch_sampler``, or ``batch_size`` given twice."""
    if kwargs.get("shuffle"):
        raise ValueError("'shuffle' must be false for accurate sharding and checkpointing")
    for key in ("sampler", "batch_sampler"):
        if key in kwargs:
            raise ValueError(f"Please remove '{key}' arg as we will initialize it automatically.")
    if batch_size is not None and "batch_size" in kwargs:
        raise ValueError("batch_size is passed into torch_batch_process and dataloader_kwargs")


def _checkpoint(core_context: core.Context, steps_completed: int, output_uuid: str) -> None:
    """Store a checkpoint recording the least ``steps_completed`` of all workers (a
    collective: every worker calls it)."""
    gathered = core_context.distributed.gather(steps_completed)
    if gathered is None:
        return
    least = min(gathered)
    metadata = {"steps_completed": least, "default_output_uuid": output_uuid}
    with core_context.checkpoint.store_path(metadata) as (path, _):
        (path / "batch_completed.json").write_text(json.dumps({"batch_completed": least}))


def torch_batch_process(
    batch_processor_cls: type[TorchBatchProcessor],
    dataset: torch.utils.data.Dataset,
    batch_size: int | None = None,
    max_batches: int | None = None,
    checkpoint_interval: int = 5,
    dataloader_kwargs: dict[str, Any] | None = None,
    distributed_context: core.DistributedContext | None = None,
) -> None:
    """Process ``dataset`` with ``batch_processor_cls`` as the module doc says.

    ``max_batches`` caps this worker's batches (ignored, as upstream, when not positive or
    beyond its share). Raises ValueError for a ``checkpoint_interval`` below 1, a dataset
    without ``__len__``, or loader arguments that break the sharding (named).
    """
    if checkpoint_interval <= 0:
        raise ValueError("checkpoint_interval should be a positive integer")
    kwargs = dict(dataloader_kwargs or {})
    _check_dataloader_kwargs(kwargs, batch_size)
    batch_size = batch_size or kwargs.pop("batch_size", DEFAULT_BATCH_SIZE)
    kwargs.pop("shuffle", None)
    if not hasattr(dataset, "__len__"):
        raise ValueError("dataset: must implement __len__()")
    with core.init(distributed=distributed_context) as core_context:
        dist = core_context.distributed
        rank, size = dist.get_rank(), dist.get_size()
        output_uuid = dist.broadcast(str(uuid.uuid4()) if rank == 0 else None)
        skip = 0
        info = core_context.info
        if info is not None and info.latest_checkpoint is not None:
            with core_context.checkpoint.restore_path(info.latest_checkpoint) as path:
                state = json.loads((path / "metadata.json").read_text())
            skip, output_uuid = state["steps_completed"], state["default_output_uuid"]
            logger.info(f"resuming batch processing after {skip} batches")
        context = TorchBatchProcessorContext(core_context, f"{output_uuid}/rank_{rank}")
        processor = batch_processor_cls(context)
        # Every worker iterates as often as the largest share, so collectives line up.
        share = math.ceil(len(dataset) / batch_size / size)  # type: ignore[arg-type]
        length = share if max_batches is None or not 0 < max_batches <= share else max_batches
        batches = [list(range(b * batch_size, min((b + 1) * batch_size, len(dataset))))
                   for b in range(rank, math.ceil(len(dataset) / batch_size), size)]
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=batches[skip:length],
                                             **kwargs)
        it = iter(loader)
        last_checkpoint = -1
        for batch_idx in range(skip, length):
            batch = next(it, None)
            if batch is not None:
                processor.process_batch(batch=batch, batch_idx=batch_idx)
            if (batch_idx + 1) % checkpoint_interval == 0:
                processor.on_checkpoint_start()
                _checkpoint(core_context, batch_idx + 1, output_uuid)
                last_checkpoint = batch_idx
                if core_context.preempt.should_preempt():
                    return
        if length - 1 > last_checkpoint and length > skip:
            processor.on_checkpoint_start()
            _checkpoint(core_context, length, output_uuid)
        processor.on_finish()
        dist.gather(None)  # every worker finished before the chief reports completion
