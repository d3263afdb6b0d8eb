"""``PyTorchTrial`` (what users subclass) and ``PyTorchTrialContext`` (what they get).

Shapes follow Determined 0.38's ``det.pytorch``: the trial builds its models and optimizers in
``__init__`` through ``context.wrap_*``; the ``Trainer`` calls ``train_batch`` once per batch
and ``evaluate_batch`` (or ``evaluate_full_dataset``) at validation time.
"""

import abc
import enum
import pathlib
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from det.errors import ConfigError
from det.harness import core
from det.harness.errors import InvalidHP as InvalidHP  # re-exported: callers import it from here


class LRScheduler:
    """Step modes for ``PyTorchTrialContext.wrap_lr_scheduler``."""

    class StepMode(enum.Enum):
        """When ``scheduler.step()`` is called: after every ``frequency`` batches, after
        every ``frequency`` epochs, after every ``frequency`` optimizer steps (by
        ``step_optimizer``, so gradient accumulation counts once), or never (the trial
        steps it)."""

        STEP_EVERY_BATCH = "batch"
        STEP_EVERY_EPOCH = "epoch"
        STEP_EVERY_OPTIMIZER_STEP = "optimizer_step"
        MANUAL_STEP = "manual"


class Reducer(enum.Enum):
    """How ``evaluate_batch`` values are combined over the validation set (the trial's
    ``evaluation_reducer()``): ``AVG`` (the mean of the per-batch values, each batch counting
    once, as the reference's), ``SUM``, ``MAX``, ``MIN``."""

    AVG = "avg"
    SUM = "sum"
    MAX = "max"
    MIN = "min"


class MetricReducer(abc.ABC):
    """A custom reduction of one validation metric: ``reset()``, then ``update(...)`` from
    the trial's ``evaluate_batch`` calls as it likes, then ``cross_slot_reduce`` of every
    worker's ``per_slot_reduce()`` gives the value. Register with
    ``context.wrap_reducer(reducer, name)``."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget what was accumulated (called before each validation)."""

    @abc.abstractmethod
    def per_slot_reduce(self) -> Any:
        """This worker's partial result."""

    @abc.abstractmethod
    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> Any:
        """The metric from every worker's partial result, in rank order."""


class PyTorchCallback:
    """Hooks into the trainer (``PyTorchTrial.build_callbacks``); each does nothing unless
    overridden. ``state_dict`` / ``load_state_dict`` ride in checkpoints."""

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        """Before training starts or resumes at ``first_batch_idx``."""

    def on_trial_shutdown(self) -> None:
        """After the trainer's last workload."""

    def on_training_start(self) -> None:
        """Before the first batch of this run."""

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        """Before the first batch of epoch ``epoch_idx``."""

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        """After the last batch of epoch ``epoch_idx``."""

    def on_training_workload_end(self, avg_metrics: dict[str, Any],
                                 batch_metrics: list[Any]) -> None:
        """After training metrics are reported (``avg_metrics``)."""

    def on_validation_start(self) -> None:
        """Before a validation."""

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        """After a validation, with its metrics."""

    def on_checkpoint_write_end(self, checkpoint_dir: str) -> None:
        """After the trainer wrote a checkpoint's files into ``checkpoint_dir``."""

    def on_checkpoint_upload_end(self, uuid: str) -> None:
        """After checkpoint ``uuid`` was stored and reported."""

    def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
        """Before the trainer saves ``checkpoint`` (the state dict; it may be changed)."""

    def on_checkpoint_load_start(self, checkpoint: dict[str, Any]) -> None:
        """Before the trainer loads ``checkpoint`` (the state dict)."""

    def state_dict(self) -> dict[str, Any]:
        """State to checkpoint."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""


class PyTorchTrialContext:
    """The trial's handle on hyperparameters, config, device and the objects to checkpoint.

    Everything wrapped (models, optimizers, lr schedulers) is saved in checkpoints and
    restored on resume, in wrapping order.
    """

    def __init__(self, core_context: core.Context, device: torch.device | None = None) -> None:
        self.core = core_context
        self.device = device or _default_device(core_context.distributed.local_rank)
        self.models: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_schedulers: list[tuple[Any, LRScheduler.StepMode, int]] = []
        self.scalers: list[Any] = []
        self.reducers: list[tuple[MetricReducer, str | None]] = []
        self._hparams = dict(core_context.task_info.hparams)
        self._config = core_context.task_info.config
        self._stop_requested = False
        self._batches_trained = 0
        self._epoch_idx = 0
        # Kept current by the trainer, for is_epoch_start / is_epoch_end.
        self._batch_in_epoch = 0
        self._epoch_len: int | None = None
        self._backward_passes: dict[int, int] = {}  # id(optimizer) -> backward passes per step
        self._optimizer_steps = 0
        self._initial_batch = 0
        self._tensorboard_path: pathlib.Path | None = None
        self._tensorboard_writer: Any = None

    @property
    def distributed(self) -> core.DistributedContext:
        """The task's ``DistributedContext`` (ranks, collectives)."""
        return self.core.distributed

    # objects to train and checkpoint
    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move ``model`` to the device and register it for checkpointing; returns it, as a
        ``DistributedDataParallel`` under several workers (gradients are averaged across
        them in ``backward``; every worker starts from the chief's parameters).

        Buffers (batch-norm statistics) are synchronized at the start, not at each forward
        (``forward_sync_buffers=False``): validation shards differ in length across workers,
        and a collective inside a forward would wait for a worker that has none left; the
        chief's buffers are the ones checkpointed.
        """
        model = model.to(self.device)
        if self.distributed.size > 1:
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                forward_sync_buffers=False, gradient_as_bucket_view=True)
        self.models.append(model)
        return model

    def wrap_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        backward_passes_per_step: int = 1,
        fp16_compression: bool | None = None,
        average_aggregated_gradients: bool | None = None,
    ) -> torch.optim.Optimizer:
        """Register ``optimizer`` for checkpointing; returns it.

        ``backward_passes_per_step`` > 1 accumulates gradients: ``step_optimizer`` steps (and
        zeroes) only after every that many batches. ``fp16_compression`` and
        ``average_aggregated_gradients`` tune Horovod's allreduce, which det does not use.
        Raises ``ValueError`` for ``backward_passes_per_step`` < 1.
        """
        if backward_passes_per_step < 1:
            raise ValueError(
                f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        self.optimizers.append(optimizer)
        self._backward_passes[id(optimizer)] = backward_passes_per_step
        return optimizer

    def wrap_scaler(self, scaler: Any) -> Any:
        """Register a ``torch.cuda.amp.GradScaler`` (mixed precision): ``backward`` scales the
        loss with it, and it is checkpointed. Returns it."""
        self.scalers.append(scaler)
        return scaler

    def autocast_forward_pass(self, to_wrap: torch.nn.Module) -> torch.nn.Module:
        """Run ``to_wrap``'s forward under ``torch.autocast`` on the trial's device (mixed
        precision); returns it."""
        forward, device_type = to_wrap.forward, self.device.type

        def autocast_forward(*args: Any, **kwargs: Any) -> Any:
            with torch.autocast(device_type=device_type):
                return forward(*args, **kwargs)

        to_wrap.forward = autocast_forward  # type: ignore[method-assign]
        return to_wrap

    def wrap_reducer(self, reducer: "MetricReducer", name: str | None = None) -> "MetricReducer":
        """Register a custom validation metric: its value is reported as ``name`` (or, when
        ``None``, its ``cross_slot_reduce`` must return a dict of metrics). Returns it."""
        self.reducers.append((reducer, name))
        return reducer

    def wrap_lr_scheduler(
        self,
        lr_scheduler: Any,
        step_mode: LRScheduler.StepMode = LRScheduler.StepMode.STEP_EVERY_EPOCH,
        frequency: int = 1,
    ) -> Any:
        """Register a ``torch.optim.lr_scheduler`` for checkpointing; the trainer steps it per
        ``step_mode`` every ``frequency`` batches or epochs. Returns it."""
        if frequency < 1:
            raise ValueError(f"lr scheduler frequency must be >= 1, got {frequency}")
        self.lr_schedulers.append((lr_scheduler, step_mode, frequency))
        return lr_scheduler

    def backward(
        self,
        loss: torch.Tensor,
        gradient: torch.Tensor | None = None,
        retain_graph: bool = False,
        create_graph: bool = False,
    ) -> None:
        """``loss.backward(...)``, the loss scaled first by the wrapped scaler if any."""
        if self.scalers:
            loss = self.scalers[0].scale(loss)
        loss.backward(gradient=gradient, retain_graph=retain_graph, create_graph=create_graph)

    def step_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        clip_grads: Callable[[Iterable[torch.nn.Parameter]], Any] | None = None,
        auto_zero_grads: bool = True,
        scaler: Any | None = None,
    ) -> None:
        """Step ``optimizer``, first calling ``clip_grads(params)`` if given (e.g.
        ``lambda p: torch.nn.utils.clip_grad_norm_(p, 1.0)``), then zero its gradients unless
        ``auto_zero_grads`` is false. With ``scaler`` (a wrapped GradScaler) the gradients are
        unscaled before clipping and the step goes through it. With
        ``backward_passes_per_step`` N it does nothing but on every N-th batch. Lr schedulers
        in ``STEP_EVERY_OPTIMIZER_STEP`` mode are stepped after it."""
        passes = self._backward_passes.get(id(optimizer), 1)
        if (self._batches_trained + 1) % passes != 0:
            return
        if scaler is not None and clip_grads is not None:
            scaler.unscale_(optimizer)
        if clip_grads is not None:
            clip_grads([p for group in optimizer.param_groups for p in group["params"]])
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        if auto_zero_grads:
            optimizer.zero_grad()
        self._optimizer_steps += 1
        for sched, mode, freq in self.lr_schedulers:
            if (mode is LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP
                    and self._optimizer_steps % freq == 0):
                sched.step()

    def to_device(self, data: Any) -> Any:
        """``data`` (tensors in lists, tuples, dicts) moved to the trial's device."""
        if isinstance(data, torch.Tensor):
            return data.to(self.device, non_blocking=True)
        if isinstance(data, Mapping):
            return {k: self.to_device(v) for k, v in data.items()}
        if isinstance(data, list | tuple):
            return type(data)(self.to_device(v) for v in data)
        return data

    # hyperparameters and config
    def get_hparams(self) -> dict[str, Any]:
        """The trial's concrete hyperparameters."""
        return dict(self._hparams)

    def get_hparam(self, name: str) -> Any:
        """One hyperparameter; raises ``det.errors.ConfigError`` naming it if absent."""
        if name not in self._hparams:
            raise ConfigError(
                f"hyperparameters.{name}",
                f"not defined; defined: {', '.join(sorted(self._hparams)) or '(none)'}",
            )
        return self._hparams[name]

    def get_global_batch_size(self) -> int:
        """Records per batch across all workers (``hyperparameters.global_batch_size``)."""
        return int(self.get_hparam("global_batch_size"))

    def get_per_slot_batch_size(self) -> int:
        """Records per batch on this worker (global batch size / workers)."""
        return self.get_global_batch_size() // self.core.distributed.get_size()

    def get_experiment_config(self) -> dict[str, Any]:
        """The expanded experiment config."""
        return self._config

    def get_data_config(self) -> dict[str, Any]:
        """The config's free-form ``data`` section ({} if absent)."""
        return dict(self._config.get("data") or {})

    def get_trial_id(self) -> int:
        """This trial's id (0 in local runs)."""
        return self.core.task_info.trial_id

    def get_experiment_id(self) -> int:
        """This trial's experiment id (0 in local runs)."""
        return self.core.task_info.experiment_id

    def get_trial_seed(self) -> int:
        """The trial's seed; the trainer seeds python, numpy and torch with it."""
        return self.core.task_info.trial_seed

    # progress and control
    def current_train_batch(self) -> int:
        """Batches trained so far (the index of the batch being trained)."""
        return self._batches_trained

    def current_train_epoch(self) -> int:
        """Index of the epoch being trained (full passes over the training loader so far)."""
        return self._epoch_idx

    def get_initial_batch(self) -> int:
        """Batches trained when this run started (non-zero when it resumed a checkpoint)."""
        return self._initial_batch

    def set_profiler(self, *args: Any, **kwargs: Any) -> None:
        """Accepted for Determined's code (it configures torch's profiler there); det runs
        no profiler, which a log line says."""
        print("det.harness: set_profiler: det runs no profiler", file=sys.stderr)

    def is_epoch_start(self) -> bool:
        """Whether the batch being trained is the first of its epoch."""
        return self._batch_in_epoch == 0

    def is_epoch_end(self) -> bool:
        """Whether the batch being trained is the last of its epoch."""
        return self._epoch_len is not None and self._batch_in_epoch == self._epoch_len - 1

    def get_tensorboard_path(self) -> pathlib.Path:
        """The local directory of the trial's TensorBoard event files (copied to the trial's
        storage on a cluster; a temporary directory off it)."""
        if self._tensorboard_path is None:
            files = self.core.tensorboard
            self._tensorboard_path = files.path if files is not None else pathlib.Path(
                tempfile.mkdtemp(prefix="det-tensorboard-"))
        return self._tensorboard_path

    def get_tensorboard_writer(self) -> Any:
        """A ``torch.utils.tensorboard.SummaryWriter`` on ``get_tensorboard_path()`` (one per
        trial): what it writes lands next to the reported metrics."""
        if self._tensorboard_writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard_writer = SummaryWriter(log_dir=str(self.get_tensorboard_path()))
        return self._tensorboard_writer

    def set_stop_requested(self, stop_requested: bool) -> None:
        """Ask the trainer to stop after the current batch: it validates, checkpoints and
        reports an early exit ``user_requested_stop``."""
        self._stop_requested = bool(stop_requested)

    def get_stop_requested(self) -> bool:
        """Whether a stop was requested."""
        return self._stop_requested


def _default_device(local_rank: int) -> torch.device:
    """This worker's GPU (the agent shows each task only its own), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module inside a ``DistributedDataParallel`` wrapper (else ``model``):
    checkpoints hold its state dict, so they load under any number of workers."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


class PyTorchTrial(abc.ABC):
    """Subclass this; the entrypoint ``module:Class`` names the subclass.

    Implement ``__init__(context)``, the two data loader builders, ``train_batch`` and either
    ``evaluate_batch`` or ``evaluate_full_dataset``.
    """

    @abc.abstractmethod
    def __init__(self, context: PyTorchTrialContext) -> None:
        """Build models, optimizers (wrapped through ``context``) here."""

    @abc.abstractmethod
    def build_training_data_loader(self) -> torch.utils.data.DataLoader:
        """A ``torch.utils.data.DataLoader`` of training batches."""

    @abc.abstractmethod
    def build_validation_data_loader(self) -> torch.utils.data.DataLoader:
        """A ``torch.utils.data.DataLoader`` of validation batches."""

    @abc.abstractmethod
    def train_batch(
        self, batch: Any, epoch_idx: int, batch_idx: int
    ) -> torch.Tensor | dict[str, Any]:
        """Train on one batch (already on the device); ``batch_idx`` counts batches since the
        trial began. Return the loss tensor or a dict of metrics (tensors or numbers); the
        trainer averages them over each reporting period."""

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        """Metrics of one validation batch; the trainer averages them over the validation
        set's batches (``evaluation_reducer``). Implement this or ``evaluate_full_dataset``;
        ``evaluate_batch(self, batch)`` without ``batch_idx`` works too, as in 0.38."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement evaluate_batch or evaluate_full_dataset"
        )

    def evaluate_full_dataset(self, data_loader: torch.utils.data.DataLoader) -> dict[str, Any]:
        """Optional: metrics over the whole validation loader, computed by the trial."""
        raise NotImplementedError

    def build_callbacks(self) -> dict[str, PyTorchCallback]:
        """Optional: named ``PyTorchCallback``s the trainer calls (their state is
        checkpointed under these names)."""
        return {}

    def evaluation_reducer(self) -> Reducer | dict[str, Reducer]:
        """Optional: how ``evaluate_batch`` values are combined, one ``Reducer`` for every
        metric or one per metric name (default ``Reducer.AVG``)."""
        return Reducer.AVG

    def get_batch_length(self, batch: Any) -> int:
        """Records in ``batch``: the first dimension of its first tensor."""
        while not isinstance(batch, torch.Tensor):
            if isinstance(batch, Mapping):
                batch = next(iter(batch.values()))
            elif isinstance(batch, list | tuple):
                batch = batch[0]
            else:
                raise TypeError(
                    f"cannot tell the length of a {type(batch).__name__} batch; "
                    "override get_batch_length"
                )
        return int(batch.shape[0])
