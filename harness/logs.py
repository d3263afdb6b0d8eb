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
import math
import re
import sys
from collections.abc import Mapping
from typing import Any

LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"
"""Determined's ``det.LOG_FORMAT``, so that the level leads each line (det_log_level reads it)."""

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
    """A metric or hyperparameter as shown in log lines, by det.cli.output's number rule
    (which the CLI and the WebUI share; not imported: a task need not load typer): an
    integral value as its digits, any other float to 4 significant digits (``0.9748``,
    ``1.235e-5``); booleans, strings and None as they are; lists and objects element by
    element."""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return repr(value)
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return re.sub(r"e([+-])0*(?=\d)", r"e\1", f"{value:.4g}")
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {number(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(number(v) for v in value) + "]"
    if isinstance(value, bool | int) or value is None:
        return json.dumps(value)
    return str(value)


def size(n_bytes: int) -> str:
    """Bytes in binary units to 4 significant digits: ``512 B``, ``1.5 KiB``, ``12.34 MiB``."""
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.4g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


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
    shown = {k: v for k, v in metrics.items() if k not in ("batches", "epochs")}
    log.info("validated at batch %d (epoch %s) in %.3g s: %s", batches, number(epochs),
             seconds, metrics_text(shown))


def checkpointed(uuid: str, batches: int, resources: Mapping[str, int]) -> None:
    """A stored and recorded checkpoint: its uuid, batch, size and files."""
    log.info("checkpoint %s at batch %d: %s in %d files", uuid, batches,
             size(sum(resources.values())), len(resources))


def preempted(batches: int, why: str) -> None:
    """The run stops at the platform's request (it checkpoints, exits 0 and resumes later)."""
    log.info("preempted at batch %d: %s", batches, why)


def finished(outcome: str, why: str) -> None:
    """The end of the task's training and why (``outcome``: what ``Trainer.fit`` returned)."""
    log.info("trial finished: %s (%s)", outcome, why)
