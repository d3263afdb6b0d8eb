"""In-process runs without a database: ``det experiment create --local [--test-mode]``.

``run_local`` picks one deterministic value per hyperparameter, runs the entrypoint's trial
class under a ``LocalTransport`` and prints what happened. Test mode is the spec's "compressed
version of the full experiment circle" (run-training-code.rst, "Local Test Mode"): a few
batches, validation, a checkpoint, then a restore into a fresh trial and one more batch.
"""

import copy
import math
import pathlib
import tempfile
from collections.abc import Mapping
from typing import Any

from det.errors import ConfigError, DetError
from det.harness import core
from det.harness.entrypoint import load_trial_class
from det.harness.errors import TrialCodeError
from det.harness.trainer import Trainer
from det.harness.transport import LocalTransport

TEST_MODE_BATCHES = 5
"""Batches trained in test mode before the checkpoint (one more after the restore)."""


def local_hparams(specs: Mapping[str, Any], path: str = "hyperparameters") -> dict[str, Any]:
    """One deterministic value per hyperparameter definition (Determined 0.38's
    ``hyperparameters.go`` forms).

    const: its value; bare value: itself; int: ``(minval + maxval) // 2``; double: the
    midpoint; log: ``base ** midpoint``; categorical: the first value; a map without
    ``type``: nested, recursively. Raises ``ConfigError`` for an unknown type.
    """
    values: dict[str, Any] = {}
    for name, spec in specs.items():
        where = f"{path}.{name}"
        if not isinstance(spec, Mapping):
            values[name] = spec
            continue
        kind = spec.get("type")
        if kind is None:
            values[name] = local_hparams(spec, where)
        elif kind == "const":
            values[name] = spec["val"]
        elif kind == "int":
            values[name] = (int(spec["minval"]) + int(spec["maxval"])) // 2
        elif kind == "double":
            values[name] = (float(spec["minval"]) + float(spec["maxval"])) / 2
        elif kind == "log":
            exponent = (float(spec["minval"]) + float(spec["maxval"])) / 2
            values[name] = math.pow(float(spec["base"]), exponent)
        elif kind == "categorical":
            values[name] = spec["vals"][0]
        else:
            raise ConfigError(
                f"{where}.type", f"expected const|int|double|log|categorical, got {kind!r}"
            )
    return values


def _fit(
    trial_class: type, transport: LocalTransport, storage: Mapping[str, Any] | None, phase: str
) -> Trainer:
    """Run one trainer; user-code exceptions become ``TrialCodeError`` naming ``phase``."""
    try:
        with core.init(transport=transport, checkpoint_storage=storage) as ctx:
            trainer = Trainer(trial_class, ctx)
            trainer.fit()
            return trainer
    except DetError:
        raise
    except Exception as e:
        raise TrialCodeError(f"{phase}: trial code raised {type(e).__name__}: {e}") from e


def run_local(config: dict[str, Any], context_dir: pathlib.Path, test_mode: bool) -> None:
    """Run the experiment's trial class in this process, without a database.

    ``config`` is the expanded experiment config; its ``entrypoint`` must be ``module:Class``
    (loaded from ``context_dir``). Full mode trains one trial for ``searcher.max_length``
    with checkpoints in ``checkpoint_storage`` (a temporary directory if absent). Test mode
    trains ``TEST_MODE_BATCHES`` batches, validates, checkpoints, restores the checkpoint into
    a fresh trial and trains one batch more, with checkpoints in a temporary directory that is
    removed afterwards.

    Raises ``det.harness.errors.EntrypointError`` for a bad entrypoint,
    ``TrialCodeError`` when user code fails, ``MissingSearcherMetricError`` when validation
    lacks ``searcher.metric``, ``det.errors.ConfigError`` for unusable config values.
    """
    trial_class = load_trial_class(config.get("entrypoint"), context_dir)  # type: ignore[arg-type]
    hparams = local_hparams(config.get("hyperparameters") or {})
    seed = int((config.get("reproducibility") or {}).get("experiment_seed") or 0)
    print(f"[det local] trial {config['entrypoint']} with hyperparameters {hparams}", flush=True)
    if not test_mode:
        transport = LocalTransport(config, hparams, trial_seed=seed)
        trainer = _fit(trial_class, transport, config.get("checkpoint_storage"), "training")
        print(
            f"[det local] done: {trainer.batches_trained} batches, latest checkpoint "
            f"{trainer.latest_checkpoint_uuid} in {trainer.core.checkpoint.storage.base}",
            flush=True,
        )
        return

    test_config = copy.deepcopy(config)
    test_config["searcher"] = {**(config.get("searcher") or {}), "max_length": {"batches": 1}}
    for key in ("min_validation_period", "min_checkpoint_period"):
        test_config.pop(key, None)
    test_config["scheduling_unit"] = TEST_MODE_BATCHES
    with tempfile.TemporaryDirectory(prefix="det-test-mode-") as tmp:
        storage = {"type": "shared_fs", "host_path": tmp}
        first = LocalTransport(test_config, hparams, trial_seed=seed, ops=[TEST_MODE_BATCHES])
        trainer = _fit(trial_class, first, storage, "test mode, first run")
        uuid = trainer.latest_checkpoint_uuid
        print(
            f"[det local] test mode: trained {trainer.batches_trained} batches, validated, "
            f"checkpointed {uuid}",
            flush=True,
        )
        second = LocalTransport(
            test_config, hparams, trial_seed=seed, latest_checkpoint=uuid,
            steps_completed=trainer.batches_trained, ops=[TEST_MODE_BATCHES + 1],
        )
        resumed = _fit(trial_class, second, storage, "test mode, run restored from checkpoint")
        print(
            f"[det local] test mode: restored {uuid} into a fresh trial, trained to batch "
            f"{resumed.batches_trained}, validated, checkpointed "
            f"{resumed.latest_checkpoint_uuid}; test mode passed",
            flush=True,
        )
