"""``determined.experimental``: 0.38's experimental namespace. ``client`` is the SDK
(:mod:`determined.experimental.client`), ``core_v2`` the Core API of unmanaged runs
(:mod:`determined.experimental.core_v2`); the client's object types are also importable
from here, as 0.38 re-exports them (``from determined.experimental import Checkpoint``).
Imported on first use, so ``import determined.experimental`` costs nothing."""

import importlib
from typing import Any

_FROM_CLIENT = ("Checkpoint", "Experiment", "Model", "ModelVersion", "Trial", "TrialMetrics",
                "Workspace", "CheckpointState", "ExperimentState", "TrialState", "OrderBy")

__all__ = ["client", "core_v2", *_FROM_CLIENT]


def __getattr__(name: str) -> Any:
    """``client`` or ``core_v2`` (the modules) or one of the client's object types;
    AttributeError for other names."""
    if name in ("client", "core_v2"):
        return importlib.import_module(f"{__name__}.{name}")
    if name in _FROM_CLIENT:
        return getattr(importlib.import_module(f"{__name__}.client"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
