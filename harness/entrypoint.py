"""Load the trial class an entrypoint ``module:Class`` names (Determined 0.38's
``exec/launch.py``)."""

import importlib
import pathlib
import re
import sys

from det.harness.errors import EntrypointError
from det.harness.trial import PyTorchTrial

TRIAL_ENTRYPOINT = re.compile(r"^[a-zA-Z0-9_.]+:[a-zA-Z0-9_]+$")
"""A trial-class entrypoint; any other string is a shell command."""


def is_trial_entrypoint(entrypoint: object) -> bool:
    """Whether ``entrypoint`` is the ``module:Class`` form."""
    return isinstance(entrypoint, str) and bool(TRIAL_ENTRYPOINT.match(entrypoint))


def load_trial_class(entrypoint: str, context_dir: pathlib.Path) -> type[PyTorchTrial]:
    """Import ``module`` from ``context_dir`` (put first on ``sys.path``) and return ``Class``.

    A module of the same name imported earlier from elsewhere is dropped first, so each
    context gets its own code. Raises ``EntrypointError`` if the form is wrong, the module or
    class is missing, or the class is not a ``PyTorchTrial`` subclass.
    """
    if not is_trial_entrypoint(entrypoint):
        raise EntrypointError(
            f"entrypoint {entrypoint!r}: expected module:Class naming a PyTorchTrial subclass"
        )
    module_name, class_name = entrypoint.split(":")
    context = str(context_dir.resolve())
    if context not in sys.path:
        sys.path.insert(0, context)
    loaded = sys.modules.get(module_name)
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(context):
        del sys.modules[module_name]
    importlib.invalidate_caches()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            raise EntrypointError(
                f"entrypoint {entrypoint!r}: module {module_name!r} not found in {context}"
            ) from e
        raise
    cls = getattr(module, class_name, None)
    if cls is None:
        raise EntrypointError(
            f"entrypoint {entrypoint!r}: module {module_name!r} has no attribute {class_name!r}"
        )
    if not (isinstance(cls, type) and issubclass(cls, PyTorchTrial)):
        raise EntrypointError(
            f"entrypoint {entrypoint!r}: {class_name} is not a subclass of "
            "det.harness.pytorch.PyTorchTrial"
        )
    return cls
