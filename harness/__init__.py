"""det.harness: the library user training code imports inside a task.

``core`` is the Core API (contexts for metrics, checkpoints, preemption, searcher ops over a
``Transport``); ``pytorch`` the ``PyTorchTrial`` API and its ``Trainer``. ``run`` is the task
entrypoint for trial classes (``python -m det.harness.run module:Class``), ``local`` the
in-process runner behind ``det experiment create --local``.

Both are imported on first use (PEP 562 ``__getattr__``), so a Core API script that never
touches ``pytorch`` does not pay for importing torch (about 0.9 s).
"""

import importlib
from types import ModuleType

__all__ = ["core", "pytorch"]


def __getattr__(name: str) -> ModuleType:
    """``det.harness.core`` / ``det.harness.pytorch``, imported on first access.

    Raises AttributeError for any other name, as a module without it would.
    """
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
