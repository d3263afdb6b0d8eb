"""The trainer loop: runs a ``PyTorchTrial``'s train / validate / checkpoint workloads.

It follows the searcher's operations (never training past an op's length), validates every
``min_validation_period`` and at the end of each op (then completes the op with
``searcher.metric``), reports training metrics every ``scheduling_unit`` batches (averaged),
checkpoints every ``min_checkpoint_period``, at the end, and when the platform asks the task
to stop (reference-facts §6.2; spec run-training-code.rst, "Pause and Activate"). It resumes
from ``latest_checkpoint`` at the same step with the same model, optimizer, scheduler, data
position and RNG state.

The per-batch path does what a hand-written loop does plus a few attribute reads: no I/O, no
``.item()``; losses are kept as detached tensors and reduced when reported.
"""

import math
import random
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from det.errors import DetError
from det.harness import core
from det.harness.errors import MissingSearcherMetricError
from det.harness.trial import InvalidHP, LRScheduler, PyTorchTrial, PyTorchTrialContext

STATE_FILE = "state.pt"
"""The trainer's file inside a checkpoint directory (``torch.save`` of a dict)."""

CHECKPOINT_FORMAT = "det.pytorch.v1"



def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy and torch (all devices) with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _detach(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.detach()
    if isinstance(out, dict):
        return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
    raise DetError(
        f"train_batch must return a loss tensor or a dict of metrics, got {type(out).__name__}"
    )


def _mean(values: list[Any]) -> float:
    if all(isinstance(v, torch.Tensor) for v in values):
        return float(torch.stack([v.float().reshape(()) for v in values]).mean().item())
    return float(np.mean([float(v) for v in values]))


def reduce_training_outputs(outputs: list[Any]) -> dict[str, float]:
    """Average ``train_batch`` outputs over batches: a tensor output becomes ``loss``; each
    key of a dict output is averaged over the batches that reported it."""
    grouped: dict[str, list[Any]] = {}
    for out in outputs:
        items = out.items() if isinstance(out, dict) else (("loss", out),)
        for key, value in items:
            grouped.setdefault(key, []).append(value)
    return {key: _mean(values) for key, values in grouped.items()}


class Trainer:
    """Runs ``trial_class`` under ``core_context``.

    Construction seeds python / numpy / torch with the trial seed, then builds the
    ``PyTorchTrialContext`` and the trial. ``fit()`` does the work.
    """

    def __init__(
        self,
        trial_class: type[PyTorchTrial],
        core_context: core.Context,
        device: torch.device | None = None,
    ) -> None:
        self.core = core_context
        info = core_context.info
        self.config = info.config
        seed_everything(info.trial_seed)
        self.context = PyTorchTrialContext(core_context, device)
        self._invalid_hp: InvalidHP | None = None
        try:
            self.trial: PyTorchTrial | None = trial_class(self.context)
        except InvalidHP as e:
            self.trial, self._invalid_hp = None, e
        self.units = core_context.units()
        searcher = self.config.get("searcher") or {}
        self.searcher_metric: str | None = searcher.get("metric")
        self.scheduling_unit = int(self.config["scheduling_unit"])
        self.validation_period = self.units.length_to_batches(
            self.config.get("min_validation_period"), "min_validation_period"
        )
        self.checkpoint_period = self.units.length_to_batches(
            self.config.get("min_checkpoint_period"), "min_checkpoint_period"
        )
        self.batches_trained = 0
        self.epoch_idx = 0
        self.batch_in_epoch = 0
        self.last_validation: tuple[int, dict[str, Any]] | None = None
        self.last_checkpoint: int | None = None
        self.latest_checkpoint_uuid: str | None = None
        self._outputs: list[Any] = []
        self._epoch_rng: torch.Tensor | None = None
        self._train_iter: Iterator[Any] | None = None
        self._val_loader: torch.utils.data.DataLoader | None = None

    # the workloads
    def fit(self) -> str:
        """Train through the searcher's ops. Returns ``"completed"`` (the searcher wants no
        more), ``"preempted"`` (checkpointed at the platform's request), ``"stopped"``
        (``context.set_stop_requested``), or ``"invalid_hp"`` (the trial raised
        ``InvalidHP``; reported as an early exit).

        Raises ``MissingSearcherMetricError`` when validation metrics lack
        ``searcher.metric``; user code exceptions propagate unchanged.
        """
        if self.trial is None:
            print(f"det.harness: invalid hyperparameters: {self._invalid_hp}", file=sys.stderr)
            self.core.train.report_early_exit(core.EarlyExitReason.INVALID_HP)
            return "invalid_hp"
        try:
            return self._fit(self.trial)
        except InvalidHP as e:
            print(f"det.harness: invalid hyperparameters: {e}", file=sys.stderr)
            self.core.train.report_early_exit(core.EarlyExitReason.INVALID_HP)
            return "invalid_hp"

    def _fit(self, trial: PyTorchTrial) -> str:
        self._train_loader = trial.build_training_data_loader()
        if len(self._train_loader) == 0:
            raise DetError("build_training_data_loader returned an empty data loader")
        if self.core.info.latest_checkpoint:
            self._restore(self.core.info.latest_checkpoint)
        else:
            self._new_epoch_iterator()
        for op in self.core.searcher.operations():
            target = self.units.to_batches(op.length, op.unit)
            outcome = self._train_to(target, op)
            if outcome is not None:
                return outcome
            metrics = self._validation_at_current_step()
            op.report_completed(self._searcher_value(metrics))
        if self.last_checkpoint != self.batches_trained:
            self.checkpoint()
        # A trial the searcher is done with is also told to stop (closed trials' runs are
        # desired STOPPED): that is completion, not preemption.
        return "completed" if self.core.searcher.out_of_work else "preempted"

    def _train_to(self, target: int, op: core.SearcherOperation) -> str | None:
        """Train until ``target`` batches, doing the periodic workloads on the way; returns
        an outcome if the task must stop early, else ``None``."""
        su = self.scheduling_unit
        while self.batches_trained < target:
            b = self.batches_trained
            stop = min(target, (b // su + 1) * su)
            next_validation = self._next_due(self.validation_period, self.last_validation_step)
            next_checkpoint = self._next_due(self.checkpoint_period, self.last_checkpoint)
            stop = int(min(stop, next_validation, next_checkpoint))
            interrupted = self._train_batches(stop)
            b = self.batches_trained
            if b % su == 0 or b == target or interrupted:
                self._report_training_metrics()
                op.report_progress(self.units.from_batches(b, op.unit))
            if interrupted:
                return self._interrupt()
            if b >= next_validation:
                self.validate()
            if b >= next_checkpoint:
                self.checkpoint()
        return None

    @staticmethod
    def _next_due(period: int | None, last: int | None) -> float:
        """The batch at which a periodic workload is next due (``inf`` without a period)."""
        return (last or 0) + period if period else math.inf

    @property
    def last_validation_step(self) -> int | None:
        """Batches trained at the last validation (``None`` before the first)."""
        return self.last_validation[0] if self.last_validation else None

    def _interrupt(self) -> str:
        if self.core.preempt.should_preempt():
            if self.last_checkpoint != self.batches_trained:
                self.checkpoint()
            return "preempted"
        self._validation_at_current_step()
        if self.last_checkpoint != self.batches_trained:
            self.checkpoint()
        self.core.train.report_early_exit(core.EarlyExitReason.USER_REQUESTED_STOP)
        return "stopped"

    def _train_batches(self, stop: int) -> bool:
        """The hot loop: train until ``stop`` batches. Returns True if it stopped early
        because of a preemption or stop request (checked before each batch)."""
        trial, ctx = self.trial, self.context
        assert trial is not None
        outputs = self._outputs
        preempt = self.core.transport.should_preempt
        to_device = ctx.to_device if ctx.device.type != "cpu" else None
        every_batch = [
            (s, f) for s, mode, f in ctx.lr_schedulers
            if mode is LRScheduler.StepMode.STEP_EVERY_BATCH
        ]
        it = self._train_iter
        assert it is not None
        b, epoch, in_epoch = self.batches_trained, self.epoch_idx, self.batch_in_epoch
        interrupted = False
        while b < stop:
            if ctx._stop_requested or preempt():
                interrupted = True
                break
            try:
                batch = next(it)
            except StopIteration:
                self._end_epoch()
                it, epoch, in_epoch = self._train_iter, self.epoch_idx, 0
                continue
            if to_device is not None:
                batch = to_device(batch)
            ctx._batches_trained = b
            out = trial.train_batch(batch, epoch, b)
            outputs.append(out.detach() if isinstance(out, torch.Tensor) else _detach(out))
            b += 1
            in_epoch += 1
            for sched, freq in every_batch:
                if b % freq == 0:
                    sched.step()
        self.batches_trained = ctx._batches_trained = b
        self.batch_in_epoch = in_epoch
        return interrupted

    def _new_epoch_iterator(self) -> None:
        # The sampler draws its shuffle seed from torch's RNG when the iterator is created;
        # keep that state so a restore can rebuild the same epoch order.
        self._epoch_rng = torch.get_rng_state()
        self._train_iter = iter(self._train_loader)

    def _end_epoch(self) -> None:
        self.epoch_idx += 1
        self.batch_in_epoch = 0
        self.context._epoch_idx = self.epoch_idx
        for sched, mode, freq in self.context.lr_schedulers:
            if mode is LRScheduler.StepMode.STEP_EVERY_EPOCH and self.epoch_idx % freq == 0:
                sched.step()
        self._new_epoch_iterator()

    def _report_training_metrics(self) -> None:
        if self._outputs:
            metrics = reduce_training_outputs(self._outputs)
            self._outputs.clear()
            self.core.train.report_training_metrics(self.batches_trained, metrics)

    def _epochs(self) -> float:
        return self.epoch_idx + self.batch_in_epoch / len(self._train_loader)

    # validation
    def validate(self) -> dict[str, Any]:
        """Validate at the current step and report the metrics (plus ``batches`` and
        ``epochs``, fractional). Torch's RNG state is restored afterwards, so validating
        never changes training."""
        trial = self.trial
        assert trial is not None
        if self._val_loader is None:
            self._val_loader = trial.build_validation_data_loader()
        rng = torch.get_rng_state()
        models = self.context.models
        modes = [m.training for m in models]
        for m in models:
            m.eval()
        try:
            with torch.no_grad():
                if type(trial).evaluate_full_dataset is not PyTorchTrial.evaluate_full_dataset:
                    raw = trial.evaluate_full_dataset(self._val_loader)
                    metrics = {k: _scalar(v) for k, v in raw.items()}
                else:
                    metrics = self._evaluate_batches(trial, self._val_loader)
        finally:
            for m, mode in zip(models, modes, strict=True):
                m.train(mode)
            torch.set_rng_state(rng)
        metrics["batches"] = self.batches_trained
        metrics["epochs"] = self._epochs()
        self.core.train.report_validation_metrics(self.batches_trained, metrics)
        self.last_validation = (self.batches_trained, metrics)
        return metrics

    def _evaluate_batches(
        self, trial: PyTorchTrial, loader: torch.utils.data.DataLoader
    ) -> dict[str, Any]:
        sums: dict[str, Any] = {}
        counts: dict[str, int] = {}
        to_device = self.context.to_device
        for idx, batch in enumerate(loader):
            batch = to_device(batch)
            n = trial.get_batch_length(batch)
            for key, value in trial.evaluate_batch(batch, idx).items():
                if isinstance(value, torch.Tensor):
                    value = value.detach().double()
                sums[key] = sums.get(key, 0.0) + value * n
                counts[key] = counts.get(key, 0) + n
        return {k: _scalar(sums[k] / counts[k]) for k in sums}

    def _validation_at_current_step(self) -> dict[str, Any]:
        if self.last_validation and self.last_validation[0] == self.batches_trained:
            return self.last_validation[1]
        return self.validate()

    def _searcher_value(self, metrics: dict[str, Any]) -> float:
        name = self.searcher_metric
        if not name or name not in metrics:
            raise MissingSearcherMetricError(str(name), list(metrics))
        try:
            value = float(metrics[name])
        except (TypeError, ValueError) as e:
            raise DetError(
                f"searcher metric {name!r} must be a number, got {metrics[name]!r}"
            ) from e
        if math.isnan(value):
            raise DetError(f"searcher metric {name!r} is NaN at batch {self.batches_trained}")
        return value

    # checkpoints
    def checkpoint(self) -> str:
        """Store the trial's state at the current step; returns the checkpoint uuid."""
        ctx = self.context
        state = {
            "format": CHECKPOINT_FORMAT,
            "models": [m.state_dict() for m in ctx.models],
            "optimizers": [o.state_dict() for o in ctx.optimizers],
            "lr_schedulers": [s.state_dict() for s, _, _ in ctx.lr_schedulers],
            "trainer": {
                "batches_trained": self.batches_trained,
                "epoch_idx": self.epoch_idx,
                "batch_in_epoch": self.batch_in_epoch,
                "last_validation": self.last_validation,
            },
            "rng": {
                "epoch_start_torch": self._epoch_rng,
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "numpy": np.random.get_state(),
                "python": random.getstate(),
            },
        }
        metadata = {
            "steps_completed": self.batches_trained,
            "format": CHECKPOINT_FORMAT,
            "framework": f"torch-{torch.__version__}",
            "trial_id": self.core.info.trial_id,
            "experiment_id": self.core.info.experiment_id,
        }
        with self.core.checkpoint.store_path(metadata) as (path, uuid):
            torch.save(state, path / STATE_FILE)
        self.last_checkpoint = self.batches_trained
        self.latest_checkpoint_uuid = uuid
        return uuid

    def _restore(self, uuid: str) -> None:
        """Load checkpoint ``uuid`` and put the data loader at the same position: rebuild the
        epoch's iterator from the epoch-start RNG state and skip the batches already trained
        in that epoch (they are loaded, not trained)."""
        ctx = self.context
        with self.core.checkpoint.restore_path(uuid) as path:
            state = torch.load(path / STATE_FILE, map_location=ctx.device, weights_only=False)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise DetError(f"checkpoint {uuid} is not a {CHECKPOINT_FORMAT} checkpoint")
        for kind, objects in (
            ("models", ctx.models),
            ("optimizers", ctx.optimizers),
            ("lr_schedulers", [s for s, _, _ in ctx.lr_schedulers]),
        ):
            if len(state[kind]) != len(objects):
                raise DetError(
                    f"checkpoint {uuid} holds {len(state[kind])} {kind}, the trial wrapped "
                    f"{len(objects)}"
                )
            for obj, obj_state in zip(objects, state[kind], strict=True):
                obj.load_state_dict(obj_state)
        trainer = state["trainer"]
        self.batches_trained = ctx._batches_trained = trainer["batches_trained"]
        self.epoch_idx = ctx._epoch_idx = trainer["epoch_idx"]
        self.batch_in_epoch = trainer["batch_in_epoch"]
        self.last_validation = trainer["last_validation"]
        self.last_checkpoint = self.batches_trained
        self.latest_checkpoint_uuid = uuid
        rng = state["rng"]
        if rng["epoch_start_torch"] is not None:
            torch.set_rng_state(rng["epoch_start_torch"])
        self._new_epoch_iterator()
        assert self._train_iter is not None
        for _ in range(self.batch_in_epoch):
            next(self._train_iter)
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])


def _scalar(value: Any) -> Any:
    """A metric value as a Python number (one-element tensors / numpy values) or a list."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, np.ndarray | np.generic):
        return value.item() if value.size == 1 else value.tolist()
    return value
