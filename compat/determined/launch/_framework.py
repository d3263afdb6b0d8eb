"""What ``determined.launch.deepspeed`` / ``.horovod`` / ``.tensorflow`` share: each runs only
where its framework is installed, else says so in one line and exits 1 (a missing
launcher module was a traceback)."""

import importlib.util
import sys


def missing_package(launcher: str, package: str) -> str | None:
    """The one-line error for ``python3 -m determined.launch.<launcher>`` when ``package`` is
    not importable in this environment, else ``None``."""
    if importlib.util.find_spec(package) is not None:
        return None
    return (f"determined.launch.{launcher}: the {package} package is not installed in this "
            f"task's environment; install it (pip install {package}, e.g. in the experiment's "
            "startup-hook.sh) or launch with determined.launch.torch_distributed")


def fail(launcher: str, message: str) -> int:
    """Print ``message`` as the launcher's one-line error; returns the exit code 1."""
    print(message if message.startswith("determined.launch.")
          else f"determined.launch.{launcher}: {message}", file=sys.stderr)
    return 1
