"""A small PyTorchTrial in the style of Determined's documentation: a two-layer network that
learns y = sin(x) on synthetic data, with an lr scheduler, a callback and a custom reducer."""

from typing import Any

import torch
from torch import nn

from determined import pytorch


def _data(n: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    return torch.utils.data.TensorDataset(x, torch.sin(x))


class MaxError(pytorch.MetricReducer):
    """The largest absolute error over the validation set."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.worst = 0.0

    def update(self, errors: torch.Tensor) -> None:
        self.worst = max(self.worst, float(errors.max()))

    def per_slot_reduce(self) -> float:
        return self.worst

    def cross_slot_reduce(self, per_slot_metrics: list) -> float:
        return max(per_slot_metrics)


class EpochCounter(pytorch.PyTorchCallback):
    def __init__(self) -> None:
        self.epochs = 0

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        self.epochs += 1

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epochs = state_dict["epochs"]


class SineTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        hidden = context.get_hparam("hidden")
        self.model = context.wrap_model(nn.Sequential(nn.Linear(1, hidden), nn.Tanh(),
                                                      nn.Linear(hidden, 1)))
        self.optimizer = context.wrap_optimizer(
            torch.optim.Adam(self.model.parameters(), lr=context.get_hparam("lr")))
        self.scheduler = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.9),
            step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_EPOCH)
        self.max_error = context.wrap_reducer(MaxError(), name="max_error")
        self.counter = EpochCounter()

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(_data(512, 0), batch_size=self.context.get_per_slot_batch_size(),
                                  shuffle=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(_data(256, 1), batch_size=64)

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"counter": self.counter}

    def train_batch(self, batch: pytorch.TorchData, epoch_idx: int, batch_idx: int
                    ) -> dict[str, Any]:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        if self.context.is_epoch_end():
            self.context.get_tensorboard_writer().add_scalar(
                "epoch_end_loss", loss.item(), batch_idx)
        return {"loss": loss, "lr": self.scheduler.get_last_lr()[0]}

    def evaluate_batch(self, batch: pytorch.TorchData, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        pred = self.model(x)
        self.max_error.update((pred - y).abs())
        return {"validation_loss": nn.functional.mse_loss(pred, y)}
