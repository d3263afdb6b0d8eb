"""det's PyTorch API: subclass ``PyTorchTrial``; ``Trainer`` runs it (Determined 0.38's
``det.pytorch``)."""

from det.harness.checkpoint_load import load_trial_from_checkpoint_path
from det.harness.lengths import Batch, Epoch, TrainUnit
from det.harness.trainer import Trainer, reduce_training_outputs, seed_everything
from det.harness.trial import (
    InvalidHP,
    LRScheduler,
    MetricReducer,
    PyTorchCallback,
    PyTorchTrial,
    PyTorchTrialContext,
    Reducer,
)

__all__ = [
    "Batch",
    "Epoch",
    "InvalidHP",
    "LRScheduler",
    "MetricReducer",
    "PyTorchCallback",
    "PyTorchTrial",
    "PyTorchTrialContext",
    "Reducer",
    "TrainUnit",
    "Trainer",
    "load_trial_from_checkpoint_path",
    "reduce_training_outputs",
    "seed_everything",
]
