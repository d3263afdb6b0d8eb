"""``determined.pytorch``: 0.38's PyTorch API over det's trainer (``det.harness.trainer``).

``PyTorchTrial`` / ``PyTorchTrialContext`` are det's own classes, so a trial written for
Determined also runs as a ``module:Class`` entrypoint. ``init()`` + ``Trainer(trial,
context).fit(...)`` run one in a script, on a det cluster or off it.
"""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.utils.data

from det.harness.checkpoint_load import load_trial_from_checkpoint_path
from det.harness.core import DistributedContext
from det.harness.lengths import Batch, Epoch, TrainUnit
from det.harness.trainer import Trainer as _DetTrainer
from det.harness.trainer import seed_everything
from det.harness.trial import (
    LRScheduler,
    MetricReducer,
    PyTorchCallback,
    PyTorchTrial,
    PyTorchTrialContext,
    Reducer,
)
from determined import core as _core

__all__ = [
    "Batch",
    "DataLoader",
    "Epoch",
    "LRScheduler",
    "MetricReducer",
    "PyTorchCallback",
    "PyTorchTrial",
    "PyTorchTrialContext",
    "Reducer",
    "TorchData",
    "TrainUnit",
    "Trainer",
    "init",
    "load_trial_from_checkpoint_path",
    "to_device",
]

TorchData = dict[str, torch.Tensor] | Sequence[torch.Tensor] | torch.Tensor
"""What a batch may be: a tensor, a sequence of tensors or a dict of them."""


class DataLoader(torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` under Determined's name; the trainer uses it as is."""

    def get_data_loader(self, repeat: bool = False, skip: int = 0, num_replicas: int = 1,
                        rank: int = 0) -> torch.utils.data.DataLoader:
        """The torch data loader (itself)."""
        return self


def to_device(data: Any, device: torch.device, warned_types: set[type] | None = None) -> Any:
    """``data`` (tensors in lists, tuples, dicts) moved to ``device``."""
    if isinstance(data, torch.Tensor):
        return data.to(device)
    if isinstance(data, dict):
        return {k: to_device(v, device) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return type(data)(to_device(v, device) for v in data)
    return data


@contextmanager
def init(
    *,
    hparams: dict[str, Any] | None = None,
    exp_conf: dict[str, Any] | None = None,
    distributed: DistributedContext | None = None,
    aggregation_frequency: int = 1,
    enable_tensorboard_logging: bool = True,
) -> Iterator[PyTorchTrialContext]:
    """Yield a ``PyTorchTrialContext`` for ``Trainer`` (0.38 ``det.pytorch.init``).

    In a det task the trial's hyperparameters and config come from the cluster; off-cluster
    from ``hparams`` and ``exp_conf``. Python, numpy and torch are seeded with the trial seed
    (``reproducibility.experiment_seed`` off-cluster). ``aggregation_frequency`` > 1 is
    ``wrap_optimizer(backward_passes_per_step=...)``'s job on det.
    """
    with _core.init(distributed=distributed, hparams=hparams, config=exp_conf) as ctx:
        seed_everything(ctx.task_info.trial_seed)
        yield PyTorchTrialContext(ctx)


class Trainer:
    """Runs a ``PyTorchTrial`` built on a context from ``init()`` (0.38 ``Trainer``)."""

    def __init__(self, trial: PyTorchTrial, context: PyTorchTrialContext) -> None:
        self._trainer = _DetTrainer.for_trial(trial, context)

    def fit(
        self,
        checkpoint_period: TrainUnit | None = None,
        validation_period: TrainUnit | None = None,
        max_length: TrainUnit | None = None,
        reporting_period: TrainUnit = Batch(100),
        checkpoint_policy: str = "best",
        latest_checkpoint: str | None = None,
        step_zero_validation: bool = False,
        test_mode: bool = False,
        profiling_enabled: bool = False,
    ) -> None:
        """Train (see ``det.harness.trainer.Trainer.fit``): to ``max_length`` if given, else
        to the searcher's operations (``searcher.max_length``). Validation and checkpoint
        periods default to the config's; ``checkpoint_policy`` ``best`` checkpoints after
        each best validation. ``profiling_enabled`` has no effect on det."""
        self._trainer.fit(
            max_length, checkpoint_period=checkpoint_period,
            validation_period=validation_period, reporting_period=reporting_period,
            checkpoint_policy=checkpoint_policy, latest_checkpoint=latest_checkpoint,
            step_zero_validation=step_zero_validation, test_mode=test_mode)
