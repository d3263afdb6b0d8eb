"""How ``det experiment create`` rewrites a config before submitting it, as Determined's CLI
does: ``--config KEY=VALUE`` overrides and the small test experiment of ``--test``."""

import copy
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from det.errors import ConfigError

_AS_LIST = {"bind_mounts"}
"""Keys whose single value an override makes a one-item list (as Determined's CLI)."""


def _value(key: str, text: str) -> Any:
    """An override's value as YAML reads it; ``a,b`` is a list (but ``[...]``/``{...}`` are
    read whole)."""
    try:
        if text.startswith(("[", "{")):
            value = yaml.safe_load(text)
            return [value] if key in _AS_LIST and isinstance(value, dict) else value
        if "," in text:
            return [yaml.safe_load(v) for v in text.split(",")]
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(key, f"--config {key}=...: not a YAML value: {e}") from None
    return [value] if key in _AS_LIST else value


def apply_overrides(config: Any, overrides: Iterable[str]) -> Any:
    """``config`` with each ``KEY=VALUE`` of ``overrides`` set (``KEY`` dotted:
    ``resources.slots_per_trial=2``; missing or null mappings on the way are created).

    Raises ``ConfigError`` for an override without ``=`` or a key under a non-mapping value.
    """
    overrides = list(overrides)
    if not overrides or not isinstance(config, Mapping):
        return config
    out = copy.deepcopy(dict(config))
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key:
            raise ConfigError("", f"--config {override!r}: expected KEY=VALUE "
                                  "(e.g. resources.slots_per_trial=2)")
        node = out
        parts = key.split(".")
        for i, part in enumerate(parts[:-1]):
            if node.get(part) is None:
                node[part] = {}
            if not isinstance(node[part], dict):
                raise ConfigError(".".join(parts[:i + 1]),
                                  f"--config {key}: this key holds no mapping")
            node = node[part]
        node[parts[-1]] = _value(key, text)
    return out


def make_test_config(config: Mapping[str, Any],
                           hparams: Mapping[str, Any]) -> dict[str, Any]:
    """The config of ``--test``'s small experiment (Determined's): one trial of ``single``
    search with the constant ``hparams`` trains one batch, validates every batch, never
    restarts, and keeps no checkpoint once it ends."""
    test = copy.deepcopy(dict(config))
    searcher = dict(test.get("searcher") or {})
    storage = dict(test.get("checkpoint_storage") or {})
    test.update({
        "description": f"[test-mode] {test.get('description') or test.get('name') or ''}".strip(),
        "scheduling_unit": 1,
        "min_validation_period": {"batches": 1},
        "searcher": {"name": "single", "metric": searcher.get("metric"),
                     "smaller_is_better": searcher.get("smaller_is_better", True),
                     "max_length": {"batches": 1}},
        "hyperparameters": {name: {"type": "const", "val": value}
                            for name, value in hparams.items()},
        "max_restarts": 0,
    })
    if storage:
        test["checkpoint_storage"] = {**storage, "save_experiment_best": 0,
                                      "save_trial_best": 0, "save_trial_latest": 0}
    return test
