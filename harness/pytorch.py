"""det's PyTorch API: subclass ``PyTorchTrial``; ``Trainer`` runs it (reference-facts §6.2)."""

from det.harness.trainer import Trainer, reduce_training_outputs, seed_everything
from det.harness.trial import InvalidHP, LRScheduler, PyTorchTrial, PyTorchTrialContext

__all__ = [
    "InvalidHP",
    "LRScheduler",
    "PyTorchTrial",
    "PyTorchTrialContext",
    "Trainer",
    "reduce_training_outputs",
    "seed_everything",
]
