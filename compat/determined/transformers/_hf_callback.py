"""``DetCallback``: a Hugging Face ``Trainer`` reporting to det as 0.38.1's does.

What it does, after 0.38.1's ``determined/transformers/_hf_callback.py``:

- ``on_log``: a log holding ``eval_*`` keys is reported as ``validation`` metrics, one holding
  ``test_*`` keys is not reported (a warning), any other as ``training`` metrics; each at
  ``steps_completed = state.global_step`` (optimizer steps, det's batches), once per step and
  group. HF's rounded ``epoch`` and its speed metrics (``*_runtime``, ``*_per_second``,
  ``*_compilation_time``) are dropped; ``batches`` (``global_step``) and ``epochs``
  (``state.epoch``, fractional) are added unless the log has them.
- ``on_save``: the chief stores ``output_dir/checkpoint-<global_step>/`` (and ``runs/``,
  HF's TensorBoard logs) as a det checkpoint whose metadata holds ``steps_completed`` and
  ``trial_id``; ``user_data`` goes into ``my_data.json`` in it.
- Resuming: with a latest checkpoint (a paused or restarted trial) it is downloaded into
  ``output_dir`` and ``args.resume_from_checkpoint`` names its ``checkpoint-N`` directory;
  pass that to ``trainer.train(resume_from_checkpoint=...)``, as upstream's examples do.
- Preemption (pause, a searcher's stop): training stops at the next log, and a checkpoint is
  saved at the end of training whatever the save strategy; unpreempted training ends with an
  evaluation and a checkpoint too, unless one was just made at that step.
- Progress: ``report_progress`` as a fraction of ``max_steps`` (or of ``num_train_epochs``).

Differences from 0.38.1, each on purpose: the ``filter_metrics`` list passed in is copied, not
extended; under ``adaptive_asha`` with a ``time_metric`` other than ``batches``/``epochs``
nothing is checked (0.38.1 raises ``AttributeError`` there); only the chief stores a
checkpoint, because det stores checkpoints from the chief alone (one host per trial: the
other ranks' files are in the same ``output_dir``).
"""

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import transformers
from transformers import trainer_utils

import determined as det

logger = logging.getLogger("det.transformers")

EVAL = "eval_"
TEST = "test_"
TRAIN = "train_"
SPEED_SUFFIXES = ("_runtime", "_per_second", "_compilation_time")


def metric_type(logs: Mapping[str, Any]) -> str:
    """``EVAL`` if any key starts ``eval_``, else ``TEST`` if any starts ``test_``, else
    ``TRAIN`` (0.38.1's ``get_metric_type``)."""
    if any(k.startswith(EVAL) for k in logs):
        return EVAL
    if any(k.startswith(TEST) for k in logs):
        return TEST
    return TRAIN


def reported_metrics(logs: Mapping[str, Any], filter_metrics: list[str] | None
                     ) -> dict[str, Any]:
    """The metrics of one HF log that det stores: those whose name contains one of
    ``filter_metrics`` (all without a filter), less HF's rounded ``epoch`` and its speed
    metrics."""
    return {k: v for k, v in logs.items()
            if (not filter_metrics or any(m in k for m in filter_metrics))
            and k != "epoch" and not k.endswith(SPEED_SUFFIXES)}


def training_length(args: transformers.TrainingArguments) -> tuple[str, float, str]:
    """``(unit, length, flag)`` of the training ``args`` ask for: ``("batches", max_steps,
    "--max_steps")`` when ``max_steps`` is set, else ``("epochs", num_train_epochs,
    "--num_train_epochs")``."""
    if args.max_steps > -1:
        return "batches", args.max_steps, "--max_steps"
    return "epochs", args.num_train_epochs, "--num_train_epochs"


def check_searcher_config(searcher: Mapping[str, Any], args: transformers.TrainingArguments
                          ) -> None:
    """Raise ``ValueError`` when the experiment's ``searcher`` section and the ``Trainer``'s
    length disagree: a unitless ``searcher.max_length``, a ``searcher.max_length`` other than
    ``--max_steps`` (batches) or ``--num_train_epochs`` (epochs), or an ASHA searcher whose
    ``max_time`` in ``batches``/``epochs`` differs from them (0.38.1's rules)."""
    unit, length, flag = training_length(args)
    max_length = searcher.get("max_length")
    if isinstance(max_length, int):
        raise ValueError("searcher.max_length: HF trainer does not respect a unitless "
                         f"max_length; remove it and rely on {flag}")
    if isinstance(max_length, Mapping):
        search_unit, search_len = next(iter(max_length.items()))
        if (search_unit, search_len) != (unit, length):
            raise ValueError(f"searcher.max_length: {search_unit}={search_len} does not match "
                             f"the HF trainer's {flag} ({unit}={length}); remove "
                             "searcher.max_length or make them equal")
    elif searcher.get("name") in ("adaptive_asha", "async_halving"):
        search_unit, search_len = searcher.get("time_metric"), searcher.get("max_time")
        if search_unit in ("batches", "epochs") and (search_unit, search_len) != (unit, length):
            raise ValueError(f"searcher.max_time: {search_unit}={search_len} does not match "
                             f"the HF trainer's {flag} ({unit}={length}); make them equal")


def missing_eval_metrics(metrics: Mapping[str, Any], searcher_metric: str | None,
                         time_metric: str | None) -> list[str]:
    """The searcher's metric and time metric (``searcher.metric``, ``searcher.time_metric``)
    absent from validation ``metrics``."""
    return [f"{name} ({field})" for name, field in ((searcher_metric, "searcher.metric"),
                                                    (time_metric, "searcher.time_metric"))
            if name is not None and name not in metrics]


def training_ends(args: transformers.TrainingArguments, state: transformers.TrainerState,
                  control: transformers.TrainerControl) -> bool:
    """Whether the epoch ending now is training's last: stopped, or ``max_steps`` batches
    (else ``num_train_epochs`` epochs) done."""
    if control.should_training_stop:
        return True
    if args.max_steps > -1:
        return state.global_step >= args.max_steps
    return state.epoch >= args.num_train_epochs


class DetCallback(transformers.TrainerCallback):  # type: ignore[misc]
    """Report a ``transformers.Trainer``'s metrics and checkpoints to det, stop it when det
    asks, and resume it from the trial's latest checkpoint (see the module's docstring).

    Args:
        core_context: the result of ``det.core.init()``.
        args: the ``TrainingArguments`` given to the ``Trainer`` (``output_dir`` and
            ``resume_from_checkpoint`` are read and set).
        filter_metrics: report only metrics whose name contains one of these (the searcher's
            metric and time metric are always reported); ``None``: all.
        user_data: a JSON-serialisable dict written as ``my_data.json`` into each checkpoint.

    Raises ``RuntimeError`` outside a det task, ``ValueError`` when the searcher config and
    ``args`` disagree (:func:`check_searcher_config`).
    """

    def __init__(self, core_context: det.core.Context, args: transformers.TrainingArguments,
                 filter_metrics: list[str] | None = None,
                 user_data: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.core_context = core_context
        self.filter_metrics = list(filter_metrics) if filter_metrics else None
        self.user_data = user_data
        self.last_train_metrics = -1
        self.last_eval_metrics = -1
        self.last_save = -1
        self.last_progress = 0

        info = det.get_cluster_info()
        if info is None:
            raise RuntimeError("det.transformers.DetCallback must be run on a Determined "
                               "cluster (a det task)")
        self.info = info
        self.load_last_checkpoint(args)

        self.searcher_metric: str | None = None
        self.time_metric: str | None = None
        if info.task_type == "TRIAL":
            searcher = info.trial.config["searcher"]
            check_searcher_config(searcher, args)
            self.searcher_metric = searcher.get("metric")
            self.time_metric = searcher.get("time_metric")
            if self.filter_metrics:
                self.filter_metrics += [m for m in (self.searcher_metric, self.time_metric) if m]

    def load_last_checkpoint(self, args: transformers.TrainingArguments) -> None:
        """Download the trial's latest checkpoint into ``args.output_dir`` (one download per
        host) and point ``args.resume_from_checkpoint`` at its ``checkpoint-N``; nothing
        without one, or with ``overwrite_output_dir`` (transformers 4's flag)."""
        latest = self.info.latest_checkpoint
        if latest is None:
            return
        if getattr(args, "overwrite_output_dir", False) is True:
            logger.info("Skipping downloading last checkpoint from Determined due "
                        "to overwrite_output_dir=True.")
            return
        distributed = self.core_context.distributed
        if distributed.get_local_rank() == 0:
            self.core_context.checkpoint.download(latest, args.output_dir)
        distributed.allgather_local(None)  # the others wait for the files
        args.resume_from_checkpoint = trainer_utils.get_last_checkpoint(args.output_dir)
        logger.info(f"Latest checkpoint downloaded to {args.resume_from_checkpoint}.")

    def on_log(self, args: transformers.TrainingArguments, state: transformers.TrainerState,
               control: transformers.TrainerControl, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        """Report ``logs`` as training or validation metrics; stop training when preempted
        (the checkpoint at the end of training is then forced by :meth:`on_epoch_end`)."""
        if logs is None:
            logger.warning("on_log called with empty logs")
            return
        kind = metric_type(logs)
        metrics = reported_metrics(logs, self.filter_metrics)
        metrics.setdefault("batches", state.global_step)
        metrics.setdefault("epochs", state.epoch)
        if kind == TRAIN:
            # HF logs the averages over training at the last step again: report a step once.
            if self.last_train_metrics != state.global_step:
                self.last_train_metrics = state.global_step
                if state.is_world_process_zero:
                    self.core_context.train.report_metrics(
                        group="training", steps_completed=state.global_step, metrics=metrics)
        elif kind == EVAL:
            if self.last_eval_metrics != state.global_step:
                self.last_eval_metrics = state.global_step
                if state.is_world_process_zero:
                    missing = missing_eval_metrics(metrics, self.searcher_metric,
                                                   self.time_metric)
                    if missing:
                        raise ValueError(f"the evaluation's metrics lack {', '.join(missing)}; "
                                         "det's searcher and checkpoint ranking need them")
                    self.core_context.train.report_metrics(
                        group="validation", steps_completed=state.global_step, metrics=metrics)
        else:
            logger.warning(f"Metrics not reported: metric type = {kind}.")
        if self.core_context.preempt.should_preempt():
            # Not should_save here: a later evaluate log would save a second time.
            control.should_training_stop = True

    def on_save(self, args: transformers.TrainingArguments, state: transformers.TrainerState,
                control: transformers.TrainerControl, **kwargs: Any) -> None:
        """Store ``checkpoint-<global_step>/`` and ``runs/`` of ``output_dir`` from the chief."""
        self.last_save = state.global_step
        if not state.is_world_process_zero:
            return
        local_path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if self.user_data is not None:
            with open(os.path.join(local_path, "my_data.json"), "w") as f:
                json.dump(self.user_data, f)
        metadata: dict[str, Any] = {"steps_completed": state.global_step}
        if self.info.task_type == "TRIAL":
            metadata["trial_id"] = self.info.trial.trial_id

        def selector(path: str) -> bool:
            return path.startswith((f"checkpoint-{state.global_step}/", "runs/"))

        self.core_context.checkpoint.upload(args.output_dir, metadata=metadata,
                                            selector=selector)

    def on_step_end(self, args: transformers.TrainingArguments,
                    state: transformers.TrainerState, control: transformers.TrainerControl,
                    **kwargs: Any) -> None:
        """Report progress as ``global_step / max_steps`` at each whole percent."""
        if state.is_world_process_zero and args.max_steps > -1:
            progress = state.global_step / args.max_steps
            if int(progress * 100) > self.last_progress:
                self.last_progress = int(progress * 100)
                self.core_context.train.report_progress(progress)

    def on_epoch_end(self, args: transformers.TrainingArguments,
                     state: transformers.TrainerState, control: transformers.TrainerControl,
                     **kwargs: Any) -> None:
        """At training's end, ask for an evaluation (unless preempted or one was made at this
        step) and a checkpoint (unless one was saved at this step); report epoch progress."""
        if training_ends(args, state, control):
            preempted = self.core_context.preempt.should_preempt()
            if state.global_step > self.last_eval_metrics and not preempted:
                control.should_evaluate = True
            if state.global_step > self.last_save:
                control.should_save = True
        if state.is_world_process_zero and args.max_steps == -1:
            self.core_context.train.report_progress(min(state.epoch / args.num_train_epochs, 1.0))
