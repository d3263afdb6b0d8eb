"""det.configs: experiment config models, loading with one-line errors, JSON Schema.

Public API:

* ``read_config_file(path) -> str`` (at most 1 MiB of UTF-8), ``load_experiment_config(text,
  source=None) -> ExperimentConfig`` (YAML text) and ``parse_experiment_config(data,
  source=None)`` (a dict, e.g. a stored expanded config); the bounds are in
  ``det.configs.limits``;
* ``ExperimentConfig`` and ``ExperimentConfig.expanded() -> dict`` (every default filled in);
* ``experiment_json_schema() -> dict``;
* ``Length``, the hyperparameter and searcher models;
* ``entrypoint_argv``, ``is_trial_class``, ``env_for_device``.
"""

from det.configs.entrypoint import entrypoint_argv, is_trial_class
from det.configs.environment import BindMount, EnvironmentConfig, env_for_device
from det.configs.experiment import (
    CheckpointStorage,
    DirectoryStorage,
    ExperimentConfig,
    Reproducibility,
    Resources,
    SharedFSStorage,
)
from det.configs.hyperparameters import (
    CategoricalHP,
    ConstHP,
    DoubleHP,
    Hyperparameter,
    Hyperparameters,
    IntHP,
    LogHP,
    NestedHP,
    iter_leaves,
)
from det.configs.length import Length
from det.configs.load import (
    experiment_json_schema,
    load_experiment_config,
    parse_experiment_config,
    read_config_file,
)
from det.configs.searcher import (
    AdaptiveAshaSearcher,
    GridSearcher,
    RandomSearcher,
    SearcherConfig,
    SingleSearcher,
    TPESearcher,
)

__all__ = [
    "AdaptiveAshaSearcher",
    "BindMount",
    "CategoricalHP",
    "CheckpointStorage",
    "ConstHP",
    "DirectoryStorage",
    "DoubleHP",
    "EnvironmentConfig",
    "ExperimentConfig",
    "GridSearcher",
    "Hyperparameter",
    "Hyperparameters",
    "IntHP",
    "Length",
    "LogHP",
    "NestedHP",
    "RandomSearcher",
    "Reproducibility",
    "Resources",
    "SearcherConfig",
    "SharedFSStorage",
    "SingleSearcher",
    "TPESearcher",
    "entrypoint_argv",
    "env_for_device",
    "experiment_json_schema",
    "is_trial_class",
    "iter_leaves",
    "load_experiment_config",
    "parse_experiment_config",
    "read_config_file",
]
