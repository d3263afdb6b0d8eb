"""``PyTorchTrial`` (what users subclass) and ``PyTorchTrialContext`` (what they get).

Shapes follow reference-facts §6.2: the trial builds its models and optimizers in
``__init__`` through ``context.wrap_*``; the ``Trainer`` calls ``train_batch`` once per batch
and ``evaluate_batch`` (or ``evaluate_full_dataset``) at validation time.
"""

import abc
import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from det.errors import ConfigError
from det.harness import core


class InvalidHP(Exception):
    """Raise from the trial (``__init__`` or ``train_batch``) when its hyperparameters cannot
    work; the trainer reports an early exit ``invalid_hp`` and the task exits 0."""


class LRScheduler:
    """Step modes for ``PyTorchTrialContext.wrap_lr_scheduler``."""

    class StepMode(enum.Enum):
        """When the trainer calls ``scheduler.step()``: after every ``frequency`` batches,
        after every ``frequency`` epochs, or never (the trial steps it)."""

        STEP_EVERY_BATCH = "batch"
        STEP_EVERY_EPOCH = "epoch"
        MANUAL_STEP = "manual"


class PyTorchTrialContext:
    """The trial's handle on hyperparameters, config, device and the objects to checkpoint.

    Everything wrapped (models, optimizers, lr schedulers) is saved in checkpoints and
    restored on resume, in wrapping order.
    """

    def __init__(self, core_context: core.Context, device: torch.device | None = None) -> None:
        self.core = core_context
        self.distributed = core_context.distributed
        self.device = device or _default_device(self.distributed.local_rank)
        self.models: list[torch.nn.Module] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_schedulers: list[tuple[Any, LRScheduler.StepMode, int]] = []
        self._hparams = dict(core_context.info.hparams)
        self._config = core_context.info.config
        self._stop_requested = False
        self._batches_trained = 0
        self._epoch_idx = 0

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

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Register ``optimizer`` for checkpointing; returns it."""
        self.optimizers.append(optimizer)
        return optimizer

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
        """``loss.backward(...)``."""
        loss.backward(gradient=gradient, retain_graph=retain_graph, create_graph=create_graph)

    def step_optimizer(
        self,
        optimizer: torch.optim.Optimizer,
        clip_grads: Callable[[Iterable[torch.nn.Parameter]], Any] | None = None,
        auto_zero_grads: bool = True,
    ) -> None:
        """Step ``optimizer``, first calling ``clip_grads(params)`` if given (e.g.
        ``lambda p: torch.nn.utils.clip_grad_norm_(p, 1.0)``), then zero its gradients unless
        ``auto_zero_grads`` is false."""
        if clip_grads is not None:
            clip_grads([p for group in optimizer.param_groups for p in group["params"]])
        optimizer.step()
        if auto_zero_grads:
            optimizer.zero_grad()

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
        return self.core.info.trial_id

    def get_experiment_id(self) -> int:
        """This trial's experiment id (0 in local runs)."""
        return self.core.info.experiment_id

    def get_trial_seed(self) -> int:
        """The trial's seed; the trainer seeds python, numpy and torch with it."""
        return self.core.info.trial_seed

    # progress and control
    def current_train_batch(self) -> int:
        """Batches trained so far (the index of the batch being trained)."""
        return self._batches_trained

    def current_train_epoch(self) -> int:
        """Index of the epoch being trained (full passes over the training loader so far)."""
        return self._epoch_idx

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
        set, weighted by ``get_batch_length``. Implement this or ``evaluate_full_dataset``."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement evaluate_batch or evaluate_full_dataset"
        )

    def evaluate_full_dataset(self, data_loader: torch.utils.data.DataLoader) -> dict[str, Any]:
        """Optional: metrics over the whole validation loader, computed by the trial."""
        raise NotImplementedError

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
