"""Fashion-MNIST (Xiao et al. 2017: 28x28 grey images of clothing, 10 classes) with a small CNN,
as a PyTorchTrial.

Data: the original IDX files (60,000 training and 10,000 test images; the test set is the
validation set). They are read from the first directory that holds all four files:
``$FASHION_MNIST_DIR``, ``/usr/share/datasets/fashion-mnist`` (Debian's
``dataset-fashion-mnist`` package), ``~/.cache/det/fashion-mnist``; else they are downloaded
from Zalando's server into the last.
"""

import functools
import gzip
import os
import pathlib
import urllib.request
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from det.harness import pytorch

FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "val_images": "t10k-images-idx3-ubyte.gz",
    "val_labels": "t10k-labels-idx1-ubyte.gz",
}
DOWNLOAD_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
DEBIAN_DIR = pathlib.Path("/usr/share/datasets/fashion-mnist")
CACHE_DIR = pathlib.Path.home() / ".cache" / "det" / "fashion-mnist"


def data_dir() -> pathlib.Path:
    """The first directory holding the four files (module docstring); downloads if none."""
    candidates = [DEBIAN_DIR, CACHE_DIR]
    if os.environ.get("FASHION_MNIST_DIR"):
        candidates.insert(0, pathlib.Path(os.environ["FASHION_MNIST_DIR"]))
    for directory in candidates:
        if all((directory / name).is_file() for name in FILES.values()):
            return directory
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    for name in FILES.values():
        if not (CACHE_DIR / name).is_file():
            partial = CACHE_DIR / f"{name}.part"
            urllib.request.urlretrieve(DOWNLOAD_URL + name, partial)
            partial.rename(CACHE_DIR / name)
    return CACHE_DIR


def read_idx(path: pathlib.Path) -> np.ndarray:
    """An IDX file (gzipped) as a uint8 array: header = 2 zero bytes, type 0x08 (ubyte), the
    number of dimensions, then one big-endian uint32 per dimension."""
    data = gzip.decompress(path.read_bytes())
    if data[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = data[3]
    shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


@functools.cache
def fashion_mnist_datasets() -> tuple[TensorDataset, TensorDataset]:
    """(training, validation) datasets of ``(float32 [N, 1, 28, 28] in [0, 1], int64 [N])``;
    read once per process."""
    directory = data_dir()

    def dataset(images: str, labels: str) -> TensorDataset:
        x = torch.from_numpy(read_idx(directory / FILES[images]).astype(np.float32) / 255.0)
        y = torch.from_numpy(read_idx(directory / FILES[labels]).astype(np.int64))
        return TensorDataset(x.unsqueeze(1), y)

    return dataset("train_images", "train_labels"), dataset("val_images", "val_labels")


class FashionMNISTTrial(pytorch.PyTorchTrial):
    """Two 3x3 conv + ReLU + 2x2 max-pool blocks (``filters``, then 2x``filters`` channels),
    then a ``hidden``-unit layer with dropout and a 10-way output; Adam."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        filters = int(context.get_hparam("filters"))
        hidden = int(context.get_hparam("hidden"))
        self.model = context.wrap_model(
            nn.Sequential(
                nn.Conv2d(1, filters, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(filters, 2 * filters, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Linear(2 * filters * 7 * 7, hidden), nn.ReLU(),
                nn.Dropout(float(context.get_hparam("dropout"))),
                nn.Linear(hidden, 10),
            )
        )
        self.optimizer = context.wrap_optimizer(
            torch.optim.Adam(self.model.parameters(), lr=float(context.get_hparam("lr")))
        )
        self.loss_fn = nn.CrossEntropyLoss()
        self.train_set, self.val_set = fashion_mnist_datasets()

    def build_training_data_loader(self) -> DataLoader:
        return DataLoader(
            self.train_set, batch_size=self.context.get_per_slot_batch_size(), shuffle=True,
            drop_last=True,
        )

    def build_validation_data_loader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=1000)

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
