"""The harness's log lines: what each workload did, worded and formatted as Determined's
harness logs them (``LOG_FORMAT``: ``INFO: [pid] det.harness: message``).

On a cluster (:func:`det.harness.core.init` with a ``DbTransport``) they go to stderr, which
the agent stores as the task's log with each line's time, rank and run; elsewhere they go
wherever the program's own logging sends ``det.harness``'s records (by default nowhere below
warnings: ``LocalTransport`` prints its own lines). The chief logs the start of training with
the hyperparameters, each validation's metrics, each checkpoint with its uuid and size, a
preemption and why, and the end and why.
"""

import json
import logging
import sys
from collections.abc import Mapping
from typing import Any

from det import figures

LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"
"""Determined's ``det.LOG_FORMAT``, so that the level leads each line (det_user.log_level reads
it)."""

log = logging.getLogger("det.harness")


def log_to_stderr() -> None:
    """Send ``det.harness``'s INFO records and above to stderr in ``LOG_FORMAT`` (once per
    process; they do not also reach the root logger, so a trial's ``basicConfig`` does not
    print them twice)."""
    if any(getattr(h, "_det_harness", False) for h in log.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler._det_harness = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def number(value: Any) -> str:
    """A metric or hyperparameter as shown in log lines: a number by det.figures's rule (the
    CLI's and the WebUI's: ``0.9748``, ``1.235e-5``), booleans, strings and None as they are
    (``true``, ``null``), lists and objects element by element."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {number(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(number(v) for v in value) + "]"
    if isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)):
        return figures.number(value)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return str(value)


def metrics_text(metrics: Mapping[str, Any]) -> str:
    """``name=value`` for each metric, in the order given (``number``'s format)."""
    return " ".join(f"{k}={number(v)}" for k, v in metrics.items())


def training_started(trial_id: int, experiment_id: int, hparams: Mapping[str, Any],
                     batches: int, checkpoint: str | None) -> None:
    """The start of training: the trial, where it starts from and its hyperparameters."""
    start = (f"resuming from checkpoint {checkpoint} at batch {batches}" if checkpoint
             else "starting at batch 0")
    log.info("trial %d of experiment %d: %s with hyperparameters %s", trial_id,
             experiment_id, start, number(dict(hparams)))


def validated(batches: int, epochs: float, seconds: float, metrics: Mapping[str, Any]) -> None:
    """A validation's metrics (``batches`` and ``epochs``, said first, left out of them)."""
    shown = {k: v for k, v in metrics.items() if k not in figures.PROGRESS_KEYS}
    log.info("validated at batch %d (epoch %s) in %.3g s: %s", batches, number(epochs),
             seconds, metrics_text(shown))


def checkpointed(uuid: str, batches: int, resources: Mapping[str, int]) -> None:
    """A stored and recorded checkpoint: its uuid, batch, size and files (worded as 0.38.1's
    ``saved checkpoint UUID``, which it logs off a cluster)."""
    log.info("saved checkpoint %s at batch %d: %s in %d files", uuid, batches,
             figures.size(sum(resources.values())), len(resources))


def status(what: str) -> None:
    """What the trial turns to (``training``, ``validating``, ``checkpointing``), as 0.38.1's
    ``core.train.set_status`` logs it off a cluster."""
    log.info("status: %s", what)


def preempted(batches: int, why: str) -> None:
    """The run stops at the platform's request (it checkpoints, exits 0 and resumes later)."""
    log.info("preempted at batch %d: %s", batches, why)


def finished(outcome: str, why: str) -> None:
    """The end of the task's training and why (``outcome``: what ``Trainer.fit`` returned)."""
    log.info("trial finished: %s (%s)", outcome, why)
