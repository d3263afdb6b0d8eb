"""Handwritten digits (scikit-learn's bundled 8x8 images) with a small MLP, as a PyTorchTrial.

Data: ``sklearn.datasets.load_digits`` (1797 images, 10 classes), pixels scaled to [0, 1],
split 80/20 with a fixed seed (1437 training, 360 validation), stratified by class.
"""

from typing import Any

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from det.harness import pytorch

SPLIT_SEED = 0
VALIDATION_FRACTION = 0.2


def digits_datasets() -> tuple[TensorDataset, TensorDataset]:
    """(training, validation) datasets of ``(float32 [N, 64] in [0, 1], int64 [N])``."""
    images, labels = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(
        images / 16.0, labels, test_size=VALIDATION_FRACTION, random_state=SPLIT_SEED,
        stratify=labels,
    )

    def dataset(x: Any, y: Any) -> TensorDataset:
        return TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y))

    return dataset(x_train, y_train), dataset(x_val, y_val)


class DigitsTrial(pytorch.PyTorchTrial):
    """64 -> hidden -> hidden -> 10 MLP with ReLU and dropout; Adam; lr halves every 5 epochs."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        hidden = int(context.get_hparam("hidden"))
        dropout = float(context.get_hparam("dropout"))
        self.model = context.wrap_model(
            nn.Sequential(
                nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(dropout),
                nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout),
                nn.Linear(hidden, 10),
            )
        )
        self.optimizer = context.wrap_optimizer(
            torch.optim.Adam(self.model.parameters(), lr=float(context.get_hparam("lr")))
        )
        context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=5, gamma=0.5),
            pytorch.LRScheduler.StepMode.STEP_EVERY_EPOCH,
        )
        self.loss_fn = nn.CrossEntropyLoss()
        self.train_set, self.val_set = digits_datasets()

    def build_training_data_loader(self) -> DataLoader:
        return DataLoader(
            self.train_set, batch_size=self.context.get_per_slot_batch_size(), shuffle=True,
            drop_last=True,
        )

    def build_validation_data_loader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        images, labels = batch
        loss = self.loss_fn(self.model(images), labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        images, labels = batch
        logits = self.model(images)
        return {
            "validation_loss": self.loss_fn(logits, labels),
            "accuracy": (logits.argmax(dim=1) == labels).float().mean(),
        }
