"""Training throughput (samples/s) under det's PyTorchTrial + Trainer vs. a plain PyTorch loop.

One model (an MLP on synthetic data, batch 128 by default) trains for the same batches three
ways: a hand-written loop (forward, backward, step, zero_grad over a DataLoader, then one
validation pass and one ``torch.save``), det's ``Trainer`` with a ``LocalTransport``
(validation and checkpoint only at the end, training metrics every 100 batches), and, if a
Determined install is available (``--reference-python``, default /tmp/detref-venv/bin/python),
the reference's ``determined.pytorch.Trainer`` in a subprocess with
``enable_tensorboard_logging=False``. Each run is a fresh process (a short
warm-up, then the timed run); runs alternate plain, det, reference, plain, ...; medians and
ratios to plain are printed. Figures only, no assertions.

    python bench/harness_overhead.py [--batches 400] [--repeats 5] [--batch-size 128]
"""

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES, HIDDEN, CLASSES = 256, 512, 10
VALIDATION_RECORDS = 1024


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def make_data(records: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(records, FEATURES, generator=g)
    return TensorDataset(x, (x[:, :CLASSES] * 3).argmax(dim=1))


def loaders(batches: int, batch_size: int) -> tuple[DataLoader, DataLoader]:
    train = DataLoader(make_data(batches * batch_size, 0), batch_size=batch_size, shuffle=True)
    val = DataLoader(make_data(VALIDATION_RECORDS, 1), batch_size=256)
    return train, val


def plain_run(batches: int, batch_size: int, ckpt_dir: str) -> float:
    """The hand-written loop; returns samples/s over training + final validation + save."""
    torch.manual_seed(0)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    train, val = loaders(batches, batch_size)
    start = time.perf_counter()
    model.train()
    for x, y in train:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in val:
            correct += int((model(x).argmax(dim=1) == y).sum())
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f"{ckpt_dir}/plain.pt")
    return batches * batch_size / (time.perf_counter() - start)


def det_run(batches: int, batch_size: int, ckpt_dir: str) -> float:
    """det's Trainer with a LocalTransport; samples/s over ``fit()``."""
    from det.harness import core, pytorch
    from det.harness.transport import LocalTransport

    class BenchTrial(pytorch.PyTorchTrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            self.context = context
            self.model = context.wrap_model(make_model())
            self.opt = context.wrap_optimizer(
                torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
            )
            self.loss_fn = nn.CrossEntropyLoss()
            self.train, self.val = loaders(batches, batch_size)

        def build_training_data_loader(self) -> DataLoader:
            return self.train

        def build_validation_data_loader(self) -> DataLoader:
            return self.val

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = self.loss_fn(self.model(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            return loss

        def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
            x, y = batch
            return {"accuracy": (self.model(x).argmax(dim=1) == y).float().mean()}

    config = {
        "searcher": {"metric": "accuracy", "max_length": {"batches": batches}},
        "hyperparameters": {"global_batch_size": batch_size},
        "scheduling_unit": 100,
    }
    transport = LocalTransport(config, dict(config["hyperparameters"]), echo=False)
    storage = {"type": "shared_fs", "host_path": ckpt_dir}
    with core.init(transport=transport, checkpoint_storage=storage) as ctx:
        trainer = pytorch.Trainer(BenchTrial, ctx)
        start = time.perf_counter()
        trainer.fit()
        elapsed = time.perf_counter() - start
    assert trainer.batches_trained == batches
    return batches * batch_size / elapsed


def reference_run(batches: int, batch_size: int, ckpt_dir: str) -> float:
    """Determined's own PyTorchTrial + Trainer, off-cluster; samples/s over ``fit()``."""
    from determined import pytorch as dpt

    class RefTrial(dpt.PyTorchTrial):
        def __init__(self, context: Any) -> None:
            self.context = context
            # Same torch DataLoader as the other runs, instead of det.pytorch.DataLoader.
            context.experimental.disable_dataset_reproducibility_checks()
            self.model = context.wrap_model(make_model())
            self.opt = context.wrap_optimizer(
                torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
            )
            self.loss_fn = nn.CrossEntropyLoss()
            self.train, self.val = loaders(batches, batch_size)

        def build_training_data_loader(self) -> DataLoader:
            return self.train

        def build_validation_data_loader(self) -> DataLoader:
            return self.val

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = self.loss_fn(self.model(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            return loss

        def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
            x, y = batch
            return {"accuracy": (self.model(x).argmax(dim=1) == y).float().mean()}

    config = {"searcher": {"name": "single", "metric": "accuracy", "smaller_is_better": False}}
    torch.manual_seed(0)
    with dpt.init(
        hparams={"global_batch_size": batch_size}, exp_conf=config,
        enable_tensorboard_logging=False,
    ) as ctx:
        trainer = dpt.Trainer(RefTrial(ctx), ctx)
        start = time.perf_counter()
        trainer.fit(
            max_length=dpt.Batch(batches), validation_period=dpt.Batch(batches),
            checkpoint_period=dpt.Batch(batches), reporting_period=dpt.Batch(100),
            checkpoint_policy="none",
        )
        elapsed = time.perf_counter() - start
    return batches * batch_size / elapsed


RUNS = {"plain": plain_run, "det": det_run, "reference": reference_run}


def worker(kind: str, batches: int, batch_size: int) -> float:
    """One measurement in this (fresh) process: a short warm-up, then the timed run."""
    with tempfile.TemporaryDirectory(prefix="det-bench-") as tmp:
        RUNS[kind](max(batches // 5, 10), batch_size, tmp)
        return RUNS[kind](batches, batch_size, tmp)


def measure(python: str, kind: str, args: argparse.Namespace) -> float | str:
    """Samples/s of one ``kind`` run in a fresh ``python`` process, or why it failed."""
    # The reference copies the working directory (its "user code") into every checkpoint
    # and stores off-cluster checkpoints under XDG_DATA_HOME: give each run empty ones.
    with tempfile.TemporaryDirectory(prefix="det-bench-") as tmp:
        code, data = pathlib.Path(tmp, "code"), pathlib.Path(tmp, "data")
        code.mkdir()
        proc = subprocess.run(
            [python, os.path.abspath(__file__), "--worker", kind, "--batches",
             str(args.batches), "--batch-size", str(args.batch_size), "--threads",
             str(args.threads)],
            capture_output=True, text=True, env={**os.environ, "XDG_DATA_HOME": str(data)},
            cwd=code, check=False,
        )
    if proc.returncode != 0:
        return f"{kind} run failed: {(proc.stderr.strip().splitlines() or ['?'])[-1][:300]}"
    return float(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--reference-python", default="/tmp/detref-venv/bin/python")
    parser.add_argument("--worker", choices=sorted(RUNS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.worker:
        print(worker(args.worker, args.batches, args.batch_size))
        return

    print(
        f"MLP {FEATURES}-{HIDDEN}-{HIDDEN}-{CLASSES}, batch {args.batch_size}, "
        f"{args.batches} batches per run, {args.repeats} alternating runs each (a fresh "
        f"process per run), {args.threads} torch threads, torch {torch.__version__}"
    )
    pythons = {"plain": sys.executable, "det": sys.executable}
    reference_note = None
    if pathlib.Path(args.reference_python).exists():
        pythons["reference"] = args.reference_python
    else:
        reference_note = f"no reference interpreter at {args.reference_python}"
    results: dict[str, list[float]] = {kind: [] for kind in pythons}
    for _ in range(args.repeats):
        for kind, python in list(pythons.items()):
            value = measure(python, kind, args)
            if isinstance(value, str):
                reference_note = value
                del pythons[kind], results[kind]
            else:
                results[kind].append(value)
    plain = statistics.median(results["plain"])
    for kind, values in results.items():
        median = statistics.median(values)
        runs = ", ".join(f"{v:.0f}" for v in values)
        print(
            f"  {kind:>9}: median {median:8.0f} samples/s, {median / plain:.3f} of plain "
            f"({runs})"
        )
    if reference_note:
        print(f"  reference (determined): not measured: {reference_note}")


if __name__ == "__main__":
    main()
