"""Compare searchers at the same budget: best validation accuracy, training batches, wall time.

For each searcher (``random``, ``adaptive_asha``, ``tpe``, and ``tpe`` with ASHA early
stopping), the pure ``searcher_step`` is driven in this process and each trial's work is run by
det's ``Trainer`` under a ``LocalTransport`` (no database, no cluster): one op at a time, oldest
first, each ``ValidateAfter(length)`` training the trial from its latest checkpoint (none at
first) to ``length`` batches, then validating once. A promoted trial resumes from the
checkpoint its previous run left, as on a cluster. Every searcher gets the example's
``random.yaml`` search space, the same ``max_trials``, ``max_length``,
``max_concurrent_trials`` and experiment seed; periodic validations and checkpoints are
switched off so that each op costs its batches plus one validation. One warm-up batch runs
first (data loading, torch's first calls) and is not counted.

Printed per searcher: trials created, best validation accuracy over every validation, total
training batches (the searcher's cost), the ratio to random's batches, and wall time.

    python bench/search_compare.py --dataset digits [--max-trials 16] [--max-length 400]
"""

import argparse
import copy
import pathlib
import tempfile
import time
from typing import Any

import torch
import yaml

from det.configs import parse_experiment_config
from det.harness import core
from det.harness.entrypoint import load_trial_class
from det.harness.local import local_hparams
from det.harness.trainer import Trainer
from det.harness.transport import LocalTransport
from det.reconciler.searchers import (
    Close,
    Create,
    Event,
    Shutdown,
    TrialExited,
    ValidateAfter,
    ValidationCompleted,
    searcher_step,
)

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
DATASETS = {
    "digits": (EXAMPLES / "digits", "model_def:DigitsTrial", 400),
    "fashion-mnist": (EXAMPLES / "fashion_mnist", "model_def:FashionMNISTTrial", 800),
}
"""--dataset -> (example directory, entrypoint, default max_length in batches)."""

SEARCHERS: dict[str, dict[str, Any]] = {
    "random": {"name": "random"},
    "adaptive_asha": {"name": "adaptive_asha", "divisor": 4, "mode": "standard"},
    "tpe": {"name": "tpe"},
    "tpe+asha": {"name": "tpe", "divisor": 4, "max_rungs": 3},
}
"""Label -> searcher keys besides the common ones (metric, budget, concurrency)."""


def experiment_config(
    dataset: str, searcher: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """The expanded config: the example's ``random.yaml`` with ``searcher`` and the budget."""
    directory, _, _ = DATASETS[dataset]
    config = yaml.safe_load((directory / "random.yaml").read_text())
    for key in ("min_validation_period", "min_checkpoint_period"):
        config.pop(key, None)
    config["searcher"] = {
        **searcher,
        "metric": "accuracy",
        "smaller_is_better": False,
        "max_trials": args.max_trials,
        "max_concurrent_trials": args.max_concurrent_trials,
        "max_length": {"batches": args.max_length},
    }
    if searcher["name"] == "tpe":
        config["searcher"]["startup_trials"] = args.startup_trials
    config["reproducibility"] = {"experiment_seed": args.seed}
    return parse_experiment_config(config).expanded()


def warm_up(config: dict[str, Any], trial_class: type, storage: pathlib.Path) -> None:
    """Train and validate one trial for one batch, so that no searcher's wall time includes
    loading the data set or torch's first-call costs."""
    hparams = local_hparams(config["hyperparameters"])
    transport = LocalTransport(config, hparams, ops=[1], echo=False)
    storage_config = {"type": "shared_fs", "host_path": str(storage)}
    with core.init(transport=transport, checkpoint_storage=storage_config) as ctx:
        Trainer(trial_class, ctx).fit()


def run_search(
    config: dict[str, Any], trial_class: type, storage: pathlib.Path
) -> dict[str, float]:
    """Run a whole search in this process; returns trials, best accuracy, batches, seconds."""
    start = time.perf_counter()
    trials: dict[str, dict[str, Any]] = {}  # request id -> hparams, seed, checkpoint, steps
    pending: list[ValidateAfter] = []
    best, batches = float("-inf"), 0
    state, actions = searcher_step(config, None, [])
    while True:
        events: list[Event] = []
        for action in actions:
            if isinstance(action, Create):
                trials[action.request_id] = {
                    "hparams": action.hparams, "seed": action.seed, "checkpoint": None,
                    "steps": 0,
                }
            elif isinstance(action, ValidateAfter):
                pending.append(action)
            elif isinstance(action, Close):
                events.append(TrialExited(action.request_id))
        if any(isinstance(a, Shutdown) for a in actions):
            break
        if not events:
            op = pending.pop(0)
            trial = trials[op.request_id]
            transport = LocalTransport(
                config, trial["hparams"], trial_seed=trial["seed"],
                latest_checkpoint=trial["checkpoint"], steps_completed=trial["steps"],
                ops=[op.length], echo=False,
            )
            storage_config = {"type": "shared_fs", "host_path": str(storage)}
            with core.init(transport=transport, checkpoint_storage=storage_config) as ctx:
                trainer = Trainer(trial_class, ctx)
                trainer.fit()
            batches += trainer.batches_trained - trial["steps"]
            trial["checkpoint"] = transport.latest_checkpoint
            trial["steps"] = trainer.batches_trained
            ((_, accuracy),) = transport.completed_ops
            best = max(best, accuracy)
            events.append(ValidationCompleted(op.request_id, op.length, accuracy))
        state, actions = searcher_step(config, state, events)
    return {
        "trials": len(trials), "best": best, "batches": batches,
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="digits")
    parser.add_argument("--searchers", default=",".join(SEARCHERS), help="comma-separated")
    parser.add_argument("--max-trials", type=int, default=16)
    parser.add_argument("--max-length", type=int, help="batches (default: per dataset)")
    parser.add_argument("--max-concurrent-trials", type=int, default=2)
    parser.add_argument("--startup-trials", type=int, default=6, help="tpe's random trials")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args()
    directory, entrypoint, default_length = DATASETS[args.dataset]
    args.max_length = args.max_length or default_length
    if args.threads:
        torch.set_num_threads(args.threads)
    trial_class = load_trial_class(entrypoint, directory)

    print(
        f"{args.dataset}: max_trials {args.max_trials}, max_length {args.max_length} batches, "
        f"max_concurrent_trials {args.max_concurrent_trials}, seed {args.seed}"
    )
    print(f"{'searcher':<14}{'trials':>7}{'best acc':>10}{'batches':>10}{'vs random':>11}"
          f"{'wall s':>9}")
    with tempfile.TemporaryDirectory(prefix="det-search-compare-") as tmp:
        warm_up(experiment_config(args.dataset, SEARCHERS["random"], args), trial_class,
                pathlib.Path(tmp))
    random_batches = None
    for label in args.searchers.split(","):
        config = experiment_config(args.dataset, SEARCHERS[label], args)
        with tempfile.TemporaryDirectory(prefix="det-search-compare-") as tmp:
            result = run_search(copy.deepcopy(config), trial_class, pathlib.Path(tmp))
        if label == "random":
            random_batches = result["batches"]
        ratio = f"{result['batches'] / random_batches:.2f}" if random_batches else "-"
        print(
            f"{label:<14}{result['trials']:>7}{result['best']:>10.4f}{result['batches']:>10}"
            f"{ratio:>11}{result['seconds']:>9.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
