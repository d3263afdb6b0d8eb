"""``determined``: Determined 0.38.1's public Python API, implemented over det's harness.

Training code written for Determined (``import determined as det``, ``det.core.init()``,
``det.pytorch.Trainer``, ``python3 -m determined.launch.torch_distributed``) runs on det
unchanged. Names, signatures and behaviour follow 0.38.1; the work is done by
``det.harness`` (Core API contexts, ``PyTorchTrial``, the trainer). The submodules are imported
on first use, so ``import determined`` (or a Core API script) does not pay for importing
torch; a test checks it loads none.
"""

import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from det.harness.errors import InvalidHP
from determined._info import ClusterInfo, TrialInfo, get_cluster_info

__version__ = "0.38.1"
"""The Determined API version this package implements."""

LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"
"""The ``logging`` format Determined's examples use (``logging.basicConfig(format=...)``)."""

__all__ = ["LOG_FORMAT", "ClusterInfo", "InvalidHP", "TrialInfo", "common", "core",
           "experimental", "get_cluster_info", "import_from_path", "launch", "pytorch",
           "transformers"]

_SUBMODULES = ("common", "core", "experimental", "launch", "pytorch", "transformers")


@contextmanager
def import_from_path(path: str | os.PathLike[str]) -> Iterator[None]:
    """Import modules from the directory ``path`` inside the block (e.g. a checkpoint's
    ``code/``): it comes first on ``sys.path``, and afterwards the path and the modules
    imported meanwhile are forgotten, so other code of the same module names stays
    importable."""
    before = set(sys.modules)
    sys.path.insert(0, os.fspath(path))
    try:
        yield
    finally:
        sys.path.remove(os.fspath(path))
        for name in set(sys.modules) - before:
            del sys.modules[name]


def __getattr__(name: str) -> ModuleType:
    """``determined.core`` / ``.pytorch`` / ``.launch`` / ..., imported on first access; raises
    AttributeError for any other name."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
