"""The trainer loop: runs a ``PyTorchTrial``'s train / validate / checkpoint workloads.

It follows the searcher's operations (never training past an op's length), validates every
``min_validation_period`` and at the end of each op (then completes the op with
``searcher.metric``), reports training metrics every ``scheduling_unit`` batches (averaged),
checkpoints every ``min_checkpoint_period``, at the end, and when the platform asks the task
to stop (Determined 0.38's ``det.pytorch``; spec run-training-code.rst, "Pause and Activate"). It
resumes
from ``latest_checkpoint`` at the same step with the same model, optimizer, scheduler, data
position and RNG state.

The per-batch path does what a hand-written loop does plus a few attribute reads: no I/O, no
``.item()``; losses are kept as detached tensors and reduced when reported.

Under several workers (``core_context.distributed.size > 1``) every worker runs
this loop in step: the training loader is re-made over a ``DistributedSampler`` (each worker
a disjoint shard of every epoch, seeded by the trial seed), validation is split across the
workers and its sums and counts added up (so the metrics equal one worker's on the same
data), training metrics are averaged over the workers, the chief alone reports and writes
checkpoints (holding every worker's RNG state), and the workers agree whether to stop
before each batch (:class:`StopAgreement`).
"""

import inspect
import json
import math
import pathlib
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from det.context import MAX_CONTEXT_BYTES, context_files
from det.errors import ContextError, DetError
from det.harness import core, logs
from det.harness.errors import MissingSearcherMetricError
from det.harness.lengths import Batch, Epoch, TrainUnit
from det.harness.trial import (
    InvalidHP,
    LRScheduler,
    PyTorchCallback,
    PyTorchTrial,
    PyTorchTrialContext,
    Reducer,
    unwrap_model,
)

STATE_FILE = "state_dict.pth"
"""The trainer's file inside a checkpoint directory (``torch.save`` of a dict), named and keyed
as Determined's (``models_state_dict``, ``optimizers_state_dict``, ...), next to
``load_data.json`` and the trial's code under ``code/``: Determined's checkpoint layout, which
``load_trial_from_checkpoint_path`` reads."""

OLD_STATE_FILE = "state.pt"
"""det's earlier file (format ``det.pytorch.v1``); still restored, so that a trial resumes
across an upgrade."""

LOAD_DATA_FILE = "load_data.json"
"""What a checkpoint's trial is: ``trial_type``, ``trial_cls_spec`` (module:Class),
``hparams`` and ``experiment_config``."""

CODE_DIR = "code"
"""The trial's code (its context directory) inside a checkpoint."""

CHECKPOINT_FORMAT = "det.pytorch.v2"
OLD_CHECKPOINT_FORMAT = "det.pytorch.v1"

CHECKPOINT_POLICIES = ("best", "all", "none")



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
    ``PyTorchTrialContext`` and the trial. ``fit()`` does the work. ``Trainer.for_trial``
    runs a trial the caller built (Determined 0.38's ``Trainer(trial, context)``).
    """

    def __init__(
        self,
        trial_class: type[PyTorchTrial],
        core_context: core.Context,
        device: torch.device | None = None,
    ) -> None:
        # Each worker draws its own dropout masks; DDP gives all the chief's initial weights.
        seed_everything(core_context.task_info.trial_seed + core_context.distributed.rank)
        context = PyTorchTrialContext(core_context, device)
        invalid_hp: InvalidHP | None = None
        trial: PyTorchTrial | None
        try:
            trial = trial_class(context)
        except InvalidHP as e:
            trial, invalid_hp = None, e
        self._bind(context, trial, invalid_hp)

    @classmethod
    def for_trial(cls, trial: PyTorchTrial, context: PyTorchTrialContext) -> "Trainer":
        """A trainer of ``trial``, already built on ``context`` (seeding is the caller's:
        ``det.harness.pytorch`` callers seed when they make the context)."""
        trainer = cls.__new__(cls)
        trainer._bind(context, trial, None)
        return trainer

    def _bind(self, context: PyTorchTrialContext, trial: PyTorchTrial | None,
              invalid_hp: InvalidHP | None) -> None:
        core_context = context.core
        self.core = core_context
        self.dist = core_context.distributed
        self.is_chief = self.dist.rank == 0
        self.config = core_context.task_info.config
        self.context = context
        self.trial = trial
        self._invalid_hp = invalid_hp
        self.units = core_context.units()
        searcher = self.config.get("searcher") or {}
        self.searcher_metric: str | None = searcher.get("metric")
        self.smaller_is_better = bool(searcher.get("smaller_is_better", True))
        self.scheduling_unit = int(self.config.get("scheduling_unit") or 100)
        # Set from the config once the training loader's length is known (_setup).
        self.validation_period: int | None = None
        self.checkpoint_period: int | None = None
        self.checkpoint_policy: str | None = None
        self.callbacks: dict[str, PyTorchCallback] = trial.build_callbacks() if trial else {}
        self.batches_trained = 0
        self.epoch_idx = 0
        self.batch_in_epoch = 0
        self.last_validation: tuple[int, dict[str, Any]] | None = None
        self.last_checkpoint: int | None = None
        self.latest_checkpoint_uuid: str | None = None
        self._best: float | None = None
        self._outputs: list[Any] = []
        self._epoch_rng: torch.Tensor | None = None
        self._train_iter: Iterator[Any] | None = None
        self._val_loader: torch.utils.data.DataLoader | None = None
        self._val_shard_loader: torch.utils.data.DataLoader | None = None
        self._agreement: StopAgreement | None = None
        self.end_reason = ""
        """Why ``fit`` returned what it did, in words for the log (det.harness.logs)."""

    # the workloads
    def fit(
        self,
        max_length: TrainUnit | None = None,
        *,
        checkpoint_period: TrainUnit | None = None,
        validation_period: TrainUnit | None = None,
        reporting_period: TrainUnit | None = None,
        checkpoint_policy: str | None = None,
        latest_checkpoint: str | None = None,
        step_zero_validation: bool = False,
        test_mode: bool = False,
    ) -> str:
        """Train, then return ``"completed"`` (done), ``"preempted"`` (checkpointed at the
        platform's request), ``"stopped"`` (``context.set_stop_requested``), or
        ``"invalid_hp"`` (the trial raised ``InvalidHP``; reported as an early exit).

        Without ``max_length`` it follows the searcher's operations (lengths in
        ``searcher.max_length``'s unit). With ``max_length`` (``Batch(n)`` / ``Epoch(n)``, as
        Determined 0.38's ``fit``) it trains that long, validates and checkpoints; the
        trial's clean exit then ends it. The periods (``Batch`` / ``Epoch``) override
        ``min_validation_period``, ``min_checkpoint_period`` and ``scheduling_unit``.
        ``checkpoint_policy``: after a validation, checkpoint ``"all"`` the time, when it is
        the ``"best"`` searcher metric so far, or ``"none"`` (default: neither, det's own
        trainer checkpoints by period). ``latest_checkpoint`` (a uuid) overrides the trial's
        own to resume from; ``step_zero_validation`` validates before training;
        ``test_mode`` trains one batch, validates and checkpoints.

        Raises ``MissingSearcherMetricError`` when validation metrics lack
        ``searcher.metric`` (where one is needed), ``DetError`` without any length to train
        to or for a bad ``checkpoint_policy``; user code exceptions propagate unchanged.
        """
        if checkpoint_policy is not None and checkpoint_policy not in CHECKPOINT_POLICIES:
            raise DetError(f"checkpoint_policy: expected one of {', '.join(CHECKPOINT_POLICIES)}"
                           f", got {checkpoint_policy!r}")
        self.checkpoint_policy = checkpoint_policy
        if self.trial is None:
            print(f"det.harness: invalid hyperparameters: {self._invalid_hp}", file=sys.stderr)
            self.end_reason = f"invalid hyperparameters: {self._invalid_hp}"
            if self.is_chief:
                self.core.train.report_early_exit(core.EarlyExitReason.INVALID_HP)
            return "invalid_hp"
        try:
            self._setup(self.trial, checkpoint_period, validation_period, reporting_period,
                        latest_checkpoint)
            if self.is_chief:
                info = self.core.task_info
                logs.training_started(info.trial_id, info.experiment_id,
                                      self.context.get_hparams(), self.batches_trained,
                                      self.latest_checkpoint_uuid)
            if step_zero_validation and self.batches_trained == 0:
                self.validate()
            if test_mode:
                max_length = Batch(self.batches_trained + 1)
            if max_length is None:
                outcome = self._fit_ops()
            else:
                outcome = self._fit_length(max_length.to_batches(len(self._train_loader)))
        except InvalidHP as e:
            print(f"det.harness: invalid hyperparameters: {e}", file=sys.stderr)
            self.end_reason = f"invalid hyperparameters: {e}"
            if self.is_chief:
                self.core.train.report_early_exit(core.EarlyExitReason.INVALID_HP)
            return "invalid_hp"
        for callback in self.callbacks.values():
            callback.on_trial_shutdown()
        if self.context._tensorboard_writer is not None:
            self.context._tensorboard_writer.flush()
        return outcome

    def _setup(self, trial: PyTorchTrial, checkpoint_period: TrainUnit | None,
               validation_period: TrainUnit | None, reporting_period: TrainUnit | None,
               latest_checkpoint: str | None) -> None:
        loader = trial.build_training_data_loader()
        # Determined's pytorch.DataLoader wraps a torch one.
        self._train_loader = self._shard(
            loader.get_data_loader() if hasattr(loader, "get_data_loader") else loader,
            training=True)
        per_epoch = len(self._train_loader)
        if per_epoch == 0:
            raise DetError("build_training_data_loader returned an empty data loader")
        self.context._epoch_len = per_epoch
        self.checkpoint_period = checkpoint_period.to_batches(per_epoch) if checkpoint_period \
            else self._config_period("min_checkpoint_period", per_epoch)
        self.validation_period = validation_period.to_batches(per_epoch) if validation_period \
            else self._config_period("min_validation_period", per_epoch)
        if reporting_period is not None:
            self.scheduling_unit = reporting_period.to_batches(per_epoch)
        latest = latest_checkpoint or self.core.task_info.latest_checkpoint
        if latest:
            self._restore(latest)
        else:
            self._new_epoch_iterator()
        self.context._initial_batch = self.batches_trained
        for callback in self.callbacks.values():
            callback.on_trial_startup(self.batches_trained, latest)
            callback.on_training_start()
            if self.batch_in_epoch == 0:
                callback.on_training_epoch_start(self.epoch_idx)

    def _config_period(self, key: str, per_epoch: int) -> int | None:
        """The config's period ``key`` in batches (``None``: none). Epochs are
        ``records_per_epoch`` records, or without it (deprecated in 0.38, so often left out)
        passes over the training loader of ``per_epoch`` batches."""
        length = self.config.get(key)
        if length and "epochs" in length and not self.units.records_per_epoch:
            return Epoch(int(length["epochs"])).to_batches(per_epoch) or None
        return self.units.length_to_batches(length, key)

    def _fit_ops(self) -> str:
        if not (self.config.get("searcher") or {}).get("max_length"):
            raise DetError("no length to train to: pass Trainer.fit(max_length=...) or set "
                           "searcher.max_length in the experiment config")
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
        if self.core.searcher.out_of_work:
            self.end_reason = "the searcher needs no more training from it"
            return "completed"
        self.end_reason = self._preempted()
        return "preempted"

    def _fit_length(self, target: int) -> str:
        outcome = self._train_to(target, None)
        if outcome is not None:
            return outcome
        self._validation_at_current_step()
        if self.last_checkpoint != self.batches_trained:
            self.checkpoint()
        self.end_reason = f"trained to max_length, {target} batches"
        return "completed"

    def _train_to(self, target: int, op: core.SearcherOperation | None) -> str | None:
        """Train until ``target`` batches, doing the periodic workloads on the way (progress
        is reported to ``op`` if given); returns an outcome if the task must stop early, else
        ``None``."""
        su = self.scheduling_unit
        while self.batches_trained < target:
            b = self.batches_trained
            stop = min(target, (b // su + 1) * su)
            next_validation = self._next_due(self.validation_period, self.last_validation_step)
            next_checkpoint = self._next_due(self.checkpoint_period, self.last_checkpoint)
            stop = int(min(stop, next_validation, next_checkpoint))
            self._status("training")
            interrupted = self._train_batches(stop)
            b = self.batches_trained
            if b % su == 0 or b == target or interrupted:
                self._report_training_metrics()
                if op is not None:
                    op.report_progress(self.units.from_batches(b, op.unit))
            if interrupted:
                return self._interrupt()
            if b >= next_validation:
                self.validate()
            # Not twice at one step: checkpoint_policy may have stored it after validating.
            if b >= next_checkpoint and self.last_checkpoint != b:
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
            self.end_reason = self._preempted()
            if self.last_checkpoint != self.batches_trained:
                self.checkpoint()
            return "preempted"
        self._validation_at_current_step()
        if self.last_checkpoint != self.batches_trained:
            self.checkpoint()
        self.end_reason = "the trial's code asked to stop (set_stop_requested)"
        if self.is_chief:
            self.core.train.report_early_exit(core.EarlyExitReason.USER_REQUESTED_STOP)
        return "stopped"

    def _preempted(self) -> str:
        """Log (the chief) that the run stops at the platform's request, and why; returns
        the why."""
        why = self.core.transport.stop_reason() if self.is_chief else "the chief was asked"
        if self.is_chief:
            logs.preempted(self.batches_trained, why)
        return why

    def _train_batches(self, stop: int) -> bool:
        """The hot loop: train until ``stop`` batches. Returns True if it stopped early
        because of a preemption or stop request (checked before each batch)."""
        trial, ctx = self.trial, self.context
        assert trial is not None
        outputs = self._outputs
        preempt = self._stop_check()
        to_device = ctx.to_device if ctx.device.type != "cpu" else None
        every_batch = [
            (s, f) for s, mode, f in ctx.lr_schedulers
            if mode is LRScheduler.StepMode.STEP_EVERY_BATCH
        ]
        it = self._train_iter
        assert it is not None
        epoch_len = len(self._train_loader)
        b, epoch, in_epoch = self.batches_trained, self.epoch_idx, self.batch_in_epoch
        interrupted = False
        while b < stop:
            if preempt():
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
            ctx._batches_trained, ctx._batch_in_epoch = b, in_epoch
            out = trial.train_batch(batch, epoch, b)
            outputs.append(out.detach() if isinstance(out, torch.Tensor) else _detach(out))
            b += 1
            in_epoch += 1
            for sched, freq in every_batch:
                if b % freq == 0:
                    sched.step()
            if in_epoch == epoch_len:  # the epoch ends with its last batch (its hooks run now)
                self._end_epoch()
                it, epoch, in_epoch = self._train_iter, self.epoch_idx, 0
        self.batches_trained = ctx._batches_trained = b
        self.batch_in_epoch = in_epoch
        return interrupted

    def _stop_check(self) -> Any:
        """The hot loop's question "stop before this batch?": the stop flag or the
        preemption flag (a read); under several workers a :class:`StopAgreement`."""
        ctx, transport = self.context, self.core.transport
        if self.dist.size == 1:
            return lambda: ctx._stop_requested or transport.should_preempt()
        if self._agreement is None:
            chief = self.is_chief
            self._agreement = StopAgreement(self.dist, lambda: (
                ctx._stop_requested, chief and transport.should_preempt()))
        return self._agreement

    def _shard(self, loader: torch.utils.data.DataLoader,
               training: bool) -> torch.utils.data.DataLoader:
        """``loader`` re-made to read this worker's shard. One worker keeps its loader,
        except that a plainly shuffled training loader is re-made the same way as for
        several: the epoch's order then depends on the trial seed alone, and N workers
        together train on the very batches one worker would (each batch split N ways)."""
        if self.dist.size == 1 and not (training and _plainly_shuffled(loader)):
            return loader
        return shard_loader(loader, self.dist.rank, self.dist.size, self.core.task_info.trial_seed,
                            training)

    def _new_epoch_iterator(self) -> None:
        # The sampler draws its shuffle seed from torch's RNG when the iterator is created
        # (a DistributedSampler from the trial seed and the epoch); keep that state so a
        # restore can rebuild the same epoch order.
        self._epoch_rng = torch.get_rng_state()
        sampler = getattr(self._train_loader, "sampler", None)
        if isinstance(sampler, torch.utils.data.DistributedSampler):
            sampler.set_epoch(self.epoch_idx)
        self._train_iter = iter(self._train_loader)

    def _end_epoch(self) -> None:
        for callback in self.callbacks.values():
            callback.on_training_epoch_end(self.epoch_idx)
        self.epoch_idx += 1
        self.batch_in_epoch = 0
        self.context._epoch_idx = self.epoch_idx
        for sched, mode, freq in self.context.lr_schedulers:
            if mode is LRScheduler.StepMode.STEP_EVERY_EPOCH and self.epoch_idx % freq == 0:
                sched.step()
        self._new_epoch_iterator()
        for callback in self.callbacks.values():
            callback.on_training_epoch_start(self.epoch_idx)

    def _report_training_metrics(self) -> None:
        # Every worker trained the same batches since the last report: a plain mean of the
        # workers' means is the mean over all of them.
        metrics = reduce_training_outputs(self._outputs) if self._outputs else {}
        self._outputs.clear()
        if self.dist.size > 1:
            per_worker = self.dist.allgather(metrics)
            keys = {k for m in per_worker for k in m}
            metrics = {k: float(np.mean([m[k] for m in per_worker if k in m])) for k in keys}
        if metrics:
            # 0.38.1 adds both unless the trial's metrics have them (_pytorch_trial.py).
            metrics.setdefault("batches", self.batches_trained)
            metrics.setdefault("epochs", self.epoch_idx)
            if self.is_chief:
                self.core.train.report_training_metrics(self.batches_trained, metrics)
            for callback in self.callbacks.values():
                callback.on_training_workload_end(metrics, [])

    def _status(self, what: str) -> None:
        """Log what the trial turns to, off a cluster, as 0.38.1's dummy train context's
        ``set_status`` does (``status: training``); its cluster form only logs at debug."""
        if self.is_chief and self.core.task_info.allocation_id == 0:
            logs.status(what)

    # validation
    def validate(self) -> dict[str, Any]:
        """Validate at the current step and report the metrics (plus ``batches`` and
        ``epochs``, the epochs completed, as 0.38.1 counts them, unless the trial's metrics
        have them). Torch's RNG state is restored afterwards, so validating never changes
        training."""
        trial = self.trial
        assert trial is not None
        self._status("validating")
        if self._val_loader is None:
            loader = trial.build_validation_data_loader()
            self._val_loader = loader.get_data_loader() if hasattr(loader, "get_data_loader") \
                else loader
        for callback in self.callbacks.values():
            callback.on_validation_start()
        for reducer, _ in self.context.reducers:
            reducer.reset()
        full_dataset = (
            type(trial).evaluate_full_dataset is not PyTorchTrial.evaluate_full_dataset)
        rng = torch.get_rng_state()
        started = time.monotonic()
        models = self.context.models
        modes = [m.training for m in models]
        for m in models:
            m.eval()
        try:
            with torch.no_grad():
                if full_dataset:
                    # The trial computes over the whole set: the chief does, and tells.
                    metrics = {}
                    if self.is_chief:
                        raw = trial.evaluate_full_dataset(self._val_loader)
                        metrics = {k: _scalar(v) for k, v in raw.items()}
                    metrics = self.dist.broadcast(metrics)
                else:
                    metrics = self._evaluate_batches(trial, self._val_shard())
        finally:
            for m, mode in zip(models, modes, strict=True):
                m.train(mode)
            torch.set_rng_state(rng)
        for reducer, name in self.context.reducers:
            value = reducer.cross_slot_reduce(
                self.core.distributed.allgather(reducer.per_slot_reduce()))
            metrics.update({name: _scalar(value)} if name is not None
                           else {k: _scalar(v) for k, v in value.items()})
        metrics.setdefault("batches", self.batches_trained)
        metrics.setdefault("epochs", self.epoch_idx)
        if self.is_chief:
            self.core.train.report_validation_metrics(self.batches_trained, metrics)
            logs.validated(self.batches_trained, metrics["epochs"], time.monotonic() - started,
                           metrics)
        self.last_validation = (self.batches_trained, metrics)
        for callback in self.callbacks.values():
            callback.on_validation_end(metrics)
        if self._checkpoint_due_by_policy(metrics) and self.last_checkpoint != self.batches_trained:
            self.checkpoint()
        return metrics

    def _checkpoint_due_by_policy(self, metrics: dict[str, Any]) -> bool:
        """Whether ``checkpoint_policy`` asks for a checkpoint after these metrics (``best``:
        the searcher metric is the best so far; without a searcher metric, never)."""
        if self.checkpoint_policy == "all":
            return True
        if self.checkpoint_policy != "best" or self.searcher_metric not in metrics:
            return False
        value = self._searcher_value(metrics)
        better = self._best is None or (
            value < self._best if self.smaller_is_better else value > self._best)
        if better:
            self._best = value
        return better

    def _evaluate_batches(
        self, trial: PyTorchTrial, loader: torch.utils.data.DataLoader
    ) -> dict[str, Any]:
        """Each metric of ``evaluate_batch`` over the loader, combined by the trial's
        ``evaluation_reducer()``. ``AVG`` is the plain mean of the per-batch values, a short
        last batch counting as much as a full one (the reference's ``_reduce_metrics``;
        across workers it weights each worker's mean by its batches, which is the same)."""
        reducers = trial.evaluation_reducer()
        sums: dict[str, Any] = {}
        counts: dict[str, int] = {}
        to_device = self.context.to_device
        with_idx = takes_batch_idx(trial.evaluate_batch)
        for idx, batch in enumerate(loader):
            batch = to_device(batch)
            metrics = trial.evaluate_batch(batch, idx) if with_idx else trial.evaluate_batch(batch)
            for key, value in metrics.items():
                if isinstance(value, torch.Tensor):
                    value = value.detach().double()
                reducer = reducers.get(key, Reducer.AVG) if isinstance(reducers, dict) \
                    else reducers
                if key not in sums:
                    sums[key], counts[key] = value, 1
                elif reducer is Reducer.AVG:
                    sums[key], counts[key] = sums[key] + value, counts[key] + 1
                elif reducer is Reducer.SUM:
                    sums[key] = sums[key] + value
                elif reducer is Reducer.MAX:
                    sums[key] = _extreme(sums[key], value, max)
                else:
                    sums[key] = _extreme(sums[key], value, min)
        def reducer_of(k: str) -> Reducer:
            return reducers.get(k, Reducer.AVG) if isinstance(reducers, dict) else reducers

        if self.dist.size > 1:
            # Each worker reduced its shard; combining the shards' sums (and batch counts)
            # and extremes gives the whole validation set's metrics.
            shares = self.dist.allgather({k: (_numeric(sums[k]), counts[k]) for k in sums})
            sums, counts = {}, {}
            for share in shares:
                for k, (value, n) in share.items():
                    value = np.asarray(value, dtype=np.float64)
                    if k not in sums:
                        sums[k], counts[k] = value, n
                    elif reducer_of(k) in (Reducer.AVG, Reducer.SUM):
                        sums[k], counts[k] = sums[k] + value, counts[k] + n
                    else:
                        pick = np.maximum if reducer_of(k) is Reducer.MAX else np.minimum
                        sums[k] = pick(sums[k], value)
        return {k: _scalar(sums[k] / counts[k] if reducer_of(k) is Reducer.AVG else sums[k])
                for k in sums}

    def _val_shard(self) -> torch.utils.data.DataLoader:
        assert self._val_loader is not None
        if self._val_shard_loader is None:
            self._val_shard_loader = self._shard(self._val_loader, training=False)
        return self._val_shard_loader

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
        """Store the trial's state at the current step in Determined's layout
        (``state_dict.pth``, ``load_data.json``, ``code/``); returns the checkpoint uuid.
        Under several workers the chief writes it, with every worker's RNG state (gathered),
        and every worker gets its uuid."""
        self._status("checkpointing")
        rng = self._rng_state()
        ranks_rng = self.dist.gather(rng) if self.dist.size > 1 else None
        uuid = self._store(rng, ranks_rng) if self.is_chief else ""
        if self.dist.size > 1:
            uuid = self.dist.broadcast(uuid)
        for callback in self.callbacks.values():
            callback.on_checkpoint_upload_end(uuid)
        self.last_checkpoint = self.batches_trained
        self.latest_checkpoint_uuid = uuid
        return uuid

    def _rng_state(self) -> dict[str, Any]:
        return {
            "epoch_start_cpu_rng_state": self._epoch_rng,
            "cpu_rng_state": torch.get_rng_state(),
            "gpu_rng_state": (torch.cuda.get_rng_state_all()
                              if torch.cuda.is_available() else None),
            "np_rng_state": np.random.get_state(),
            "random_rng_state": random.getstate(),
        }

    def _store(self, rng: dict[str, Any], ranks_rng: list[Any] | None) -> str:
        ctx = self.context
        if ctx._tensorboard_writer is not None:  # its events go to storage with the checkpoint
            ctx._tensorboard_writer.flush()
        state: dict[str, Any] = {
            "format": CHECKPOINT_FORMAT,
            "models_state_dict": [unwrap_model(m).state_dict() for m in ctx.models],
            "optimizers_state_dict": [o.state_dict() for o in ctx.optimizers],
            "lr_schedulers_state_dict": [s.state_dict() for s, _, _ in ctx.lr_schedulers],
            "callbacks": {name: cb.state_dict() for name, cb in self.callbacks.items()},
            "det_trainer": {
                "batches_trained": self.batches_trained,
                "epoch_idx": self.epoch_idx,
                "batch_in_epoch": self.batch_in_epoch,
                "last_validation": self.last_validation,
                "best": self._best,
            },
            "rng_state": rng,
            "rng_state_per_rank": ranks_rng,
        }
        if ctx.scalers:
            state["scaler_state_dict"] = ctx.scalers[0].state_dict()
        for callback in self.callbacks.values():
            callback.on_checkpoint_save_start(state)
        metadata = {
            "steps_completed": self.batches_trained,
            "format": CHECKPOINT_FORMAT,
            "framework": f"torch-{torch.__version__}",
            "trial_id": self.core.task_info.trial_id,
            "experiment_id": self.core.task_info.experiment_id,
        }
        with self.core.checkpoint.store_path(metadata) as (path, uuid):
            torch.save(state, path / STATE_FILE)
            self._write_load_data(path)
            for callback in self.callbacks.values():
                callback.on_checkpoint_write_end(str(path))
        return uuid

    def _write_load_data(self, path: pathlib.Path) -> None:
        """``load_data.json`` and ``code/`` (the trial's context directory: the working
        directory in a task, the trial module's directory elsewhere; left out, with a
        warning, past det's context size limit)."""
        cls = type(self.trial)
        module = sys.modules.get(cls.__module__)
        module_file = getattr(module, "__file__", None)
        # A class defined in the script that was run is imported by the script's name.
        module_name = pathlib.Path(module_file).stem if cls.__module__ == "__main__" \
            and module_file else cls.__module__
        (path / LOAD_DATA_FILE).write_text(json.dumps({
            "trial_type": "PyTorchTrial",
            "experiment_config": self.config,
            "hparams": self.context.get_hparams(),
            "trial_cls_spec": f"{module_name}:{cls.__qualname__}",
            "is_trainer": True,
        }, default=str))
        in_task = self.core.task_info.allocation_id != 0
        root = pathlib.Path.cwd() if in_task or module_file is None \
            else pathlib.Path(module_file).parent
        try:
            files = list(context_files(root))
        except ContextError as e:
            print(f"det.harness: checkpoint without code/: {e}", file=sys.stderr)
            return
        if sum(size for _, size in files) > MAX_CONTEXT_BYTES:
            print(f"det.harness: checkpoint without code/: {root} is larger than the context "
                  "limit", file=sys.stderr)
            return
        for rel, _ in files:
            if (root / rel).is_file() and not (root / rel).is_symlink():
                (path / CODE_DIR / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / rel, path / CODE_DIR / rel)

    def _restore(self, uuid: str) -> None:
        """Load checkpoint ``uuid`` and put the data loader at the same position: rebuild the
        epoch's iterator from the epoch-start RNG state and skip the batches already trained
        in that epoch (they are loaded, not trained)."""
        ctx = self.context
        with self.core.checkpoint.restore_path(uuid) as path:
            state = _load_state(path, uuid)
        for callback in self.callbacks.values():
            callback.on_checkpoint_load_start(state)
        for kind, objects in (
            ("models_state_dict", ctx.models),
            ("optimizers_state_dict", ctx.optimizers),
            ("lr_schedulers_state_dict", [s for s, _, _ in ctx.lr_schedulers]),
        ):
            if len(state[kind]) != len(objects):
                raise DetError(
                    f"checkpoint {uuid} holds {len(state[kind])} {kind.split('_state')[0]}, "
                    f"the trial wrapped {len(objects)}"
                )
            for obj, obj_state in zip(objects, state[kind], strict=True):
                target = unwrap_model(obj) if kind == "models_state_dict" else obj
                target.load_state_dict(obj_state)
        if ctx.scalers and "scaler_state_dict" in state:
            ctx.scalers[0].load_state_dict(state["scaler_state_dict"])
        for name, callback in self.callbacks.items():
            if name in state.get("callbacks", {}):
                callback.load_state_dict(state["callbacks"][name])
        trainer = state["det_trainer"]
        self.batches_trained = ctx._batches_trained = trainer["batches_trained"]
        self.epoch_idx = ctx._epoch_idx = trainer["epoch_idx"]
        self.batch_in_epoch = trainer["batch_in_epoch"]
        self.last_validation = trainer["last_validation"]
        self._best = trainer.get("best")
        self.last_checkpoint = self.batches_trained
        self.latest_checkpoint_uuid = uuid
        rng = state["rng_state"]
        per_rank = state.get("rng_state_per_rank")
        if per_rank and len(per_rank) == self.dist.size:
            rng = per_rank[self.dist.rank]
        if rng["epoch_start_cpu_rng_state"] is not None:
            torch.set_rng_state(rng["epoch_start_cpu_rng_state"])
        self._new_epoch_iterator()
        assert self._train_iter is not None
        for _ in range(self.batch_in_epoch):
            next(self._train_iter)
        torch.set_rng_state(rng["cpu_rng_state"])
        if rng["gpu_rng_state"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["gpu_rng_state"])
        np.random.set_state(rng["np_rng_state"])
        random.setstate(rng["random_rng_state"])


class StopAgreement:
    """Whether every worker stops before the next batch: true when the chief was asked to
    stop (preemption) or any worker requested a stop, the same answer on every worker.

    Agreed one batch late, so that no batch waits on it: each call takes the answer of the
    all-reduce the previous call started (which ran alongside that batch) and, unless it
    says stop, starts the next one. A flag raised before batch ``k`` stops the workers
    before batch ``k + 1``. Every worker calls it at the same batches, and the collectives
    in between (metrics, validation, checkpoints) come in the same order on all of them.
    """

    def __init__(self, dist: core.DistributedContext,
                 flags: Callable[[], tuple[bool, bool]]) -> None:
        self._dist = dist
        self._flags = flags
        self._pending: Callable[[], tuple[bool, ...]] | None = None

    def __call__(self) -> bool:
        if self._pending is None:
            self._pending = self._dist.any_true_async(*self._flags())
        stop = any(self._pending())
        self._pending = None if stop else self._dist.any_true_async(*self._flags())
        return stop


class StridedSampler(torch.utils.data.Sampler[int]):
    """Indices ``rank, rank + size, ...`` of a dataset of ``length``: one worker's share of
    the validation set, every record in exactly one share (no padding, unlike
    ``DistributedSampler``, so that the workers' sums add up to the whole set's)."""

    def __init__(self, length: int, rank: int, size: int) -> None:
        self._indices = range(rank, length, size)

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices)

    def __len__(self) -> int:
        return len(self._indices)


def shard_loader(loader: torch.utils.data.DataLoader, rank: int, size: int, seed: int,
                 training: bool) -> torch.utils.data.DataLoader:
    """``loader`` re-made to read worker ``rank``'s share of its dataset, with the same batch
    size, collation and workers: for training a ``DistributedSampler`` (shuffled, seeded by
    ``seed`` and the epoch, when ``loader`` shuffled; every worker gets as many batches), for
    validation a :class:`StridedSampler`. An ``IterableDataset`` is returned as is (the
    trial shards it itself, e.g. by ``context.distributed.rank``).

    The training order is the same for any number of workers: the seeded permutation of
    the epoch, dealt out in turn, so worker ``r``'s batch ``k`` holds records
    ``k * B * size + r, + size, ...``, and the workers' batches ``k`` together are one
    worker's batch ``k`` at ``size`` times the batch size (an epoch's last, partial batch
    aside: ``DistributedSampler`` pads the shards to equal lengths with a few repeats).

    Raises ``DetError`` for a loader with a custom sampler or batch sampler, which det cannot
    split (shard its dataset by rank in the trial instead).
    """
    data = torch.utils.data
    if isinstance(loader.dataset, data.IterableDataset):
        return loader
    plain = (data.RandomSampler, data.SequentialSampler)
    if loader.batch_size is None or not isinstance(loader.sampler, plain) \
            or type(loader.batch_sampler) is not data.BatchSampler:
        raise DetError(
            "cannot split this data loader across workers: it has a custom sampler or batch "
            "sampler; give build_*_data_loader a plain DataLoader (batch_size, shuffle) or "
            "shard the dataset by context.distributed.rank")
    if training:
        sampler: data.Sampler[int] = data.DistributedSampler(
            loader.dataset, num_replicas=size, rank=rank,
            shuffle=isinstance(loader.sampler, data.RandomSampler), seed=seed)
    else:
        sampler = StridedSampler(len(loader.dataset), rank, size)  # type: ignore[arg-type]
    return data.DataLoader(
        loader.dataset, batch_size=loader.batch_size, sampler=sampler,
        num_workers=loader.num_workers, collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory, drop_last=loader.drop_last, timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn, persistent_workers=loader.persistent_workers)


def _plainly_shuffled(loader: torch.utils.data.DataLoader) -> bool:
    data = torch.utils.data
    return (not isinstance(loader.dataset, data.IterableDataset)
            and type(loader.sampler) is data.RandomSampler and loader.generator is None
            and type(loader.batch_sampler) is data.BatchSampler)


def _numeric(value: Any) -> Any:
    """A metric sum as a float or a nested list (picklable without torch tensors)."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


def _load_state(path: pathlib.Path, uuid: str) -> dict[str, Any]:
    """The trainer state of the checkpoint at ``path``, in this version's keys (an earlier
    ``det.pytorch.v1`` checkpoint is read too), its tensors on the CPU wherever they were
    saved: ``load_state_dict`` copies weights onto the models' devices and moves optimizer
    state to its parameters', and the RNG states must be CPU byte tensors
    (``torch.set_rng_state``, ``torch.cuda.set_rng_state_all``). Raises ``DetError`` for
    anything else."""
    if (path / STATE_FILE).exists():
        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
        if state.get("format") == CHECKPOINT_FORMAT:
            return dict(state)
    elif (path / OLD_STATE_FILE).exists():
        old = torch.load(path / OLD_STATE_FILE, map_location="cpu", weights_only=False)
        if old.get("format") == OLD_CHECKPOINT_FORMAT:
            rng = old["rng"]
            return {
                "models_state_dict": old["models"],
                "optimizers_state_dict": old["optimizers"],
                "lr_schedulers_state_dict": old["lr_schedulers"],
                "det_trainer": old["trainer"],
                "rng_state": {
                    "epoch_start_cpu_rng_state": rng["epoch_start_torch"],
                    "cpu_rng_state": rng["torch"], "gpu_rng_state": rng["cuda"],
                    "np_rng_state": rng["numpy"], "random_rng_state": rng["python"],
                },
            }
    raise DetError(f"checkpoint {uuid} is not a checkpoint of det's PyTorch trainer")


def takes_batch_idx(evaluate_batch: Callable[..., Any]) -> bool:
    """Whether a (bound) ``evaluate_batch`` takes ``batch_idx``: a parameter of that name or a
    second positional one. 0.38.1 accepts ``evaluate_batch(self, batch)`` too and passes the
    index only when it is taken (its ``util.has_param(fn, "batch_idx", 2)``)."""
    params = inspect.signature(evaluate_batch).parameters.values()
    positional = [p for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return any(p.name == "batch_idx" for p in params) or len(positional) >= 2


def _extreme(a: Any, b: Any, pick: Any) -> Any:
    """The larger (``pick`` max) or smaller (min) of two metric values, element-wise for
    tensors."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        a, b = torch.as_tensor(a), torch.as_tensor(b)
        return torch.maximum(a, b) if pick is max else torch.minimum(a, b)
    return pick(a, b)


def _scalar(value: Any) -> Any:
    """A metric value as a Python number (one-element tensors / numpy values) or a list."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, np.ndarray | np.generic):
        return value.item() if value.size == 1 else value.tolist()
    return value
