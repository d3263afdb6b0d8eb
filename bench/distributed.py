"""Distributed training throughput (issue 12): samples/s of det's Trainer with 1 worker vs N
workers at the same global batch size, each worker with one intra-op thread.

Two models: digits-sized (MLP 64-128-128-10, global batch 32, as examples/digits) and the
harness bench's larger MLP (256-512-512-10, global batch 128, bench/harness_overhead.py), on
synthetic data. Each run is ``python -m det.launch.torch_distributed`` (torchrun, gloo on CPU)
starting this file in ``--worker`` mode with N slots: the workers run a ``PyTorchTrial``
under det's ``Trainer`` with a ``LocalTransport`` (no database), DDP, sharded data, the
per-batch stop agreement and training metrics reduced every 100 batches. Rank 0 times the
batches after a warm-up and prints samples/s (global records per second). The same training
as a hand-written DDP loop (``plain``: torch alone) is measured alongside, so that what det
adds is told apart from what the host and torch cost. Runs alternate; medians and the N/1
ratios are printed. Figures only, no assertions.

    python bench/distributed.py [--workers 2] [--batches 600] [--warmup 50] [--repeats 3]

On a host with GPUs the workers train on them instead (one per GPU, nccl; the trainer picks
the device and backend), so ``--workers`` up to the GPU count measures 1 vs N GPUs.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

MODELS = {
    # name: (features, hidden, global batch size)
    "digits": (64, 128, 32),
    "mlp": (256, 512, 128),
}
CLASSES = 10


def worker(args: argparse.Namespace) -> None:
    """One worker: train ``args.batches`` batches of ``args.model`` under det's Trainer."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from det.harness import core, pytorch
    from det.harness.transport import LocalTransport

    torch.set_num_threads(1)
    features, hidden, global_batch = MODELS[args.model]
    marks: dict[str, float] = {}

    def data(records: int, seed: int) -> TensorDataset:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(records, features, generator=g)
        return TensorDataset(x, (x[:, :CLASSES] * 3).argmax(dim=1))

    class Trial(pytorch.PyTorchTrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            self.context = context
            self.model = context.wrap_model(nn.Sequential(
                nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                nn.Linear(hidden, CLASSES)))
            self.opt = context.wrap_optimizer(
                torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9))
            self.loss_fn = nn.CrossEntropyLoss()

        def build_training_data_loader(self) -> DataLoader:
            return DataLoader(data(args.batches * global_batch, 0), shuffle=True,
                              batch_size=self.context.get_per_slot_batch_size())

        def build_validation_data_loader(self) -> DataLoader:
            return DataLoader(data(1024, 1), batch_size=256)

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            if batch_idx == args.warmup:
                marks["start"] = time.perf_counter()
            x, y = batch
            loss = self.loss_fn(self.model(x), y)
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            if batch_idx == args.batches - 1:
                marks["end"] = time.perf_counter()
            return loss

        def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
            x, y = batch
            return {"accuracy": (self.model(x).argmax(dim=1) == y).float().mean()}

    config = {"searcher": {"name": "single", "metric": "accuracy", "smaller_is_better": False,
                           "max_length": {"batches": args.batches}},
              "scheduling_unit": 100, "hyperparameters": {"global_batch_size": global_batch}}
    transport = LocalTransport(config, {"global_batch_size": global_batch}, echo=False)
    with tempfile.TemporaryDirectory() as tmp, core.init(
            transport=transport,
            checkpoint_storage={"type": "shared_fs", "host_path": tmp}) as ctx:
        pytorch.Trainer(Trial, ctx).fit()
        if ctx.distributed.rank == 0:
            timed = args.batches - args.warmup
            rate = timed * global_batch / (marks["end"] - marks["start"])
            print(json.dumps({"samples_per_s": rate}), flush=True)


def plain_worker(args: argparse.Namespace) -> None:
    """The same training as a hand-written DDP loop (no det), for comparison: what torch
    itself costs at this size on this host."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(1)
    features, hidden, global_batch = MODELS[args.model]
    size = int(os.environ["WORLD_SIZE"])
    if size > 1:
        dist.init_process_group("gloo")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batches * global_batch, features, generator=g)
    data = TensorDataset(x, (x[:, :CLASSES] * 3).argmax(dim=1))
    rank = int(os.environ["RANK"])
    loader = DataLoader(data, batch_size=global_batch // size,
                        sampler=DistributedSampler(data, size, rank, seed=0))
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, CLASSES))
    if size > 1:
        model = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    start = 0.0
    for i, (xb, yb) in enumerate(loader):
        if i == args.warmup:
            start = time.perf_counter()
        loss_fn(model(xb), yb).backward()
        opt.step()
        opt.zero_grad()
    if rank == 0:
        rate = (args.batches - args.warmup) * global_batch / (time.perf_counter() - start)
        print(json.dumps({"samples_per_s": rate}), flush=True)
    if size > 1:
        dist.destroy_process_group()


def run(model: str, workers: int, args: argparse.Namespace, plain: bool = False) -> float:
    """Samples/s of one launch of ``workers`` workers."""
    env = {**os.environ, "DET_SLOT_IDS": json.dumps(list(range(workers))),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "det.launch.torch_distributed", "--", sys.executable,
           __file__, "--worker", "--model", model, "--batches", str(args.batches),
           "--warmup", str(args.warmup), *(["--plain"] if plain else [])]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if "samples_per_s" in line:
            return float(json.loads(line.split("] ", 1)[1])["samples_per_s"])
    raise RuntimeError(f"no figure in the output:\n{out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="digits,mlp")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        (plain_worker if args.plain else worker)(args)
        return
    n = args.workers
    print(f"{'model':8} {'loop':6} {'1 worker':>10} {f'{n} workers':>10} {'ratio':>6}"
          f"   (samples/s, medians of {args.repeats})")
    for model in args.models.split(","):
        figures: dict[tuple[bool, int], list[float]] = {
            (plain, w): [] for plain in (False, True) for w in (1, n)}
        for _ in range(args.repeats):
            for plain, w in figures:
                figures[plain, w].append(run(model, w, args, plain))
        for plain in (False, True):
            one, many = (statistics.median(figures[plain, w]) for w in (1, n))
            print(f"{model:8} {'plain' if plain else 'det':6} {one:10.0f} {many:10.0f} "
                  f"{many / one:6.2f}")


if __name__ == "__main__":
    main()
