"""Off-cluster parity with Determined 0.38.1 (issue 38): ``python3 train.py`` with det's
``determined`` reports training metrics with ``batches`` and ``epochs``, counts epochs as
0.38.1 does (the epochs completed: epoch 2 at batch 12 of 5-batch epochs, not 2.4), and logs
the status and ``saved checkpoint`` lines in 0.38.1's order.

``EXPECTED`` is what 0.38.1 (``pip install determined==0.38.1``, with this file's ``TRAIN``
script) logs, filtered as ``key_lines`` filters; measured once and written down here, since
the reference is not installed with det."""

import os
import re
import subprocess
import sys
from pathlib import Path

TRAIN = '''
import logging
import os
import torch
from torch import nn
import determined as det
from determined import pytorch


class Tiny(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(nn.Linear(4, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))

    def _data(self):
        x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
        return torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))

    def build_training_data_loader(self):
        return pytorch.DataLoader(self._data(), batch_size=8)  # 5 batches an epoch

    def build_validation_data_loader(self):
        return pytorch.DataLoader(self._data(), batch_size=8)

    def train_batch(self, batch, epoch_idx, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss, **({"epochs": 7.5} if os.environ.get("OWN_EPOCHS") else {})}

    def evaluate_batch(self, batch):
        x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y)}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    with pytorch.init() as ctx:
        trainer = pytorch.Trainer(Tiny(ctx), ctx)
        trainer.fit(max_length=pytorch.Batch(12), validation_period=pytorch.Batch(6),
                    checkpoint_period=pytorch.Batch(6), reporting_period=pytorch.Batch(3))
'''

EXPECTED = [
    "status: training",
    "training 3: batches=3 epochs=0",
    "status: training",
    "training 6: batches=6 epochs=1",
    "status: validating",
    "validation 6: batches=6 epochs=1",
    "status: checkpointing",
    "saved checkpoint",
    "status: training",
    "training 9: batches=9 epochs=1",
    "status: training",
    "training 12: batches=12 epochs=2",
    "status: validating",
    "validation 12: batches=12 epochs=2",
    "status: checkpointing",
    "saved checkpoint",
]

REPORT = re.compile(r"report_(training|validation)_metrics\(steps_completed=(\d+), metrics=")


def key_lines(log: str) -> list[str]:
    """The status, metrics (steps, batches, epochs) and saved-checkpoint lines of a log."""
    out = []
    for line in log.splitlines():
        if m := REPORT.search(line):
            batches, epochs = (re.search(rf"'{k}': ([\d.]+)", line) for k in ("batches", "epochs"))
            out.append(f"{m[1]} {m[2]}: batches={batches and batches[1]} "
                       f"epochs={epochs and epochs[1]}")
        elif m := re.search(r"(status: \w+|saved checkpoint) ?", line):
            out.append(m[1])
    return out


def run_train(tmp_path: Path, **env: str) -> str:
    (tmp_path / "train.py").write_text(TRAIN)
    r = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=240,
        env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout + r.stderr


def test_off_cluster_run_logs_as_0_38_1_does(tmp_path: Path) -> None:
    log = run_train(tmp_path)
    assert key_lines(log) == EXPECTED, log
    uuids = re.findall(r"saved checkpoint ([0-9a-f-]{36}) at batch (\d+)", log)
    assert [b for _, b in uuids] == ["6", "12"]
    for uuid, _ in uuids:
        assert (tmp_path / "data" / "determined" / uuid).is_dir()


def test_the_trials_own_epochs_win(tmp_path: Path) -> None:
    """0.38.1 adds ``batches`` and ``epochs`` only where the trial's metrics lack them."""
    log = run_train(tmp_path, OWN_EPOCHS="1")
    training = [x for x in key_lines(log) if x.startswith("training")]
    assert training == [f"training {b}: batches={b} epochs=7.5" for b in (3, 6, 9, 12)]
