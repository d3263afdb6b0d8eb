"""A trial that trains nothing: its metric falls by a fixed factor each batch. For checking
the platform's workloads (training, validation, checkpoints, restarts) cheaply."""

from typing import Any

import torch

from determined import pytorch


class NoOpTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.base = float(context.get_hparam("metrics_base"))
        # A parameter, so that the trainer has a model and an optimizer to checkpoint.
        self.model = context.wrap_model(torch.nn.Linear(1, 1))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(torch.utils.data.TensorDataset(torch.zeros(64, 1)),
                                  batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(torch.utils.data.TensorDataset(torch.zeros(8, 1)),
                                  batch_size=8)

    def _metric(self) -> float:
        return self.base ** (self.context.current_train_batch() + 1)

    def train_batch(self, batch: pytorch.TorchData, epoch_idx: int, batch_idx: int
                    ) -> dict[str, Any]:
        return {"loss": self._metric()}

    def evaluate_batch(self, batch: pytorch.TorchData, batch_idx: int) -> dict[str, Any]:
        return {"validation_error": self._metric()}
