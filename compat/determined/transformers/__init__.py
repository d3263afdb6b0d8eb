"""``determined.transformers``: 0.38.1's ``DetCallback`` for Hugging Face's ``Trainer``.

Needs the ``transformers`` package (and ``accelerate``, which its ``Trainer`` needs); det's
``dev`` extra installs both, its runtime does not. Without them, importing this module raises
``ImportError`` naming the package and how to install it.
"""

import importlib.util

for _package in ("transformers", "accelerate"):
    if importlib.util.find_spec(_package) is None:
        raise ImportError(
            f"determined.transformers needs the {_package} package, which is not installed in "
            f"this environment; install it (pip install 'transformers[torch]', e.g. in the "
            "experiment's startup-hook.sh)", name=_package)

from determined.transformers._hf_callback import DetCallback  # noqa: E402 (after the check)

__all__ = ["DetCallback"]
